"""A sync callable's inner call to an idle sync model runs on the caller's own thread (Scheduler.run_here).

It is still a request of the inner model: counted in its statistics, one call at a time on its instance (a busy
model queues and batches the calls with its clients' requests), and cancelled with the outer request.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from pytriton.compose import ModelCallError, call_model, call_model_async
from pytriton.core.stats import FOLD_EVERY
from pytriton.metrics import MetricFamily
from pytriton.model_config import ModelConfig, Tensor
from pytriton.options.limits import ServerLimits
from pytriton.proxy.types import Request
from pytriton.security import TritonSecurityConfig
from pytriton.triton import Triton, TritonConfig
from tests.conftest import ACCESS_TOKEN, HTTP_AUTH, http_url, running_triton
from tests.inner_calls import cancelled_with_its_request, given_up_over_grpc, queued_behind_a_held_batch
from tests.waiting import wait_until

INPUTS = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
OUTPUTS = [Tensor(name="y", dtype=np.float32, shape=(-1,))]


class _Inner:
    """A sync model that notes each batch's size and thread, and waits at `gate` while it is `held`."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.batches: List[int] = []
        self.threads: List[str] = []

    @property
    def held(self) -> bool:
        return not self.gate.is_set()

    @held.setter
    def held(self, value: bool) -> None:
        if value:
            self.gate.clear()
        else:
            self.gate.set()

    def __call__(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        self.gate.wait(10)
        self.batches.append(len(requests))
        self.threads.append(threading.current_thread().name)
        return [{"y": request["x"]} for request in requests]


class _Caller:
    """A sync model that calls `inner` with its input plus one, noting its own thread."""

    def __init__(self, inner: str) -> None:
        self.inner = inner
        self.threads: List[str] = []
        self.errors: List[ModelCallError] = []

    def __call__(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        self.threads.append(threading.current_thread().name)
        try:
            return [call_model(self.inner, {"x": request["x"] + 1}) for request in requests]
        except ModelCallError as error:
            self.errors.append(error)
            raise


def _infer(url: str, model: str, value: float) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    given = httpclient.InferInput("x", [1, 1], "FP32")
    given.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    output: Optional[np.ndarray] = client.infer(model, [given]).as_numpy("y")
    assert output is not None
    return output


def _statistics(url: str, model: str) -> Dict[str, Any]:
    client = httpclient.InferenceServerClient(url)
    stats: Dict[str, Any] = client.get_inference_statistics(model, headers=HTTP_AUTH)["model_stats"][0]
    return stats


def _scheduler(triton: Triton, model: str) -> Any:
    return triton._runtime.engine.model(model).scheduler


def _batch_counts(stats: Dict[str, Any]) -> Dict[int, int]:
    """Batch size -> how many batches of that size a model's statistics count."""
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}


def _wait_for_one_failure(url: str, model: str) -> None:
    wait_until(lambda: int(_statistics(url, model)["inference_stats"]["fail"]["count"]) == 1, f"{model}'s failure")


def _bind(
    triton: Triton, name: str, model: Any, inputs: Sequence[Tensor] = INPUTS, outputs: Sequence[Tensor] = OUTPUTS
) -> None:
    triton.bind(name, model, list(inputs), list(outputs), config=ModelConfig(max_batch_size=8))


def _binding(**models: Any) -> Callable[[Triton], None]:
    """A `running_triton` bind: each named model (a callable or a list of instances) takes x and gives y."""

    def bind(triton: Triton) -> None:
        for name, model in models.items():
            _bind(triton, name, model)

    return bind


def _queue_three_behind_a_held_call(triton: Triton, inner: Any) -> Dict[str, np.ndarray]:
    """A client's call and the `caller` model's two instances' (5.0 each) wait in `inner`'s queue while it is held.

    Returns the answers by sender: `client`, `first` and `second`.
    """
    url = http_url(triton)

    def hold(held: bool) -> Callable[[], None]:
        return lambda: setattr(inner, "held", held)

    return queued_behind_a_held_batch(
        triton,
        "inner",
        hold(True),
        hold(False),
        lambda: _infer(url, "inner", 0.0),
        {
            "client": lambda: _infer(url, "inner", 5.0),
            "first": lambda: _infer(url, "caller", 5.0),
            "second": lambda: _infer(url, "caller", 5.0),
        },
    )


def _cancel_through(
    triton: Triton, outer: str, errors: List[ModelCallError], inner: str, reached: Callable[[], bool]
) -> None:
    """Sends `outer` a gRPC request that its client gives up on once `reached()`: its call to `inner` waits.

    Asserts the call failed as CANCELLED with the outer request, `inner` counted one failure and holds nothing.
    """
    given_up_over_grpc(triton, outer, reached)
    wait_until(lambda: len(errors) == 1, f"{outer}'s call error")
    assert errors[0].status.name == "CANCELLED"
    assert errors[0].message in cancelled_with_its_request(triton, outer)
    _wait_for_one_failure(http_url(triton), inner)
    assert _scheduler(triton, inner).open_requests == (0, 0)


@pytest.mark.parametrize("frontends", [None, 3], ids=["in-process", "two-frontend-processes"])
def test_an_inner_call_to_an_idle_model_runs_on_the_callers_thread_and_is_counted(frontends: Optional[int]) -> None:
    inner, caller = _Inner(), _Caller("inner")
    with running_triton(_binding(inner=inner, caller=caller), frontends=frontends) as triton:
        url = http_url(triton)
        for value in (1.0, 2.0, 3.0):
            assert _infer(url, "caller", value).tolist() == [[value + 1]]
        assert inner.threads == caller.threads  # each inner call ran on its caller's thread
        stats = _statistics(url, "inner")
        assert int(stats["inference_count"]) == 3
        assert int(stats["execution_count"]) == 3
        assert int(stats["inference_stats"]["success"]["count"]) == 3
        assert _batch_counts(stats) == {1: 3}
        assert _scheduler(triton, "inner").open_requests == (0, 0)


def test_direct_inner_calls_of_several_batch_sizes_are_each_counted_once_in_statistics_and_metrics() -> None:
    # A direct call's success is counted from its caller's thread and taken into the counters when they are read
    # (ModelStats.lone_successes), or every FOLD_EVERY calls: more calls than that, of two batch sizes in turns.
    inner = _Inner()
    calls = FOLD_EVERY + 51

    def many(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        for index in range(calls):
            rows = 1 + 2 * (index % 2)  # 1, 3, 1, 3, ...
            outputs = call_model("inner", {"x": np.repeat(requests[0]["x"], rows, axis=0)})
            assert outputs["y"].shape == (rows, 1)
        return [{"y": request["x"]} for request in requests]

    with running_triton(_binding(inner=inner, many=many)) as triton:
        url = http_url(triton)
        assert _infer(url, "many", 1.0).tolist() == [[1.0]]
        ones, threes = (calls + 1) // 2, calls // 2
        stats = _statistics(url, "inner")
        assert int(stats["inference_count"]) == ones + 3 * threes
        assert int(stats["execution_count"]) == calls
        assert int(stats["last_inference"]) > 0
        for name in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
            assert int(stats["inference_stats"][name]["count"]) == calls, name
        assert int(stats["inference_stats"]["success"]["ns"]) >= int(stats["inference_stats"]["compute_infer"]["ns"])
        assert int(stats["inference_stats"]["queue"]["ns"]) == 0
        assert _batch_counts(stats) == {1: ones, 3: threes}
        assert int(stats["inference_stats"]["fail"]["count"]) == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{triton.metrics_port}/metrics", timeout=30) as response:
            text = response.read().decode()
    counted = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("model") == "inner"
    }
    assert counted["nv_inference_request_success_total"] == calls
    assert counted["nv_inference_count_total"] == ones + 3 * threes
    assert counted["nv_inference_exec_count_total"] == calls


def test_direct_inner_calls_of_a_model_whose_latencies_metrics_observe_are_observed_each() -> None:
    # A model with latency summaries has its direct calls counted on the loop, which feeds the summaries each one.
    inner, caller = _Inner(), _Caller("inner")
    bind = _binding(inner=inner, caller=caller)
    with running_triton(bind, metrics_config=["summary_latencies=true"]) as triton:
        url = http_url(triton)
        for value in (1.0, 2.0, 3.0):
            assert _infer(url, "caller", value).tolist() == [[value + 1]]
        assert inner.threads == caller.threads  # direct calls

        def observed() -> Dict[str, float]:
            with urllib.request.urlopen(f"http://127.0.0.1:{triton.metrics_port}/metrics", timeout=30) as response:
                text = response.read().decode()
            return {
                sample.name: sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.labels.get("model") == "inner" and sample.name.endswith("_count")
            }

        wait_until(lambda: observed().get("nv_inference_request_summary_us_count") == 3, "the 3 calls observed")
        counts = observed()
        for name in ("queue", "compute_input", "compute_infer", "compute_output"):
            assert counts[f"nv_inference_{name}_summary_us_count"] == 3, name
        stats = _statistics(url, "inner")
        assert int(stats["inference_stats"]["success"]["count"]) == 3
        assert int(stats["execution_count"]) == 3


def test_a_long_calls_direct_inner_calls_are_counted_while_it_still_runs() -> None:
    # A direct call's success is counted from its caller's thread and taken in when the statistics are read: a
    # caller that makes many calls and then runs on has them counted meanwhile.
    inner, release = _Inner(), threading.Event()

    def many(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        for _ in range(200):
            call_model("inner", {"x": requests[0]["x"]})
        release.wait(60)  # held until the test has seen the counts: past its two waits of 10 s each
        return [{"y": request["x"]} for request in requests]

    with running_triton(_binding(inner=inner, many=many)) as triton:
        url = http_url(triton)
        answered: List[Any] = []

        def ask() -> None:
            try:
                answered.append(_infer(url, "many", 1.0))
            except Exception as error:  # noqa: BLE001 - the test reports it
                answered.append(error)

        client = threading.Thread(target=ask)
        client.start()
        try:
            wait_until(lambda: len(inner.batches) == 200, "the 200 inner calls")
            wait_until(
                lambda: int(_statistics(url, "inner")["inference_stats"]["success"]["count"]) == 200,
                "the inner calls counted while their caller still runs",
            )
            assert client.is_alive(), answered
        finally:
            release.set()
            client.join(10)
        assert answered[0].tolist() == [[1.0]]
        wait_until(lambda: int(_statistics(url, "inner")["inference_stats"]["success"]["count"]) == 200)


def test_inner_calls_to_a_busy_model_queue_and_batch_with_client_requests_in_its_own_thread() -> None:
    inner, caller = _Inner(), _Caller("inner")
    # Two instances of the caller: two outer requests run at once, each making its own inner call.
    with running_triton(_binding(inner=inner, caller=[caller, caller])) as triton:
        url = http_url(triton)
        results = _queue_three_behind_a_held_call(triton, inner)
        assert inner.batches == [1, 3]
        assert inner.threads[1] == inner.threads[0]  # the batch ran in the inner instance's thread
        assert inner.threads[1] not in caller.threads
        assert results["client"].tolist() == [[5.0]]
        assert results["first"].tolist() == results["second"].tolist() == [[6.0]]
        stats = _statistics(url, "inner")
        assert int(stats["inference_count"]) == 4
        assert _batch_counts(stats) == {1: 1, 3: 1}

        # Idle again: the next call runs on its caller's thread.
        assert _infer(url, "caller", 7.0).tolist() == [[8.0]]
        assert inner.threads[-1] == caller.threads[-1]


class _Watching:
    """A sync model that waits until its request is cancelled (or 10 s), noting its thread and what it saw."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.saw_cancel: List[bool] = []
        self.threads: List[str] = []

    def __call__(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        self.threads.append(threading.current_thread().name)
        self.started.set()
        deadline = time.monotonic() + 10
        while not requests[0].is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.005)
        self.saw_cancel.append(requests[0].is_cancelled())
        return [{"y": request["x"]} for request in requests]


def test_an_inner_call_on_the_callers_thread_is_cancelled_with_the_outer_request() -> None:
    watching, caller = _Watching(), _Caller("watching")
    with running_triton(_binding(watching=watching, caller=caller)) as triton:
        _cancel_through(triton, "caller", caller.errors, "watching", watching.started.is_set)
        assert watching.threads == caller.threads  # it ran on the caller's thread
        assert watching.saw_cancel == [True]


def test_a_cancel_reaches_the_inner_call_that_a_direct_inner_calls_callable_makes() -> None:
    # caller -> middle -> watching, each call direct on the caller's thread: the outer request's cancel reaches
    # middle's call, and through middle's own call path the call middle's callable makes.
    watching, middle, caller = _Watching(), _Caller("watching"), _Caller("middle")
    with running_triton(_binding(watching=watching, middle=middle, caller=caller)) as triton:
        _cancel_through(triton, "caller", caller.errors, "middle", watching.started.is_set)
        assert watching.threads == middle.threads == caller.threads  # every call ran on the caller's thread
        assert watching.saw_cancel == [True]
        assert [error.status.name for error in middle.errors] == ["CANCELLED"]
        _wait_for_one_failure(http_url(triton), "watching")
        assert _scheduler(triton, "watching").open_requests == (0, 0)


class _AsyncCaller:
    """An async model that calls `inner` with its input plus one."""

    def __init__(self, inner: str) -> None:
        self.inner = inner
        self.errors: List[ModelCallError] = []

    async def __call__(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        try:
            return [await call_model_async(self.inner, {"x": request["x"] + 1}) for request in requests]
        except ModelCallError as error:
            self.errors.append(error)
            raise


def test_an_async_callers_inner_call_to_an_idle_model_runs_in_its_thread_is_counted_and_cancelled() -> None:
    inner, watching = _Inner(), _Watching()
    caller, watcher = _AsyncCaller("inner"), _AsyncCaller("watching")
    with running_triton(_binding(inner=inner, watching=watching, caller=caller, watcher=watcher)) as triton:
        url = http_url(triton)
        for value in (1.0, 2.0):
            assert _infer(url, "caller", value).tolist() == [[value + 1]]
        assert len(set(inner.threads)) == 1 and inner.threads[0].startswith("pytriton-inner")
        stats = _statistics(url, "inner")
        assert int(stats["inference_count"]) == 2
        assert int(stats["inference_stats"]["success"]["count"]) == 2

        _cancel_through(triton, "watcher", watcher.errors, "watching", watching.started.is_set)
        assert watching.saw_cancel == [True]


def test_a_direct_inner_calls_outputs_are_checked_and_selected_as_a_responses() -> None:
    kept = {"a": np.array([[1.0]], np.float32), "b": np.array([[2.0]], np.float32)}
    seen: List[Any] = []

    def two(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        seen.append(threading.current_thread().name)
        return [kept for _ in requests]  # the same dict every time: the caller gets its own

    def undeclared(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        return [{"y": request["x"], "extra": request["x"]} for request in requests]

    def wrong(requests: List[Request]) -> List[Dict[str, Any]]:
        return [{"y": [1.0]} for _ in requests]  # a list, not an array

    def forgets(requests: List[Request]) -> List[Dict[str, Any]]:
        return [{} for _ in requests]  # `y` asked for: left out, as Triton leaves it out

    got: List[Any] = []

    def caller(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        seen.append(threading.current_thread().name)
        both = call_model("two", {"x": requests[0]["x"]})
        got.append(sorted(both))
        both.pop("a")  # the callee's own dict is not changed
        got.append(sorted(call_model("two", {"x": requests[0]["x"]}, requested_outputs=["b"])))
        got.append(sorted(call_model("undeclared", {"x": requests[0]["x"]})))
        try:
            call_model("wrong", {"x": requests[0]["x"]})
        except ModelCallError as error:
            got.append(error.message)
        got.append(sorted(call_model("forgets", {"x": requests[0]["x"]}, requested_outputs=["y"])))
        return [{"y": request["x"]} for request in requests]

    two_outputs = [Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))]

    def bind(triton: Triton) -> None:
        _bind(triton, "two", two, outputs=two_outputs)
        _binding(undeclared=undeclared, wrong=wrong, forgets=forgets, caller=caller)(triton)

    with running_triton(bind) as triton:
        url = http_url(triton)
        assert _infer(url, "caller", 1.0).tolist() == [[1.0]]
        assert seen[0] == seen[1] == seen[2]  # both calls to `two` ran on the caller's thread
        assert got[:3] == [["a", "b"], ["b"], ["y"]]
        assert "Not all values returned by `wrong` model callable are numpy arrays" in got[3]
        assert got[4] == []
        assert sorted(kept) == ["a", "b"]
        stats = _statistics(url, "two")
        assert int(stats["inference_stats"]["success"]["count"]) == 2
        assert int(stats["inference_stats"]["queue"]["count"]) == 2
        assert int(stats["inference_stats"]["compute_output"]["count"]) == 2
        _wait_for_one_failure(url, "wrong")
        assert int(_statistics(url, "wrong")["execution_count"]) == 1


def test_an_inner_calls_inputs_are_checked_as_a_clients() -> None:
    errors: List[str] = []
    two_inputs = [Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))]

    def caller(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        row = np.ones((1, 1), np.float32)
        for target, inputs in (
            ("inner", {"nope": row}),
            ("inner", {"x": np.ones((1, 1), np.complex64)}),
            ("inner", {"x": np.ones((1, 1), np.int32)}),
            ("inner", {"x": np.ones((9, 1), np.float32)}),
            ("pair", {"a": row}),
            ("pair", {"a": row, "b": np.ones((2, 1), np.float32)}),
        ):
            try:
                call_model(target, inputs)
            except ModelCallError as error:
                errors.append(error.message)
        return [{"y": request["x"]} for request in requests]

    def bind(triton: Triton) -> None:
        _bind(triton, "inner", _Inner())
        _bind(triton, "pair", lambda requests: [{"y": r["a"]} for r in requests], inputs=two_inputs)
        _bind(triton, "caller", caller)

    with running_triton(bind) as triton:
        assert _infer(http_url(triton), "caller", 1.0).tolist() == [[1.0]]
    assert errors[0] == "unexpected inference input 'nope' for model 'inner'"
    assert errors[1] == "input 'x' for model 'inner' has unsupported dtype complex64"
    assert errors[2] == "inference input 'x' data-type is 'INT32', but model 'inner' expects 'FP32'"
    assert errors[3] == "inference request batch-size must be <= 8 for 'inner'"
    assert errors[4].startswith("expected 2 inputs but got 1 inputs for model 'pair'")
    assert errors[5] == "input 'a' batch size does not match other inputs for 'pair'"
    assert len(errors) == 6


def test_an_inner_calls_checks_passed_once_are_remembered_by_signature_and_others_still_checked() -> None:
    answers: List[Any] = []
    returned: List[Any] = [np.float32, np.float32, np.float64, "list", np.int8, np.float32]

    def varying(requests: List[Request]) -> List[Dict[str, Any]]:
        kind = returned.pop(0)
        y = [1.0] if kind == "list" else np.full((1, 1), 2, kind)
        return [{"y": y} for _ in requests]

    def caller(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        row = np.ones((1, 1), np.float32)
        for inputs in (
            {"x": row},  # passes: remembered
            {"x": row},  # the same signature: passes unchecked
            {"x": np.ones((1, 1), np.int32)},  # the same name, another dtype: checked, refused
            {"x": np.ones((9, 1), np.float32)},  # another batch size: checked, refused
            {"x": np.ones((1, 2), np.float32)},  # another shape, which fits: checked, passes
            {"nope": row},
            {"x": row},
            {"x": row},
            {"x": row},
        ):
            try:
                got = call_model("varying", inputs)
                answers.append((got["y"].dtype.name, got["y"].tolist()))
            except ModelCallError as error:
                answers.append(error.message)
        return [{"y": request["x"]} for request in requests]

    with running_triton(_binding(varying=varying, caller=caller)) as triton:
        url = http_url(triton)
        assert _infer(url, "caller", 1.0).tolist() == [[1.0]]
        _wait_for_one_failure(url, "varying")
        stats = _statistics(url, "varying")
    # Returned float32 `y` passed twice; float64, then int8, each for the FP32 output, are still cast.
    assert answers[:6] == [
        ("float32", [[2.0]]),
        ("float32", [[2.0]]),
        "inference input 'x' data-type is 'INT32', but model 'varying' expects 'FP32'",
        "inference request batch-size must be <= 8 for 'varying'",
        ("float32", [[2.0]]),
        "unexpected inference input 'nope' for model 'varying'",
    ]
    assert "Not all values returned by `varying` model callable are numpy arrays" in answers[6]
    assert answers[7:] == [("float32", [[2.0]]), ("float32", [[2.0]])]
    assert returned == []  # each call whose inputs passed ran the model
    assert int(stats["inference_stats"]["success"]["count"]) == 5


_USER_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_compose_direct_user_var", default="unset")


def test_a_direct_inner_call_sees_its_callers_context_variables_and_leaves_them_as_they_were() -> None:
    seen: List[str] = []

    def inner(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        seen.append(threading.current_thread().name)
        seen.append(_USER_VAR.get())
        _USER_VAR.set("set by inner")
        return [{"y": request["x"]} for request in requests]

    def caller(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        seen.append(threading.current_thread().name)
        _USER_VAR.set("set by caller")
        call_model("inner", {"x": requests[0]["x"]})
        seen.append(_USER_VAR.get())
        call_model("inner", {"x": requests[0]["x"]})  # the caller's own path and scope are back: it calls again
        return [{"y": request["x"]} for request in requests]

    with running_triton(_binding(inner=inner, caller=caller)) as triton:
        assert _infer(http_url(triton), "caller", 1.0).tolist() == [[1.0]]
    assert seen[0] == seen[1]  # the call ran on the caller's thread
    assert seen[2:] == ["set by caller", "set by caller", seen[0], "set by caller"]


def test_a_direct_inner_calls_outputs_are_held_to_the_servers_response_limit() -> None:
    errors: List[str] = []
    threads: List[str] = []

    def big(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        threads.append(threading.current_thread().name)
        return [{"y": np.zeros((1, 128), np.float32)} for _ in requests]  # 512 bytes

    def caller(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        threads.append(threading.current_thread().name)
        try:
            call_model("big", {"x": requests[0]["x"]})
        except ModelCallError as error:
            errors.append(error.message)
        return [{"y": request["x"]} for request in requests]

    triton = Triton(
        config=TritonConfig(http_port=0, grpc_port=0, allow_metrics=False),
        limits=ServerLimits(max_response_bytes=256),
        security_config=TritonSecurityConfig(access_token=ACCESS_TOKEN),
    )
    try:
        _binding(big=big, caller=caller)(triton)
        triton.run()
        assert _infer(http_url(triton), "caller", 1.0).tolist() == [[1.0]]
    finally:
        triton.stop()
    assert threads[0] == threads[1]  # the call ran on the caller's thread
    assert errors == [
        "the outputs 'y' returned by model 'big' take 512 bytes, more than the 256 bytes a response may carry on "
        "this server"
    ]


def test_a_direct_inner_calls_custom_metrics_carry_the_inner_model() -> None:
    family = MetricFamily("test_compose_direct_calls", "Calls counted by each callable", MetricFamily.COUNTER)
    threads: List[str] = []

    def inner(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        threads.append(threading.current_thread().name)
        family.Metric(labels={"by": "inner"}).increment()
        return [{"y": request["x"]} for request in requests]

    def caller(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        threads.append(threading.current_thread().name)
        outputs = call_model("inner", {"x": requests[0]["x"]})
        family.Metric(labels={"by": "caller"}).increment()  # after the call: the caller's own scope again
        return [outputs]

    with running_triton(_binding(inner=inner, caller=caller)) as triton:
        assert _infer(http_url(triton), "caller", 1.0).tolist() == [[1.0]]
        with urllib.request.urlopen(f"http://127.0.0.1:{triton.metrics_port}/metrics", timeout=30) as response:
            text = response.read().decode()
    assert threads[0] == threads[1]  # the call ran on the caller's thread
    families = {family.name: family for family in text_string_to_metric_families(text)}
    labels = sorted(
        (sample.labels["by"], sample.labels["model"], sample.value)
        for sample in families["test_compose_direct_calls"].samples
        if sample.name.endswith("_total")
    )
    assert labels == [("caller", "caller", 1.0), ("inner", "inner", 1.0)]


class _AsyncInner:
    """An async model that notes each batch's size and the task that ran it, and waits while `held`."""

    def __init__(self) -> None:
        self.held = False
        self.batches: List[int] = []
        self.tasks: List[str] = []
        self.task_ids: List[int] = []
        self.saw_cancel: List[bool] = []

    async def __call__(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.append(task.get_coro().__qualname__)  # type: ignore[union-attr]
        self.task_ids.append(id(task))
        self.batches.append(len(requests))
        deadline = time.monotonic() + 10
        while self.held and not requests[0].is_cancelled() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        self.saw_cancel.append(requests[0].is_cancelled())
        return [{"y": request["x"]} for request in requests]


def test_a_sync_callers_inner_call_to_an_idle_async_model_is_awaited_at_once_and_counted() -> None:
    inner, caller = _AsyncInner(), _Caller("inner")
    with running_triton(_binding(inner=inner, caller=[caller, caller])) as triton:
        url = http_url(triton)
        for value in (1.0, 2.0):
            assert _infer(url, "caller", value).tolist() == [[value + 1]]
        assert inner.tasks == ["_await_here"] * 2  # a task of its own, not a batch's
        stats = _statistics(url, "inner")
        assert int(stats["inference_stats"]["success"]["count"]) == 2
        assert int(stats["execution_count"]) == 2
        assert _batch_counts(stats) == {1: 2}

        # Busy: the callers' calls queue and batch with a client's request.
        results = _queue_three_behind_a_held_call(triton, inner)
        assert inner.batches[2:] == [1, 3]
        assert results["client"].tolist() == [[5.0]]
        assert results["first"].tolist() == results["second"].tolist() == [[6.0]]
        assert _scheduler(triton, "inner").open_requests == (0, 0)


def test_a_sync_callers_inner_call_awaited_at_once_is_cancelled_with_the_outer_request() -> None:
    inner, caller = _AsyncInner(), _Caller("inner")
    inner.held = True
    with running_triton(_binding(inner=inner, caller=caller)) as triton:
        _cancel_through(triton, "caller", caller.errors, "inner", lambda: inner.batches == [1])
        assert inner.tasks == ["_await_here"]
        assert inner.saw_cancel == [True]


def test_a_sync_callers_inner_call_awaited_at_once_fails_with_the_inner_models_message() -> None:
    caller = _Caller("failing")

    async def failing(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        raise ValueError("no good")

    with running_triton(_binding(failing=failing, caller=caller)) as triton:
        url = http_url(triton)
        with pytest.raises(InferenceServerException) as failed:
            _infer(url, "caller", 1.0)
        assert "ValueError: no good" in str(failed.value)
        assert caller.errors[0].status.name == "INTERNAL" and caller.errors[0].message == "ValueError: no good"
        _wait_for_one_failure(url, "failing")
        assert int(_statistics(url, "failing")["execution_count"]) == 1


def test_a_sync_callers_inner_call_awaited_at_once_is_answered_at_the_servers_cut_off() -> None:
    inner, caller = _AsyncInner(), _Caller("inner")
    inner.held = True
    outcomes: List[Any] = []

    def send(url: str) -> None:
        try:
            outcomes.append(_infer(url, "caller", 1.0))
        except InferenceServerException as error:
            outcomes.append(error)

    with running_triton(_binding(inner=inner, caller=caller), exit_timeout_secs=1) as triton:
        client = threading.Thread(target=send, args=(http_url(triton),))
        client.start()
        wait_until(lambda: inner.tasks == ["_await_here"])
        stopping = threading.Thread(target=triton.stop)
        stopping.start()
        wait_until(lambda: len(caller.errors) == 1)  # answered at the cut-off, not when the call ends
        inner.held = False
        stopping.join(10)
        client.join(10)
    assert caller.errors[0].status.name == "UNAVAILABLE"
    assert caller.errors[0].message == "model 'inner' stopped before the request was served"
    assert len(outcomes) == 1 and isinstance(outcomes[0], InferenceServerException)


class _AsyncTaskCaller(_AsyncCaller):
    """`_AsyncCaller`, noting the task each of its calls runs in."""

    def __init__(self, inner: str) -> None:
        super().__init__(inner)
        self.task_ids: List[int] = []

    async def __call__(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        self.task_ids.append(id(asyncio.current_task()))
        return await super().__call__(requests)


def test_an_async_callers_inner_call_to_an_idle_async_model_is_awaited_in_the_callers_task_and_counted() -> None:
    inner, caller = _AsyncInner(), _AsyncTaskCaller("inner")
    with running_triton(_binding(inner=inner, caller=[caller, caller])) as triton:
        url = http_url(triton)
        for value in (1.0, 2.0):
            assert _infer(url, "caller", value).tolist() == [[value + 1]]
        assert inner.task_ids == caller.task_ids  # no task of its own
        stats = _statistics(url, "inner")
        assert int(stats["inference_stats"]["success"]["count"]) == 2
        assert int(stats["execution_count"]) == 2
        assert _batch_counts(stats) == {1: 2}

        # Busy: the callers' calls queue and batch with a client's request.
        results = _queue_three_behind_a_held_call(triton, inner)
        assert inner.batches[2:] == [1, 3]
        assert results["client"].tolist() == [[5.0]]
        assert results["first"].tolist() == results["second"].tolist() == [[6.0]]
        assert _scheduler(triton, "inner").open_requests == (0, 0)


def test_an_async_callers_inner_call_awaited_in_its_task_is_cancelled_with_the_outer_request() -> None:
    inner, caller = _AsyncInner(), _AsyncTaskCaller("inner")
    inner.held = True
    with running_triton(_binding(inner=inner, caller=caller)) as triton:
        _cancel_through(triton, "caller", caller.errors, "inner", lambda: inner.batches == [1])
        assert inner.task_ids == caller.task_ids
        assert inner.saw_cancel == [True]


def test_an_async_callers_inner_call_awaited_in_its_task_fails_with_the_inner_models_message() -> None:
    caller = _AsyncCaller("failing")

    async def failing(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        raise ValueError("no good")

    with running_triton(_binding(failing=failing, caller=caller)) as triton:
        url = http_url(triton)
        with pytest.raises(InferenceServerException) as failed:
            _infer(url, "caller", 1.0)
        assert "ValueError: no good" in str(failed.value)
        assert caller.errors[0].status.name == "INTERNAL" and caller.errors[0].message == "ValueError: no good"
        _wait_for_one_failure(url, "failing")
        assert int(_statistics(url, "failing")["execution_count"]) == 1


def test_an_async_callers_inner_call_awaited_in_its_task_leaves_its_context_variables_as_they_were() -> None:
    seen: List[Any] = []

    async def inner(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        seen.append(id(asyncio.current_task()))
        seen.append(_USER_VAR.get())
        _USER_VAR.set("set by inner")
        await asyncio.sleep(0)  # a step after a wait runs in the call's context too
        seen.append(_USER_VAR.get())
        return [{"y": request["x"]} for request in requests]

    async def caller(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        seen.append(id(asyncio.current_task()))
        _USER_VAR.set("set by caller")
        await call_model_async("inner", {"x": requests[0]["x"]})
        seen.append(_USER_VAR.get())
        return [{"y": request["x"]} for request in requests]

    with running_triton(_binding(inner=inner, caller=caller)) as triton:
        assert _infer(http_url(triton), "caller", 1.0).tolist() == [[1.0]]
    assert seen[0] == seen[1]  # the call was awaited in the caller's task
    assert seen[2:] == ["set by caller", "set by inner", "set by caller"]


def test_an_inner_call_awaited_in_its_callers_task_that_the_caller_stops_awaiting_sees_is_cancelled() -> None:
    """asyncio.wait_for over call_model_async: the cancel reaches the callable as is_cancelled(), never thrown in."""
    inner = _AsyncInner()
    outcomes: List[str] = []

    async def caller(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        try:
            await asyncio.wait_for(call_model_async("inner", {"x": requests[0]["x"]}), 0.2)
        except asyncio.TimeoutError:
            outcomes.append("timed out")
        return [{"y": request["x"]} for request in requests]

    with running_triton(_binding(inner=inner, caller=caller)) as triton:
        url = http_url(triton)
        inner.held = True
        assert _infer(url, "caller", 1.0).tolist() == [[1.0]]
        assert outcomes == ["timed out"]
        wait_until(lambda: inner.saw_cancel == [True], "the inner callable saw is_cancelled()")
        _wait_for_one_failure(url, "inner")
        assert _scheduler(triton, "inner").open_requests == (0, 0)
        inner.held = False
        assert _infer(url, "caller", 2.0).tolist() == [[2.0]]  # its instance is free again
        # Awaited where wait_for awaits the call (a task of wait_for's own before Python 3.12), not in a batch's task
        assert len(inner.tasks) == 2 and "Scheduler._run" not in inner.tasks
