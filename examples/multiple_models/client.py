"""Call each of the three models of the server and check the answers."""

import argparse

import numpy as np

from pytriton.client import ModelClient


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="localhost", help="http://host:port or grpc://host:port")
    args = parser.parse_args()

    a = np.array([[1.5, 2.5]], dtype=np.float32)
    b = np.array([[0.5, 0.5]], dtype=np.float32)
    with ModelClient(args.url, "AddSub") as client:
        result = client.infer_batch(a=a, b=b)
    np.testing.assert_allclose(result["add"], [[2.0, 3.0]])
    np.testing.assert_allclose(result["sub"], [[1.0, 2.0]])
    print("AddSub:", result["add"].tolist(), result["sub"].tolist())

    text = np.array([[b"hello"], [b"triton"]], dtype=object)
    with ModelClient(args.url, "Upper") as client:
        result = client.infer_batch(text=text)
    np.testing.assert_array_equal(result["upper"], np.array([[b"HELLO"], [b"TRITON"]], dtype=object))
    print("Upper:", result["upper"].tolist())

    with ModelClient(args.url, "Power") as client:
        if client.is_batching_supported:
            raise SystemExit("Power should not batch")
        result = client.infer_sample(base=np.array([1, 2, 3], dtype=np.int64), exponent=np.array([3], dtype=np.int64))
    np.testing.assert_array_equal(result["power"], [1, 8, 27])
    print("Power:", result["power"].tolist())
    print("OK")


if __name__ == "__main__":
    main()
