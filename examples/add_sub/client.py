"""Ask the AddSub model for one sample and for a batch, and check the answers."""

import argparse

import numpy as np

from pytriton.client import ModelClient


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="localhost", help="http://host:port or grpc://host:port")
    args = parser.parse_args()

    a_batch = np.arange(8, dtype=np.float32).reshape(2, 4)
    b_batch = np.full((2, 4), 10, dtype=np.float32)

    with ModelClient(args.url, "AddSub") as client:
        batch = client.infer_batch(a_batch, b_batch)  # inputs by position...
        sample = client.infer_sample(a=a_batch[0], b=b_batch[0])  # ...or by name

    np.testing.assert_allclose(batch["add"], a_batch + b_batch)
    np.testing.assert_allclose(batch["sub"], a_batch - b_batch)
    np.testing.assert_allclose(sample["add"], a_batch[0] + b_batch[0])
    np.testing.assert_allclose(sample["sub"], a_batch[0] - b_batch[0])
    for name, value in batch.items():
        print(f"{name}: {value.tolist()}")
    print("OK")


if __name__ == "__main__":
    main()
