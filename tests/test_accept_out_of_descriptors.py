"""A server out of descriptors while connections wait to be accepted: it says so once, serves on, accepts them later."""

from __future__ import annotations

import pathlib
import socket
import subprocess
import textwrap
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
import tritonclient.http as httpclient

from pytriton.model_config import ModelConfig, Tensor
from pytriton.remote_triton import RemoteTriton
from pytriton.runtime.attach import attach_address
from tests.server_process import start_script, stop_script

IO = {
    "inputs": [Tensor(name="x", dtype=np.float32, shape=(-1,))],
    "outputs": [Tensor(name="y", dtype=np.float32, shape=(-1,))],
}

# A server whose `starve` model takes every descriptor its process may open, and whose `feed` model gives them back.
STARVABLE_SERVER = textwrap.dedent(
    """
    import logging, os
    import numpy as np
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    held = []

    def echo(requests):
        return [{"y": request["x"]} for request in requests]

    def starve(requests):
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        return [{"y": np.array([len(held)], np.float32)} for _ in requests]

    def feed(requests):
        while held:
            os.close(held.pop())
        return [{"y": np.zeros(1, np.float32)} for _ in requests]

    if __name__ == "__main__":
        handler = logging.FileHandler(LOG_FILE)
        logging.getLogger("pytriton").addHandler(handler)
        logging.getLogger("pytriton").setLevel(logging.INFO)
        io = {
            "inputs": [Tensor(name="x", dtype=np.float32, shape=(-1,))],
            "outputs": [Tensor(name="y", dtype=np.float32, shape=(-1,))],
            "config": ModelConfig(batching=False),
        }
        config = TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)
        with Triton(config=config, frontends=FRONTENDS) as triton:
            for name, function in (("echo", echo), ("starve", starve), ("feed", feed)):
                triton.bind(name, function, **io)
            triton.run()
            print(triton.http_port, flush=True)
            triton.serve()
    """
)


def _start(tmp_path: pathlib.Path, frontends: int) -> Tuple[subprocess.Popen[str], int, pathlib.Path]:
    """Start the starvable server; the process, its HTTP port and its log file."""
    log = tmp_path / "server.log"
    script = STARVABLE_SERVER.replace("LOG_FILE", repr(str(log))).replace("FRONTENDS", str(frontends or None))
    server = start_script(tmp_path, script)
    assert server.stdout is not None
    lines = []
    for line in server.stdout:
        if line.strip().isdigit():
            return server, int(line), log
        lines.append(line)
    stop_script(server)
    raise AssertionError(f"the server did not start: {lines}")


def _y(client: httpclient.InferenceServerClient, model: str, x: np.ndarray) -> List[float]:
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [float(value) for value in client.infer(model, [tensor]).as_numpy("y")]


def _tripled(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"y": request["x"] * 3} for request in requests]


@pytest.mark.parametrize("frontends", [0, 2], ids=["one process", "frontend processes"])
def test_a_remote_triton_connecting_to_a_server_out_of_descriptors_waits_and_attaches(
    tmp_path: pathlib.Path, frontends: int
) -> None:
    """The attach socket's reader only logged a failed accept: the socket stayed readable, so the loop called it
    again at once, for ever while no descriptor was free (a core at 100% and tens of thousands of log lines a
    second). Now accepting pauses, is logged once, and the connection waiting meanwhile is accepted later."""
    server, port, log = _start(tmp_path, frontends)
    try:
        # One connection throughout: while the server has no descriptor left it could not accept another.
        with httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30) as client:
            assert _y(client, "starve", np.zeros(1, np.float32))[0] > 0
            waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            waiting.connect(attach_address(port))  # into the backlog: the server cannot accept it now
            try:
                for value in (1.0, 2.0, 3.0):  # the server's loop turns, and serves
                    assert _y(client, "echo", np.array([value], np.float32)) == [value]
                _y(client, "feed", np.zeros(1, np.float32))
                with RemoteTriton(url=f"http://127.0.0.1:{port}") as remote:
                    remote.bind("tripled", _tripled, **IO, config=ModelConfig(batching=False))
                    assert _y(client, "tripled", np.array([2.0], np.float32)) == [6.0]
            finally:
                waiting.close()
    finally:
        stop_script(server)
    written = log.read_text()
    failures = [line for line in written.splitlines() if "Too many open files" in line]
    assert len(failures) == 1 and "cannot accept RemoteTriton connections for now" in failures[0], failures[:3]
    assert "accepting RemoteTriton connections again" in written, written
