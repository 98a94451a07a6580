"""Send concurrent requests with AsyncioModelClient and check the answers."""

import argparse
import asyncio

import numpy as np

from pytriton.client import AsyncioModelClient


async def run(url):
    async with AsyncioModelClient(url, "AsyncDouble") as client:
        inputs = [np.arange(n, n + 3, dtype=np.int32) for n in range(8)]
        results = await asyncio.gather(*(client.infer_sample(x=x) for x in inputs))
    for x, result in zip(inputs, results):
        np.testing.assert_array_equal(result["doubled"], x * 2)
    print("doubled:", [result["doubled"].tolist() for result in results])
    print("requests per model call:", [int(result["batch_size"][0]) for result in results])


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="localhost", help="http://host:port or grpc://host:port")
    args = parser.parse_args()
    asyncio.run(run(args.url))
    print("OK")


if __name__ == "__main__":
    main()
