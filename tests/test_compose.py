"""A callable calling another bound model in-process (pytriton/compose.py), through that model's queue."""

from __future__ import annotations

import functools
import gc
import logging
import os
import signal
import threading
from typing import Any, Dict, List, Optional, Set

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pytriton.compose import ModelCallError, call_model, call_model_async, stream_model
from pytriton.decorators import batch
from pytriton.instances import ProcessInstances
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.proxy.types import Request
from pytriton.triton import Triton
from tests.conftest import HTTP_AUTH, http_url, memfds_held, running_triton
from tests.inner_calls import (
    cancelled_with_its_request,
    given_up_over_grpc,
    pending,
    queued_behind_a_held_batch,
    running,
)
from tests.waiting import wait_until

INPUTS = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
OUTPUTS = [Tensor(name="y", dtype=np.float32, shape=(-1,))]


def _identity_batch_sizes(sizes: List[int], gate: threading.Event) -> Any:
    @batch
    def identity(x: np.ndarray) -> Dict[str, np.ndarray]:
        gate.wait(10)
        sizes.append(len(x))
        return {"y": x}

    return identity


@batch
def _sync_pipeline(x: np.ndarray) -> Dict[str, np.ndarray]:
    return call_model("identity", {"x": x + 1})


async def _async_pipeline(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    return [await call_model_async("identity", {"x": request["x"] * 2}) for request in requests]


def _infer(url: str, model: str, values: List[float]) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    array = np.array([values], dtype=np.float32)
    given = httpclient.InferInput("x", list(array.shape), "FP32")
    given.set_data_from_numpy(array)
    result = client.infer(model, [given])
    output: Optional[np.ndarray] = result.as_numpy("y")
    assert output is not None
    return output


def _bind_batching_identity(triton: Triton, sizes: List[int], gate: threading.Event) -> None:
    """`identity`, noting its batch sizes in `sizes` and waiting at `gate`; its batcher waits up to 200 ms."""
    triton.bind(
        "identity",
        _identity_batch_sizes(sizes, gate),
        INPUTS,
        OUTPUTS,
        config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=200_000)),
    )


def _bind_pipeline(triton: Triton, sizes: List[int], gate: threading.Event) -> None:
    _bind_batching_identity(triton, sizes, gate)
    config = ModelConfig(max_batch_size=8)
    triton.bind("sync_pipeline", _sync_pipeline, INPUTS, OUTPUTS, config=config)
    triton.bind("async_pipeline", _async_pipeline, INPUTS, OUTPUTS, config=config)


def test_sync_and_async_callables_call_a_model_whose_batcher_joins_them_with_client_requests() -> None:
    sizes: List[int] = []
    gate = threading.Event()
    with running_triton(lambda triton: _bind_pipeline(triton, sizes, gate)) as triton:
        url = http_url(triton)
        client = httpclient.InferenceServerClient(url)
        gate.set()
        assert _infer(url, "sync_pipeline", [1.0, 2.0]).tolist() == [[2.0, 3.0]]
        assert _infer(url, "async_pipeline", [1.0, 2.0]).tolist() == [[2.0, 4.0]]
        sizes.clear()
        # The identity model's first batch holds the instance at the gate; the three requests that come
        # meanwhile (a client's, and one from each pipeline) wait in its queue and run as one batch.
        results = queued_behind_a_held_batch(
            triton,
            "identity",
            gate.clear,
            gate.set,
            lambda: _infer(url, "identity", [0.0]),
            {m: functools.partial(_infer, url, m, [5.0]) for m in ("identity", "sync_pipeline", "async_pipeline")},
        )
        assert sizes == [1, 3]
        assert results["identity"].tolist() == [[5.0]]
        assert results["sync_pipeline"].tolist() == [[6.0]]
        assert results["async_pipeline"].tolist() == [[10.0]]
        statistics = client.get_inference_statistics("identity", headers=HTTP_AUTH)["model_stats"][0]
        counts = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in statistics["batch_stats"]}
        assert counts == {1: 3, 3: 1}  # two warm-up calls of the pipelines and the blocker; then one batch of 3
        assert int(statistics["inference_count"]) == 6


def _call_target(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """Calls the model its request's `target` parameter names (passing its parameters on), within `timeout_s`."""
    responses = []
    for request in requests:
        parameters = request.parameters or {}
        timeout = parameters.get("timeout_s")
        responses.append(
            call_model(
                str(parameters["target"]),
                {"x": request["x"]},
                parameters=parameters,
                timeout_s=None if timeout is None else float(timeout),
            )
        )
    return responses


def _fail(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    raise ValueError("the inner model refuses")


def _bind_errors(triton: Triton, gate: threading.Event) -> None:
    config = ModelConfig(max_batch_size=8)
    for name in ("caller", "ping", "pong"):
        triton.bind(name, _call_target, INPUTS, OUTPUTS, config=config)
    triton.bind("failing", _fail, INPUTS, OUTPUTS, config=config)
    triton.bind("gated", _identity_batch_sizes([], gate), INPUTS, OUTPUTS, config=config)


def _infer_with(url: str, model: str, parameters: Dict[str, Any], timeout_us: Optional[int] = None) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    given = httpclient.InferInput("x", [1, 1], "FP32")
    given.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
    output: Optional[np.ndarray] = client.infer(model, [given], parameters=parameters, timeout=timeout_us).as_numpy("y")
    assert output is not None
    return output


def test_inner_errors_cycles_and_deadlines_reach_the_client_with_the_inner_message() -> None:
    gate = threading.Event()
    with running_triton(lambda triton: _bind_errors(triton, gate)) as triton:
        url = http_url(triton)
        with pytest.raises(InferenceServerException) as failed:
            _infer_with(url, "caller", {"target": "failing"})
        assert failed.value.status() == "500"
        assert failed.value.message() == "ValueError: the inner model refuses"

        with pytest.raises(InferenceServerException) as unknown:
            _infer_with(url, "caller", {"target": "nowhere"})
        assert unknown.value.status() == "404"
        assert "nowhere" in str(unknown.value.message())

        with pytest.raises(InferenceServerException) as cycle:
            _infer_with(url, "ping", {"target": "pong"})  # pong calls the model its parameter names: pong again
        assert cycle.value.status() == "400"
        assert (
            cycle.value.message()
            == "model 'pong' is already on the call path (ping -> pong -> pong): a cycle is refused"
        )

        with pytest.raises(InferenceServerException) as expired:
            _infer_with(url, "caller", {"target": "gated", "timeout_s": 0.2})
        assert expired.value.status() == "503"
        assert expired.value.message() == "the deadline passed before model 'gated' answered"
        gate.set()
        assert _infer_with(url, "caller", {"target": "gated"}).tolist() == [[1.0]]


def test_calls_outside_a_callable_are_refused() -> None:
    with pytest.raises(ModelCallError, match="inside an inference callable"):
        call_model("identity", {"x": np.zeros((1, 1), np.float32)})


def _count_up(requests: List[Request]) -> Any:
    """A decoupled model: one response per step, x, x+1, x+2."""
    for step in range(3):
        yield [{"y": request["x"] + step} for request in requests]


def _sum_stream(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """Adds up the responses streamed by the decoupled model."""
    return [
        {
            "y": sum(
                (outputs["y"] for outputs in stream_model("count_up", {"x": request["x"]})),
                np.zeros((1, 1), np.float32),
            )
        }
        for request in requests
    ]


async def _sum_stream_async(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    responses = []
    for request in requests:
        total = np.zeros((1, 1), np.float32)
        async for outputs in stream_model("count_up", {"x": request["x"]}):
            total = total + outputs["y"]
        responses.append({"y": total})
    return responses


def _bind_streams(triton: Triton) -> None:
    config = ModelConfig(max_batch_size=8)
    triton.bind("count_up", _count_up, INPUTS, OUTPUTS, config=ModelConfig(max_batch_size=8, decoupled=True))
    triton.bind("sum_stream", _sum_stream, INPUTS, OUTPUTS, config=config)
    triton.bind("sum_stream_async", _sum_stream_async, INPUTS, OUTPUTS, config=config)
    triton.bind("caller", _call_target, INPUTS, OUTPUTS, config=config)


def test_callables_stream_a_decoupled_models_responses() -> None:
    with running_triton(_bind_streams) as triton:
        url = http_url(triton)
        assert _infer_with(url, "sum_stream", {}).tolist() == [[6.0]]  # 1 + 2 + 3
        assert _infer_with(url, "sum_stream_async", {}).tolist() == [[6.0]]
        with pytest.raises(InferenceServerException) as plain:
            _infer_with(url, "caller", {"target": "count_up"})
        assert plain.value.message() == "model 'count_up' is decoupled: stream its responses (stream_model)"


def _bind_cancellation(triton: Triton, gate: threading.Event, seen: List[ModelCallError]) -> None:
    def caller(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        try:
            return [call_model("gated", {"x": request["x"]}) for request in requests]
        except ModelCallError as error:
            seen.append(error)
            raise

    config = ModelConfig(max_batch_size=8)
    triton.bind("caller", caller, INPUTS, OUTPUTS, config=config)
    # Its requests wait in its queue first, so that their batch runs in a task of the scheduler's own.
    delayed = ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=5_000))
    triton.bind("delayed_caller", caller, INPUTS, OUTPUTS, config=delayed)
    triton.bind("gated", _identity_batch_sizes([], gate), INPUTS, OUTPUTS, config=config)


def _failures(url: str, model: str) -> int:
    client = httpclient.InferenceServerClient(url)
    statistics = client.get_inference_statistics(model, headers=HTTP_AUTH)["model_stats"][0]
    return int(statistics["inference_stats"]["fail"]["count"])


@pytest.mark.parametrize("frontends", [None, 3], ids=["in-process", "two-frontend-processes"])
def test_a_cancelled_or_expired_outer_request_ends_its_inner_call(frontends: Optional[int]) -> None:
    """Through frontend processes too: the hub's cancel of a forwarded request reached a queued one only."""
    gate = threading.Event()
    seen: List[ModelCallError] = []
    with running_triton(lambda triton: _bind_cancellation(triton, gate, seen), frontends=frontends) as triton:
        url = http_url(triton)
        blocker = threading.Thread(target=_infer, args=(url, "gated", [0.0]))  # holds gated's only instance
        blocker.start()
        wait_until(lambda: running(triton, "gated"))

        # The client gives up on the outer request; its inner call leaves gated's queue, CANCELLED.
        given_up_over_grpc(triton, "caller", lambda: pending(triton, "gated") == 1)
        wait_until(lambda: len(seen) == 1)
        assert seen[0].status.name == "CANCELLED"
        assert seen[0].message in cancelled_with_its_request(triton, "caller")
        assert _failures(url, "gated") == 1

        # The same for a batch that runs in the scheduler's task: once no request of it has a client left.
        given_up_over_grpc(triton, "delayed_caller", lambda: pending(triton, "gated") == 1)
        wait_until(lambda: len(seen) == 2)
        assert seen[1].status.name == "CANCELLED"
        assert (
            seen[1].message == "every request of the batch of model 'delayed_caller' that made the call was cancelled"
        )
        assert _failures(url, "gated") == 2

        # The outer request's timeout (the `timeout` parameter, in microseconds) bounds the inner call.
        with pytest.raises(InferenceServerException) as expired:
            _infer_with(url, "caller", {}, timeout_us=300_000)
        assert expired.value.status() == "503"
        assert expired.value.message() == "the deadline passed before model 'gated' answered"
        assert _failures(url, "gated") == 3
        assert pending(triton, "gated") == 0
        gate.set()
        blocker.join(10)
        assert _infer_with(url, "caller", {}).tolist() == [[1.0]]


# -- from process instances: the same calls over the instance's channel to the server -----------------


def _process_caller(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """In an instance process: calls the model named by `target`, or streams `count_up` when `target` is 'stream'."""
    responses = []
    for request in requests:
        parameters = request.parameters or {}
        target = str(parameters["target"])
        if target == "stream":
            total = np.zeros((1, 1), np.float32)
            for outputs in stream_model("count_up", {"x": request["x"]}):
                total = total + outputs["y"]
            responses.append({"y": total})
        else:
            timeout = parameters.get("timeout_s")
            timeout_s = None if timeout is None else float(timeout)
            responses.append(call_model(target, {"x": request["x"] + 1}, parameters=parameters, timeout_s=timeout_s))
    return responses


async def _process_caller_async(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    return [await call_model_async("identity", {"x": request["x"] * 3}) for request in requests]


def _bind_process_callers(triton: Triton, sizes: List[int], gate: threading.Event) -> None:
    config = ModelConfig(max_batch_size=8)
    _bind_batching_identity(triton, sizes, gate)
    triton.bind("failing", _fail, INPUTS, OUTPUTS, config=config)
    triton.bind("count_up", _count_up, INPUTS, OUTPUTS, config=ModelConfig(max_batch_size=8, decoupled=True))
    triton.bind("process_caller", ProcessInstances(_process_caller), INPUTS, OUTPUTS, config=config)
    triton.bind("process_async", ProcessInstances(_process_caller_async), INPUTS, OUTPUTS, config=config)


def test_process_instances_call_models_of_the_server() -> None:
    sizes: List[int] = []
    gate = threading.Event()
    gate.set()
    with running_triton(lambda triton: _bind_process_callers(triton, sizes, gate)) as triton:
        url = http_url(triton)
        assert _infer_with(url, "process_caller", {"target": "identity"}).tolist() == [[2.0]]
        assert _infer_with(url, "process_async", {}).tolist() == [[3.0]]
        assert _infer_with(url, "process_caller", {"target": "stream"}).tolist() == [[6.0]]  # 1 + 2 + 3
        with pytest.raises(InferenceServerException) as failed:
            _infer_with(url, "process_caller", {"target": "failing"})
        assert failed.value.message() == "ValueError: the inner model refuses"
        with pytest.raises(InferenceServerException) as cycle:
            _infer_with(url, "process_caller", {"target": "process_caller"})
        assert cycle.value.message() == (
            "model 'process_caller' is already on the call path (process_caller -> process_caller): a cycle is refused"
        )

        # Calls from both process instances join a client's request in one batch of the identity model.
        sizes.clear()
        calls = {
            "identity": lambda: _infer(url, "identity", [5.0]),
            "process_caller": lambda: _infer_with(url, "process_caller", {"target": "identity"}),
            "process_async": lambda: _infer_with(url, "process_async", {}),
        }
        results = queued_behind_a_held_batch(
            triton, "identity", gate.clear, gate.set, lambda: _infer(url, "identity", [0.0]), calls
        )
        assert sizes == [1, 3]
        assert {name: value.tolist() for name, value in results.items()} == {
            "identity": [[5.0]],
            "process_caller": [[2.0]],
            "process_async": [[3.0]],
        }

        # Deadlines and cancellation reach a process instance's call: it leaves identity's queue each time.
        gate.clear()
        blocker = threading.Thread(target=_infer, args=(url, "identity", [0.0]))
        blocker.start()
        wait_until(lambda: running(triton, "identity"))
        failures = _failures(url, "identity")
        with pytest.raises(InferenceServerException) as expired:
            _infer_with(url, "process_caller", {"target": "identity", "timeout_s": 0.2})
        assert expired.value.message() == "the deadline passed before model 'identity' answered"
        assert _failures(url, "identity") == failures + 1
        given_up_over_grpc(triton, "process_caller", lambda: pending(triton, "identity") == 1, {"target": "identity"})
        wait_until(lambda: _failures(url, "identity") == failures + 2)
        assert pending(triton, "identity") == 0
        gate.set()
        blocker.join(10)
        assert _infer_with(url, "process_caller", {"target": "identity"}).tolist() == [[2.0]]


def _unpicklable_caller(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """Calls `target` with x (a large array: the call's tensors go in the call arena) and s, as `s` says.

    s "lambda": an object array holding a lambda, "generator": one holding a generator; else bytes.
    """
    responses = []
    for request in requests:
        parameters = request.parameters or {}
        kind = parameters.get("s")
        s: Any = np.array([[b"fine"]], dtype=object)
        if kind == "lambda":
            s = np.array([[b"fine", lambda: 1]], dtype=object)[:, 1:]
        elif kind == "generator":
            s = np.empty((1, 1), dtype=object)
            s[0, 0] = (value for value in range(3))
        x = np.ones((1, 100_000), np.float32)  # 400 kB: in the call arena, grown by the first call
        outputs = call_model(str(parameters["target"]), {"x": x, "s": s})
        responses.append({"y": outputs["y"][:, :1] + request["x"]})
    return responses


def test_a_call_whose_inputs_do_not_pickle_fails_from_a_process_instance_as_from_a_thread() -> None:
    def bind(triton: Triton) -> None:
        config = ModelConfig(max_batch_size=8)
        with_s = [*INPUTS, Tensor(name="s", dtype=bytes, shape=(1,))]
        with_fp32_s = [*INPUTS, Tensor(name="s", dtype=np.float32, shape=(1,))]
        triton.bind("with_bytes", _identity_of_x, with_s, OUTPUTS, config=config)
        triton.bind("with_floats", _identity_of_x, with_fp32_s, OUTPUTS, config=config)
        triton.bind("thread_caller", _unpicklable_caller, INPUTS, OUTPUTS, config=config)
        triton.bind("process_caller", ProcessInstances(_unpicklable_caller), INPUTS, OUTPUTS, config=config)

    with running_triton(bind) as triton:
        url = http_url(triton)
        for kind in ("lambda", "generator"):
            # A model whose input is not BYTES: the inner model's own message, from either kind of instance.
            for caller in ("thread_caller", "process_caller"):
                with pytest.raises(InferenceServerException) as refused:
                    _infer_with(url, caller, {"target": "with_floats", "s": kind})
                assert refused.value.status() == "400"
                assert refused.value.message() == (
                    "inference input 's' data-type is 'BYTES', but model 'with_floats' expects 'FP32'"
                )
            # A BYTES input that passes the model's checks but cannot leave the process: 400, naming why.
            with pytest.raises(InferenceServerException) as unsent:
                _infer_with(url, "process_caller", {"target": "with_bytes", "s": kind})
            assert unsent.value.status() == "400"
            # Python 3.13 says "Can't get local object", earlier ones "Can't pickle local object".
            why = "AttributeError: Can't " if kind == "lambda" else "TypeError: cannot pickle"
            assert unsent.value.message().startswith(
                f"the call to model 'with_bytes' cannot leave the instance process: input 's' does not pickle ({why}"
            )
        # The instance is whole: its calls (their large tensors in the arena the first, failed, call grew) go on.
        for caller in ("thread_caller", "process_caller"):
            assert _infer_with(url, caller, {"target": "with_bytes"}).tolist() == [[2.0]]


@batch
def _identity_of_x(x: np.ndarray, s: np.ndarray) -> Dict[str, np.ndarray]:
    return {"y": x}


def test_an_inner_requests_spans_nest_under_its_callers() -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    def bind(triton: Triton) -> None:
        config = ModelConfig(max_batch_size=8)
        triton.bind("identity", _identity_batch_sizes([], _open_gate()), INPUTS, OUTPUTS, config=config)
        triton.bind("caller", _call_target, INPUTS, OUTPUTS, config=config)

    trace = ["mode=opentelemetry", "rate=1", "level=TIMESTAMPS"]
    with running_triton(bind, trace_config=trace) as triton:
        exporter = InMemorySpanExporter()
        triton._runtime.tracing.add_span_processor(SimpleSpanProcessor(exporter))
        assert _infer_with(http_url(triton), "caller", {"target": "identity"}).tolist() == [[1.0]]
        spans = exporter.get_finished_spans()
        by_model = {
            span.attributes["triton.model_name"]: span for span in spans if span.name == "request" and span.attributes
        }
        outer_compute = next(
            span
            for span in spans
            if span.name == "compute"
            and span.parent is not None
            and span.parent.span_id == by_model["caller"].context.span_id
        )
        inner = by_model["identity"]
        assert inner.parent is not None and inner.parent.span_id == outer_compute.context.span_id
        assert inner.context.trace_id == by_model["caller"].context.trace_id


def _open_gate() -> threading.Event:
    gate = threading.Event()
    gate.set()
    return gate


def _threads_calling(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """In an instance process: each request's value goes through `identity` from 4 threads at once, + the sum.

    A fifth thread keeps asking is_cancelled() meanwhile: it reads the same channel the answers come on.
    """
    from concurrent.futures import ThreadPoolExecutor

    done = threading.Event()

    def ask() -> None:
        while not done.is_set():
            requests[0].is_cancelled()

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            futures = [
                pool.submit(call_model, "identity", {"x": request["x"] + step})
                for request in requests
                for step in range(4)
            ]
            values = [future.result(timeout=30)["y"] for future in futures]
    finally:
        done.set()
        asker.join()
    return [{"y": np.sum(values[index * 4 : index * 4 + 4], axis=0)} for index in range(len(requests))]


def test_threads_of_a_process_instance_call_models_at_once_and_each_gets_its_own_answers() -> None:
    def bind(triton: Triton) -> None:
        identity = _identity_batch_sizes([], _open_gate())
        triton.bind("identity", identity, INPUTS, OUTPUTS, config=ModelConfig(max_batch_size=64))
        triton.bind(
            "threads", ProcessInstances(_threads_calling), INPUTS, OUTPUTS, config=ModelConfig(max_batch_size=8)
        )

    with running_triton(bind) as triton:
        url = http_url(triton)
        for value in (1.0, 10.0, 100.0):
            assert _infer(url, "threads", [value]).tolist() == [[4 * value + 6]]  # value + 0, +1, +2, +3


# -- large tensors from a process instance: through shared memory both ways, and let go of ------------------------

_BIG = 3 << 19  # float32 values: 6 MiB
_MIB = 1 << 18  # float32 values: 1 MiB


def _memfds() -> Set[int]:
    """pytriton's shared-memory segments this process holds a descriptor or a mapping of, by inode."""
    held = memfds_held()
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/memfd:pytriton" in line:
                held.add(int(line.split()[4]))
    return held


def _big_caller(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """In an instance process, by `mode`.

    "round_trip": a 6 MiB tensor of `seed` through `identity`, `twice` and the decoupled `count_up` (3 responses);
    answers what `identity` gave back. "repeat": `calls` calls of 1 MiB (to `identity` and `twice` in turn) from
    each of `threads` threads, each answer checked; answers how many shared-memory segments this process then
    holds, the size of its call arena and how many regions of it are lent. "refused": the same with calls that fail
    or expire. "hang": a call to `gated` with 6 MiB.
    """
    from concurrent.futures import ThreadPoolExecutor

    parameters = requests[0].parameters or {}
    mode = str(parameters["mode"])
    if mode == "round_trip":
        sent = np.random.default_rng(int(parameters["seed"])).standard_normal((1, _BIG)).astype(np.float32)
        got = call_model("identity", {"x": sent})["y"]  # its output lies in its inputs, in this process's arena
        doubled = call_model("twice", {"x": sent})["y"]  # in the server's answer arena
        assert not got.flags.owndata and not doubled.flags.owndata, "the outputs are read in place"
        assert np.array_equal(doubled, sent * 2)
        streamed = [outputs["y"] for outputs in stream_model("count_up", {"x": sent})]  # all three held at once
        assert len(streamed) == 3 and all(np.array_equal(part, sent + step) for step, part in enumerate(streamed))
        return [{"y": got}]
    if mode == "hang":
        return [call_model("gated", {"x": np.ones((1, _BIG), np.float32)})]

    def calls(thread: int) -> None:
        for step in range(int(parameters["calls"])):
            sent = np.full((1, _MIB), thread * 1000 + step, np.float32)
            sent[0, ::7] = -step  # not constant: a stale region would show
            if mode == "refused":  # the inner model fails, or the call expires in `gated`'s queue
                with pytest.raises(ModelCallError):
                    call_model("failing" if step % 2 else "gated", {"x": sent}, timeout_s=0.05)
            elif step % 2:
                assert np.array_equal(call_model("twice", {"x": sent})["y"], sent * 2)
            else:
                assert np.array_equal(call_model("identity", {"x": sent})["y"], sent)

    threads = int(parameters["threads"])
    if threads == 1:
        calls(0)
    else:
        with ThreadPoolExecutor(threads) as pool:
            for future in [pool.submit(calls, thread) for thread in range(threads)]:
                future.result(timeout=60)
    from pytriton.core.process_instances.host import _HOSTS

    arena = _HOSTS[0]._calls._calls  # the call arena: its size, and the regions lent (the start counts as one)
    return [{"y": np.array([[len(_memfds()), arena._regions.size, len(arena._regions)]], np.float32)}]


@batch
def _twice(x: np.ndarray) -> Dict[str, np.ndarray]:
    return {"y": x * 2}


def _bind_big_caller(triton: Triton, gate: threading.Event) -> None:
    config = ModelConfig(max_batch_size=64)
    triton.bind("identity", _identity_batch_sizes([], _open_gate()), INPUTS, OUTPUTS, config=config)
    triton.bind("gated", _identity_batch_sizes([], gate), INPUTS, OUTPUTS, config=config)
    triton.bind("failing", _fail, INPUTS, OUTPUTS, config=config)
    triton.bind("twice", _twice, INPUTS, OUTPUTS, config=config)
    triton.bind("count_up", _count_up, INPUTS, OUTPUTS, config=ModelConfig(max_batch_size=8, decoupled=True))
    triton.bind("big_caller", ProcessInstances(_big_caller), INPUTS, OUTPUTS, config=ModelConfig(max_batch_size=8))


def _process_instance(triton: Triton, model: str) -> Any:
    (instance,) = triton._runtime.engine.model(model).scheduler.instances
    return instance


def test_a_process_instances_inner_calls_pass_large_tensors_through_shared_memory_and_let_go_of_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.CRITICAL, "pytriton.model")  # a captured failure's traceback would hold its inputs
    gate = threading.Event()
    with running_triton(lambda triton: _bind_big_caller(triton, gate)) as triton:
        url = http_url(triton)
        for seed in (1, 2):
            expected = np.random.default_rng(seed).standard_normal((1, _BIG)).astype(np.float32)
            got = _infer_with(url, "big_caller", {"mode": "round_trip", "seed": seed})
            assert got.dtype == np.float32 and np.array_equal(got, expected)

        # Many calls in a row, from one thread and from 4 at once: neither side holds more segments as they go, and
        # every region the server lent for an answer came back.
        calls = _process_instance(triton, "big_caller")._link.calls
        counts = []
        for threads in (1, 4, 1, 4):
            counts.append(_infer_with(url, "big_caller", {"mode": "repeat", "calls": 25, "threads": threads}))
            assert len(calls.answers._regions) == 1  # the arena's copied-out start only
        server_held = _memfds()
        for threads in (1, 4):
            counts.append(_infer_with(url, "big_caller", {"mode": "repeat", "calls": 25, "threads": threads}))
        assert _memfds() == server_held
        held, sizes, lent = zip(*(count[0].tolist() for count in counts))
        assert len(set(held[2:])) == 1 and len(set(sizes[2:])) == 1, counts
        assert max(lent) <= 1 + 2 * 4, counts  # the last calls' regions may come back with the next message

        # Calls that fail or expire give their inputs' regions back as well: a failed inner request's inputs once
        # the garbage collector frees the exception's traceback (the failing model's frame holds them): here, after
        # the request.
        refused = []
        for _ in range(3):
            refused.append(_infer_with(url, "big_caller", {"mode": "refused", "calls": 10, "threads": 1}))
            gc.collect()
        held, sizes, lent = zip(*(count[0].tolist() for count in refused))
        assert len(set(held)) == 1 and len(set(sizes)) == 1 and max(lent) <= 1 + 10 + 2, refused
        gate.set()  # the first call to `gated` still runs there


def test_an_instance_process_killed_in_an_inner_call_leaves_the_server_serving_and_its_memory_freed() -> None:
    gate = threading.Event()
    with running_triton(lambda triton: _bind_big_caller(triton, gate)) as triton:
        url = http_url(triton)
        assert int(_infer_with(url, "big_caller", {"mode": "repeat", "calls": 1, "threads": 1})[0][0]) > 0
        before = _memfds()
        failed: List[BaseException] = []

        def hang() -> None:
            try:
                _infer_with(url, "big_caller", {"mode": "hang"})
            except InferenceServerException as error:
                failed.append(error)

        caller = threading.Thread(target=hang)
        caller.start()
        wait_until(lambda: running(triton, "gated"))
        link = _process_instance(triton, "big_caller")._link
        dead = _memfds_of(link)
        assert link.calls.inputs.segment is not None  # the call's 6 MiB came in the process's call arena
        os.kill(link.pid, signal.SIGKILL)
        caller.join(10)
        assert len(failed) == 1 and "was killed by signal SIGKILL" in str(failed[0])
        gate.set()  # the inner request, cancelled, still runs with the dead process's memory as its input
        wait_until(lambda: not running(triton, "gated") and _process_instance(triton, "big_caller").alive)
        expected = np.random.default_rng(3).standard_normal((1, _BIG)).astype(np.float32)
        assert np.array_equal(_infer_with(url, "big_caller", {"mode": "round_trip", "seed": 3}), expected)
        wait_until(lambda: not _memfds() & dead)
        assert not _memfds() - before - _memfds_of(_process_instance(triton, "big_caller")._link)


def _memfds_of(link: Any) -> Set[int]:
    """The segments the server holds for a process's link (its arenas, by inode)."""
    found = set()
    for segment in (link.inputs.segment, link.outputs.segment, link.calls.inputs.segment, link.calls.answers.segment):
        if segment is not None:
            found.add(os.fstat(segment.fileno()).st_ino)
    return found
