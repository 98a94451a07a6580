"""The composition bench's Triton server: the same pipeline as Python-backend models, composed with Triton's BLS.

    /tmp/nvidia-pytriton/run python bench/composition_triton.py --http-port 31000   # cwd: not the repo root

Run by NVIDIA's PyTriton's interpreter (never this project's): it starts nvidia-pytriton's bundled tritonserver
with a local model store and no bound callable, writes hand-written Python-backend models into that store
(``model.py`` on ``triton_python_backend_utils``, ``backend: "python"``), loads them through the repository API
with the server's access token, prints ``ready`` and serves until SIGTERM. Every model is FP32 ``x`` [-1] -> ``y``,
max_batch_size 64, ``dynamic_batching {}`` and one CPU instance, as `bench/composition_server.py` binds ours:

* ``pre``: ``y = x * 2 + 1`` on the batch's rows stacked, then split again per request;
* ``identity``: ``y = x``; ``identity_async``: the same with an ``async def execute``;
* ``pipeline``: the preprocessing step, then ``identity`` called with BLS (``InferenceRequest.exec()``): the whole
  batch as one inner request;
* ``pipeline_async``: the same from an ``async def execute`` (``await InferenceRequest.async_exec()``);
* ``sync_loop``, ``async_loop``: ``exec()`` and ``await async_exec()`` to the model named by the request's
  ``target`` parameter, 2,000 times one after the other: the microseconds per BLS call, without a client.

nvidia-pytriton's own proxy models are Python-backend models of this kind: their config.pbtxt carries no
EXECUTION_ENV_PATH; the stub it copies into the server's backends/python directory is the one built for the
running interpreter's Python version, linked to its libpython, and tritonserver runs with that interpreter's
``bin`` first on PATH: a stub imports from the interpreter's environment (numpy here) with nothing to set.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys
import threading
import urllib.request
from typing import Any, Dict

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

_HEAD = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _stacked(requests):
    arrays = [pb_utils.get_input_tensor_by_name(request, "x").as_numpy() for request in requests]
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays), [len(array) for array in arrays]


def _answers(y, rows):
    parts = [y] if len(rows) == 1 else np.split(y, np.cumsum(rows)[:-1])
    return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("y", part)]) for part in parts]


def _inner(model_name, x):
    return pb_utils.InferenceRequest(
        model_name=model_name, requested_output_names=["y"], inputs=[pb_utils.Tensor("x", x)]
    )


def _output(response):
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, "y").as_numpy()


LOOP_CALLS = 2000
_ONE_ROW = np.zeros((1, 16), np.float32)
"""

_BODIES: Dict[str, str] = {
    "pre": """
    def execute(self, requests):
        x, rows = _stacked(requests)
        return _answers(x * 2 + 1, rows)
""",
    "identity": """
    def execute(self, requests):
        return _answers(*_stacked(requests))
""",
    "identity_async": """
    async def execute(self, requests):
        return _answers(*_stacked(requests))
""",
    "pipeline": """
    def execute(self, requests):
        x, rows = _stacked(requests)
        return _answers(_output(_inner("identity", x * 2 + 1).exec()), rows)
""",
    "pipeline_async": """
    async def execute(self, requests):
        x, rows = _stacked(requests)
        return _answers(_output(await _inner("identity", x * 2 + 1).async_exec()), rows)
""",
    "sync_loop": """
    def execute(self, requests):
        target = json.loads(requests[0].parameters())["target"]
        started = time.perf_counter()
        for _ in range(LOOP_CALLS):
            _output(_inner(target, _ONE_ROW).exec())
        per_call = (time.perf_counter() - started) / LOOP_CALLS * 1e6
        return _answers(np.full((len(requests), 1), per_call, np.float32), [1] * len(requests))
""",
    "async_loop": """
    async def execute(self, requests):
        target = json.loads(requests[0].parameters())["target"]
        started = time.perf_counter()
        for _ in range(LOOP_CALLS):
            _output(await _inner(target, _ONE_ROW).async_exec())
        per_call = (time.perf_counter() - started) / LOOP_CALLS * 1e6
        return _answers(np.full((len(requests), 1), per_call, np.float32), [1] * len(requests))
""",
}

_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 64
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

# Callees first: a model's BLS target is loaded before it.
MODELS = ("identity", "identity_async", "pre", "pipeline", "pipeline_async", "sync_loop", "async_loop")


def write_model(repository: pathlib.Path, name: str) -> None:
    """One Python-backend model directory: config.pbtxt and 1/model.py."""
    version = repository / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (repository / name / "config.pbtxt").write_text(_CONFIG.format(name=name))
    (version / "model.py").write_text(_HEAD + "\n\nclass TritonPythonModel:\n" + _BODIES[name])


def load_model(http_port: int, name: str, token: str) -> None:
    """POST the repository API's load for `name`, with the access token its restricted API asks for."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/v2/repository/models/{name}/load",
        data=json.dumps({}).encode(),
        headers={"triton-access-token": token, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        answer.read()


def main() -> None:
    """Serve until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    args = parser.parse_args()
    from pytriton.triton import Triton, TritonConfig, TritonLifecyclePolicy  # NVIDIA's pytriton, not ours

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    config = TritonConfig(http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port)
    with Triton(config=config, triton_lifecycle_policy=TritonLifecyclePolicy(local_model_store=True)) as started:
        triton: Any = started  # NVIDIA's Triton: its private server config names the model store
        triton.run()
        repository = pathlib.Path(triton._triton_server_config["model_repository"])
        for name in MODELS:
            write_model(repository, name)
            load_model(args.http_port, name, triton.get_access_token())
        print("ready", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
