"""Triton's scheduling semantics: dynamic batching, priorities, queue policies, instances, cache, faults."""

from __future__ import annotations

import asyncio
import concurrent.futures
import pathlib
import textwrap
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pytest
import tritonclient.http as httpclient

from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.sinks import FutureSink
from pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor, TimeoutAction
from pytriton.triton import Triton
from tests.conftest import HTTP_AUTH, running_triton
from tests.http_helpers import get_json, post_json
from tests.server_process import start_script, stop_script

REPO = pathlib.Path(__file__).resolve().parents[1]
TENSOR = Tensor(name="x", dtype=np.float32, shape=(-1,))
OUT = Tensor(name="y", dtype=np.float32, shape=(-1,))


class Recorder:
    """A callable that records each call's batch and can be held until released."""

    def __init__(self, delay_s: float = 0.0, hold_first: bool = False) -> None:
        self.calls: List[List[float]] = []
        self.rows: List[int] = []
        self.delay_s = delay_s
        self.started = threading.Event()
        self.release = threading.Event()
        if not hold_first:
            self.release.set()
        self.lock = threading.Lock()

    def __call__(self, requests):
        with self.lock:
            self.calls.append([float(r["x"].ravel()[0]) for r in requests])
            self.rows.append(sum(r["x"].shape[0] for r in requests))
        self.started.set()
        self.release.wait(30)
        if self.delay_s:
            time.sleep(self.delay_s)
        return [{"y": r["x"]} for r in requests]


def _body(value: float, rows: int = 1, parameters: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    body: Dict[str, Any] = {"inputs": [{"name": "x", "shape": [rows, 1], "datatype": "FP32", "data": [value] * rows}]}
    if parameters:
        body["parameters"] = parameters
    return body


def _serve(model: Callable, config: ModelConfig, **triton_config: Any):
    def bind(triton: Triton) -> None:
        triton.bind("m", model, inputs=[TENSOR], outputs=[OUT], config=config)

    return running_triton(bind, allow_grpc=False, allow_metrics=False, **triton_config)


def _wait_pending(triton: Triton, count: int) -> None:
    """Wait until `count` requests wait in the model's queue (test-only view of the engine)."""
    scheduler = triton._runtime.engine.model("m").scheduler
    deadline = time.monotonic() + 10
    while scheduler.pending < count:
        assert time.monotonic() < deadline, f"only {scheduler.pending} of {count} requests queued"
        time.sleep(0.002)


def _send_all(port: int, bodies: List[Dict[str, Any]]) -> List[concurrent.futures.Future]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(len(bodies), 1))
    futures = [pool.submit(post_json, port, "/v2/models/m/infer", body) for body in bodies]
    pool.shutdown(wait=False)
    return futures


def test_concurrent_requests_form_batches_never_above_max():
    model = Recorder(hold_first=True)
    with _serve(model, ModelConfig(max_batch_size=8)) as triton:
        first = _send_all(triton.http_port, [_body(0)])
        assert model.started.wait(10)
        rest = _send_all(triton.http_port, [_body(i, rows=3) for i in range(1, 7)])
        _wait_pending(triton, 6)
        model.release.set()
        assert all(f.result()[0] == 200 for f in first + rest)
    assert max(model.rows) <= 8
    assert max(len(call) for call in model.calls) == 2  # 3 + 3 rows fit, a third request would exceed 8
    assert sorted(v for call in model.calls for v in call) == list(range(7))


def test_requests_join_in_arrival_order():
    model = Recorder(hold_first=True)
    with _serve(model, ModelConfig(max_batch_size=4)) as triton:
        first = _send_all(triton.http_port, [_body(0)])
        assert model.started.wait(10)
        for i in range(1, 9):
            _send_all(triton.http_port, [_body(i)])
            _wait_pending(triton, i)
        model.release.set()
        first[0].result()
    assert model.calls[1:] == [[1, 2, 3, 4], [5, 6, 7, 8]]


def test_a_model_without_a_dynamic_batcher_runs_each_request_alone():
    # ModelConfig(batcher=None): 0.7 writes no dynamic_batching, and Triton's default scheduler runs each request
    # by itself (max_batch_size still bounds its rows); here the queued requests were batched together
    model = Recorder(hold_first=True)
    with _serve(model, ModelConfig(max_batch_size=4, batcher=None)) as triton:
        first = _send_all(triton.http_port, [_body(0)])
        assert model.started.wait(10)
        rest = _send_all(triton.http_port, [_body(i, rows=2) for i in range(1, 4)])
        _wait_pending(triton, 3)
        model.release.set()
        assert all(f.result()[0] == 200 for f in first + rest)
    assert sorted(model.calls) == [[0], [1], [2], [3]] and sorted(model.rows) == [1, 2, 2, 2]


def test_preferred_batch_size_fires_without_waiting_for_the_delay():
    model = Recorder()
    # A batch that waited for the delay would leave a minute late: no load on the machine comes near.
    config = ModelConfig(
        max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=60_000_000, preferred_batch_size=[2])
    )
    with _serve(model, config) as triton:
        started = time.monotonic()
        futures = _send_all(triton.http_port, [_body(1), _body(2)])
        assert all(f.result()[0] == 200 for f in futures)
        elapsed = time.monotonic() - started
    assert sorted(model.calls[0]) == [1, 2] and len(model.calls) == 1
    assert elapsed < 30


def test_lone_request_waits_for_max_queue_delay():
    model = Recorder()
    config = ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=300_000))
    with _serve(model, config) as triton:
        started = time.monotonic()
        status, _ = post_json(triton.http_port, "/v2/models/m/infer", _body(1))
        elapsed = time.monotonic() - started
    assert status == 200
    assert 0.28 <= elapsed < 10  # at the delay, not before; the upper bound only says that the batch left


def test_priority_levels_serve_highest_first():
    model = Recorder(hold_first=True)
    config = ModelConfig(max_batch_size=1, batcher=DynamicBatcher(priority_levels=3, default_priority_level=3))
    with _serve(model, config) as triton:
        first = _send_all(triton.http_port, [_body(0)])
        assert model.started.wait(10)
        order = [(10, 3), (11, 0), (20, 2), (30, 1), (21, 2), (31, 1)]
        for count, (value, priority) in enumerate(order, start=1):
            _send_all(triton.http_port, [_body(value, parameters={"priority": priority})])
            _wait_pending(triton, count)
        model.release.set()
        first[0].result()
        _wait_pending(triton, 0)
        deadline = time.monotonic() + 10
        while len(model.calls) < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert [call[0] for call in model.calls] == [0, 30, 31, 20, 21, 10, 11]


def test_queue_full_is_rejected_with_503():
    model = Recorder(hold_first=True)
    config = ModelConfig(max_batch_size=1, batcher=DynamicBatcher(default_queue_policy=QueuePolicy(max_queue_size=2)))
    with _serve(model, config) as triton:
        first = _send_all(triton.http_port, [_body(0)])
        assert model.started.wait(10)
        queued = _send_all(triton.http_port, [_body(1), _body(2)])
        _wait_pending(triton, 2)
        status, document = post_json(triton.http_port, "/v2/models/m/infer", _body(3))
        assert status == 503 and document["error"] == "[request id: <id_unknown>] Exceeds maximum queue size"
        status, document = post_json(triton.http_port, "/v2/models/m/infer", {**_body(4), "id": "r4"})
        assert status == 503 and document["error"] == "[request id: r4] Exceeds maximum queue size"
        model.release.set()
        assert [f.result()[0] for f in first + queued] == [200, 200, 200]


def test_queue_timeout_rejects_while_the_instance_is_busy():
    model = Recorder(hold_first=True)
    policy = QueuePolicy(default_timeout_microseconds=100_000, timeout_action=TimeoutAction.REJECT)
    config = ModelConfig(max_batch_size=1, batcher=DynamicBatcher(default_queue_policy=policy))
    with _serve(model, config) as triton:
        first = _send_all(triton.http_port, [_body(0)])
        assert model.started.wait(10)
        started = time.monotonic()
        status, document = post_json(triton.http_port, "/v2/models/m/infer", _body(1))
        elapsed = time.monotonic() - started
        model.release.set()
        assert first[0].result()[0] == 200
    assert status == 503 and document["error"] == "Request timeout expired"
    assert 0.09 <= elapsed < 10  # at the timeout, not before, and not once the instance is free
    assert model.calls == [[0]]


def test_timeout_override_only_shortens_the_default():
    model = Recorder(hold_first=True)
    # The default timeout is a minute: a request that kept it would be that late.
    policy = QueuePolicy(default_timeout_microseconds=60_000_000, allow_timeout_override=True)
    config = ModelConfig(max_batch_size=1, batcher=DynamicBatcher(default_queue_policy=policy))
    with _serve(model, config) as triton:
        first = _send_all(triton.http_port, [_body(0)])
        assert model.started.wait(10)
        started = time.monotonic()
        status, document = post_json(triton.http_port, "/v2/models/m/infer", _body(1, parameters={"timeout": 50_000}))
        assert time.monotonic() - started < 30
        model.release.set()
        first[0].result()
    assert status == 503 and document["error"] == "Request timeout expired"


def test_delay_action_runs_late_instead_of_failing():
    model = Recorder(hold_first=True)
    # Only the late request's timeout is short (its own, 50 ms): the fresh one's minute cannot expire before the
    # instance is free, however loaded the machine (with 50 ms each, both could be delayed, and run in order).
    policy = QueuePolicy(
        default_timeout_microseconds=60_000_000, timeout_action=TimeoutAction.DELAY, allow_timeout_override=True
    )
    config = ModelConfig(
        max_batch_size=1,
        batcher=DynamicBatcher(priority_levels=2, default_priority_level=2, priority_queue_policy={2: policy}),
    )
    with _serve(model, config) as triton:
        first = _send_all(triton.http_port, [_body(0)])
        assert model.started.wait(10)
        late = _send_all(triton.http_port, [_body(1, parameters={"timeout": 50_000})])
        _wait_pending(triton, 1)
        time.sleep(0.15)  # let the level-2 request's 50 ms timeout expire: it becomes delayed
        fresh = _send_all(triton.http_port, [_body(2)])
        _wait_pending(triton, 2)
        model.release.set()
        assert [f.result()[0] for f in first + late + fresh] == [200, 200, 200]
    assert [call[0] for call in model.calls] == [0, 2, 1]


def test_a_request_rejected_at_its_timeout_frees_its_place_in_a_full_queue():
    # tritonserver 2.51 rejects an expired request only when its batcher next looks at the queue (an instance
    # frees, or its 500 ms poll while all are busy): until then the request holds its place, and a new one is
    # refused "Exceeds maximum queue size". Here the timeout rejects it at once and frees the place (docs/migration.md).
    model = Recorder(hold_first=True)
    policy = QueuePolicy(max_queue_size=1, default_timeout_microseconds=50_000, timeout_action=TimeoutAction.REJECT)
    config = ModelConfig(max_batch_size=1, batcher=DynamicBatcher(default_queue_policy=policy))
    with _serve(model, config) as triton:
        first = _send_all(triton.http_port, [_body(0)])
        assert model.started.wait(10)
        status, document = post_json(triton.http_port, "/v2/models/m/infer", _body(1))  # answered while held
        assert status == 503 and document["error"] == "Request timeout expired"
        status, document = post_json(triton.http_port, "/v2/models/m/infer", _body(2))  # the place is free
        assert status == 503 and document["error"] == "Request timeout expired"
        model.release.set()
        assert first[0].result()[0] == 200
    assert model.calls == [[0]]


def test_a_delayed_request_keeps_its_place_in_a_full_queue():
    # As tritonserver 2.51 (probed side by side): a request whose timeout DELAYed it still counts toward
    # max_queue_size, and runs once the instance is free.
    model = Recorder(hold_first=True)
    policy = QueuePolicy(max_queue_size=1, default_timeout_microseconds=50_000, timeout_action=TimeoutAction.DELAY)
    config = ModelConfig(max_batch_size=1, batcher=DynamicBatcher(default_queue_policy=policy))
    with _serve(model, config) as triton:
        first = _send_all(triton.http_port, [_body(0)])
        assert model.started.wait(10)
        delayed = _send_all(triton.http_port, [_body(1)])
        queues = triton._runtime.engine.model("m").scheduler._queues

        async def delayed_count() -> int:  # read on the engine's loop, which changes the queues
            return sum(entry.delayed for entry in queues)

        deadline = time.monotonic() + 10
        while not triton._runtime._loop.run(delayed_count(), timeout=10):  # test-only view: its timeout DELAYed it
            assert time.monotonic() < deadline, "the request was not delayed"
            time.sleep(0.002)
        status, document = post_json(triton.http_port, "/v2/models/m/infer", _body(2))
        assert status == 503 and document["error"] == "[request id: <id_unknown>] Exceeds maximum queue size"
        model.release.set()
        assert [f.result()[0] for f in first + delayed] == [200, 200]
    assert model.calls == [[0], [1]]


def test_two_instances_run_in_parallel():
    intervals: List[tuple] = []
    lock = threading.Lock()
    both_started = threading.Barrier(2, timeout=10)

    def instance(requests):
        start = time.monotonic()
        both_started.wait()
        with lock:
            intervals.append((start, time.monotonic()))
        return [{"y": r["x"]} for r in requests]

    def bind(triton: Triton) -> None:
        triton.bind("m", [instance, instance], inputs=[TENSOR], outputs=[OUT], config=ModelConfig(max_batch_size=1))

    with running_triton(bind, allow_grpc=False, allow_metrics=False) as triton:
        futures = _send_all(triton.http_port, [_body(1), _body(2)])
        assert [f.result()[0] for f in futures] == [200, 200]
    assert len(intervals) == 2  # the barrier only opens when both instances run at the same time


@pytest.mark.parametrize("delay_us", [0, 100])
def test_one_request_at_a_time_runs_on_the_instance_that_ran_the_last(delay_us: int):
    # The instance freed last is the warm one (its caches, its CUDA stream or context): taking turns between
    # instances made a lone GPU request ~2.6 ms slower (docs/performance.md, "On a GPU").
    ran: List[str] = []

    def instance(name: str) -> Callable[..., Any]:
        def infer(requests):
            ran.append(name)
            return [{"y": r["x"]} for r in requests]

        return infer

    config = ModelConfig(max_batch_size=4, batcher=DynamicBatcher(max_queue_delay_microseconds=delay_us))

    def bind(triton: Triton) -> None:
        triton.bind("m", [instance("a"), instance("b"), instance("c")], inputs=[TENSOR], outputs=[OUT], config=config)

    with running_triton(bind, allow_grpc=False, allow_metrics=False) as triton:
        for value in range(6):
            assert post_json(triton.http_port, "/v2/models/m/infer", _body(value))[0] == 200
    assert len(ran) == 6 and len(set(ran)) == 1


def test_async_instances_overlap():
    import asyncio

    active = {"now": 0, "max": 0}
    both: List[asyncio.Event] = []  # made on the server's loop

    async def instance(requests):
        if not both:
            both.append(asyncio.Event())
        active["now"] += 1
        active["max"] = max(active["max"], active["now"])
        if active["now"] == 2:
            both[0].set()
        await asyncio.wait_for(both[0].wait(), 10)  # each call waits for the other: calls one at a time time out
        active["now"] -= 1
        return [{"y": r["x"]} for r in requests]

    def bind(triton: Triton) -> None:
        triton.bind("m", [instance, instance], inputs=[TENSOR], outputs=[OUT], config=ModelConfig(max_batch_size=1))

    with running_triton(bind, allow_grpc=False, allow_metrics=False) as triton:
        futures = _send_all(triton.http_port, [_body(1), _body(2)])
        assert [f.result()[0] for f in futures] == [200, 200]
    assert active["max"] == 2


def test_response_cache_hit_skips_the_model():
    model = Recorder()
    with _serve(
        model, ModelConfig(max_batch_size=4, response_cache=True), cache_config=["local,size=1048576"]
    ) as triton:
        first = post_json(triton.http_port, "/v2/models/m/infer", _body(7))
        second = post_json(triton.http_port, "/v2/models/m/infer", _body(7))
        other = post_json(triton.http_port, "/v2/models/m/infer", _body(8))
        _, stats = get_json(triton.http_port, "/v2/models/m/stats", HTTP_AUTH)
        _, config = get_json(triton.http_port, "/v2/models/m/config")
    assert first == second and first[0] == 200 and other[0] == 200
    assert model.calls == [[7], [8]]
    inference = stats["model_stats"][0]["inference_stats"]
    assert inference["cache_hit"]["count"] == 1 and inference["cache_miss"]["count"] == 2
    assert inference["success"]["count"] == 3
    assert stats["model_stats"][0]["execution_count"] == 2
    assert config["response_cache"] == {"enable": True}


def test_exception_fails_only_its_batch():
    def model(requests):
        if any(float(r["x"].ravel()[0]) == 13 for r in requests):
            raise RuntimeError("unlucky batch")
        return [{"y": r["x"]} for r in requests]

    with _serve(model, ModelConfig(max_batch_size=1)) as triton:
        futures = _send_all(triton.http_port, [_body(v) for v in (1, 13, 2, 3)])
        results = [f.result() for f in futures]
    assert [status for status, _ in results] == [200, 500, 200, 200]
    assert "unlucky batch" in results[1][1]["error"]


def test_stop_answers_every_in_flight_request():
    model = Recorder(hold_first=True, delay_s=0.05)
    triton_cm = _serve(model, ModelConfig(max_batch_size=1))
    triton = triton_cm.__enter__()
    futures = _send_all(triton.http_port, [_body(i) for i in range(5)])
    assert model.started.wait(10)
    _wait_pending(triton, 4)
    stopper = threading.Thread(target=triton_cm.__exit__, args=(None, None, None))
    stopper.start()
    deadline = time.monotonic() + 10
    while triton._runtime.engine.accepting and time.monotonic() < deadline:
        time.sleep(0.005)
    model.release.set()
    stopper.join(30)
    assert [f.result()[0] for f in futures] == [200] * 5


def test_requests_after_stop_are_refused():
    model = Recorder()
    with _serve(model, ModelConfig(max_batch_size=2)) as triton:
        engine = triton._runtime.engine
        port = triton.http_port
    assert not engine.accepting
    with pytest.raises(OSError):
        post_json(port, "/v2/models/m/infer", _body(1))


@pytest.mark.parametrize("preserve", [True, False])
def test_preserve_ordering_holds_later_responses(preserve):
    slow_started, fast_ran, release = threading.Event(), threading.Event(), threading.Event()

    def instance(requests):
        value = float(requests[0]["x"].ravel()[0])
        if value == 0:
            slow_started.set()
            release.wait(30)  # the first request's call ends only when the test says
        else:
            fast_ran.set()
        return [{"y": r["x"]} for r in requests]

    def bind(triton: Triton) -> None:
        batcher = DynamicBatcher(preserve_ordering=preserve)
        config = ModelConfig(max_batch_size=1, batcher=batcher)
        triton.bind("m", [instance, instance], inputs=[TENSOR], outputs=[OUT], config=config)

    with running_triton(bind, allow_grpc=False, allow_metrics=False) as triton:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        try:
            slow = pool.submit(post_json, triton.http_port, "/v2/models/m/infer", _body(0))
            assert slow_started.wait(10)
            fast = pool.submit(post_json, triton.http_port, "/v2/models/m/infer", _body(1))
            assert fast_ran.wait(10)  # on the other instance, while the first call is held
            if preserve:
                with pytest.raises(concurrent.futures.TimeoutError):  # its response waits behind the first's
                    fast.result(0.5)
            else:
                assert fast.result(10)[0] == 200 and not slow.done()
        finally:
            release.set()
            pool.shutdown()
        assert slow.result()[0] == 200 and fast.result()[0] == 200


THREAD_START_FAILS_ONCE = textwrap.dedent(
    """
    import threading
    import numpy as np
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    def total(requests):
        return [{"total": np.array([request["x"].sum()], dtype=np.float64)} for request in requests]

    if __name__ == "__main__":
        start = threading.Thread.start
        failed = set()

        def start_or_fail(self):
            # The first start of each instance thread fails, as when the process is at its limit of threads.
            model = self.name.rsplit("-", 2)[0]
            if model.startswith("pytriton-") and model not in failed:
                failed.add(model)
                raise RuntimeError("can't start new thread")
            return start(self)

        threading.Thread.start = start_or_fail
        io = {
            "inputs": [Tensor(name="x", dtype=np.float32, shape=(-1,))],
            "outputs": [Tensor(name="total", dtype=np.float64, shape=(1,))],
        }
        queued = ModelConfig(max_batch_size=4, batcher=DynamicBatcher(max_queue_delay_microseconds=1000))
        with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as triton:
            triton.bind("inline", total, **io, config=ModelConfig(batching=False))  # runs in the handler's task
            triton.bind("queued", total, **io, config=queued)  # goes through the queue and a task of its own
            triton.run()
            print(triton.http_port, flush=True)
            triton.serve()
    """
)


@pytest.mark.parametrize("model", ["inline", "queued"])
def test_an_instance_whose_thread_cannot_start_fails_that_batch_and_serves_the_next(
    tmp_path: pathlib.Path, model: str
) -> None:
    """`RuntimeError: can't start new thread` at a batch's start fails that batch, naming the model and instance.

    It left the instance off the free list for good: the model never answered again.
    """
    server = start_script(tmp_path, THREAD_START_FAILS_ONCE)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        with httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=20) as client:

            def total(value: float) -> float:
                tensor = httpclient.InferInput("x", [1, 3] if model == "queued" else [3], "FP32")
                tensor.set_data_from_numpy(np.full((1, 3) if model == "queued" else 3, value, np.float32))
                return float(client.infer(model, [tensor]).as_numpy("total")[0])

            with pytest.raises(httpclient.InferenceServerException) as failed:
                total(1.0)
            message = str(failed.value)
            assert f"model '{model}' instance thread pytriton-{model}-1-0 could not start the batch" in message
            assert "RuntimeError: can't start new thread" in message
            assert total(2.0) == 6.0  # the instance is free again, and its thread starts now
            assert total(3.0) == 9.0
            assert client.is_model_ready(model)
    finally:
        stop_script(server)


def _submit_three(triton: Triton, held: bool) -> List[List[float]]:
    """Submit three requests to model "m" in one loop callback, as the hub submits a frontend's message."""
    model = triton._runtime.engine.model("m")
    scheduler = model.scheduler

    async def submit() -> List[List[float]]:
        loop = asyncio.get_running_loop()
        futures: List[asyncio.Future[InferenceResponse]] = [loop.create_future() for _ in range(3)]
        if held:
            scheduler.hold()
        try:
            for value, future in enumerate(futures):
                inputs = {"x": np.full((1, 1), float(value), np.float32)}
                request = InferenceRequest(
                    request_id="", inputs=inputs, parameters={}, requested_outputs=None, batch_size=1
                )
                model.submit(request, FutureSink(future), False)
        finally:
            if held:
                scheduler.release()
        return [[float(r.outputs[0].array.ravel()[0])] for r in await asyncio.gather(*futures)]

    return triton._runtime._loop.run(submit(), timeout=30)


@pytest.mark.parametrize("held", [True, False])
def test_requests_submitted_while_the_scheduler_is_held_start_as_one_batch(held: bool) -> None:
    """The hub holds a model's scheduler while it queues the requests of one frontend message (Scheduler.hold):
    on an idle instance they run as one batch, where unheld the first starts alone and the others wait for it."""
    recorder = Recorder()
    with _serve(recorder, ModelConfig(max_batch_size=8)) as triton:
        answers = _submit_three(triton, held)
    assert answers == [[0.0], [1.0], [2.0]]
    assert recorder.calls == ([[0.0, 1.0, 2.0]] if held else [[0.0], [1.0, 2.0]])
