"""Call AddSubOptional without and with its optional inputs, and check the answers."""

import argparse

import numpy as np

from pytriton.client import ModelClient


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="localhost", help="http://host:port or grpc://host:port")
    args = parser.parse_args()

    a = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    b = np.ones((2, 3), dtype=np.float32)
    offset = np.array([[100], [200]], dtype=np.float32)  # one offset per sample
    scale = np.full((2, 1), 3, dtype=np.float32)  # one scale for the whole request

    with ModelClient(args.url, "AddSubOptional") as client:
        plain = client.infer_batch(a=a, b=b)  # offset=0 and scale=1 filled in by the server
        scaled = client.infer_batch(a=a, b=b, offset=offset, scale=scale)

    np.testing.assert_allclose(plain["add"], a + b)
    np.testing.assert_allclose(plain["sub"], a - b)
    np.testing.assert_allclose(scaled["add"], (a + b) * 3 + offset)
    np.testing.assert_allclose(scaled["sub"], (a - b) * 3 + offset)
    print("defaults:", plain["add"].tolist(), plain["sub"].tolist())
    print("scale=3, offset=[100, 200]:", scaled["add"].tolist(), scaled["sub"].tolist())
    print("OK")


if __name__ == "__main__":
    main()
