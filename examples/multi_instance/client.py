"""Send concurrent requests to the two-instance Linear model; check the answers and that both instances worked."""

import argparse
import collections

import numpy as np

from pytriton.client import FuturesModelClient

WEIGHTS = np.arange(12, dtype=np.float32).reshape(4, 3)  # the server's weights


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="localhost", help="http://host:port or grpc://host:port")
    args = parser.parse_args()

    samples = np.random.default_rng(0).random((16, 4), dtype=np.float32)
    with FuturesModelClient(args.url, "Linear", max_workers=8) as client:
        futures = [client.infer_sample(x=x) for x in samples]  # all sent at once
        results = [future.result() for future in futures]

    for x, result in zip(samples, results):
        np.testing.assert_allclose(result["y"], x @ WEIGHTS, rtol=1e-5)
    served_by = collections.Counter(int(result["instance"][0]) for result in results)
    print("requests served by instance:", dict(sorted(served_by.items())))
    if set(served_by) != {0, 1}:
        raise SystemExit(f"expected both instances to serve requests, got {dict(served_by)}")
    print("OK")


if __name__ == "__main__":
    main()
