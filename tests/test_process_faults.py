"""Process instances when things go wrong: a process killed mid-batch, hung, short of shared memory, a server killed."""

from __future__ import annotations

import itertools
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import subprocess
import textwrap
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Set, Tuple

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import pytriton.ipc.spawn
from pytriton.exceptions import PyTritonUnrecoverableError
from pytriton.instances import ProcessInstances
from pytriton.ipc.spawn import LEAST_GRACE_S
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import http_url, memfds_held, running_triton
from tests.fleet import wait_until
from tests.pids import alive, started_at
from tests.server_process import WAIT_S, namespaces, start_script, stop_script

IO = {
    "inputs": [Tensor(name="x", dtype=np.float32, shape=(-1,))],
    "outputs": [Tensor(name="pid", dtype=np.int64, shape=(1,)), Tensor(name="y", dtype=np.float32, shape=(-1,))],
}
UNBATCHED = ModelConfig(batching=False)
REPO = pathlib.Path(__file__).resolve().parents[1]
# What a stop may take past the moment it should end: closing the ports, killing and reaping processes, on a
# machine as loaded as a shared CI runner (two cores, a dozen runnable processes: 0.93 s was seen). Every wrong
# stop the tests below tell apart from the right one ends far later (LONG_GRACE_S, a 120 s call), or is cut off
# by the stop's own limit, OVERRUN_S (10 s) past exit_timeout_secs.
STOP_MARGIN_S = 5.0
# EXIT_GRACE_S while the stop tests run: a stop that waited for it instead of the deadline would take a minute.
LONG_GRACE_S = 60.0


def fragile(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Echoes; a negative input kills the process with SIGKILL, one over 1000 exits it with status 3."""
    for request in requests:
        x = request["x"]
        if (x < 0).any():
            os.kill(os.getpid(), signal.SIGKILL)
        if (x > 1000).any():
            os._exit(3)
        if x.size and x.flat[0] > 0 and x.flat[0] < 100:
            time.sleep(float(x.flat[0]) / 1000)  # 1..99: milliseconds of work
    return [{"pid": np.array([os.getpid()], dtype=np.int64), "y": request["x"]} for request in requests]


def gated_start_factory() -> Any:
    """Loads only once the gate file the test names is gone (a restart the test holds back, then lets go)."""
    gate = os.environ["START_GATE"]
    while os.path.exists(gate):
        time.sleep(0.01)
    return fragile


def sleeps(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Sleeps as many seconds as its input says, once it has left a file named after its pid in $CALLED_DIR."""
    (pathlib.Path(os.environ["CALLED_DIR"]) / str(os.getpid())).touch()
    time.sleep(float(requests[0]["x"].flat[0]))
    return [{"pid": np.array([os.getpid()], dtype=np.int64), "y": request["x"]} for request in requests]


def unrecoverable(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    raise PyTritonUnrecoverableError("the device is gone")


def _client(triton: Triton) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(http_url(triton), network_timeout=60)


def _infer(client: httpclient.InferenceServerClient, model: str, x: np.ndarray) -> Dict[str, np.ndarray]:
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(model, [tensor])
    return {"pid": result.as_numpy("pid"), "y": result.as_numpy("y")}


def _instance_pids() -> Set[int]:
    """Processes of this test process that are instance processes."""
    found = set()
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and b"pytriton.core.process_instances.host" in cmdline:
            found.add(int(entry.name))
    return found


def _serving_again(caplog: pytest.LogCaptureFixture) -> List[str]:
    """The log lines that say an instance's new process is up (logged once it serves, not when it is spawned)."""
    return [record.getMessage() for record in caplog.records if "is serving again" in record.getMessage()]


def test_a_process_killed_mid_batch_fails_only_its_batch_and_comes_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "pytriton")

    def bind(triton: Triton) -> None:
        triton.bind("fragile", ProcessInstances(fragile, count=2), **IO, config=UNBATCHED)

    with running_triton(bind) as triton:
        before = _instance_pids()
        failures: List[str] = []
        served: List[int] = []  # the pid that answered each request of the load
        stop = threading.Event()
        came_back = threading.Event()  # a process started after the faults answered a request

        def load() -> None:
            with _client(triton) as client:
                while not stop.is_set():
                    try:
                        pid = int(_infer(client, "fragile", np.array([2.0], np.float32))["pid"][0])
                    except Exception as error:  # noqa: BLE001 - counted: the test expects none
                        failures.append(repr(error))
                        continue
                    served.append(pid)
                    if pid not in before:
                        came_back.set()

        threads = [threading.Thread(target=load) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            wait_until(lambda: len(served) >= 50, WAIT_S, "the load to be served 50 times")
            with _client(triton) as client, pytest.raises(httpclient.InferenceServerException) as killed:
                _infer(client, "fragile", np.array([-1.0], np.float32))
            with _client(triton) as client, pytest.raises(httpclient.InferenceServerException) as exited:
                _infer(client, "fragile", np.array([5000.0], np.float32))
            wait_until(lambda: len(_serving_again(caplog)) == 2, WAIT_S, "a new process for each that ended")
            assert came_back.wait(WAIT_S), "no request was served by a restarted instance"
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        with _client(triton) as client:
            assert client.is_model_ready("fragile")
    assert failures == []
    assert "model 'fragile' instance" in str(killed.value) and "SIGKILL" in str(killed.value)
    assert "exited with status 3" in str(exited.value)
    assert len(_instance_pids()) == 0  # stopped with the server


def forks(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Forks a child that sleeps (its pid in `pid`) for input 1, exits with status 3 for input 2, else echoes."""
    x = float(requests[0]["x"].flat[0])
    pid = os.getpid()
    if x == 1:
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
    if x == 2:
        os._exit(3)
    return [{"pid": np.array([pid], dtype=np.int64), "y": request["x"]} for request in requests]


def test_a_process_whose_forked_child_lives_on_is_seen_to_die_and_the_child_is_killed() -> None:
    """The child held copies of the process's channel: its batch failed only once the child ended.

    Once the death is seen, what the process forked is killed: it lived on beside the process started again.
    """

    def bind(triton: Triton) -> None:
        triton.bind("forks", ProcessInstances(forks), **IO, config=UNBATCHED)

    with running_triton(bind) as triton:
        client = httpclient.InferenceServerClient(http_url(triton), network_timeout=20)
        child = int(_infer(client, "forks", np.array([1.0], np.float32))["pid"][0])
        started = started_at(child)
        try:
            with pytest.raises(InferenceServerException, match="exited with status 3"):
                _infer(client, "forks", np.array([2.0], np.float32))
            wait_until(lambda: not alive(child, started), WAIT_S, "the dead instance's child to be killed")
            assert _infer(client, "forks", np.array([3.0], np.float32))["y"].tolist() == [3.0]
        finally:
            client.close()
            if alive(child, started):
                os.kill(child, signal.SIGKILL)


def test_processes_a_model_forked_do_not_outlive_the_stop() -> None:
    """They lived on, orphans, after the server stopped (holding whatever the model had open)."""

    def bind(triton: Triton) -> None:
        triton.bind("forks", ProcessInstances(forks), **IO, config=UNBATCHED)

    with running_triton(bind) as triton:
        client = httpclient.InferenceServerClient(http_url(triton), network_timeout=20)
        try:
            child = int(_infer(client, "forks", np.array([1.0], np.float32))["pid"][0])
        finally:
            client.close()
        started = started_at(child)
    try:
        # SIGKILLed in the stop, reaped by init: a moment may pass before it leaves /proc
        wait_until(lambda: not alive(child, started), WAIT_S, "the forked process to be gone")
    finally:
        if alive(child, started):
            os.kill(child, signal.SIGKILL)


def trapped(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Echoes after 5 ms; the first batch of several requests once the test arms the trap waits to be killed.

    That batch claims the trap (renames $TRAP_DIR/armed, atomic among the processes) and writes its
    pid and request ids to $TRAP_DIR/batch.json before it sleeps.
    """
    folder = pathlib.Path(os.environ["TRAP_DIR"])
    if len(requests) > 1:
        try:
            (folder / "armed").rename(folder / "sprung")
        except OSError:
            pass
        else:
            ids = [int(request["x"].flat[0]) for request in requests]
            (folder / "batch.tmp").write_text(json.dumps({"pid": os.getpid(), "ids": ids}))
            (folder / "batch.tmp").rename(folder / "batch.json")
            time.sleep(60)
    time.sleep(0.005)
    return [{"pid": np.array([[os.getpid()]], dtype=np.int64), "y": request["x"]} for request in requests]


def test_sigkill_of_a_process_holding_a_dynamic_batch_fails_exactly_that_batch(tmp_path: pathlib.Path) -> None:
    batching = ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=5000))

    def bind(triton: Triton) -> None:
        instances = ProcessInstances(trapped, count=2, env={"TRAP_DIR": str(tmp_path)})
        triton.bind("batched", instances, **IO, config=batching)

    with running_triton(bind) as triton:
        before = _instance_pids()
        served: Dict[int, int] = {}  # request id -> pid of the process that answered
        failed: Dict[int, str] = {}
        ids = itertools.count(1)
        stop = threading.Event()
        came_back = threading.Event()  # a process started after the kill answered a request

        def load() -> None:
            with _client(triton) as client:
                while not stop.is_set():
                    request_id = next(ids)
                    try:
                        result = _infer(client, "batched", np.array([[request_id]], np.float32))
                    except httpclient.InferenceServerException as error:
                        failed[request_id] = str(error)
                        continue
                    served[request_id] = int(result["pid"].flat[0])
                    if served[request_id] not in before:
                        came_back.set()

        # More requests in flight than a batch holds: the load needs both instances (a free one is taken
        # last-freed first, so a load one instance can carry would never reach the one that came back).
        threads = [threading.Thread(target=load) for _ in range(16)]
        for thread in threads:
            thread.start()
        try:
            wait_until(
                lambda: len(served) >= 100 and set(served.values()) == before,
                WAIT_S,
                "both instances to serve the load",
            )
            (tmp_path / "armed").touch()
            batch_file = tmp_path / "batch.json"
            wait_until(batch_file.exists, WAIT_S, "a batch of several requests to spring the trap", 0.002)
            trap = json.loads(batch_file.read_text())
            os.kill(trap["pid"], signal.SIGKILL)  # from outside, as the OOM killer or an operator would
            # Not the new process's pid showing up: it serves only once it has imported and built the model,
            # which on a loaded machine took longer than the second the load used to go on for.
            assert came_back.wait(WAIT_S), "the instance that came back served nothing"
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        with _client(triton) as client:
            assert client.is_model_ready("batched")
        after = _instance_pids()
    assert len(trap["ids"]) > 1
    assert set(failed) == set(trap["ids"]), failed
    for message in failed.values():
        assert "model 'batched' instance" in message, message
        assert f"(pid {trap['pid']}) was killed by signal SIGKILL" in message, message
    assert trap["pid"] in before and trap["pid"] not in after and len(after) == 2
    (restarted,) = after - before
    assert restarted in served.values()


def _pending(triton: Triton, model: str) -> int:
    """Requests waiting in a model's queue, as the metrics endpoint says."""
    url = f"http://127.0.0.1:{triton.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=WAIT_S) as response:
        text = response.read().decode()
    match = re.search(rf'^nv_inference_pending_request_count\{{model="{model}",version="1"\}} (\d+)', text, re.M)
    assert match, text
    return int(match.group(1))


def test_the_model_is_not_ready_while_its_only_process_restarts(tmp_path: pathlib.Path) -> None:
    gate = tmp_path / "gate"

    def bind(triton: Triton) -> None:
        instances = ProcessInstances(factory=gated_start_factory, env={"START_GATE": str(gate)})
        triton.bind("single", instances, **IO, config=UNBATCHED)

    with running_triton(bind) as triton, _client(triton) as client, ThreadPoolExecutor(1) as pool:
        assert client.is_model_ready("single")
        gate.touch()  # the next process waits in its factory until the gate is gone
        with pytest.raises(httpclient.InferenceServerException):
            _infer(client, "single", np.array([-1.0], np.float32))
        assert not client.is_model_ready("single")

        def queued() -> Dict[str, np.ndarray]:
            with _client(triton) as own:
                return _infer(own, "single", np.array([0.0], np.float32))

        answer = pool.submit(queued)
        wait_until(lambda: _pending(triton, "single") == 1, WAIT_S, "the request to wait in the queue")
        assert not client.is_model_ready("single")
        gate.unlink()
        assert answer.result(WAIT_S)["y"].tolist() == [0.0]  # served by the new process
        assert client.is_model_ready("single")


def test_requests_go_to_the_live_instance_while_one_killed_idle_restarts(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "pytriton")
    gate = tmp_path / "gate"

    def bind(triton: Triton) -> None:
        instances = ProcessInstances(factory=gated_start_factory, count=2, env={"START_GATE": str(gate)})
        triton.bind("pair", instances, **IO, config=UNBATCHED)

    def died() -> bool:
        return any("was killed by signal SIGKILL; starting it again" in r.getMessage() for r in caplog.records)

    with running_triton(bind) as triton, _client(triton) as client:
        # Requests one at a time all go to the instance freed last: the one the next request would get.
        last = int(_infer(client, "pair", np.array([0.0], np.float32))["pid"][0])
        gate.touch()  # its next process waits in its factory until the gate is gone
        os.kill(last, signal.SIGKILL)  # idle: it held no batch
        wait_until(died, WAIT_S, "the server to see the process die")
        assert client.is_model_ready("pair")  # the other instance serves
        # Each failed with "is not running" while the dead one was the first free instance.
        served = [int(_infer(client, "pair", np.array([0.0], np.float32))["pid"][0]) for _ in range(3)]
        assert last not in served and len(set(served)) == 1
        gate.unlink()
        wait_until(lambda: len(_serving_again(caplog)) == 1, WAIT_S, "the killed instance to serve again")
        assert _infer(client, "pair", np.array([1.0], np.float32))["y"].tolist() == [1.0]


def _named_segments() -> Set[str]:
    """POSIX segments this process could have left (where memfd is missing they are named after its pid)."""
    return {name for name in os.listdir("/dev/shm") if str(os.getpid()) in name}


def test_stop_leaves_no_process_and_no_shared_memory() -> None:
    before = _named_segments()
    held_before = memfds_held()

    def bind(triton: Triton) -> None:
        triton.bind("fragile", ProcessInstances(fragile, count=3), **IO, config=UNBATCHED)

    with running_triton(bind) as triton, _client(triton) as client:
        x = np.ones(1 << 18, dtype=np.float32)  # 1 MiB: through the arenas
        assert np.array_equal(_infer(client, "fragile", x)["y"], x)
        assert len(_instance_pids()) == 3
        assert memfds_held() - held_before
    assert _instance_pids() == set()
    assert memfds_held() <= held_before
    assert _named_segments() == before


@pytest.fixture
def long_grace(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """EXIT_GRACE_S is LONG_GRACE_S: a process told to exit that waited it out would hold the stop for a minute."""
    monkeypatch.setattr(pytriton.ipc.spawn, "EXIT_GRACE_S", LONG_GRACE_S)
    yield


def _sleeps_model(tmp_path: pathlib.Path) -> ProcessInstances:
    """Model "sleeps" (one process), which leaves its pid in tmp_path/called when a call begins."""
    (tmp_path / "called").mkdir()
    return ProcessInstances(sleeps, env={"CALLED_DIR": str(tmp_path / "called")})


def _call_that_sleeps(triton: Triton, tmp_path: pathlib.Path) -> Tuple[Callable[[], None], List[Exception]]:
    """A function that calls model "sleeps" for 120 s in a thread and returns once the call runs in the model,
    and the list the call's failure goes to (the stop fails it)."""
    failed: List[Exception] = []

    def call() -> None:
        with _client(triton) as client:
            try:
                _infer(client, "sleeps", np.array([120.0], np.float32))
            except Exception as error:  # noqa: BLE001 - the stop fails it; the test reads it
                failed.append(error)

    def start() -> None:
        threading.Thread(target=call, daemon=True).start()
        wait_until(lambda: any((tmp_path / "called").iterdir()), WAIT_S, "the call to run in the model")

    return start, failed


def test_a_hung_instance_cannot_hold_stop_past_the_exit_timeout(tmp_path: pathlib.Path, long_grace: None) -> None:
    triton = Triton(config=TritonConfig(http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=1))
    start_call, failed = _call_that_sleeps(triton, tmp_path)
    try:
        triton.bind("sleeps", _sleeps_model(tmp_path), **IO, config=UNBATCHED)
        triton.run()
        start_call()
        assert len(_instance_pids()) == 1
    finally:
        started = time.monotonic()
        triton.stop()
    took = time.monotonic() - started
    assert 1 <= took < 1 + STOP_MARGIN_S, f"stop took {took:.2f} s"  # exit_timeout_secs, then the process is killed
    wait_until(lambda: bool(failed), WAIT_S, "the stopped call to fail")
    assert isinstance(failed[0], httpclient.InferenceServerException)
    assert _instance_pids() == set()


def lingering_factory() -> Any:
    """A model that starts a thread which never ends and is no daemon: it would hold the interpreter's exit."""
    threading.Thread(target=threading.Event().wait, name="model-poller").start()
    return fragile


def test_an_idle_instance_whose_model_left_a_thread_running_does_not_hold_stop(
    capfd: pytest.CaptureFixture[str], long_grace: None
) -> None:
    # A process held by its thread would be killed at the stop's deadline, 30 s on: the stop would take that long,
    # and the process would not say it exits.
    triton = Triton(config=TritonConfig(http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=30))
    try:
        triton.bind("lingering", ProcessInstances(factory=lingering_factory, count=2), **IO, config=UNBATCHED)
        triton.run()
        with _client(triton) as client:
            assert _infer(client, "lingering", np.array([1.0], np.float32))["y"].tolist() == [1.0]
        assert len(_instance_pids()) == 2
    finally:
        started = time.monotonic()
        triton.stop()
    took = time.monotonic() - started
    assert took < STOP_MARGIN_S, f"stop took {took:.2f} s"
    assert _instance_pids() == set()
    assert capfd.readouterr().err.count("exits without waiting for threads of its model: model-poller") == 2


def hangs_at_exit_factory() -> Any:
    """A model whose exit never ends (an atexit handler that hangs): only a kill stops its process."""
    import atexit

    atexit.register(threading.Event().wait)
    return fragile


def test_an_idle_process_that_will_not_exit_is_killed_at_the_stop_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle process that will not exit is killed at the stop's deadline, LEAST_GRACE_S after it was told at the
    soonest, and EXIT_GRACE_S after it was told when no deadline comes sooner."""
    import asyncio

    from pytriton.core.process_instances.instance import start_instances

    plan = ProcessInstances(factory=hangs_at_exit_factory).plan("hangs_at_exit", None)

    async def start_then_close(deadline_in_s: float) -> Tuple[float, int]:
        (instance,) = await start_instances(plan)
        pid = instance._link.pid
        started = time.monotonic()
        await instance.close(deadline=started + deadline_in_s)
        return time.monotonic() - started, pid

    grace_s = pytriton.ipc.spawn.EXIT_GRACE_S
    took, pid = asyncio.run(start_then_close(LONG_GRACE_S))
    assert grace_s <= took < grace_s + STOP_MARGIN_S  # no deadline sooner: EXIT_GRACE_S
    assert not _alive(pid)
    # From here a process that waited out EXIT_GRACE_S instead of the deadline would be a minute late.
    monkeypatch.setattr(pytriton.ipc.spawn, "EXIT_GRACE_S", LONG_GRACE_S)
    took, pid = asyncio.run(start_then_close(1.0))
    assert 1.0 <= took < 1.0 + STOP_MARGIN_S
    assert not _alive(pid)
    took, pid = asyncio.run(start_then_close(-1.0))  # the deadline is over: LEAST_GRACE_S still
    assert LEAST_GRACE_S <= took < LEAST_GRACE_S + STOP_MARGIN_S
    assert not _alive(pid)


def _stopping_waits(caplog: pytest.LogCaptureFixture) -> bool:
    """Whether the stop's drain has begun to wait for the requests still open."""
    return any(record.getMessage().startswith("stopping: waiting up to") for record in caplog.records)


def test_a_hurried_stop_gives_a_process_that_will_not_exit_only_the_least_grace(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture, long_grace: None
) -> None:
    """A second signal (hurry) while the drain waits: the idle process that hangs at exit is killed after LEAST_GRACE_S.

    Before, it had EXIT_GRACE_S whatever the hurry.
    """
    caplog.set_level(logging.INFO, "pytriton")
    triton = Triton(config=TritonConfig(http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=600))
    start_call, failed = _call_that_sleeps(triton, tmp_path)
    stopper = threading.Thread(target=triton.stop)
    try:
        triton.bind("hangs_at_exit", ProcessInstances(factory=hangs_at_exit_factory), **IO, config=UNBATCHED)
        triton.bind("sleeps", _sleeps_model(tmp_path), **IO, config=UNBATCHED)
        triton.run()
        with _client(triton) as client:
            hung_pid = int(_infer(client, "hangs_at_exit", np.array([1.0], np.float32))["pid"][0])
        start_call()
        stopper.start()  # the drain waits for the call (exit_timeout_secs 600)
        wait_until(lambda: _stopping_waits(caplog), WAIT_S, "the stop to wait for the call")
        assert stopper.is_alive()
    finally:
        started = time.monotonic()
        triton._hurry()
        stopper.join(timeout=LONG_GRACE_S + WAIT_S)
    took = time.monotonic() - started
    assert not stopper.is_alive()
    assert LEAST_GRACE_S <= took < LEAST_GRACE_S + STOP_MARGIN_S, f"a hurried stop took {took:.2f} s"
    wait_until(lambda: bool(failed), WAIT_S, "the stopped call to fail")
    assert isinstance(failed[0], httpclient.InferenceServerException)
    assert not _alive(hung_pid)
    assert _instance_pids() == set()


def exits_gracefully_factory() -> Any:
    """A model whose process leaves its pid in $EXITED_DIR when it exits by itself (atexit; a SIGKILL skips it)."""
    import atexit

    atexit.register((pathlib.Path(os.environ["EXITED_DIR"]) / str(os.getpid())).touch)
    return fragile


@pytest.mark.parametrize("in_flight", [False, True], ids=["idle", "a-hung-call-drains-until-the-deadline"])
def test_stop_gives_a_process_that_will_not_exit_only_what_is_left_of_the_exit_timeout(
    in_flight: bool, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, long_grace: None
) -> None:
    """The stop's one deadline (exit_timeout_secs) bounds the drain and the processes' exit; a healthy one exits.

    Idle, the processes are told to exit at once and have until the deadline, 3 s. With a call that drains until
    the deadline (1 s), they are told then, and get LEAST_GRACE_S, made 3 s here: on a loaded machine the healthy
    process may need more than the real 0.5 s to exit, and would then be killed.
    """
    exit_timeout_s = 1 if in_flight else 3
    least_grace_s = 3.0 if in_flight else LEAST_GRACE_S
    monkeypatch.setattr(pytriton.ipc.spawn, "LEAST_GRACE_S", least_grace_s)
    exited = tmp_path / "exited"
    exited.mkdir()
    triton = Triton(config=TritonConfig(http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=exit_timeout_s))
    start_call, failed = _call_that_sleeps(triton, tmp_path)
    try:
        triton.bind("hangs_at_exit", ProcessInstances(factory=hangs_at_exit_factory), **IO, config=UNBATCHED)
        healthy = ProcessInstances(factory=exits_gracefully_factory, env={"EXITED_DIR": str(exited)})
        triton.bind("healthy", healthy, **IO, config=UNBATCHED)
        triton.bind("sleeps", _sleeps_model(tmp_path), **IO, config=UNBATCHED)
        triton.run()
        with _client(triton) as client:
            hung_pid = int(_infer(client, "hangs_at_exit", np.array([1.0], np.float32))["pid"][0])
            healthy_pid = int(_infer(client, "healthy", np.array([1.0], np.float32))["pid"][0])
        if in_flight:
            start_call()
        assert len(_instance_pids()) == 3
    finally:
        started = time.monotonic()
        triton.stop()
    took = time.monotonic() - started
    if in_flight:
        wait_until(lambda: bool(failed), WAIT_S, "the stopped call to fail")
        assert isinstance(failed[0], httpclient.InferenceServerException)
    # Past the deadline a process told to exit still gets LEAST_GRACE_S, so that a healthy one exits.
    least = exit_timeout_s + (least_grace_s if in_flight else 0)
    assert least <= took < least + STOP_MARGIN_S, f"stop took {took:.2f} s with exit_timeout_secs={exit_timeout_s}"
    assert not _alive(hung_pid)
    assert _instance_pids() == set()
    assert os.listdir(exited) == [str(healthy_pid)]  # killed, it would have left nothing


FD_STARVED_SERVER = textwrap.dedent(
    """
    import os, resource
    import numpy as np
    from pytriton.instances import ProcessInstances
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    held = []

    def total(requests):
        return [{"total": np.array([request["x"].sum()], dtype=np.float64)} for request in requests]

    def starve(requests):
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        return [{"total": np.array([len(held)], dtype=np.float64)} for _ in requests]

    def feed(requests):
        while held:
            os.close(held.pop())
        return [{"total": np.array([0.0])} for _ in requests]

    if __name__ == "__main__":
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        io = {
            "inputs": [Tensor(name="x", dtype=np.float32, shape=(-1,))],
            "outputs": [Tensor(name="total", dtype=np.float64, shape=(1,))],
            "config": ModelConfig(batching=False),
        }
        with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as triton:
            triton.bind("total", ProcessInstances(total), **io)
            triton.bind("starve", starve, **io)  # thread instances: they run in the server's process
            triton.bind("feed", feed, **io)
            triton.bind("fresh", total, **io)  # a thread instance first called once no descriptor is left
            triton.run()
            print(triton.http_port, flush=True)
            triton.serve()
    """
)


def _start_fd_starved_server(tmp_path: pathlib.Path, script_text: str) -> Tuple[subprocess.Popen[str], int]:
    """Start a script server under RLIMIT_NOFILE 256; it prints lines, then its HTTP port."""
    server = start_script(tmp_path, script_text)
    assert server.stdout is not None
    lines = []
    for line in server.stdout:
        if line.strip().isdigit():
            return server, int(line)
        lines.append(line)
    stop_script(server)
    raise AssertionError(f"the server did not start: {lines}")


def _total(client: httpclient.InferenceServerClient, model: str, x: np.ndarray) -> float:
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return float(client.infer(model, [tensor]).as_numpy("total")[0])


def test_a_server_out_of_descriptors_sends_the_batch_over_the_socket(tmp_path: pathlib.Path) -> None:
    """memfd_create fails with EMFILE when the arena grows: the batch travels in the message, the instance serves on."""
    server, port = _start_fd_starved_server(tmp_path, FD_STARVED_SERVER)
    try:
        # One connection throughout: while the server has no descriptor left it could not accept another.
        with httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30) as client:

            def total(model: str, x: np.ndarray) -> float:
                return _total(client, model, x)

            assert total("total", np.ones(4, np.float32)) == 4.0  # the instance's first arena: 1 MiB
            assert total("starve", np.zeros(1, np.float32)) > 0  # every descriptor the server may have is taken
            big = np.ones(1 << 20, np.float32)  # 4 MiB: the arena would grow, and no memfd can be made
            assert total("total", big) == float(1 << 20)
            assert total("total", big) == float(1 << 20)  # the instance was not left busy
            total("feed", np.zeros(1, np.float32))
            assert total("total", big * 2) == float(2 << 20)
    finally:
        stop_script(server)


def test_a_thread_instance_first_called_out_of_descriptors_serves(tmp_path: pathlib.Path) -> None:
    """Its pipe (and the loop's) opened when it was bound, its first call needs no descriptor (it got HTTP 500, and
    the instance never took another request)."""
    server, port = _start_fd_starved_server(tmp_path, FD_STARVED_SERVER)
    try:
        with httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30) as client:
            assert _total(client, "starve", np.zeros(1, np.float32)) > 0  # every descriptor is taken from now on
            assert _total(client, "fresh", np.ones(3, np.float32)) == 3.0
            assert _total(client, "fresh", np.ones(5, np.float32)) == 5.0
            _total(client, "feed", np.zeros(1, np.float32))
            assert _total(client, "fresh", np.ones(7, np.float32)) == 7.0
    finally:
        stop_script(server)


def test_a_hub_out_of_descriptors_refuses_a_frontends_new_buffer_and_serves_on(tmp_path: pathlib.Path) -> None:
    """Through two frontend processes, a new receive buffer's descriptor cannot reach the hub while it has none left.

    That message closed the frontend's channel (an IndexError): the frontend went, and with it its connections. Now
    the hub refuses the buffer, and the frontend copies the requests read into it into their messages.
    """
    log = tmp_path / "hub.log"
    script = FD_STARVED_SERVER.replace(
        "with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as triton:",
        f"logging.getLogger('pytriton').addHandler(logging.FileHandler({str(log)!r}))\n"
        "    with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False), frontends=3) "
        "as triton:",
    ).replace("import os, resource", "import logging, os, resource")
    assert "frontends=3" in script
    server, port = _start_fd_starved_server(tmp_path, script)
    try:
        with httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30) as client:  # one frontend's
            assert _total(client, "fresh", np.ones(4, np.float32)) == 4.0
            assert _total(client, "starve", np.zeros(1, np.float32)) > 0  # the hub has no descriptor left
            big = np.ones(1 << 20, np.float32)  # 4 MiB: read into a new buffer of the frontend's
            try:  # sent before the frontend heard of the refusal, it is answered 503; after, it is copied
                first = _total(client, "fresh", big)
            except InferenceServerException as error:
                assert error.status() == "503" and "could not map the buffer" in str(error.message()), error
            else:
                assert first == float(1 << 20)
            assert _total(client, "fresh", big) == float(1 << 20)
            assert _total(client, "fresh", big * 2) == float(2 << 20)
            _total(client, "feed", np.zeros(1, np.float32))
            assert _total(client, "fresh", big * 3) == float(3 << 20)
    finally:
        stop_script(server)
    written = log.read_text()
    assert "a receive buffer of a frontend process could not be mapped" in written, written
    assert "unreadable message" not in written and "its connections were closed" not in written, written


FD_STARVED_BIND = textwrap.dedent(
    """
    import os, resource
    import numpy as np
    from pytriton.exceptions import PyTritonRuntimeError
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    def total(requests):
        return [{"total": np.array([request["x"].sum()], dtype=np.float64)} for request in requests]

    if __name__ == "__main__":
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        io = {
            "inputs": [Tensor(name="x", dtype=np.float32, shape=(-1,))],
            "outputs": [Tensor(name="total", dtype=np.float64, shape=(1,))],
            "config": ModelConfig(batching=False),
        }
        with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as triton:
            triton.bind("warm", total, **io)  # what binding imports is imported: no module is read while starved
            held = []
            try:
                while True:
                    held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                pass
            try:
                triton.bind("total", total, **io)
            except PyTritonRuntimeError as error:
                print("refused:", error, flush=True)
            while held:
                os.close(held.pop())
            triton.bind("total", total, **io)
            triton.run()
            print(triton.http_port, flush=True)
            triton.serve()
    """
)


def test_a_thread_model_bound_out_of_descriptors_is_refused_at_bind(tmp_path: pathlib.Path) -> None:
    """The bind fails, saying why; nothing of it stays bound, and a bind once descriptors are free serves."""
    server = start_script(tmp_path, FD_STARVED_BIND)
    try:
        assert server.stdout is not None
        refused = server.stdout.readline()
        assert refused.startswith("refused: model 'total' did not start:"), refused
        assert "out of file descriptors" in refused and "Too many open files" in refused
        with httpclient.InferenceServerClient(f"127.0.0.1:{int(server.stdout.readline())}") as client:
            assert _total(client, "total", np.ones(3, np.float32)) == 3.0
    finally:
        stop_script(server)


def test_a_batch_that_cannot_be_sent_fails_alone_and_the_instance_serves_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Packing a batch raises (here by a patch: after the shared-memory fallback nothing real makes it fail)."""
    from pytriton.core.process_instances import input_arena

    pack = input_arena.InputArena.pack

    def pack_or_fail(self: input_arena.InputArena, dicts: Any, job_id: int = 0, in_shared: Any = None) -> Any:
        if any(isinstance(item, dict) and item["x"].size and item["x"].flat[0] == 777 for item in dicts):
            raise MemoryError("no memory for this batch")
        return pack(self, dicts, job_id, in_shared)

    monkeypatch.setattr(input_arena.InputArena, "pack", pack_or_fail)

    def bind(triton: Triton) -> None:
        triton.bind("fragile", ProcessInstances(fragile), **IO, config=UNBATCHED)

    with running_triton(bind) as triton, _client(triton) as client:
        for _ in range(2):
            with pytest.raises(httpclient.InferenceServerException) as failed:
                _infer(client, "fragile", np.array([777.0], np.float32))
            assert "model 'fragile' instance 0 could not take the batch: no memory for this batch" in str(failed.value)
            assert _infer(client, "fragile", np.array([5.0], np.float32))["y"].tolist() == [5.0]
        assert client.is_model_ready("fragile")
    logged = [record.getMessage() for record in caplog.records if record.name == "pytriton.model"]
    assert logged and all("a batch was not run (1 request failed)" in line for line in logged), logged
    assert all("inference callable raised" not in line for line in logged)  # it never ran


def doubles(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Twice its input, a new array (not one in the job's inputs: it goes in the process's result arena)."""
    return [{"pid": np.array([os.getpid()], dtype=np.int64), "y": request["x"] * 2} for request in requests]


def test_outputs_the_server_cannot_take_are_logged_as_such_and_the_instance_serves_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The server's map of a new result arena fails (here by a patch; tests/test_memory_limits.py has the real memory
    limit). The callable ran: the log said "a batch was not run"; it says the server could not take its outputs."""
    from pytriton.ipc import tensors

    adopt = tensors.ArenaReader.adopt
    refusing = [True]

    def adopt_or_refuse(self: tensors.ArenaReader, size: int, fds: Any) -> None:
        if refusing[0] and size >= 8 << 20:
            self.close()  # as a failed map: the old arena was let go of first
            for fd in fds:
                os.close(fd)
            raise tensors.SharedMemoryUnavailable(12, "cannot map shared memory: Cannot allocate memory")
        adopt(self, size, fds)

    monkeypatch.setattr(tensors.ArenaReader, "adopt", adopt_or_refuse)

    def bind(triton: Triton) -> None:
        triton.bind("doubles", ProcessInstances(doubles), **IO, config=UNBATCHED)

    large = np.ones(4 << 20, np.float32)  # 16 MiB of outputs: a new result arena
    with running_triton(bind) as triton, _client(triton) as client:
        pid = _infer(client, "doubles", np.array([1.0], np.float32))["pid"].tolist()
        with pytest.raises(httpclient.InferenceServerException) as failed:
            _infer(client, "doubles", large)
        assert (
            "OutputsNotTaken: model 'doubles' instance 0: the server could not map its outputs: "
            "[Errno 12] cannot map shared memory: Cannot allocate memory"
        ) in str(failed.value)
        assert _infer(client, "doubles", np.array([3.0], np.float32))["y"].tolist() == [6.0]
        refusing[0] = False
        served = _infer(client, "doubles", large)  # the process made a new arena: the refused one was let go of
        assert served["pid"].tolist() == pid and (served["y"] == 2).all()
    logged = [record.getMessage() for record in caplog.records if record.name == "pytriton.model"]
    assert logged == [
        "model 'doubles' version 1: the server could not take a batch's outputs (1 request failed): "
        "model 'doubles' instance 0: the server could not map its outputs: "
        "[Errno 12] cannot map shared memory: Cannot allocate memory"
    ]


def counts_calls(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Echoes, with "pid" holding how many batches this process has run (a global of the process)."""
    global _calls
    _calls += 1
    return [{"pid": np.array([_calls], dtype=np.int64), "y": request["x"]} for request in requests]


_calls = 0


def test_batches_bigger_than_the_arena_run_once_each() -> None:
    def bind(triton: Triton) -> None:
        triton.bind("counts", ProcessInstances(counts_calls, shm_budget_bytes=1 << 20), **IO, config=UNBATCHED)

    with running_triton(bind) as triton, _client(triton) as client:
        for call in range(1, 4):
            x = np.full(1 << 20, call, np.float32)  # 4 MiB: over the 1 MiB budget, through the socket
            result = _infer(client, "counts", x)
            assert np.array_equal(result["y"], x)
            assert result["pid"].tolist() == [call]


@pytest.mark.parametrize("budget", [0, 4096])
def test_a_tiny_shared_memory_budget_still_serves(budget: int) -> None:
    def bind(triton: Triton) -> None:
        triton.bind("fragile", ProcessInstances(fragile, shm_budget_bytes=budget), **IO, config=UNBATCHED)

    with running_triton(bind) as triton, _client(triton) as client:
        for size in (1, 1000, 1 << 20):
            x = np.random.default_rng(size).random(size, dtype=np.float32) - 0.5 + 1.0
            assert np.array_equal(_infer(client, "fragile", x + 200)["y"], x + 200)


def test_an_unrecoverable_error_in_a_process_stops_the_server() -> None:
    def bind(triton: Triton) -> None:
        triton.bind("gone", ProcessInstances(unrecoverable), **IO, config=UNBATCHED)

    with running_triton(bind) as triton, _client(triton) as client:
        with pytest.raises(httpclient.InferenceServerException, match="the device is gone"):
            _infer(client, "gone", np.array([1.0], np.float32))
        deadline = time.monotonic() + 10
        while triton.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not triton.is_alive()


SERVER_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from pytriton.instances import ProcessInstances
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    def identity(requests):
        return [{"y": request["x"]} for request in requests]

    if __name__ == "__main__":
        with Triton(config=TritonConfig(http_port=0, grpc_port=0, metrics_port=0)) as triton:
            triton.bind(
                "identity",
                ProcessInstances(identity, count=2),
                inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
                outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
                config=ModelConfig(batching=False),
            )
            triton.run()
            print(triton.http_port, flush=True)
            triton.serve()
    """
)


def _children_of(pid: int) -> Set[int]:
    found = set()
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.add(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _alive(pid: int) -> bool:
    try:
        return (pathlib.Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigkill_of_the_server_takes_its_instance_processes_with_it(tmp_path: pathlib.Path) -> None:
    server = start_script(tmp_path, SERVER_SCRIPT)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        with httpclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
            tensor = httpclient.InferInput("x", [2], "FP32")
            tensor.set_data_from_numpy(np.ones(2, np.float32))
            assert client.infer("identity", [tensor]).as_numpy("y").tolist() == [1.0, 1.0]
        children = {child: started_at(child) for child in _children_of(server.pid)}  # a pid may be taken again
        assert len(children) == 2
        server.kill()
        server.wait()
        deadline = time.monotonic() + 10
        while any(alive(*child) for child in children.items()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(*child) for child in children.items())
    finally:
        server.kill()
        server.wait()
        assert server.stdout is not None
        server.stdout.close()


def test_a_64_kib_dev_shm_does_not_stop_large_tensors(tmp_path: pathlib.Path) -> None:
    """As in a Docker container with a small /dev/shm: instance arenas are memfds, which it does not bound."""
    unshare = shutil.which("unshare")
    assert unshare, "this test needs util-linux's unshare (apt-get install util-linux)"
    mount_then_run = 'mount -t tmpfs -o size=64k tmpfs /dev/shm && exec "$0" "$@"'
    namespace = namespaces(unshare, "--mount", "--propagation", "private")
    server = start_script(tmp_path, SERVER_SCRIPT, [*namespace, "sh", "-c", mount_then_run])
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line, "the server in its mount namespace did not start"
        with httpclient.InferenceServerClient(f"127.0.0.1:{int(line)}", network_timeout=60) as client:
            x = np.random.default_rng(1).random(4 << 20, dtype=np.float32)  # 16 MiB, 256 times /dev/shm
            tensor = httpclient.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            assert np.array_equal(client.infer("identity", [tensor]).as_numpy("y"), x)
    finally:
        stop_script(server)


def forks_and_both_return(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Forks a child that returns the batch's answer too, as a model that forgets to end its child does."""
    os.fork()
    return [{"pid": np.array([os.getpid()], dtype=np.int64), "y": request["x"]} for request in requests]


def test_a_forked_child_that_returns_from_the_callable_ends_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    """The child went back to the process's loop and sent its answer on its copy of the channel, closed in a forked
    child: a traceback ending 'OSError: [Errno 9] Bad file descriptor' in the server's stderr. It now ends as it
    returns, silently; the process's own answer is the request's."""

    def bind(triton: Triton) -> None:
        triton.bind("forks_twice", ProcessInstances(forks_and_both_return), **IO, config=UNBATCHED)

    with running_triton(bind) as triton:
        client = httpclient.InferenceServerClient(http_url(triton), network_timeout=20)
        try:
            first = _infer(client, "forks_twice", np.array([1.0], np.float32))
            second = _infer(client, "forks_twice", np.array([2.0], np.float32))
        finally:
            client.close()
        assert first["y"].tolist() == [1.0] and second["y"].tolist() == [2.0]
        assert first["pid"].tolist() == second["pid"].tolist()  # the instance process itself, never restarted
    assert "Bad file descriptor" not in capfd.readouterr().err


def forks_and_answers_later_in_child(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Forks a child that returns another answer after the process's own, as a model that forgets to end it does."""
    child = os.fork() == 0
    time.sleep(1.0 if child else 0.5)
    sign = -1 if child else 1
    return [{"pid": np.array([os.getpid()], np.int64), "y": sign * request["x"]} for request in requests]


def test_a_forked_child_that_returns_from_the_callable_never_writes_over_the_answer() -> None:
    """The child packed its answer into the result arena, shared memory mapped in it as in the instance process, with
    the same allocator state: in the region the process lent for its own answer. Held up on a busy server (its loop
    here), the process's answer was read after the child's was written over it; 3 answers in 200 were wrong (another
    request's values) with no wait at all."""

    def bind(triton: Triton) -> None:
        triton.bind("forks_late", ProcessInstances(forks_and_answers_later_in_child), **IO, config=UNBATCHED)

    x = np.array([1.0, 2.0, 3.0], np.float32)
    with running_triton(bind) as triton:
        client = httpclient.InferenceServerClient(http_url(triton), network_timeout=20)
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        try:
            # The first answer makes the arena (the child makes its own); the second's region is in it.
            for _ in range(2):
                answer = client.async_infer("forks_late", [tensor])
                time.sleep(0.25)  # the job reached the process: its own answer comes at 0.5 s, its child's at 1 s
                triton._runtime.loop.call_soon_threadsafe(time.sleep, 1.5)  # the server reads after the child wrote
                assert answer.get_result().as_numpy("y").tolist() == x.tolist()
        finally:
            client.close()
