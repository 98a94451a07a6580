"""Send parameters and headers with a request and check that the model used them."""

import argparse

import numpy as np

from pytriton.client import ModelClient


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="localhost", help="http://host:port or grpc://host:port")
    args = parser.parse_args()

    x = np.array([[1, 2, 3]], dtype=np.float32)
    with ModelClient(args.url, "ScaleShift") as client:
        plain = client.infer_batch(x=x)
        result = client.infer_batch(
            x=x,
            parameters={"multiplier": 10},
            headers={"x-offset": "0.5", "unrelated-header": "not forwarded"},
        )

    np.testing.assert_allclose(plain["y"], x)
    np.testing.assert_allclose(result["y"], x * 10 + 0.5)
    print("y:", result["y"].tolist())
    print("OK")


if __name__ == "__main__":
    main()
