"""Every request-failing fault of a model is logged once at the server, with its cause, and a failing model
cannot flood the log (core/logs/failure_log.py): a server in a subprocess, a real client, its log."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from pathlib import Path
from typing import Any, List, Optional

import pytest

from pytriton.core.errors import BatchNotRun, InferenceError, OutputsNotTaken
from pytriton.core.logs.failure_log import FailureLog
from pytriton.exceptions import PyTritonUnrecoverableError
from tests.http_helpers import post_json
from tests.server_process import ServerProcess

SERVER = """
    import numpy as np
    from pytriton.instances import ProcessInstances
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton

    def parse(text):
        raise ValueError(f"cannot parse {text!r}")

    def raises(requests):
        return [{"y": parse(r["x"].tolist())} for r in requests]

    def no_batch(requests):  # forgot @batch: one dict for the whole list
        return {"y": requests[0]["x"]}

    def wrong_dtype(requests):
        return [{"y": r["x"].astype(np.int32)} for r in requests]

    def forgets_z(requests):
        return [{"y": r["x"]} for r in requests]

    def generator(requests):
        yield [{"y": r["x"]} for r in requests]

    def lookup(requests):  # runs in an instance process of its own
        return [{"y": {}["weights"]} for r in requests]

    def ping(depth):  # two functions that call each other: Python's traceback cannot fold their frames
        return pong(depth + 1)

    def pong(depth):
        return ping(depth + 1)

    def recurses(requests):  # RecursionError, about 1000 frames deep
        return ping(0)

    x = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    y = [Tensor(name="y", dtype=np.float32, shape=(-1,))]
    with Triton() as triton:
        triton.bind("remote", ProcessInstances(lookup), inputs=x, outputs=y, config=ModelConfig(max_batch_size=4))
        triton.bind("remote_recurses", ProcessInstances(recurses), inputs=x, outputs=y,
                    config=ModelConfig(max_batch_size=4))
        for name, fn in [("raises", raises), ("no_batch", no_batch), ("generator", generator), ("recurses", recurses)]:
            triton.bind(name, fn, inputs=x, outputs=y, config=ModelConfig(max_batch_size=4))
        triton.bind("wrong_dtype", wrong_dtype, inputs=x, outputs=y, config=ModelConfig(max_batch_size=4), strict=True)
        triton.bind("forgets_z", forgets_z, inputs=x, outputs=y + [Tensor(name="z", dtype=np.float32, shape=(-1,))],
                    config=ModelConfig(max_batch_size=4))
        triton.serve()
"""


def _infer(port: int, model: str, outputs: Optional[List[str]] = None) -> Any:
    body: Any = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    if outputs:
        body["outputs"] = [{"name": name} for name in outputs]
    status, document = post_json(port, f"/v2/models/{model}/infer", body)
    assert status == 500, document
    return document["error"]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = ServerProcess.script(tmp_path_factory.mktemp("faulty"), SERVER)
    with server:
        ports = server.wait_started()
        yield server, ports["http"]


def test_a_callable_exception_is_logged_with_its_traceback(faulty: Any) -> None:
    server, port = faulty
    assert _infer(port, "raises") == "ValueError: cannot parse [[1.0, 2.0]]"
    server.wait_for(
        r"^\S+ \S+ ERROR pytriton.model: model 'raises' version 1: the inference callable raised "
        r"ValueError: cannot parse \[\[1.0, 2.0\]\] \(1 request failed\)$"
    )
    server.wait_for(r"^Traceback \(most recent call last\):$")
    server.wait_for(r'server.py", line \d+, in raises$')
    server.wait_for(r'server.py", line \d+, in parse$')
    server.wait_for(r"^ValueError: cannot parse \[\[1.0, 2.0\]\]$")


def test_an_exception_from_an_instance_process_is_logged_with_that_process_traceback(faulty: Any) -> None:
    server, port = faulty
    start = len(server.lines)
    assert "weights" in _infer(port, "remote")
    server.wait_for(
        r"ERROR pytriton.model: model 'remote' version 1: the inference callable raised KeyError: 'weights'"
    )
    server.wait_for(r"^Traceback \(most recent call last\):$")
    server.wait_for(r'host.py", line \d+, in _call$')  # a frame of the instance's process
    server.wait_for(r'^  File "<dynamic-code>", line \d+, in lookup$')
    server.wait_for(r"^KeyError: 'weights'$")
    record = "\n".join(server.lines[start:])
    assert "KeyError" in record and "scheduler.py" not in record  # not where the server raised it again


@pytest.mark.parametrize("model", ["recurses", "remote_recurses"])
def test_a_deep_recursion_is_logged_with_the_first_and_last_frames_of_its_traceback(faulty: Any, model: str) -> None:
    # A callable that recursed until RecursionError logged 3000 lines a failure (100,000 frames deep: 300,000).
    server, port = faulty
    start = len(server.lines)
    assert _infer(port, model) == "RecursionError: maximum recursion depth exceeded"
    server.wait_for(rf"ERROR pytriton.model: model '{model}' version 1: the inference callable raised RecursionError")
    server.wait_for(r"^RecursionError: maximum recursion depth exceeded$")
    lines = server.lines[start:]
    first = next(index for index, line in enumerate(lines) if f"model '{model}' version 1" in line)
    record = lines[first : lines.index("RecursionError: maximum recursion depth exceeded", first) + 1]
    assert record[1] == "Traceback (most recent call last):"
    assert any(re.search(r", in recurses$", line) for line in record[:20])  # the head: where it started
    left_out = [line for line in record if re.fullmatch(r"  \.\.\. \(\d+ more frames not logged\) \.\.\.", line)]
    assert len(left_out) == 1
    assert int(left_out[0].split("(")[1].split()[0]) > 800
    assert re.search(r", in p[io]ng$", record[-3])  # the tail: where it raised
    assert len(record) < 300


def test_a_traceback_of_100000_frames_is_logged_cut_to_its_edges(caplog: pytest.LogCaptureFixture) -> None:
    # Each line was cut at 16 KiB, but every line was logged: 300,000 of them (14 MB), seconds to format on the loop.
    import sys
    import threading

    caplog.set_level(logging.ERROR, "pytriton.model")

    def ping(depth: int) -> None:
        if depth >= 100_000:
            raise ValueError("too deep")
        pong(depth + 1)

    def pong(depth: int) -> None:
        ping(depth + 1)

    log = FailureLog("'m' version 1", burst=2)
    errors: List[BaseException] = []

    def fail() -> None:
        try:
            ping(0)
        except ValueError as error:
            errors.append(error)
            log.callable_raised(error, 1)
            # From an instance process: its traceback as text, 300,000 lines (cut there too; here whatever comes).
            remote = ValueError("too deep")
            remote.remote_traceback = "Traceback (most recent call last):\n" + '  File "m.py", line 1, in f\n' * 300_000
            remote.remote_traceback += "ValueError: too deep\n"  # type: ignore[attr-defined]
            log.callable_raised(remote, 1)

    limit, stack = sys.getrecursionlimit(), threading.stack_size()
    sys.setrecursionlimit(250_000)
    threading.stack_size(1 << 30)
    try:
        deep = threading.Thread(target=fail)
        deep.start()
    finally:
        threading.stack_size(stack)
    deep.join()
    sys.setrecursionlimit(limit)
    assert len(errors) == 1
    records = [record for record in caplog.records if record.name == "pytriton.model"]
    assert len(records) == 2
    local, remote_text = (caplog.handler.format(record).splitlines() for record in records)
    assert local[1] == "Traceback (most recent call last):"
    assert local[-1] == "ValueError: too deep"
    assert "  ... (99902 more frames not logged) ..." in local  # fail()'s and ping/pong's 100,002 frames, less 100
    assert any(line.endswith(", in fail") for line in local[:6])
    assert len(local) < 300
    assert remote_text[1] == "Traceback (most recent call last):"
    assert remote_text[-1] == "ValueError: too deep"
    assert "... (299502 more lines not logged) ..." in remote_text  # 300,002 lines, less 500
    assert len(remote_text) == 1 + 2 * 250 + 1


@pytest.mark.parametrize(
    ("model", "outputs", "cause"),
    [
        ("no_batch", None, r"Outputs returned by `no_batch` model callable must be list of response dicts"),
        ("wrong_dtype", None, r"Returned output `y` for model `wrong_dtype` has invalid type"),
        ("generator", None, r"Outputs returned by `generator` model callable must be list of response dicts"),
    ],
)
def test_refused_outputs_are_logged_with_the_check_that_failed(
    faulty: Any, model: str, outputs: Optional[List[str]], cause: str
) -> None:
    server, port = faulty
    assert re.search(cause, _infer(port, model, outputs))
    server.wait_for(
        rf"ERROR pytriton.model: model '{model}' version 1: the inference callable's outputs were refused "
        rf"\(1 request failed\): {cause}"
    )


def test_an_output_asked_for_and_not_returned_is_left_out_with_one_warning(faulty: Any) -> None:
    # As NVIDIA's PyTriton and Triton answer it (200 without the output); the operator hears of it once.
    server, port = faulty
    x = [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]
    for asked, answered in ((["z"], []), (["y", "z"], ["y"]), (["z"], [])):
        body = {"inputs": x, "outputs": [{"name": name} for name in asked]}
        status, document = post_json(port, "/v2/models/forgets_z/infer", body)
        assert status == 200 and [output["name"] for output in document["outputs"]] == answered, document
    server.wait_for(
        r"WARNING pytriton.model: model 'forgets_z' version 1: a request asked for output 'z', which the inference "
        r"callable did not return; it is left out of the response, as Triton leaves it out. Logged once for this "
        r"output.$"
    )
    assert _infer(port, "raises")  # a marker: logged after the requests above
    server.wait_for(r"model 'raises' version 1: the inference callable raised")
    assert server.output().count("a request asked for output 'z'") == 1


def test_a_generator_on_a_model_that_is_not_decoupled_is_reported_when_bound(faulty: Any) -> None:
    server, _ = faulty
    assert re.search(
        r"WARNING pytriton.core.engine: model 'generator' version 1: the inference callable is a generator but the "
        r"model is not decoupled, so every request will fail; bind it with ModelConfig\(decoupled=True\)",
        server.output(),
    )


def test_a_client_error_is_not_logged_as_the_model_s_fault(faulty: Any) -> None:
    server, port = faulty
    status, _ = post_json(port, "/v2/models/raises/infer", {"inputs": [{"name": "nope", "shape": [1], "data": [1]}]})
    assert status == 400
    assert _infer(port, "raises")  # a marker: the next line logged is this failure
    server.wait_for(r"model 'raises' version 1: the inference callable raised")
    assert "nope" not in server.output()


def test_a_failing_model_cannot_flood_the_log(tmp_path: Path) -> None:
    with ServerProcess.script(tmp_path, SERVER) as server:
        port = server.wait_started()["http"]
        for _ in range(25):
            _infer(port, "raises")
        server.signal(signal.SIGTERM)
        server.wait_for(
            r"ERROR pytriton.model: model 'raises' version 1: \.\.\. and 15 more failures not logged "
            r"\(at most 10 every 60 s are\); the last: ValueError: cannot parse \[\[1.0, 2.0\]\]$"
        )
        assert server.wait() == 0
    assert len(re.findall(r"model 'raises' version 1: the inference callable raised", server.output())) == 10
    assert server.output().count("Traceback (most recent call last):") == 10


# The log itself, in this process.


def _records(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [record.getMessage() for record in caplog.records if record.name == "pytriton.model"]


def test_held_back_failures_are_counted_when_the_interval_ends(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, "pytriton.model")

    async def fail_often() -> None:
        log = FailureLog("'m' version 1", burst=2, interval_s=0.3)
        for index in range(5):
            log.outputs_refused(InferenceError.internal(f"bad output {index}"), 3)
        await asyncio.sleep(0.6)  # the interval ends: its summary is logged
        log.outputs_refused(InferenceError.internal("bad output 5"), 1)  # a new interval: logged at once
        log.flush()  # nothing held back since

    asyncio.run(fail_often())
    assert _records(caplog) == [
        "model 'm' version 1: the inference callable's outputs were refused (3 requests failed): bad output 0",
        "model 'm' version 1: the inference callable's outputs were refused (3 requests failed): bad output 1",
        "model 'm' version 1: ... and 3 more failures not logged (at most 2 every 0.3 s are); the last: bad output 4",
        "model 'm' version 1: the inference callable's outputs were refused (1 request failed): bad output 5",
    ]


def test_an_unrecoverable_error_is_always_logged_and_stops_are_not_faults(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, "pytriton.model")

    async def fail() -> None:
        log = FailureLog("'m' version 1", burst=1)
        log.callable_raised(ValueError("first"), 1)
        log.outputs_refused(InferenceError.unavailable("model 'm' stopped before the request was served"), 1)
        log.callable_raised(PyTritonUnrecoverableError("device lost"), 2)
        log.flush()

    asyncio.run(fail())
    assert _records(caplog) == [
        "model 'm' version 1: the inference callable raised ValueError: first (1 request failed)",
        "model 'm' version 1: the inference callable raised PyTritonUnrecoverableError: device lost "
        "(2 requests failed)",
    ]


def test_a_batch_not_run_is_logged_as_such_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, "pytriton.model")

    async def fail() -> None:
        log = FailureLog("'m' version 1", burst=1)
        for _ in range(2):
            log.batch_not_run(BatchNotRun("model 'm' instance 0 could not take the batch: MemoryError"), 3)
        log.flush()

    asyncio.run(fail())
    assert _records(caplog) == [
        "model 'm' version 1: a batch was not run (3 requests failed): "
        "model 'm' instance 0 could not take the batch: MemoryError",
        "model 'm' version 1: ... and 1 more failure not logged (at most 1 every 60 s are); the last: "
        "model 'm' instance 0 could not take the batch: MemoryError",
    ]
    assert all(record.exc_info is None for record in caplog.records)


def test_outputs_not_taken_are_logged_as_such_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """The callable ran: the log does not say the batch was not run."""
    caplog.set_level(logging.ERROR, "pytriton.model")
    why = "model 'm' instance 0: the server had no memory for its 1048576 bytes of outputs"

    async def fail() -> None:
        log = FailureLog("'m' version 1", burst=1)
        for _ in range(2):
            log.outputs_not_taken(OutputsNotTaken(why), 1)
        log.flush()

    asyncio.run(fail())
    assert _records(caplog) == [
        f"model 'm' version 1: the server could not take a batch's outputs (1 request failed): {why}",
        f"model 'm' version 1: ... and 1 more failure not logged (at most 1 every 60 s are); the last: {why}",
    ]
    assert all(record.exc_info is None for record in caplog.records)


def test_a_message_with_lone_surrogates_is_logged_as_escapes(caplog: pytest.LogCaptureFixture) -> None:
    # ValueError("\udcff") logged as it is made every UTF-8 handler fail on the record ("--- Logging error ---"),
    # and pytest-xdist could not send the test's report. It goes as the client's message does: "\udcff" escaped.
    caplog.set_level(logging.ERROR, "pytriton.model")

    def parse() -> None:
        raise ValueError("bad \udcff byte")

    async def fail() -> None:
        log = FailureLog("'m' version 1", burst=1)
        try:
            parse()
        except ValueError as error:
            log.callable_raised(error, 1)

    asyncio.run(fail())
    (record,) = [record for record in caplog.records if record.name == "pytriton.model"]
    text = caplog.handler.format(record)
    text.encode("utf-8")  # no lone surrogate left
    assert text.splitlines()[0].endswith(
        "model 'm' version 1: the inference callable raised ValueError: bad \\udcff byte (1 request failed)"
    )
    assert "in parse" in text and text.rstrip().endswith("ValueError: bad \\udcff byte")


def test_a_message_of_megabytes_is_logged_cut_saying_how_much_more_there_was(caplog: pytest.LogCaptureFixture) -> None:
    # An error of a 10 MB message logged 20 MB a failure: the line, then the traceback's last line again; from an
    # instance process, its traceback (as text) the same.
    caplog.set_level(logging.ERROR, "pytriton.model")
    message = "x" * 1_000_000

    def parse() -> None:
        raise ValueError(message)

    remote = ValueError(message)
    trace = f'Traceback (most recent call last):\n  File "m.py", line 1, in f\nValueError: {message}\n'
    remote.remote_traceback = trace  # type: ignore[attr-defined]

    async def fail() -> None:
        log = FailureLog("'m' version 1", burst=2)
        try:
            parse()
        except ValueError as error:
            log.callable_raised(error, 1)
        log.callable_raised(remote, 1)

    asyncio.run(fail())
    records = [record for record in caplog.records if record.name == "pytriton.model"]
    assert len(records) == 2
    summary = f"ValueError: {message}"
    cut = f"{summary[: 16 * 1024]}... ({len(summary) - 16 * 1024} more characters)"
    for record in records:
        text = caplog.handler.format(record)
        assert len(text) < 64 * 1024
        lines = text.splitlines()
        assert lines[0].endswith(f"model 'm' version 1: the inference callable raised {cut} (1 request failed)")
        assert lines[1] == "Traceback (most recent call last):"
        assert lines[-1] == cut
