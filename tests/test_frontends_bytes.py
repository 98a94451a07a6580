"""BYTES tensors through frontend processes: exact both ways, and a long one taken in off the hub's loop and off
the frontend's (tests/frontend_probe notes which thread of a frontend process pickles and rebuilds one).

The server has two frontend processes (frontends=3: the hub serves no connection itself), so every request here
crosses from a frontend to the hub and its answer back (docs/architecture.md, "Frontend processes"). An object
array of PIECE_ELEMENTS strings or more crosses in pickled pieces, in the message's body (runtime/frontends/
protocol.py), and the hub rebuilds it in a thread; a shorter one in the message's head, as before.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import pickle
import queue
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, NamedTuple, Tuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pytriton.core import request as core_request
from pytriton.core.process_instances import long_outputs
from pytriton.core.tensors.raw_tensors import PIECE_ELEMENTS
from pytriton.ipc import channel
from pytriton.model_config import ModelConfig, Tensor
from pytriton.runtime.frontends import protocol
from pytriton.triton import Triton
from tests.conftest import grpc_url, http_url, running_triton
from tests.frontend_processes import frontend_pids, one_connection_each, serving_pid

LONG = PIECE_ELEMENTS + 3  # pieces of PIECE_ELEMENTS and a short last one
# Strings a wire mangles when it takes them for text: empty, NUL bytes (a trailing one too), not UTF-8.
ODD = [b"", b"\x00", b"a\x00b\x00", b"\xff\xfe\x80", "é".encode(), b"plain"]
TEXT = [b"", b"\x00", b"a\x00b\x00", "é".encode(), b"plain"]  # JSON carries UTF-8 only
LOOP = "pytriton-loop"


def _echo(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Answers its input, after checking that the callable got bytes elements in an object array."""
    answers = []
    for request in requests:
        array = request["in"]
        assert array.dtype == object and all(type(item) is bytes for item in array.flat), "not bytes elements"
        answers.append({"out": array})
    return answers


def _steps(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    """Steps of LONG strings (pickled off the hub's loop) and of one, in turn; then an error when asked for one."""
    for step in range(4):
        count = LONG if step % 2 == 0 else 1
        yield [{"out": np.array([b"%d-%d" % (step, index) for index in range(count)], dtype=object)}]
    if requests[0]["in"].flat[0] == b"fail":
        raise ValueError("failed after its steps")


converted_on: List[str] = []  # the threads _Noted elements were made plain bytes in, to cross to a frontend


class _Noted(bytes):
    """A string of the model's own class: made plain bytes (bytes()) before it crosses, and noted where."""

    def __bytes__(self) -> bytes:
        converted_on.append(threading.current_thread().name)
        return self[:]  # a slice of a subclass is plain bytes


def _noted(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    out = np.empty(LONG, dtype=object)
    out[:] = [_Noted(b"n%d" % index) for index in range(LONG)]
    return [{"out": out} for _ in requests]


def _bind(triton: Triton) -> None:
    triton.bind(
        "noted",
        _noted,
        inputs=[Tensor(name="in", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="out", dtype=bytes, shape=(-1,))],
        config=ModelConfig(batching=False),
    )
    triton.bind(
        "steps",
        _steps,
        inputs=[Tensor(name="in", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="out", dtype=bytes, shape=(-1,))],
        config=ModelConfig(batching=False, decoupled=True),
    )
    config = ModelConfig(batching=False)
    for name, shape in (("echo1", (-1,)), ("echo2", (-1, -1))):
        triton.bind(
            name,
            _echo,
            inputs=[Tensor(name="in", dtype=bytes, shape=shape)],
            outputs=[Tensor(name="out", dtype=bytes, shape=shape)],
            config=config,
        )


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(_bind, frontends=3) as server:
        yield server


def _strings(values: List[bytes], shape: List[int]) -> np.ndarray:
    count = int(np.prod(shape))
    array = np.empty(count, dtype=object)
    array[:] = [values[index % len(values)] for index in range(count)]
    return array.reshape(shape)


def _infer(triton: Triton, protocol_name: str, array: np.ndarray) -> np.ndarray:
    """The answer of model echo1 or echo2 (by the array's rank) to `array`, over HTTP binary or JSON, or gRPC."""
    model = "echo1" if array.ndim == 1 else "echo2"
    shape = list(array.shape)
    if protocol_name == "grpc":
        client = grpcclient.InferenceServerClient(grpc_url(triton))
        tensor = grpcclient.InferInput("in", shape, "BYTES")
        tensor.set_data_from_numpy(array)
        answer = client.infer(model, [tensor]).as_numpy("out")
        client.close()
        return answer
    binary = protocol_name == "http binary"
    http = httpclient.InferenceServerClient(http_url(triton), network_timeout=120)
    tensor = httpclient.InferInput("in", shape, "BYTES")
    tensor.set_data_from_numpy(array, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("out", binary_data=binary)]
    answer = http.infer(model, [tensor], outputs=outputs).as_numpy("out")
    http.close()
    return answer


CASES = [
    ("http binary", ODD),
    ("http json", TEXT),
    ("grpc", ODD),
]


# Guards: these pass before and after BYTES crossed in pieces; the long ones take the pieces' way both ways.
@pytest.mark.parametrize(("protocol_name", "values"), CASES, ids=[case[0] for case in CASES])
@pytest.mark.parametrize("shape", [[0], [2, 0], [3, 2], [len(ODD)], [LONG], [LONG // 2 + 1, 2]])
def test_bytes_cross_exactly_both_ways(
    triton: Triton, protocol_name: str, values: List[bytes], shape: List[int]
) -> None:
    array = _strings(values, shape)
    answer = _infer(triton, protocol_name, array)
    assert answer.shape == array.shape
    assert answer.dtype == object
    got = [item.encode() if isinstance(item, str) else item for item in answer.flat]  # JSON's come as str
    assert got == array.reshape(-1).tolist()


# A guard: passes before and after a stream's long responses were pickled off the hub's loop, each in its turn.
@pytest.mark.parametrize("ending", [b"end", b"fail"])
def test_a_stream_s_long_steps_keep_their_place_among_short_ones_and_its_end(triton: Triton, ending: bytes) -> None:
    responses: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        tensor = grpcclient.InferInput("in", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([ending], dtype=object))
        client.async_stream_infer("steps", [tensor], enable_empty_final_response=True)
        steps = []
        while True:
            result, error = responses.get(timeout=60)
            if error is not None:
                steps.append(str(error))
                break
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            steps.append(result.as_numpy("out").tolist())
        client.stop_stream()
    assert [len(step) for step in steps[:4]] == [LONG, 1, LONG, 1]
    for number, step in enumerate(steps[:4]):
        assert step == [b"%d-%d" % (number, index) for index in range(len(step))]
    if ending == b"fail":
        assert len(steps) == 5 and "failed after its steps" in steps[4]
    else:
        assert len(steps) == 4


def test_a_long_bytes_tensor_crosses_outside_the_message_head() -> None:
    """A long object array was pickled in the head (numpy's reduce: a million short strings, 0.2 s on the sending
    loop, 0.05 s unpickling on the receiving one, in one call each): now its elements lie in the body, in pieces."""
    array = _strings(ODD, [LONG])
    request = core_request.InferenceRequest(
        request_id="", inputs={"in": array}, parameters={}, requested_outputs=None, batch_size=0
    )
    head, body, _ = protocol.pack_request(1, "echo1", "1", request, False, lambda _: None)
    assert len(pickle.dumps(head)) < 1024
    joined = memoryview(b"".join(bytes(part) for part in body))
    rebuilt = protocol.unpack_request(head, joined, lambda *_: np.empty(0)).inputs["in"]
    assert rebuilt.tolist() == array.tolist()
    response = core_request.InferenceResponse([core_request.OutputTensor("out", "BYTES", array)])
    head, body = protocol.pack_response(1, response, lambda _: None, 0)
    assert len(pickle.dumps(head)) < 1024
    joined = memoryview(b"".join(bytes(part) for part in body))
    assert protocol.unpack_response(head, joined, lambda *_: np.empty(0)).outputs[0].array.tolist() == array.tolist()


def test_a_long_bytes_input_is_taken_in_off_the_hubs_loop(triton: Triton, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub unpickled a long BYTES input on its event loop as it read the request: every other client of the
    server waited (a million strings: 50 ms, and 0.2 s more to pickle the answer). Now a thread rebuilds it, and
    the hub answers a health request, forwarded from a frontend, while it does."""
    taken_on: List[str] = []
    answered = threading.Event()
    unpickle_head, unpickle_piece = channel.loads, long_outputs.loads

    def head_noted(data: Any) -> Any:
        value = unpickle_head(data)
        if _holds_long_input(value):
            taken_on.append(threading.current_thread().name)  # on the loop: waiting here would wait for ever
        return value

    def piece_noted(data: Any) -> Any:
        name = threading.current_thread().name
        if not taken_on and name != LOOP:
            taken_on.append(name)
            answered.wait(60)
        return unpickle_piece(data)

    monkeypatch.setattr(channel, "loads", head_noted)
    monkeypatch.setattr(long_outputs, "loads", piece_noted)
    array = _strings(ODD, [LONG])
    answers: List[np.ndarray] = []
    sender = threading.Thread(target=lambda: answers.append(_infer(triton, "grpc", array)))
    sender.start()
    try:
        for _ in range(600):
            if taken_on:
                break
            sender.join(0.1)
        assert taken_on, "the long input never reached the hub"
        connection = http.client.HTTPConnection(http_url(triton), timeout=30)
        connection.request("GET", "/v2/health/ready")
        assert connection.getresponse().status == 200
        connection.close()
    finally:
        answered.set()
        sender.join(60)
    assert taken_on[0] != LOOP
    assert answers and answers[0].tolist() == array.tolist()


def test_a_long_bytes_answer_is_made_ready_to_cross_off_the_hubs_loop(triton: Triton) -> None:
    """The hub made a long BYTES answer's elements plain and pickled them on its event loop (a million strings:
    0.2 s of every other client's time). Now a thread does, and the answer crosses exactly."""
    converted_on.clear()
    http = httpclient.InferenceServerClient(http_url(triton))
    tensor = httpclient.InferInput("in", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"x"], dtype=object))
    answer = http.infer("noted", [tensor]).as_numpy("out")
    http.close()
    assert answer.tolist() == [b"n%d" % index for index in range(LONG)]
    assert len(converted_on) == LONG
    assert LOOP not in set(converted_on)


def _holds_long_input(head: Any) -> bool:
    """Whether a message's head holds an object array of LONG elements (an INFER's input, pickled in it)."""
    stack = [head]
    while stack:
        value = stack.pop()
        if isinstance(value, np.ndarray) and value.dtype == object and value.size >= LONG:
            return True
        if isinstance(value, (tuple, list)):
            stack.extend(value)
    return False


# -- a frontend's side, off its loop: frontend processes of a server started with tests/frontend_probe first on their
# PYTHONPATH note which thread pickles and rebuilds a long array whose first element is b"hold:NAME", and hold it
# (off their loop only) until file NAME exists in the probe's folder.

PROBE = str(Path(__file__).parent / "frontend_probe")
PROBE_ENV = "PYTRITON_TEST_LONG_OBJECTS_PROBE"
OFF_LOOP = "pytriton-long-objects"
HELD_STEPS_DONE = threading.Event()


def _long_answer(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """LONG strings, the first one the hold marker the request names."""
    answers = []
    for request in requests:
        marker = request["in"].flat[0]
        answers.append({"out": np.array([marker, *(b"a%d" % index for index in range(1, LONG))], dtype=object)})
    return answers


def _held_steps(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    """`_steps`, the first step's first string the hold marker the request names; HELD_STEPS_DONE after the last."""
    marker = requests[0]["in"].flat[0]
    for step in range(4):
        count = LONG if step % 2 == 0 else 1
        strings = [b"%d-%d" % (step, index) for index in range(count)]
        if step == 0:
            strings[0] = marker
        yield [{"out": np.array(strings, dtype=object)}]
    HELD_STEPS_DONE.set()


def _stream_echo(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    """Its input, then one short string."""
    yield [{"out": requests[0]["in"]}]
    yield [{"out": np.array([b"after"], dtype=object)}]


def _bind_probed(triton: Triton) -> None:
    _bind(triton)
    config = ModelConfig(batching=False)
    decoupled = ModelConfig(batching=False, decoupled=True)
    for name, function, model_config in (
        ("long_answer", _long_answer, config),
        ("held_steps", _held_steps, decoupled),
        ("stream_echo", _stream_echo, decoupled),
    ):
        triton.bind(
            name,
            function,
            inputs=[Tensor(name="in", dtype=bytes, shape=(-1,))],
            outputs=[Tensor(name="out", dtype=bytes, shape=(-1,))],
            config=model_config,
        )


class Probed(NamedTuple):
    """A server whose frontend processes are probed, their pids, and the probe's folder."""

    triton: Triton
    pids: List[int]
    folder: Path


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probed]:
    """A server whose frontend processes are probed (another server of this module may run beside it)."""
    folder = tmp_path_factory.mktemp("probe")
    others = set(frontend_pids())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(PROBE_ENV, str(folder))
        patch.setenv("PYTHONPATH", os.pathsep.join([PROBE, *filter(None, [os.environ.get("PYTHONPATH")])]))
        with running_triton(_bind_probed, frontends=3) as server:
            patch.undo()  # the frontends started: nothing else of this process's needs it
            yield Probed(server, [pid for pid in frontend_pids() if pid not in others], folder)


def _notes(folder: Path, name: str) -> List[Tuple[str, str]]:
    """What the probe noted of the arrays held as `name`: (pickle or rebuild, the thread)."""
    path = folder / f"{name}.notes"
    if not path.exists():
        return []
    return [tuple(line.split(" ", 1)) for line in path.read_text().splitlines()]  # type: ignore[misc]


def _until_noted(folder: Path, name: str, kind: str) -> None:
    for _ in range(600):
        if any(noted == kind for noted, _ in _notes(folder, name)):
            return
        time.sleep(0.1)
    raise AssertionError(f"no frontend came to {kind} {name}")


@contextlib.contextmanager
def _two_on_one_frontend(probed: Probed) -> Iterator[List[http.client.HTTPConnection]]:
    """Two HTTP connections that the same frontend process serves."""
    triton, pids = probed.triton, probed.pids
    by_pid: Dict[int, List[http.client.HTTPConnection]] = {}
    opened = []
    try:
        for _ in range(16):
            connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=60)
            opened.append(connection)
            connection.connect()
            same = by_pid.setdefault(serving_pid(connection.sock, pids), [])
            same.append(connection)
            if len(same) == 2:
                yield same
                return
        raise AssertionError(f"no two connections reached the same frontend of {pids}")
    finally:
        for connection in opened:
            connection.close()


def _post_binary(connection: http.client.HTTPConnection, model: str, array: np.ndarray) -> np.ndarray:
    """`array` to `model` over `connection` (HTTP, binary tensors); its answer "out"."""
    tensor = httpclient.InferInput("in", list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("out", binary_data=True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body([tensor], outputs)
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(json_size)}
    connection.request("POST", f"/v2/models/{model}/infer", body, headers)
    answer = connection.getresponse()
    data = answer.read()
    assert answer.status == 200, data[:500]
    length = answer.getheader("Inference-Header-Content-Length")
    result = httpclient.InferenceServerClient.parse_response_body(data, header_length=int(length) if length else None)
    return result.as_numpy("out")


def _served_meanwhile(connection: http.client.HTTPConnection) -> None:
    """A small request answered by the frontend whose long one is held off its loop."""
    small = np.array([b"small"], dtype=object)
    assert _post_binary(connection, "echo1", small).tolist() == [b"small"]


def _sent_while_held(probed: Probed, model: str, array: np.ndarray, name: str, stage: str) -> List[np.ndarray]:
    """Send `array` to `model` on one connection of a frontend; while the probe holds its `stage` (pickle, rebuild)
    of the long array marked `name`, a small request on another connection of that frontend is answered. Then the
    hold ends: the answers of `array` (one, unless it failed)."""
    answers: List[np.ndarray] = []
    with _two_on_one_frontend(probed) as (long_connection, small_connection):
        sender = threading.Thread(target=lambda: answers.append(_post_binary(long_connection, model, array)))
        sender.start()
        try:
            _until_noted(probed.folder, name, stage)
            _served_meanwhile(small_connection)
            assert sender.is_alive()  # its request waits for the held stage, which waits for this
        finally:
            (probed.folder / name).touch()
            sender.join(60)
    return answers


def _marked(name: str, count: int = LONG) -> np.ndarray:
    return np.array([b"hold:" + name.encode(), *(b"s%d" % index for index in range(1, count))], dtype=object)


def test_a_long_bytes_request_is_pickled_off_the_frontends_loop(probed: Probed) -> None:
    """A frontend pickled a long BYTES input on its event loop as it sent the request to the hub (a million strings:
    35-65 ms of every other client of the frontend). Now a thread does: a small request to the same frontend is
    answered while the pickling is held."""
    array = _marked("request")
    answers = _sent_while_held(probed, "echo1", array, "request", "pickle")
    assert [thread for kind, thread in _notes(probed.folder, "request") if kind == "pickle"] == [OFF_LOOP]
    assert answers and answers[0].tolist() == array.tolist()


def test_a_long_bytes_answer_is_rebuilt_off_the_frontends_loop(probed: Probed) -> None:
    """A frontend rebuilt a long BYTES answer on its event loop as the hub's message came (a million strings: 35-65
    ms of every other client of the frontend). Now a thread does: a small request to the same frontend is answered
    while the rebuilding is held."""
    marker = np.array([b"hold:answer"], dtype=object)
    answers = _sent_while_held(probed, "long_answer", marker, "answer", "rebuild")
    assert _notes(probed.folder, "answer") == [("rebuild", OFF_LOOP)]
    assert answers and answers[0].tolist() == [b"hold:answer", *(b"a%d" % index for index in range(1, LONG))]


def test_a_streams_long_responses_rebuilt_off_the_loop_keep_their_order(probed: Probed) -> None:
    """A stream's long response rebuilt off a frontend's loop is not overtaken by the short ones and the end the hub
    sent after it: they wait behind it. The long one is held until the model has sent everything and each frontend
    has answered a request since (its channel from the hub is in order)."""
    triton, folder = probed.triton, probed.folder
    HELD_STEPS_DONE.clear()
    responses: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        try:
            tensor = grpcclient.InferInput("in", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([b"hold:steps"], dtype=object))
            client.async_stream_infer("held_steps", [tensor], enable_empty_final_response=True)
            _until_noted(folder, "steps", "rebuild")
            assert HELD_STEPS_DONE.wait(60)
            for connection in one_connection_each(probed.triton.http_port, probed.pids).values():
                with contextlib.closing(connection):
                    _served_meanwhile(connection)
        finally:
            (folder / "steps").touch()
        steps = []
        while True:
            result, error = responses.get(timeout=60)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            steps.append(result.as_numpy("out").tolist())
        client.stop_stream()
    expected = [[b"%d-%d" % (step, index) for index in range(LONG if step % 2 == 0 else 1)] for step in range(4)]
    expected[0][0] = b"hold:steps"
    assert steps == expected
    assert {thread for kind, thread in _notes(folder, "steps")} == {OFF_LOOP}


@pytest.mark.parametrize("streaming", [False, True], ids=["ModelInfer", "ModelStreamInfer"])
def test_a_long_grpc_request_is_pickled_off_the_frontends_loop(probed: Probed, streaming: bool) -> None:
    """The long BYTES input of a gRPC request, plain or streamed, is pickled in a frontend's thread too; the
    round trip is exact."""
    triton, folder = probed.triton, probed.folder
    name = f"grpc-{streaming}"
    (folder / name).touch()  # noted, not held
    array = _marked(name)
    tensor = grpcclient.InferInput("in", [LONG], "BYTES")
    tensor.set_data_from_numpy(array)
    with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
        if not streaming:
            answers = [client.infer("echo1", [tensor]).as_numpy("out").tolist()]
        else:
            responses: queue.Queue[Any] = queue.Queue()
            client.start_stream(callback=lambda result, error: responses.put((result, error)))
            client.async_stream_infer("stream_echo", [tensor])
            answers = []
            for _ in range(2):
                result, error = responses.get(timeout=60)
                assert error is None, error
                answers.append(result.as_numpy("out").tolist())
            client.stop_stream()
    assert answers == [array.tolist()] + ([[b"after"]] if streaming else [])
    assert [thread for kind, thread in _notes(folder, name) if kind == "pickle"] == [OFF_LOOP]
