"""What the tests of inner calls (tests/test_compose*.py) share: a held model's queue, a request given up on."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, TypeVar

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from pytriton.triton import Triton
from tests.conftest import grpc_url
from tests.waiting import wait_until

Answer = TypeVar("Answer")


def running(triton: Triton, model: str) -> bool:
    """Whether one of `model`'s batches runs now."""
    return bool(triton._runtime.engine.model(model).scheduler.open_requests[1])


def cancelled_with_its_request(triton: Triton, outer: str) -> Tuple[str, ...]:
    """Why an inner call of `outer`'s lone request may fail when the request's client gives up on it.

    In the server's own loop that request runs in the task that serves it, and the task's end cancels the call.
    Forwarded by a frontend process, it runs in a batch of the scheduler's: the call is cancelled once no request
    of that batch has a client left. With one frontend process the hub serves some connections itself: either.
    """
    ended = f"the request to model '{outer}' that made the call has ended"
    cancelled = f"every request of the batch of model '{outer}' that made the call was cancelled"
    pool = triton._runtime._pool
    if pool is None:
        return (ended,)
    return (cancelled, ended) if pool._here else (cancelled,)


def pending(triton: Triton, model: str) -> int:
    """How many requests wait in `model`'s queue."""
    return int(triton._runtime.engine.model(model).scheduler.pending)


def queued_behind_a_held_batch(
    triton: Triton,
    model: str,
    hold: Callable[[], None],
    release: Callable[[], None],
    block: Callable[[], Any],
    calls: Mapping[str, Callable[[], Answer]],
) -> Dict[str, Answer]:
    """Runs `calls` at once while `model`'s only instance is held, so that they join its queue, then lets it go.

    `hold()` makes the model wait, `block()` (in a thread of its own) sends it the request it holds on; once all
    the calls wait in the queue, `release()` lets the model go. Returns each call's answer by its key.
    """
    hold()
    blocker = threading.Thread(target=block)
    blocker.start()
    wait_until(lambda: running(triton, model), f"{model}'s held batch")
    answers: Dict[str, Answer] = {}
    threads = [threading.Thread(target=lambda key=key: answers.__setitem__(key, calls[key]())) for key in calls]
    for thread in threads:
        thread.start()
    wait_until(lambda: pending(triton, model) == len(calls), f"{len(calls)} requests in {model}'s queue")
    release()
    for thread in [*threads, blocker]:
        thread.join(10)
    return answers


def given_up_over_grpc(
    triton: Triton, model: str, reached: Callable[[], bool], parameters: Optional[Dict[str, Any]] = None
) -> None:
    """Sends `model` x = [[1.0]] over gRPC and gives up on it (the client cancels the call) once `reached()`: its
    inner call is made. Asserts the client saw the call cancelled.

    Given up at a moment the test waits for, not after a client deadline: on a loaded machine a deadline of
    0.5 s could pass before the outer request made its inner call, and the test then waited for nothing.
    """
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    try:
        given = grpcclient.InferInput("x", [1, 1], "FP32")
        given.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
        outcome: queue.Queue[Optional[InferenceServerException]] = queue.Queue()
        call = client.async_infer(model, [given], lambda result, error: outcome.put(error), parameters=parameters)
        wait_until(reached, f"{model}'s inner call")
        assert outcome.empty(), outcome.get()  # it is still waiting on its inner call
        call.cancel()
        error = outcome.get(timeout=10)
        assert error is not None and error.status() == "StatusCode.CANCELLED", error
    finally:
        client.close()
