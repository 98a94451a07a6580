"""Send concurrent requests to the Tokenize model; check the answers and that both processes served some."""

import argparse

import numpy as np

from pytriton.client import FuturesModelClient


def expected_score(text):
    return sum(sum(ord(char) for char in word) % 97 for word in text.split())


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="localhost", help="http://host:port or grpc://host:port")
    args = parser.parse_args()

    texts = [" ".join(f"word{index}-{repeat}" for repeat in range(2000)) for index in range(32)]
    with FuturesModelClient(args.url, "Tokenize", max_workers=8) as client:
        futures = [client.infer_sample(text=np.array([text.encode()])) for text in texts]
        results = [future.result() for future in futures]

    for text, result in zip(texts, results):
        if int(result["score"][0]) != expected_score(text):
            raise SystemExit(f"wrong score for one text: {int(result['score'][0])}")
    pids = {int(result["pid"][0]) for result in results}
    print("requests served by processes:", sorted(pids))
    if len(pids) != 2:
        raise SystemExit(f"expected both instance processes to serve requests, got {sorted(pids)}")
    print("OK")


if __name__ == "__main__":
    main()
