"""What the tests of inner calls (tests/test_compose*.py) share: a held model's queue, a request given up on."""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Mapping, Optional, TypeVar

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from pytriton.triton import Triton
from tests.conftest import grpc_url
from tests.waiting import wait_until

Answer = TypeVar("Answer")


def running(triton: Triton, model: str) -> bool:
    """Whether one of `model`'s batches runs now."""
    return bool(triton._runtime.engine.model(model).scheduler.open_requests[1])


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


def given_up_over_grpc(triton: Triton, model: str, parameters: Optional[Dict[str, Any]] = None) -> None:
    """Sends `model` x = [[1.0]] over gRPC with a client deadline of 0.5 s, and asserts the client gave up."""
    client = grpcclient.InferenceServerClient(grpc_url(triton))
    given = grpcclient.InferInput("x", [1, 1], "FP32")
    given.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
    with pytest.raises(InferenceServerException) as deadline:
        client.infer(model, [given], parameters=parameters, client_timeout=0.5)
    assert deadline.value.status() == "StatusCode.DEADLINE_EXCEEDED"
