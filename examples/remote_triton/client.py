"""Call the AddSub model that remote.py bound, and the server's own Identity model."""

import argparse

import numpy as np

from pytriton.client import ModelClient


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="localhost", help="http://host:port or grpc://host:port")
    args = parser.parse_args()
    a = np.array([[1.0], [2.0]], dtype=np.float32)
    b = np.array([[10.0], [20.0]], dtype=np.float32)
    with ModelClient(args.url, "AddSub") as client:
        result = client.infer_batch(a=a, b=b)
    np.testing.assert_allclose(result["add"], a + b)
    np.testing.assert_allclose(result["sub"], a - b)
    with ModelClient(args.url, "Identity") as client:
        np.testing.assert_allclose(client.infer_batch(data=a)["data"], a)
    print("OK")


if __name__ == "__main__":
    main()
