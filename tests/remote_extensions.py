"""A RemoteTriton in a process of its own, for the tests of what it adds to a server: custom metrics and routes.

    python -m tests.remote_extensions URL NAME MARKS

It defines `test_remote_outside`, a counter made outside any callable and incremented once before binding;
binds NAME_composed (which calls the server's `doubled`), then NAME (tests.test_custom_metrics.Counting,
families `test_remote_*`), and adds routes under /NAME/
(below); prints "BOUND"; then answers one command per line of its standard input, and exits at its end:
    bump     increments test_remote_outside (outside a callable); prints DONE
    close    closes the RemoteTriton; prints CLOSED
Its route handlers leave files in the directory MARKS: `<route>-entered`, `<route>-cancelled`. The server has the
models `doubled`, `same` (an identity) and `held` (tests/test_remote_triton_extensions.py).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys
import time
from typing import Any, Dict, List

import numpy as np

from pytriton.compose import ModelCallError, call_model, call_model_async
from pytriton.metrics import MetricFamily
from pytriton.model_config import ModelConfig, Tensor
from pytriton.remote_triton import RemoteTriton
from pytriton.routes import RouteRequest, RouteResponse
from tests.test_custom_metrics import INPUTS, OUTPUTS, Counting

MARKS = pathlib.Path(sys.argv[3]) if len(sys.argv) > 3 else pathlib.Path(".")


def _mark(name: str) -> None:
    (MARKS / name).touch()


async def echo(request: RouteRequest) -> Dict[str, Any]:
    """What the route got, and where it ran."""
    return {
        "name": request.path_params["name"],
        "query": request.query,
        "body": request.json(),
        "header": request.headers.get("x-test"),
        "pid": os.getpid(),
    }


def doubled(request: RouteRequest) -> RouteResponse:
    """The server's `doubled` model, called from a sync handler; its answer as text, status 201."""
    outputs = call_model("doubled", {"x": np.array(request.json()["x"], np.float32)})
    return RouteResponse(str(outputs["x"].tolist()).encode(), status=201, media_type="text/plain")


async def doubled_async(request: RouteRequest) -> Dict[str, Any]:
    """The same from an async handler, and the model bound by this process too."""
    outputs = await call_model_async("doubled", {"x": np.array(request.json()["x"], np.float32)})
    counted = await call_model_async(sys.argv[2], {"in": np.array([[1.0]], np.float32)})
    return {"x": outputs["x"], "counted": counted["out"]}


def wrong_dtype(request: RouteRequest) -> Any:
    """A model call the server refuses (FP64 for an FP32 input): 400 with its message."""
    return call_model("doubled", {"x": np.zeros(1, np.float64)})


def failing(request: RouteRequest) -> Any:
    """A handler that raises: 500."""
    raise ValueError("no luck")


async def cancelled_itself(request: RouteRequest) -> Any:
    """A handler whose own await was cancelled (not its client's leaving): 500."""
    raise asyncio.CancelledError()


def text(request: RouteRequest) -> RouteResponse:
    """A str body: sent as UTF-8."""
    return RouteResponse("é", media_type="text/plain")


async def held(request: RouteRequest) -> Any:
    """Waits on the server's `held` model until its client leaves (then it is cancelled)."""
    _mark("held-entered")
    try:
        return await call_model_async("held", {"x": np.array([1.0], np.float32)})
    except asyncio.CancelledError:
        _mark("held-cancelled")
        raise


def held_sync(request: RouteRequest) -> Any:
    """Calls the server's `held` model; once its client left, that call and the next fail (marked with status)."""
    _mark("held_sync-entered")
    statuses = []
    for _ in range(2):
        try:
            call_model("held", {"x": np.array([1.0], np.float32)})
        except ModelCallError as error:
            statuses.append(error.status.name)
    _mark("held_sync-" + "-".join(statuses))
    return {}


_MIB = 1 << 18  # float32 values: 1 MiB


def _big_input(mib: int, seed: int) -> np.ndarray:
    sent = np.full(mib * _MIB, seed, np.float32)
    sent[::7] = -seed  # not constant: a stale region would show
    return sent


def _checked(model: str, sent: np.ndarray, got: np.ndarray) -> List[bool]:
    """Whether `got` is what `model` answers to `sent`, and whether it was read in place (not copied out)."""
    return [bool(np.array_equal(got, sent if model == "same" else sent * 2)), not got.flags.owndata]


def big(request: RouteRequest) -> Dict[str, Any]:
    """`calls` calls of `mib` MiB to `doubled` and `same` in turn: for each, whether right and whether in place."""
    asked = request.json()
    checked: List[List[bool]] = []
    for step in range(asked["calls"]):
        model = "same" if step % 2 else "doubled"
        sent = _big_input(asked["mib"], step)
        checked.append(_checked(model, sent, call_model(model, {"x": sent})["x"]))
    return {"checked": checked}


async def big_async(request: RouteRequest) -> Dict[str, Any]:
    """The same from an async handler, the calls of each step at once."""
    asked = request.json()
    checked: List[List[bool]] = []
    for step in range(0, asked["calls"], 2):
        sent = _big_input(asked["mib"], step)
        answers = await asyncio.gather(*(call_model_async(model, {"x": sent}) for model in ("doubled", "same")))
        checked.extend(_checked(model, sent, got["x"]) for model, got in zip(("doubled", "same"), answers))
    return {"checked": checked}


def held_big(request: RouteRequest) -> Any:
    """Calls the server's `held` model with 4 MiB (and waits with it)."""
    _mark("held_big-entered")
    return call_model("held", {"x": _big_input(4, 1)})


def hang(request: RouteRequest) -> Any:
    """Never answers while its process lives."""
    _mark("hang-entered")
    while True:
        time.sleep(1)


def composed(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """A callable that calls the server's `doubled` model (bound before another model of this process)."""
    return [{"x": call_model("doubled", {"x": request["x"]})["x"]} for request in requests]


def main() -> None:
    outside = MetricFamily("test_remote_outside", "Counted outside any callable", MetricFamily.COUNTER).Metric()
    outside.increment()
    name = sys.argv[2]
    remote = RemoteTriton(url=sys.argv[1])
    remote.connect()
    io = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    remote.bind(f"{name}_composed", composed, inputs=io, outputs=io, config=ModelConfig(batching=False))
    remote.bind(name, Counting("test_remote"), inputs=INPUTS, outputs=OUTPUTS, config=ModelConfig(max_batch_size=4))
    remote.add_route(f"/{name}/echo/{{name}}", echo, methods=["POST", "PUT"])
    remote.add_route(f"/{name}/doubled", doubled)
    remote.add_route(f"/{name}/doubled_async", doubled_async)
    remote.add_route(f"/{name}/wrong_dtype", wrong_dtype)
    remote.add_route(f"/{name}/failing", failing)
    remote.add_route(f"/{name}/cancelled_itself", cancelled_itself)
    remote.add_route(f"/{name}/text", text)
    remote.add_route(f"/{name}/held", held)
    remote.add_route(f"/{name}/held_sync", held_sync)
    remote.add_route(f"/{name}/hang", hang)
    remote.add_route(f"/{name}/big", big)
    remote.add_route(f"/{name}/big_async", big_async)
    remote.add_route(f"/{name}/held_big", held_big)
    print("BOUND", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "bump":
            outside.increment()
            print("DONE", flush=True)
        elif command == "close":
            remote.stop()
            print("CLOSED", flush=True)
    remote.stop()


if __name__ == "__main__":
    main()
