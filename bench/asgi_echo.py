"""Bare-ASGI KServe echo: the HTTP ceiling (uvicorn + httptools + uvloop, orjson, no pytriton engine).

It answers POST /v2/models/<m>/infer by echoing every input as the output of the same position
(OUTPUT_1 for INPUT_1), in JSON or in the binary extension (Inference-Header-Content-Length), doing
the same orjson decode/encode of the KServe JSON body a real server does but no tensor conversion,
batching or model call. GET /v2/health/ready and /v2/models/<m>/ready answer 200.

    .venv/bin/python bench/asgi_echo.py --http-port 31000                     # on uvicorn: the ceiling
    .venv/bin/python bench/asgi_echo.py --http-port 31000 --server pytriton   # on pytriton's HTTP server

The second form serves the same app on this project's own ASGI server, which shows what the HTTP
layer alone costs there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any, Callable, Dict, List, Tuple, Union

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import orjson

HEADER = b"inference-header-content-length"
JSON_HEADERS = [(b"content-type", b"application/json")]
SMALL_BODY = 64 * 1024
Headers = List[Tuple[bytes, bytes]]
Chunk = Union[bytes, memoryview]


async def _body(receive: Callable[[], Any]) -> Union[bytes, bytearray]:
    """The whole request body (no copy when it came in one message)."""
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    buffer = bytearray(body)
    while message.get("more_body", False):
        message = await receive()
        buffer += message.get("body", b"")
    return buffer


def _out_name(name: str) -> str:
    """INPUT_n -> OUTPUT_n."""
    return name.replace("INPUT", "OUTPUT", 1)


def _infer(model: str, headers: Dict[bytes, bytes], body: Union[bytes, bytearray]) -> Tuple[Headers, List[Chunk]]:
    """The response headers and body chunks echoing the request."""
    header_len = headers.get(HEADER)
    if header_len is None:
        request = orjson.loads(body)
        outputs = [
            {"name": _out_name(i["name"]), "datatype": i["datatype"], "shape": i["shape"], "data": i["data"]}
            for i in request["inputs"]
        ]
        doc = {"model_name": model, "model_version": "1", "outputs": outputs}
        return JSON_HEADERS, [orjson.dumps(doc)]
    size = int(header_len)
    view = memoryview(body)
    request = orjson.loads(view[:size])
    offset = size
    outputs: List[Dict[str, Any]] = []
    blobs: List[Chunk] = []
    for i in request["inputs"]:
        n = int(i.get("parameters", {}).get("binary_data_size", 0))
        blobs.append(view[offset : offset + n])
        offset += n
        outputs.append(
            {
                "name": _out_name(i["name"]),
                "datatype": i["datatype"],
                "shape": i["shape"],
                "parameters": {"binary_data_size": n},
            }
        )
    head = orjson.dumps({"model_name": model, "model_version": "1", "outputs": outputs})
    response_headers = [
        (b"content-type", b"application/octet-stream"),
        (HEADER, str(len(head)).encode()),
    ]
    if sum(len(blob) for blob in blobs) < SMALL_BODY:
        return response_headers, [b"".join([head, *blobs])]
    return response_headers, [head, *blobs]  # large tensors: no join, one write each


async def app(scope: Dict[str, Any], receive: Callable[[], Any], send: Callable[[Any], Any]) -> None:
    """The raw ASGI application."""
    if scope["type"] != "http":
        return
    parts = scope["path"].strip("/").split("/")
    status, headers, chunks = 404, JSON_HEADERS, [b'{"error":"not found"}']
    if scope["method"] == "POST" and len(parts) >= 4 and parts[1] == "models" and parts[-1] == "infer":
        raw = await _body(receive)
        try:
            headers, chunks = _infer(parts[2], dict(scope["headers"]), raw)
            status = 200
        except (ValueError, KeyError, TypeError) as error:
            status, chunks = 400, [orjson.dumps({"error": str(error)})]
    elif scope["method"] == "GET" and (parts[1:] == ["health", "ready"] or parts[-1] == "ready"):
        status, chunks = 200, [b""]
    length = sum(len(chunk) for chunk in chunks)
    headers = [*headers, (b"content-length", str(length).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    for index, chunk in enumerate(chunks):
        await send({"type": "http.response.body", "body": chunk, "more_body": index < len(chunks) - 1})


def main() -> None:
    """Serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("BENCH_HTTP_PORT", "0")))
    parser.add_argument("--grpc-port", type=int, default=0, help="ignored")
    parser.add_argument("--metrics-port", type=int, default=0, help="ignored")
    parser.add_argument(
        "--server", choices=("uvicorn", "pytriton"), default=os.environ.get("BENCH_ASGI_SERVER", "uvicorn")
    )
    args = parser.parse_args()
    if args.server == "pytriton":
        import uvloop

        uvloop.run(_serve_on_pytriton(args.http_port))
        return
    import uvicorn

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.http_port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        ws="none",
        server_header=False,
        date_header=False,
        access_log=False,
        log_level="warning",
    )


async def _serve_on_pytriton(port: int) -> None:
    """Serve the app on pytriton's own HTTP server until SIGTERM/SIGINT."""
    from pytriton.transport.http.server import AsgiServer
    from pytriton.transport.sockets import bind_socket

    server = AsgiServer(app, bind_socket("127.0.0.1", port))
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop()


if __name__ == "__main__":
    main()
