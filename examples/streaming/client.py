"""Read the WordStream model's responses as they come, over gRPC or over HTTP (server-sent events)."""

import argparse
import json
import urllib.request

import numpy as np

from pytriton.client import DecoupledModelClient

TEXT = "streaming responses arrive one by one"


def stream_grpc(url):
    """DecoupledModelClient (gRPC only): infer_sample yields one result per response."""
    words = []
    with DecoupledModelClient(url, "WordStream") as client:
        for result in client.infer_sample(text=np.array([TEXT.encode()], dtype=object)):
            print("gRPC:", result["index"].tolist(), result["word"].tolist())
            words.append(result["word"][0].decode())
    return words


def stream_http(url):
    """POST /v2/models/<model>/generate_stream: one `data: {json}` event per response."""
    request = urllib.request.Request(
        f"{url}/v2/models/WordStream/generate_stream",
        data=json.dumps({"text": TEXT}).encode(),
        headers={"Content-Type": "application/json"},
    )
    words = []
    with urllib.request.urlopen(request, timeout=30) as response:
        for line in response:
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[len(b"data: ") :])
            if "error" in event:
                raise SystemExit(f"stream failed: {event['error']}")
            print("HTTP:", event)
            words.append(event["word"])
    return words


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--url",
        default="grpc://localhost:8001",
        help="grpc://host:port (ModelStreamInfer) or http://host:port (generate_stream, server-sent events)",
    )
    args = parser.parse_args()

    protocol, stream = ("HTTP", stream_http) if args.url.startswith("http") else ("gRPC", stream_grpc)
    words = stream(args.url)
    expected = TEXT.split()
    if words != expected:
        raise SystemExit(f"{protocol}: expected {expected}, got {words}")
    print("OK")


if __name__ == "__main__":
    main()
