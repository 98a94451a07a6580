"""One keep-alive HTTP/1.1 connection that sends a request at a time and reads its whole answer.

For the benches that measure a server's CPU per request (`cpu_ab`, `sequences`): a client this plain costs little
and adds no concurrency of its own, so the server's CPU over N requests is N requests' worth.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Dict, Optional

import numpy as np


def infer_message(model: str, parameters: Optional[Dict[str, Any]] = None) -> bytes:
    """A whole binary-tensor infer request for FP32 INPUT_1 [1, 16] -> OUTPUT_1, with request `parameters`."""
    head: Dict[str, Any] = {
        "inputs": [{"name": "INPUT_1", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}],
        "outputs": [{"name": "OUTPUT_1", "parameters": {"binary_data": True}}],
    }
    if parameters:
        head["parameters"] = parameters
    json_part = json.dumps(head, separators=(",", ":")).encode()
    body = json_part + np.arange(16, dtype=np.float32).tobytes()
    return (
        b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: %d\r\n"
        b"Content-Length: %d\r\n\r\n" % (model.encode(), len(json_part), len(body))
    ) + body


class KeepAliveClient:
    """One connection to 127.0.0.1:port, made once the server's `model` is ready (SystemExit past `timeout_s`)."""

    def __init__(self, port: int, model: str, timeout_s: float = 60.0, poll_s: float = 0.05) -> None:
        """Connect once the model is ready, asking every `poll_s` (each ask is the server's work too)."""
        deadline = time.monotonic() + timeout_s
        ready = b"GET /v2/models/%s/ready HTTP/1.1\r\nHost: x\r\n\r\n" % model.encode()
        while True:
            try:
                self.sock = socket.create_connection(("127.0.0.1", port))
                if self.send(ready, check=False):
                    return
                self.sock.close()
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"model '{model}' on port {port} was not ready within {timeout_s:g} s")
            time.sleep(poll_s)

    def send(self, message: bytes, check: bool = True) -> bool:
        """Send a request and read its whole answer; whether it was a 200 (anything else raises when `check`)."""
        self.sock.sendall(message)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise OSError("the server closed the connection")
            got += chunk
        head, rest = got.split(b"\r\n\r\n", 1)
        length = int(
            next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")).split(b":")[1]
        )
        while len(rest) < length:
            rest += self.sock.recv(65536)
        ok = head.startswith(b"HTTP/1.1 200")
        if check and not ok:
            raise RuntimeError((head + b"\n" + rest).decode(errors="replace"))
        return ok
