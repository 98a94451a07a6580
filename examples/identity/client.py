"""Send a batch to the Identity model and check that it comes back unchanged."""

import argparse

import numpy as np

from pytriton.client import ModelClient


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="localhost", help="http://host:port or grpc://host:port")
    args = parser.parse_args()

    data = np.random.default_rng(0).random((4, 3), dtype=np.float32)
    # object arrays keep arbitrary bytes (np.bytes_ would strip trailing b"\x00")
    text = np.array([[b"a", b"bc"], [b"\x00\xff", b""], [b"pytriton", b"x"], [b"1", b"22\x00"]], dtype=object)

    with ModelClient(args.url, "Identity") as client:
        result = client.infer_batch(data=data, text=text)

    np.testing.assert_array_equal(result["data_out"], data)
    np.testing.assert_array_equal(result["text_out"], text)
    print("data_out:", result["data_out"].tolist())
    print("text_out:", result["text_out"].tolist())
    print("OK")


if __name__ == "__main__":
    main()
