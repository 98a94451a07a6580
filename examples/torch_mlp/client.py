"""Classify a batch with the MLP model; check probabilities, labels, and that batching changes nothing."""

import argparse

import numpy as np

from pytriton.client import ModelClient


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="localhost", help="http://host:port or grpc://host:port")
    args = parser.parse_args()

    features = np.random.default_rng(0).standard_normal((8, 16), dtype=np.float32)
    with ModelClient(args.url, "MLP") as client:
        batch = client.infer_batch(features=features)
        samples = [client.infer_sample(features=row) for row in features]

    probabilities = batch["probabilities"]
    if probabilities.shape != (8, 4) or probabilities.dtype != np.float32:
        raise SystemExit(f"unexpected probabilities: {probabilities.dtype} {probabilities.shape}")
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(batch["label"][:, 0], probabilities.argmax(axis=1))
    for row, sample in zip(probabilities, samples):  # a sample alone gets the same answer as in a batch
        np.testing.assert_allclose(sample["probabilities"], row, rtol=1e-5, atol=1e-6)
    print("labels:", batch["label"][:, 0].tolist())
    print("OK")


if __name__ == "__main__":
    main()
