"""Sequence batching: Triton's sequence batcher for Python callables, over HTTP, gRPC and gRPC streams.

The `simple_sequence` stand-in answers as Triton's example model does (OUTPUT = INPUT + START), so that the flows
of Triton's sequence client examples (simple_*sequence*_infer_client.py) run here unchanged in substance.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.client
import json
import os
import queue
import sys
import threading
import time
import uuid
import weakref
from functools import partial
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from pytriton.client import ModelClient
from pytriton.client.exceptions import PyTritonClientInferenceServerError
from pytriton.core.queues import PriorityQueues
from pytriton.core.watch import QueueWatch
from pytriton.exceptions import PyTritonModelConfigError
from pytriton.instances import ProcessInstances
from pytriton.model_config import (
    DynamicBatcher,
    ModelConfig,
    SequenceBatcher,
    SequenceControlInput,
    SequenceControlKind,
    SequenceStrategyDirect,
    SequenceStrategyOldest,
    Tensor,
)
from pytriton.proxy.types import Request
from pytriton.remote_triton import RemoteTriton
from pytriton.triton import Triton
from tests.conftest import ACCESS_TOKEN, HTTP_AUTH, grpc_url, http_url, running_triton
from tests.frontend_processes import serving_pid
from tests.http_helpers import post_json
from tests.waiting import wait_until

START = SequenceControlKind.CONTROL_SEQUENCE_START
END = SequenceControlKind.CONTROL_SEQUENCE_END
READY = SequenceControlKind.CONTROL_SEQUENCE_READY
CORRID = SequenceControlKind.CONTROL_SEQUENCE_CORRID
IO: Dict[str, Any] = {
    "inputs": [Tensor(name="INPUT", dtype=np.int32, shape=(1,))],
    "outputs": [Tensor(name="OUTPUT", dtype=np.int32, shape=(1,))],
}
# The example's values: each sequence starts with its first value, then these (negated for the second and third).
VALUES = [11, 7, 5, 3, 2, 0, 1]
SequenceId = Union[int, str]


def simple_sequence(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """Triton's example model `simple_sequence`: OUTPUT = INPUT + START (its START control input)."""
    return [{"OUTPUT": (request["INPUT"] + request["START"]).astype(np.int32)} for request in requests]


def accumulate(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """A running total per sequence, kept in the sequence's state (works in an instance process as well)."""
    responses = []
    for request in requests:
        assert request.sequence_state is not None
        total = request.sequence_state.get("total", 0) + int(request["INPUT"].sum())
        request.sequence_state["total"] = total
        responses.append({"OUTPUT": np.full(request["INPUT"].shape, total, np.int32)})
    return responses


def accumulate_or_exit(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """`accumulate` that ends its process on a negative input, naming its process in PID."""
    if any(int(request["INPUT"].sum()) < 0 for request in requests):
        os._exit(3)
    pid = np.array([[os.getpid()]], np.int64)
    return [{**response, "PID": pid} for response in accumulate(requests)]


DYING_OUTPUTS = [*IO["outputs"], Tensor(name="PID", dtype=np.int64, shape=(1,))]


SIMPLE_SEQUENCE = ModelConfig(
    max_batch_size=8,
    sequence_batcher=SequenceBatcher(
        control_inputs=[
            SequenceControlInput("START", START, int32_false_true=[0, 1]),
            SequenceControlInput("READY", READY, int32_false_true=[0, 1]),
        ]
    ),
)
ACCUMULATE = ModelConfig(max_batch_size=4, sequence_batcher=SequenceBatcher())
SINGLE_SLOT = ModelConfig(max_batch_size=1, sequence_batcher=SequenceBatcher(direct=SequenceStrategyDirect()))


class Recorder:
    """A callable that records the sequence ids of each batch it runs; `gate` holds a call until set."""

    def __init__(self) -> None:
        self.batches: List[List[SequenceId]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        self.batches.append([request.sequence_id for request in requests if request.sequence_id is not None])
        self.entered.set()
        assert self.gate.wait(30)
        return accumulate(requests)


_READY_ORDER = Recorder()  # the `oldest_order` model's batches
_READY_PICK = Recorder()  # the `oldest_pick` model's batches


class _Token:
    """Something a sequence keeps in its state, whose life shows whether the state was dropped."""


_TOKENS: List[Any] = []  # weak references to every token made in this process


def idle_probe(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """A START keeps a token in its sequence's state; each request answers how many tokens are still alive."""
    responses = []
    for request in requests:
        if request.sequence_start and request.sequence_state is not None:
            token = _Token()
            request.sequence_state["token"] = token
            _TOKENS.append(weakref.ref(token))
            del token
        responses.append({"OUTPUT": np.array([[sum(ref() is not None for ref in _TOKENS)]], np.int32)})
    return responses


_TWO_SLOTS_BATCHES: List[List[Optional[SequenceId]]] = []  # the sequence ids of each batch `two_slots` ran


def two_slots(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """`accumulate`, recording every request of each batch it gets (a request with no sequence as None)."""
    _TWO_SLOTS_BATCHES.append([request.sequence_id for request in requests])
    return accumulate(requests)


def controls(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """Echo the control inputs, as the backends get them."""
    return [
        {
            "START": request["S"].astype(np.float32),
            "END": request["E"],
            "READY": request["R"],
            "CORRID": request["C"],
            "OUTPUT": request["INPUT"],
        }
        for request in requests
    ]


CONTROLS_OUTPUTS = [
    Tensor(name="START", dtype=np.float32, shape=(1,)),
    Tensor(name="END", dtype=np.bool_, shape=(1,)),
    Tensor(name="READY", dtype=np.int32, shape=(1,)),
    Tensor(name="CORRID", dtype=bytes, shape=(1,)),
    Tensor(name="OUTPUT", dtype=np.int32, shape=(1,)),
]


def _bind(triton: Triton, recorder: Recorder, oldest_recorder: Recorder) -> None:
    triton.bind("simple_sequence", simple_sequence, **IO, config=SIMPLE_SEQUENCE)
    triton.bind("accumulate", accumulate, **IO, config=ACCUMULATE)
    triton.bind("refusals", accumulate, **IO, config=ACCUMULATE)
    triton.bind("stream_fast", accumulate, **IO, config=ACCUMULATE)
    triton.bind("accumulate_process", ProcessInstances(accumulate), **IO, config=ACCUMULATE)
    _bind_dying(triton)
    triton.bind("recorder", recorder, **IO, config=ModelConfig(max_batch_size=4, sequence_batcher=SequenceBatcher()))
    single_slot = ModelConfig(max_batch_size=1, sequence_batcher=SequenceBatcher(direct=SequenceStrategyDirect()))
    triton.bind("single_slot", accumulate, **IO, config=single_slot)
    triton.bind("backlog", accumulate, **IO, config=SINGLE_SLOT)
    two_slots_config = ModelConfig(max_batch_size=2, sequence_batcher=SequenceBatcher(direct=SequenceStrategyDirect()))
    triton.bind("two_slots", two_slots, **IO, config=two_slots_config)
    slow_idle = SequenceBatcher(direct=SequenceStrategyDirect(), max_sequence_idle_microseconds=60_000_000)
    triton.bind("backlog_cancel", accumulate, **IO, config=ModelConfig(max_batch_size=1, sequence_batcher=slow_idle))
    idle = ModelConfig(max_batch_size=2, sequence_batcher=SequenceBatcher(max_sequence_idle_microseconds=100_000))
    triton.bind("idle", accumulate, **IO, config=idle)
    triton.bind("idle_probe", idle_probe, **IO, config=idle)
    triton.bind("idle_probe_process", ProcessInstances(idle_probe), **IO, config=idle)
    string_controls = SequenceBatcher(
        control_inputs=[
            SequenceControlInput("S", START, fp32_false_true=[0.0, 1.0]),
            SequenceControlInput("E", END, bool_false_true=[False, True]),
            SequenceControlInput("R", READY, int32_false_true=[5, 9]),
            SequenceControlInput("C", CORRID, data_type=bytes),
        ]
    )
    triton.bind(
        "controls",
        controls,
        inputs=IO["inputs"],
        outputs=CONTROLS_OUTPUTS,
        config=ModelConfig(max_batch_size=2, sequence_batcher=string_controls),
    )
    numeric_corrid = SequenceBatcher(
        oldest=SequenceStrategyOldest(max_candidate_sequences=3),
        control_inputs=[SequenceControlInput("CORRID", CORRID, data_type=np.uint64)],
    )
    triton.bind("corrid", _corrid_echo, **IO, config=ModelConfig(max_batch_size=2, sequence_batcher=numeric_corrid))
    int32_corrid = SequenceBatcher(control_inputs=[SequenceControlInput("CORRID", CORRID, data_type=np.int32)])
    triton.bind("corrid32", _corrid_echo, **IO, config=ModelConfig(max_batch_size=2, sequence_batcher=int32_corrid))
    oldest = SequenceStrategyOldest(preferred_batch_size=[3], max_queue_delay_microseconds=60_000_000)
    oldest_config = ModelConfig(max_batch_size=4, sequence_batcher=SequenceBatcher(oldest=oldest))
    triton.bind("oldest", oldest_recorder, **IO, config=oldest_config)
    ready_order = SequenceBatcher(oldest=SequenceStrategyOldest(), max_sequence_idle_microseconds=60_000_000)
    triton.bind("oldest_order", _READY_ORDER, **IO, config=ModelConfig(max_batch_size=2, sequence_batcher=ready_order))
    candidates = SequenceBatcher(
        oldest=SequenceStrategyOldest(max_candidate_sequences=3), max_sequence_idle_microseconds=60_000_000
    )
    triton.bind("oldest_pick", _READY_PICK, **IO, config=ModelConfig(max_batch_size=2, sequence_batcher=candidates))
    streaming = ModelConfig(max_batch_size=2, decoupled=True, sequence_batcher=SequenceBatcher())
    triton.bind("streaming", stream_totals, **IO, config=streaming)


def _bind_dying(triton: Triton) -> None:
    dying = ProcessInstances(accumulate_or_exit, count=2)
    # Sequences that outlive the restart's wait (the first request after the death waits for the new process).
    config = ModelConfig(max_batch_size=4, sequence_batcher=SequenceBatcher(max_sequence_idle_microseconds=60_000_000))
    triton.bind("dying", dying, inputs=IO["inputs"], outputs=DYING_OUTPUTS, config=config)


def stream_totals(requests: List[Request]) -> Iterator[List[Dict[str, np.ndarray]]]:
    """A decoupled model: the running total, then the total again times ten, per request."""
    totals = accumulate(requests)
    yield totals
    yield [{"OUTPUT": response["OUTPUT"] * 10} for response in totals]


def _corrid_echo(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    return [{"OUTPUT": request["CORRID"].astype(np.int32)} for request in requests]


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="module")
def oldest_recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="module")
def server(recorder: Recorder, oldest_recorder: Recorder) -> Iterator[Triton]:
    with running_triton(partial(_bind, recorder=recorder, oldest_recorder=oldest_recorder)) as triton:
        yield triton


@pytest.fixture(scope="module")
def frontends_recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="module")
def frontends_server(frontends_recorder: Recorder) -> Iterator[Triton]:
    def bind(triton: Triton) -> None:
        triton.bind("simple_sequence", simple_sequence, **IO, config=SIMPLE_SEQUENCE)
        triton.bind("accumulate_process", ProcessInstances(accumulate), **IO, config=ACCUMULATE)
        _bind_dying(triton)
        triton.bind("accumulate", accumulate, **IO, config=ACCUMULATE)
        triton.bind("backlog", accumulate, **IO, config=SINGLE_SLOT)
        triton.bind("stream_fast", accumulate, **IO, config=ACCUMULATE)
        sequences = ModelConfig(max_batch_size=4, sequence_batcher=SequenceBatcher())
        triton.bind("recorder", frontends_recorder, **IO, config=sequences)

    with running_triton(bind, frontends=3) as triton:
        yield triton


@pytest.fixture(params=["one process", "frontends=3"])
def any_server(request: pytest.FixtureRequest) -> Triton:
    name = "server" if request.param == "one process" else "frontends_server"
    triton: Triton = request.getfixturevalue(name)
    return triton


def _input(module: Any, value: int, rows: int = 1) -> Any:
    tensor = module.InferInput("INPUT", [rows, 1], "INT32")
    tensor.set_data_from_numpy(np.full((rows, 1), value, np.int32))
    return tensor


def _example_sequences() -> List[Tuple[SequenceId, List[int]]]:
    """The example's three sequences: two integer ids and one uuid4 string id."""
    return [
        (1000, [0, *VALUES]),
        (1001, [100, *[-value for value in VALUES]]),
        (str(uuid.uuid4()), [20, *[-value for value in VALUES]]),
    ]


def _expected(values: List[int]) -> List[int]:
    """What `simple_sequence` answers: the first value plus one (its START), then each value."""
    return [values[0] + 1, *values[1:]]


def _flags(index: int, count: int) -> Dict[str, bool]:
    return {"sequence_start": index == 0, "sequence_end": index == count - 1}


# -- the flows of Triton's four sequence client examples ---------------------------------------------------


def test_http_sync_as_triton_example(any_server: Triton) -> None:
    client = httpclient.InferenceServerClient(http_url(any_server))
    for sequence_id, values in _example_sequences():
        results = []
        for index, value in enumerate(values):
            result = client.infer(
                "simple_sequence",
                [_input(httpclient, value)],
                outputs=[httpclient.InferRequestedOutput("OUTPUT")],
                sequence_id=sequence_id,
                **_flags(index, len(values)),
            )
            results.append(int(result.as_numpy("OUTPUT")[0][0]))
        assert results == _expected(values)


def test_grpc_sync_as_triton_example(any_server: Triton) -> None:
    with grpcclient.InferenceServerClient(grpc_url(any_server)) as client:
        for sequence_id, values in _example_sequences():
            results = []
            for index, value in enumerate(values):
                result = client.infer(
                    "simple_sequence",
                    [_input(grpcclient, value)],
                    sequence_id=sequence_id,
                    **_flags(index, len(values)),
                )
                results.append(int(result.as_numpy("OUTPUT")[0][0]))
            assert results == _expected(values)


def _by_sequence(responses: List[Any], sequences: List[Tuple[SequenceId, List[int]]]) -> Dict[str, List[int]]:
    """Stream results grouped by the sequence named in their request id ("<sequence id>_<count>"), in order."""
    grouped: Dict[str, List[int]] = {str(sequence_id): [] for sequence_id, _ in sequences}
    for result in responses:
        grouped[result.get_response().id.rsplit("_", 1)[0]].append(int(result.as_numpy("OUTPUT")[0][0]))
    return grouped


def test_grpc_stream_as_triton_example(any_server: Triton) -> None:
    sequences = _example_sequences()
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_url(any_server)) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        for sequence_id, values in sequences:
            for index, value in enumerate(values):
                client.async_stream_infer(
                    "simple_sequence",
                    [_input(grpcclient, value)],
                    request_id=f"{sequence_id}_{index + 1}",
                    sequence_id=sequence_id,
                    **_flags(index, len(values)),
                )
        received = [answers.get(timeout=30) for _ in range(sum(len(values) for _, values in sequences))]
        client.stop_stream()
    assert not [item for item in received if isinstance(item, InferenceServerException)]
    grouped = _by_sequence(received, sequences)
    assert grouped == {str(sequence_id): _expected(values) for sequence_id, values in sequences}


def test_grpc_aio_stream_as_triton_example(any_server: Triton) -> None:
    sequences = _example_sequences()

    async def requests() -> Any:
        for sequence_id, values in sequences:
            for index, value in enumerate(values):
                yield {
                    "model_name": "simple_sequence",
                    "inputs": [_input(grpcaio, value)],
                    "request_id": f"{sequence_id}_{index + 1}",
                    "sequence_id": sequence_id,
                    **_flags(index, len(values)),
                }

    async def run() -> List[Any]:
        received = []
        async with grpcaio.InferenceServerClient(grpc_url(any_server)) as client:
            async for result, error in client.stream_infer(inputs_iterator=requests()):
                assert error is None, error
                received.append(result)
                if len(received) == sum(len(values) for _, values in sequences):
                    break
        return received

    grouped = _by_sequence(asyncio.run(run()), sequences)
    assert grouped == {str(sequence_id): _expected(values) for sequence_id, values in sequences}


# -- the state API ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["accumulate", "accumulate_process"])
def test_state_is_kept_per_sequence_interleaved(server: Triton, model: str) -> None:
    http = httpclient.InferenceServerClient(http_url(server))
    with grpcclient.InferenceServerClient(grpc_url(server)) as grpc:
        ids: List[SequenceId] = [7, "seven", "7"]  # 7 and "7" are two sequences, as in Triton
        totals = {sequence_id: 0 for sequence_id in ids}
        for step in range(4):
            for number, sequence_id in enumerate(ids):
                value = (number + 1) * 10 + step
                totals[sequence_id] += value
                client, module = (http, httpclient) if step % 2 else (grpc, grpcclient)
                result = client.infer(
                    model,
                    [_input(module, value)],
                    sequence_id=sequence_id,
                    sequence_start=step == 0,
                    sequence_end=step == 3,
                )
                assert int(result.as_numpy("OUTPUT")[0][0]) == totals[sequence_id]


def test_state_over_frontends_and_process_instances(frontends_server: Triton) -> None:
    client = httpclient.InferenceServerClient(http_url(frontends_server))
    outputs = []
    for index, value in enumerate([1, 2, 3]):
        # The largest uint64 id (gRPC's int64 parameter cannot carry it; HTTP's JSON can).
        result = client.infer(
            "accumulate_process", [_input(httpclient, value)], sequence_id=2**64 - 1, **_flags(index, 3)
        )
        outputs.append(int(result.as_numpy("OUTPUT")[0][0]))
    assert outputs == [1, 3, 6]


def test_a_negative_grpc_id_is_the_unsigned_id_of_its_bits(server: Triton) -> None:
    # gRPC carries an integer id as int64: Triton reads -1 as 2**64 - 1, the id HTTP's JSON can send as it is.
    with grpcclient.InferenceServerClient(grpc_url(server)) as grpc:
        grpc.infer("accumulate", [_input(grpcclient, 2)], sequence_id=-1, sequence_start=True)
    http = httpclient.InferenceServerClient(http_url(server))
    result = http.infer("accumulate", [_input(httpclient, 3)], sequence_id=2**64 - 1, sequence_end=True)
    assert result.as_numpy("OUTPUT").tolist() == [[5]]


def test_start_on_a_live_sequence_starts_it_again(server: Triton) -> None:
    client = httpclient.InferenceServerClient(http_url(server))

    def send(value: int, **flags: bool) -> int:
        result = client.infer("accumulate", [_input(httpclient, value)], sequence_id=31, **flags)
        return int(result.as_numpy("OUTPUT")[0][0])

    assert send(5, sequence_start=True) == 5
    assert send(6) == 11
    assert send(100, sequence_start=True) == 100  # Triton warns of the conflict and goes on: a fresh state
    assert send(1, sequence_end=True) == 101


# -- Triton's errors -----------------------------------------------------------------------------------------

ERRORS = [
    ({}, 1, "inference request to model 'accumulate' must specify a non-zero or non-empty correlation ID"),
    ({"sequence_id": 0, "sequence_start": True}, 1, "must specify a non-zero or non-empty correlation ID"),
    ({"sequence_id": "", "sequence_start": True}, 1, "must specify a non-zero or non-empty correlation ID"),
    (
        {"sequence_id": 4242},
        1,
        "inference request for sequence 4242 to model 'accumulate' must specify the START flag on the first request "
        "of the sequence",
    ),
    ({"sequence_id": "nope"}, 1, "inference request for sequence nope to model 'accumulate' must specify the START"),
    (
        {"sequence_id": 4243, "sequence_start": True},
        2,
        "inference request to model 'accumulate' must specify batch-size 1 due to requirements of sequence batcher",
    ),
]


@pytest.mark.parametrize(("parameters", "rows", "message"), ERRORS)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_errors_as_triton(
    any_server: Triton, protocol: str, parameters: Dict[str, Any], rows: int, message: str
) -> None:
    if protocol == "http":
        client: Any = httpclient.InferenceServerClient(http_url(any_server))
        module: Any = httpclient
    else:
        client = grpcclient.InferenceServerClient(grpc_url(any_server))
        module = grpcclient
    with pytest.raises(InferenceServerException) as raised:
        client.infer("accumulate", [_input(module, 1, rows)], **parameters)
    assert message in raised.value.message()
    assert raised.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")


def test_refused_requests_count_no_failure(server: Triton) -> None:
    # tritonserver 2.51, the same five requests to a fresh sequence model: inference_stats success 1, fail 0,
    # and nv_inference_request_failure 0 for every reason: its sequence batcher's refusals are not the model's.
    client = httpclient.InferenceServerClient(http_url(server))
    refused: List[Dict[str, Any]] = [{}, {"sequence_id": 0, "sequence_start": True}, {"sequence_id": 8}]
    for parameters in refused:
        with pytest.raises(InferenceServerException, match="must specify"):
            client.infer("refusals", [_input(httpclient, 1)], **parameters)
    with pytest.raises(InferenceServerException, match="must specify batch-size 1"):
        client.infer("refusals", [_input(httpclient, 1, rows=2)], sequence_id=8, sequence_start=True)
    client.infer("refusals", [_input(httpclient, 1)], sequence_id=8, sequence_start=True, sequence_end=True)
    statistics = client.get_inference_statistics("refusals", headers={"triton-access-token": ACCESS_TOKEN})
    counts = statistics["model_stats"][0]["inference_stats"]
    assert (counts["success"]["count"], counts["fail"]["count"]) == (1, 0)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        # tritonserver 2.51 answers each of these 500 with this error (400 here: the client sent it).
        ({"sequence_id": -1}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
        ({"sequence_id": 2**64}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
        ({"sequence_id": 1.5}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
        ({"sequence_id": True}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
        ({"sequence_id": None}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
        ({"sequence_id": {"a": 1}}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
        ({"sequence_start": 1}, "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean"),
        ({"sequence_end": "true"}, "Unable to parse 'sequence_end': attempt to access JSON non-boolean as boolean"),
    ],
)
def test_sequence_parameters_of_a_wrong_type_get_tritons_words(
    server: Triton, parameters: Dict[str, Any], message: str
) -> None:
    body = {
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
        "parameters": {"sequence_id": 5, "sequence_start": True, **parameters},
    }
    status, document = post_json(server.http_port, "/v2/models/accumulate/infer", body)
    assert (status, document) == (400, {"error": message})


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_string_id_over_128_bytes_is_refused_as_triton(any_server: Triton, protocol: str) -> None:
    # tritonserver 2.51 (its core's TRITONSERVER_InferenceRequestSetCorrelationIdString): an id of 129 bytes or
    # more (UTF-8: 65 x "é" is 130) is 501 / UNIMPLEMENTED, to any model, counted as no failure; 128 runs. Ours
    # took an id of any size (1 MB, 4 MB) and kept it while the sequence lived, and a copy in each CORRID input.
    module: Any = httpclient if protocol == "http" else grpcclient
    client: Any = module.InferenceServerClient(http_url(any_server) if protocol == "http" else grpc_url(any_server))
    flags = {"sequence_start": True, "sequence_end": True}
    for sequence_id in ("c" * 128, "é" * 64):
        result = client.infer("accumulate", [_input(module, 3)], sequence_id=sequence_id, **flags)
        assert result.as_numpy("OUTPUT").tolist() == [[3]]
    for sequence_id in ("c" * 129, "é" * 65, "a" * (1 << 20)):
        with pytest.raises(InferenceServerException) as raised:
            client.infer("accumulate", [_input(module, 1)], sequence_id=sequence_id, **flags)
        assert (raised.value.status(), raised.value.message()) == (
            "501" if protocol == "http" else "StatusCode.UNIMPLEMENTED",
            "string correlation ID cannot be longer than 128 characters",
        )


def test_a_sequence_takes_no_request_after_its_end(server: Triton) -> None:
    client = httpclient.InferenceServerClient(http_url(server))
    client.infer("accumulate", [_input(httpclient, 1)], sequence_id=55, sequence_start=True, sequence_end=True)
    with pytest.raises(InferenceServerException, match="sequence 55 to model 'accumulate' must specify the START"):
        client.infer("accumulate", [_input(httpclient, 1)], sequence_id=55)


def test_corrid_of_another_type_is_refused(server: Triton) -> None:
    client = httpclient.InferenceServerClient(http_url(server))
    with pytest.raises(InferenceServerException) as raised:
        client.infer("corrid", [_input(httpclient, 1)], sequence_id="abc", sequence_start=True)
    assert raised.value.message() == (
        "sequence batching control 'CORRID' data-type is 'BYTES', but model 'corrid' expects 'UINT64'"
    )
    with pytest.raises(InferenceServerException, match="data-type is 'UINT64', but model 'controls' expects 'BYTES'"):
        client.infer("controls", [_input(httpclient, 1)], sequence_id=3, sequence_start=True)


# -- control inputs -----------------------------------------------------------------------------------------


def test_control_inputs_as_configured(server: Triton) -> None:
    with grpcclient.InferenceServerClient(grpc_url(server)) as client:
        seen = []
        for index in range(3):
            result = client.infer("controls", [_input(grpcclient, index)], sequence_id="ctl-1", **_flags(index, 3))
            seen.append(tuple(result.as_numpy(name).tolist() for name in ("START", "END", "READY", "CORRID")))
    assert seen == [
        ([[1.0]], [[False]], [[9]], [[b"ctl-1"]]),
        ([[0.0]], [[False]], [[9]], [[b"ctl-1"]]),
        ([[0.0]], [[True]], [[9]], [[b"ctl-1"]]),
    ]
    client = httpclient.InferenceServerClient(http_url(server))
    result = client.infer("corrid", [_input(httpclient, 1)], sequence_id=123456, sequence_start=True, sequence_end=True)
    assert result.as_numpy("OUTPUT").tolist() == [[123456]]


def test_a_corrid_too_large_for_its_type_keeps_its_low_bits(server: Triton) -> None:
    client = httpclient.InferenceServerClient(http_url(server))
    result = client.infer("corrid32", [_input(httpclient, 1)], sequence_id=2**32 + 5, sequence_start=True)
    assert result.as_numpy("OUTPUT").tolist() == [[5]]


@pytest.mark.parametrize("frontends", [False, True], ids=["one process", "frontends=3"])
def test_a_stream_answers_in_request_order(request: pytest.FixtureRequest, frontends: bool) -> None:
    # tritonserver 2.51 on one stream: a sequence's request in a 0.3 s step, then a refused request and a fast
    # request to another model: the three answers left together at 0.42 s, in request order (ours sent the two
    # fast ones first).
    server: Triton = request.getfixturevalue("frontends_server" if frontends else "server")
    recorder: Recorder = request.getfixturevalue("frontends_recorder" if frontends else "recorder")
    answers: queue.Queue[Any] = queue.Queue()
    http = httpclient.InferenceServerClient(http_url(server))
    auth = {"triton-access-token": ACCESS_TOKEN}
    recorder.entered.clear()
    recorder.gate.clear()
    try:
        with grpcclient.InferenceServerClient(grpc_url(server)) as client:
            client.start_stream(callback=lambda result, error: answers.put(error or result))
            client.async_stream_infer(
                "recorder", [_input(grpcclient, 1)], request_id="slow", sequence_id=77, sequence_start=True
            )
            assert recorder.entered.wait(10)
            client.async_stream_infer("accumulate", [_input(grpcclient, 1)], request_id="refused", sequence_id=78)
            client.async_stream_infer(
                "stream_fast", [_input(grpcclient, 2)], request_id="fast", sequence_id=79, sequence_start=True
            )
            deadline = time.monotonic() + 10
            while not http.get_inference_statistics("stream_fast", headers=auth)["model_stats"][0]["inference_count"]:
                assert time.monotonic() < deadline, "the fast request never ran"
                time.sleep(0.01)
            assert answers.empty()  # the fast request ran; its answer waits for the slow one's
            recorder.gate.set()
            received = [answers.get(timeout=10) for _ in range(3)]
            client.stop_stream()
    finally:
        recorder.gate.set()
    assert received[0].get_response().id == "slow"
    assert isinstance(received[1], InferenceServerException)
    assert "sequence 78 to model 'accumulate' must specify the START flag" in received[1].message()
    assert received[2].get_response().id == "fast"
    http.infer("recorder", [_input(httpclient, 0)], sequence_id=77, sequence_end=True)


def test_a_decoupled_model_streams_per_sequence(server: Triton) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_url(server)) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        for index, value in enumerate([1, 2, 3]):
            client.async_stream_infer("streaming", [_input(grpcclient, value)], sequence_id="s", **_flags(index, 3))
        received = [answers.get(timeout=30) for _ in range(6)]
        client.stop_stream()
    assert [int(result.as_numpy("OUTPUT")[0][0]) for result in received] == [1, 10, 3, 30, 6, 60]


def test_config_shows_the_sequence_batcher_as_triton(server: Triton) -> None:
    client = httpclient.InferenceServerClient(http_url(server))
    config = client.get_model_config("simple_sequence")
    assert "dynamic_batching" not in config
    assert config["sequence_batching"] == {  # as Triton 2.51 prints its example's config
        "max_sequence_idle_microseconds": 1000000,
        "control_input": [
            {
                "name": name,
                "control": [
                    {
                        "kind": kind,
                        "int32_false_true": [0, 1],
                        "fp32_false_true": [],
                        "bool_false_true": [],
                        "data_type": "TYPE_INVALID",
                    }
                ],
            }
            for name, kind in (("START", "CONTROL_SEQUENCE_START"), ("READY", "CONTROL_SEQUENCE_READY"))
        ],
        "state": [],
        "iterative_sequence": False,
    }
    oldest = client.get_model_config("corrid")["sequence_batching"]
    assert oldest["oldest"] == {
        "max_candidate_sequences": 3,
        "preferred_batch_size": [2],
        "max_queue_delay_microseconds": 0,
        "preserve_ordering": False,
    }
    assert oldest["control_input"][0]["control"][0]["data_type"] == "TYPE_UINT64"
    start = client.get_model_config("controls")["sequence_batching"]["control_input"][0]["control"][0]
    assert start["fp32_false_true"] == [0, 1] and start["data_type"] == "TYPE_INVALID"  # Triton prints 0 and 1
    direct = client.get_model_config("single_slot")["sequence_batching"]["direct"]
    assert direct == {"max_queue_delay_microseconds": 0, "minimum_slot_utilization": 0}
    assert "sequence" in client.get_server_metadata()["extensions"]
    with grpcclient.InferenceServerClient(grpc_url(server)) as grpc:
        batching = grpc.get_model_config("simple_sequence", as_json=True)["config"]["sequence_batching"]
    assert [control["name"] for control in batching["control_input"]] == ["START", "READY"]


# -- slots, batches and idle sequences ----------------------------------------------------------------------


def _scheduler(triton: Triton, model: str) -> Any:
    return triton._runtime.engine.model(model).scheduler


def _wait_pending(triton: Triton, model: str, count: int) -> None:
    """Wait until `count` requests wait in the model's queue (test-only view of the engine)."""
    scheduler = _scheduler(triton, model)
    deadline = time.monotonic() + 10
    while scheduler.pending != count:
        assert time.monotonic() < deadline, f"{scheduler.pending} requests queued, not {count}"
        time.sleep(0.002)


def _send(
    pool: concurrent.futures.Executor, triton: Triton, model: str, sequence_id: SequenceId, value: int, **flags: bool
) -> concurrent.futures.Future[int]:
    def call() -> int:
        with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
            result = client.infer(model, [_input(grpcclient, value)], sequence_id=sequence_id, **flags)
            return int(result.as_numpy("OUTPUT")[0][0])

    return pool.submit(call)


def test_batches_mix_sequences_one_request_each(server: Triton, recorder: Recorder) -> None:
    recorder.batches.clear()
    recorder.entered.clear()
    recorder.gate.clear()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        try:
            first = _send(pool, server, "recorder", 1, 1, sequence_start=True)
            assert recorder.entered.wait(10)
            # While sequence 1 runs: its next request, and three new sequences (each with two requests) queue.
            queued = [_send(pool, server, "recorder", 1, 2)]
            _wait_pending(server, "recorder", 1)
            for sequence_id in (2, 3, 4):
                queued.append(_send(pool, server, "recorder", sequence_id, 10, sequence_start=True))
                _wait_pending(server, "recorder", len(queued))
            for sequence_id in (2, 3, 4):
                queued.append(_send(pool, server, "recorder", sequence_id, 5, sequence_end=True))
                _wait_pending(server, "recorder", len(queued))
        finally:
            recorder.gate.set()
        assert first.result(10) == 1
        assert [future.result(10) for future in queued] == [3, 10, 10, 10, 15, 15, 15]
        _send(pool, server, "recorder", 1, 0, sequence_end=True).result(10)
    # The four sequences' next requests ran together, one each; their second requests the batch after.
    assert recorder.batches == [[1], [1, 2, 3, 4], [2, 3, 4], [1]]


def test_the_oldest_strategy_waits_for_a_preferred_batch(server: Triton, oldest_recorder: Recorder) -> None:
    # A minute's delay: the requests wait until three sequences have one ready (the preferred size).
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = []
        for sequence_id in (11, 12, 13):
            futures.append(_send(pool, server, "oldest", sequence_id, sequence_id, sequence_start=True))
            if sequence_id < 13:
                _wait_pending(server, "oldest", len(futures))
        assert [future.result(10) for future in futures] == [11, 12, 13]
    assert oldest_recorder.batches == [[11, 12, 13]]


def _ready_order_batches(server: Triton, model: str, recorder: Recorder, later: List[int]) -> List[List[SequenceId]]:
    """Sequence 1's START runs held; its next request, then each of `later`'s START queue; the batches run."""
    recorder.batches.clear()
    recorder.entered.clear()
    recorder.gate.clear()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        try:
            first = _send(pool, server, model, 1, 1, sequence_start=True)
            assert recorder.entered.wait(10)
            queued = [_send(pool, server, model, 1, 2)]
            _wait_pending(server, model, 1)
            for sequence_id in later:
                queued.append(_send(pool, server, model, sequence_id, 10, sequence_start=True))
                _wait_pending(server, model, len(queued))
        finally:
            recorder.gate.set()
        assert first.result(10) == 1
        assert [future.result(10) for future in queued] == [3] + [10] * len(later)
        for sequence_id in [1, *later]:
            _send(pool, server, model, sequence_id, 0, sequence_end=True).result(10)
    return recorder.batches[: -1 - len(later)]


def test_the_oldest_strategy_orders_sequences_by_when_they_became_ready(server: Triton) -> None:
    # tritonserver 2.51, oldest, max_batch_size 2: A1 running (300 ms), A2 then B1 queued: the next batch was
    # [B1, A2]. Its oldest strategy hands a sequence's next request to its dynamic batcher only once the previous
    # one finished: A2 became ready after B1. Ours ran [A2, B1] (arrival order).
    assert _ready_order_batches(server, "oldest_order", _READY_ORDER, [2]) == [[1], [2, 1]]


def test_the_oldest_strategy_picks_the_sequences_ready_first(server: Triton) -> None:
    # tritonserver 2.51, max_candidate_sequences 3 over max_batch_size 2: A1 running (300 ms), A2, B1, C1 queued:
    # the batches were [A1], [B1, C1], [A2], the sequences ready first taken. Ours ran [A2, B1], then [C1].
    assert _ready_order_batches(server, "oldest_pick", _READY_PICK, [2, 3]) == [[1], [2, 3], [1]]


def test_the_oldest_strategy_orders_a_batchs_next_requests_by_its_order(server: Triton) -> None:
    # tritonserver 2.51, oldest, 3 candidates over max_batch_size 2: X1 running (300 ms), A1, B1 queued, then B2,
    # A2: after [A1, B1] (B1 100 ms) the batch was [A2, B2]: they became ready as A1 then B1 finished. Ours ran
    # [B2, A2] (arrival order).
    _READY_PICK.batches.clear()
    _READY_PICK.entered.clear()
    _READY_PICK.gate.clear()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        try:
            first = _send(pool, server, "oldest_pick", 1, 1, sequence_start=True)
            assert _READY_PICK.entered.wait(10)
            queued = []
            for sequence_id, start in ((2, True), (3, True), (3, False), (2, False)):
                queued.append(_send(pool, server, "oldest_pick", sequence_id, 10, sequence_start=start))
                _wait_pending(server, "oldest_pick", len(queued))
        finally:
            _READY_PICK.gate.set()
        assert first.result(10) == 1
        assert [future.result(10) for future in queued] == [10, 10, 20, 20]
        for sequence_id in (1, 2, 3):
            _send(pool, server, "oldest_pick", sequence_id, 0, sequence_end=True).result(10)
    assert _READY_PICK.batches[:3] == [[1], [2, 3], [2, 3]]


def test_a_sequence_without_a_free_slot_waits_for_one(server: Triton) -> None:
    # single_slot: one instance, max_batch_size 1: one slot.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert _send(pool, server, "single_slot", 1, 1, sequence_start=True).result(10) == 1
        waiting = _send(pool, server, "single_slot", 2, 100, sequence_start=True, sequence_end=True)
        _wait_pending(server, "single_slot", 1)
        assert _send(pool, server, "single_slot", 1, 2).result(10) == 3  # the slot's sequence goes on
        assert not waiting.done() and _scheduler(server, "single_slot").pending == 1
        assert _send(pool, server, "single_slot", 1, 3, sequence_end=True).result(10) == 6
        assert waiting.result(10) == 100  # sequence 1 ended: sequence 2 took its slot


def test_a_lone_request_of_a_later_slot_runs_alone(server: Triton) -> None:
    # tritonserver 2.51's direct strategy fills the free slots below a batch's highest one with null requests
    # (READY false): its model got 2 requests for sequence 2's lone ones, and its batch_stats counted batches of 2.
    # A callable gets only clients' requests.
    _TWO_SLOTS_BATCHES.clear()
    client = httpclient.InferenceServerClient(http_url(server))
    steps: List[Tuple[int, Dict[str, bool]]] = [
        (1, {"sequence_start": True}),
        (2, {"sequence_start": True}),
        (1, {"sequence_end": True}),
        (2, {}),
        (2, {"sequence_end": True}),
    ]
    for sequence_id, flags in steps:
        client.infer("two_slots", [_input(httpclient, 1)], sequence_id=sequence_id, **flags)
    assert _TWO_SLOTS_BATCHES == [[1], [2], [1], [2], [2]]
    statistics = client.get_inference_statistics("two_slots", headers={"triton-access-token": ACCESS_TOKEN})
    batches = statistics["model_stats"][0]["batch_stats"]
    assert [(batch["batch_size"], batch["compute_infer"]["count"]) for batch in batches] == [(1, 5)]


def test_a_sequence_waiting_for_a_slot_past_its_timeout_ends(any_server: Triton) -> None:
    # tritonserver 2.51, one slot held and a second sequence's START with a 200 ms timeout: after it, 503 /
    # UNAVAILABLE "timeout of the corresponding sequence has been expired"; the sequence is gone (its next request
    # needs START); the model counts fail 1 (nv_inference_request_failure REJECTED). Ours served it once the slot
    # was free, whenever that was.
    http = httpclient.InferenceServerClient(http_url(any_server))
    http.infer("backlog", [_input(httpclient, 1)], sequence_id=1, sequence_start=True)
    with pytest.raises(InferenceServerException) as raised:
        http.infer("backlog", [_input(httpclient, 5)], sequence_id=2, sequence_start=True, timeout=100_000)
    assert (raised.value.status(), raised.value.message()) == (
        "503",
        "timeout of the corresponding sequence has been expired",
    )
    with pytest.raises(InferenceServerException, match="sequence 2 to model 'backlog' must specify the START flag"):
        http.infer("backlog", [_input(httpclient, 5)], sequence_id=2, sequence_end=True)
    result = http.infer("backlog", [_input(httpclient, 2)], sequence_id=1, sequence_end=True)
    assert result.as_numpy("OUTPUT").tolist() == [[3]]  # the slot's sequence went on
    # A sequence whose slot frees before its timeout runs.
    http.infer("backlog", [_input(httpclient, 1)], sequence_id=1, sequence_start=True)

    def start_waiting() -> Any:
        with grpcclient.InferenceServerClient(grpc_url(any_server)) as grpc:
            inputs = [_input(grpcclient, 4)]
            result = grpc.infer("backlog", inputs, sequence_id=3, sequence_start=True, timeout=60_000_000)
            return result.as_numpy("OUTPUT").tolist()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(start_waiting)
        _wait_pending(any_server, "backlog", 1)
        http.infer("backlog", [_input(httpclient, 2)], sequence_id=1, sequence_end=True)
        assert waiting.result(10) == [[4]]
    http.infer("backlog", [_input(httpclient, 0)], sequence_id=3, sequence_end=True)
    statistics = http.get_inference_statistics("backlog", headers={"triton-access-token": ACCESS_TOKEN})
    counts = statistics["model_stats"][0]["inference_stats"]
    assert (counts["success"]["count"], counts["fail"]["count"]) == (6, 1)


def test_a_cancelled_request_ends_its_sequence_as_triton(server: Triton) -> None:
    # tritonserver 2.51, one slot held (idle after 60 s), a second sequence's START (gRPC, 1 s deadline) and its
    # next request waiting for a slot: the START's deadline passes and the sequence is cancelled: its next request
    # is answered CANCELLED with no words (HTTP 400 {"error":""}) and the one after needs START again. Ours ran
    # the rest of the sequence without its START once a slot was free.
    http = httpclient.InferenceServerClient(http_url(server))
    http.infer("backlog_cancel", [_input(httpclient, 1)], sequence_id=1, sequence_start=True)

    def start() -> str:
        with (
            grpcclient.InferenceServerClient(grpc_url(server)) as grpc,
            pytest.raises(InferenceServerException) as raised,
        ):
            grpc.infer("backlog_cancel", [_input(grpcclient, 3)], sequence_id=2, sequence_start=True, client_timeout=1)
        return str(raised.value.status())

    def then() -> Tuple[str, str]:
        with pytest.raises(InferenceServerException) as raised:
            httpclient.InferenceServerClient(http_url(server)).infer(
                "backlog_cancel", [_input(httpclient, 4)], sequence_id=2
            )
        return str(raised.value.status()), str(raised.value.message())

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        started = pool.submit(start)
        _wait_pending(server, "backlog_cancel", 1)
        following = pool.submit(then)
        _wait_pending(server, "backlog_cancel", 2)
        assert started.result(10) == "StatusCode.DEADLINE_EXCEEDED"
        assert following.result(10) == ("400", "")  # before sequence 1 ends: it never got a slot
    with pytest.raises(InferenceServerException, match="sequence 2 to model 'backlog_cancel' must specify the START"):
        http.infer("backlog_cancel", [_input(httpclient, 5)], sequence_id=2, sequence_end=True)
    result = http.infer("backlog_cancel", [_input(httpclient, 2)], sequence_id=1, sequence_end=True)
    assert result.as_numpy("OUTPUT").tolist() == [[3]]
    result = http.infer(
        "backlog_cancel", [_input(httpclient, 7)], sequence_id=3, sequence_start=True, sequence_end=True
    )
    assert result.as_numpy("OUTPUT").tolist() == [[7]]  # the cancelled sequence left no claim on the slot
    statistics = http.get_inference_statistics("backlog_cancel", headers={"triton-access-token": ACCESS_TOKEN})
    counts = statistics["model_stats"][0]["inference_stats"]
    assert (counts["success"]["count"], counts["fail"]["count"]) == (3, 2)


def test_a_process_that_dies_mid_sequence_fails_its_batch_and_its_sequences_go_on(any_server: Triton) -> None:
    # Its sequences go on in the process started again, with no state; the other process's keep theirs.
    client = httpclient.InferenceServerClient(http_url(any_server))

    def infer(sequence_id: int, value: int, **flags: bool) -> Tuple[int, int]:
        result = client.infer("dying", [_input(httpclient, value)], sequence_id=sequence_id, **flags)
        return int(result.as_numpy("OUTPUT")[0][0]), int(result.as_numpy("PID")[0][0])

    ids = [71, 72, 73]
    pids = {sequence_id: infer(sequence_id, 1, sequence_start=True)[1] for sequence_id in ids}
    assert len(set(pids.values())) == 2  # the sequences are spread over both instances
    with pytest.raises(InferenceServerException, match="exited with status 3"):
        infer(ids[0], -1)
    dead = pids[ids[0]]
    expected = {sequence_id: 10 if pids[sequence_id] == dead else 11 for sequence_id in ids}
    assert {sequence_id: infer(sequence_id, 10)[0] for sequence_id in ids} == expected
    assert client.is_model_ready("dying")
    ended = {sequence_id: infer(sequence_id, 100, sequence_end=True)[0] for sequence_id in ids}
    assert ended == {sequence_id: total + 100 for sequence_id, total in expected.items()}
    stats = client.get_inference_statistics("dying", headers=HTTP_AUTH)["model_stats"][0]["inference_stats"]
    assert (stats["success"]["count"], stats["fail"]["count"]) == (9, 1)


def test_an_idle_sequence_ends_and_its_state_is_dropped(server: Triton) -> None:
    client = httpclient.InferenceServerClient(http_url(server))
    states = _scheduler(server, "idle").instances[0].sequence_states
    client.infer("idle", [_input(httpclient, 4)], sequence_id="idler", sequence_start=True)
    # The model's sequences end after 100 ms without a request: each try waits longer than that.
    deadline = time.monotonic() + 10
    while True:
        time.sleep(0.3)
        try:
            client.infer("idle", [_input(httpclient, 1)], sequence_id="idler")
        except InferenceServerException as error:
            assert "sequence idler to model 'idle' must specify the START flag" in error.message()
            break
        assert time.monotonic() < deadline, "the sequence never went idle"
    assert len(states) == 0
    result = client.infer("idle", [_input(httpclient, 4)], sequence_id="idler", sequence_start=True, sequence_end=True)
    assert result.as_numpy("OUTPUT").tolist() == [[4]]


def _until_idle(client: Any, model: str, sequence_id: str) -> None:
    """Wait until the model's sequence ended idle (it ends after 100 ms without a request: each try waits longer)."""
    deadline = time.monotonic() + 10
    while True:
        time.sleep(0.3)
        try:
            client.infer(model, [_input(httpclient, 1)], sequence_id=sequence_id)
        except InferenceServerException as error:
            assert f"sequence {sequence_id} to model '{model}' must specify the START flag" in error.message()
            return
        assert time.monotonic() < deadline, "the sequence never went idle"


@pytest.mark.parametrize("model", ["idle_probe", "idle_probe_process"])
def test_an_idle_sequences_state_is_freed_where_the_callable_runs(server: Triton, model: str) -> None:
    client = httpclient.InferenceServerClient(http_url(server))
    before = int(
        client.infer(model, [_input(httpclient, 0)], sequence_id="other", sequence_start=True).as_numpy("OUTPUT")[0][0]
    )
    client.infer(model, [_input(httpclient, 0)], sequence_id="other", sequence_end=True)  # its token is freed at END
    alive = client.infer(model, [_input(httpclient, 0)], sequence_id="held", sequence_start=True)
    assert int(alive.as_numpy("OUTPUT")[0][0]) == 1 and before == 1
    _until_idle(client, model, "held")
    # The next batch of the instance (a process instance hears of the idle sequence with it): one token, its own.
    fresh = client.infer(model, [_input(httpclient, 0)], sequence_id="next", sequence_start=True, sequence_end=True)
    assert int(fresh.as_numpy("OUTPUT")[0][0]) == 1


class _StateProbe:
    """A START keeps a token in its sequence's state whose end touches `directory`/<sequence id>, where it runs."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __call__(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        for request in requests:
            if request.sequence_start and request.sequence_state is not None:
                token = _Token()
                weakref.finalize(token, _touch, os.path.join(self.directory, str(request.sequence_id)))
                request.sequence_state["token"] = token
        return [{"OUTPUT": np.zeros((1, 1), np.int32)} for _ in requests]


def _touch(path: str) -> None:
    with open(path, "w"):
        pass


@pytest.mark.parametrize("where", ["thread instance", "process instance", "RemoteTriton"])
def test_an_idle_sequences_state_is_dropped_with_no_request_after(tmp_path: Any, where: str) -> None:
    probe = _StateProbe(str(tmp_path))
    idle = ModelConfig(max_batch_size=2, sequence_batcher=SequenceBatcher(max_sequence_idle_microseconds=100_000))

    def bind(triton: Triton) -> None:
        if where != "RemoteTriton":
            triton.bind("probe", ProcessInstances(probe) if where == "process instance" else probe, **IO, config=idle)

    with running_triton(bind) as triton, contextlib.ExitStack() as stack:
        if where == "RemoteTriton":
            remote = stack.enter_context(RemoteTriton(url=f"127.0.0.1:{triton.http_port}"))
            remote.bind("probe", probe, **IO, config=idle)
        client = httpclient.InferenceServerClient(http_url(triton))
        client.infer("probe", [_input(httpclient, 0)], sequence_id="held", sequence_start=True)
        # No request comes after: the sequence ends idle after 100 ms, and its state goes then, not with a next batch.
        wait_until((tmp_path / "held").exists, "the idle sequence's state to be dropped")


def test_a_model_bound_with_remote_triton_keeps_its_state_in_its_process(server: Triton) -> None:
    with RemoteTriton(url=f"127.0.0.1:{server.http_port}") as remote:
        remote.bind("remote_accumulate", accumulate, **IO, config=ACCUMULATE)
        client = httpclient.InferenceServerClient(http_url(server))
        totals = [
            int(
                client.infer(
                    "remote_accumulate", [_input(httpclient, value)], sequence_id="r", **_flags(index, 3)
                ).as_numpy("OUTPUT")[0][0]
            )
            for index, value in enumerate([4, 5, 6])
        ]
        config = client.get_model_config("remote_accumulate")
    assert totals == [4, 9, 15]
    assert config["sequence_batching"]["max_sequence_idle_microseconds"] == 1000000


def test_model_client_sends_no_sequence_and_gets_tritons_error(server: Triton) -> None:
    # PyTriton's ModelClient (as nvidia-pytriton's) has no sequence arguments, and tritonclient refuses them as
    # parameters: a sequence model answers its requests with Triton's error.
    with ModelClient(f"http://{http_url(server)}", "accumulate") as client:
        with pytest.raises(
            PyTritonClientInferenceServerError, match="must specify a non-zero or non-empty correlation"
        ):
            client.infer_sample(INPUT=np.array([1], np.int32))
        with pytest.raises(PyTritonClientInferenceServerError, match='"sequence_id" is a reserved parameter'):
            client.infer_sample(INPUT=np.array([1], np.int32), parameters={"sequence_id": 5})


# -- configuration --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            ModelConfig(batcher=DynamicBatcher(max_queue_delay_microseconds=10), sequence_batcher=SequenceBatcher()),
            "both a dynamic batcher",
        ),
        (ModelConfig(response_cache=True, sequence_batcher=SequenceBatcher()), "Response Cache does not currently"),
        (ModelConfig(sequence_batcher=SequenceBatcher(state=[object()])), "implicit sequence state"),
        (
            ModelConfig(
                sequence_batcher=SequenceBatcher(direct=SequenceStrategyDirect(), oldest=SequenceStrategyOldest())
            ),
            "one strategy",
        ),
        (
            ModelConfig(sequence_batcher=SequenceBatcher(control_inputs=[SequenceControlInput("S", START)])),
            "must specify either 'int32_false_true'",
        ),
        (
            ModelConfig(
                sequence_batcher=SequenceBatcher(
                    control_inputs=[
                        SequenceControlInput("S", START, int32_false_true=[0, 1], bool_false_true=[False, True])
                    ]
                )
            ),
            "more than one from",
        ),
        (
            ModelConfig(
                sequence_batcher=SequenceBatcher(
                    control_inputs=[SequenceControlInput("C", CORRID, data_type=np.float32)]
                )
            ),
            "unexpected data type for control CONTROL_SEQUENCE_CORRID",
        ),
        (
            ModelConfig(
                sequence_batcher=SequenceBatcher(
                    control_inputs=[SequenceControlInput("INPUT", READY, int32_false_true=[0, 1])]
                )
            ),
            "has the name of another input",
        ),
        (
            ModelConfig(
                max_batch_size=2,
                sequence_batcher=SequenceBatcher(oldest=SequenceStrategyOldest(preferred_batch_size=[4])),
            ),
            "preferred batch size must be <= max batch size",
        ),
    ],
)
def test_configs_triton_refuses_are_refused(config: ModelConfig, message: str) -> None:
    triton = Triton()
    try:
        with pytest.raises(PyTritonModelConfigError, match=message):
            triton.bind("m", accumulate, **IO, config=config)
    finally:
        triton.stop()


def test_sequence_parameters_are_ignored_without_a_sequence_batcher(start_triton: Any) -> None:
    def bind(triton: Triton) -> None:
        triton.bind("plain", accumulate_plain, **IO, config=ModelConfig(max_batch_size=2))

    triton = start_triton(bind)
    client = httpclient.InferenceServerClient(http_url(triton))
    result = client.infer("plain", [_input(httpclient, 3)], sequence_id=9)  # no START: nobody checks
    assert result.as_numpy("OUTPUT").tolist() == [[3]]


def accumulate_plain(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    assert all(request.sequence_id is None and request.sequence_state is None for request in requests)
    return [{"OUTPUT": request["INPUT"]} for request in requests]


def test_a_batch_looks_at_the_slot_holders_requests_not_the_backlogs(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 sequences wait for a slot while the two slot holders run 20 requests: no batch looks at the backlog.

    Each batch scanned the model's whole queue, the backlog's requests first (O(N) a request, O(N^2) to serve N
    waiting sequences: 4,000 cost 1.2 ms of the loop a request). Counted, not timed: the queue's entries that
    batches iterate, and the sequences `take_batch` looks at.
    """
    recorder = Recorder()
    idle = SequenceBatcher(direct=SequenceStrategyDirect(), max_sequence_idle_microseconds=60_000_000)
    iterated = [0]
    original_iter = PriorityQueues.__iter__

    def counting_iter(queues: PriorityQueues) -> Iterator[Any]:
        # Not the watch's sweep, which looks at every waiting request's client every 0.1 s (core/watch.py): that
        # is no batch's work, and it came in this window in 2 runs of 3.
        by_sweep = sys._getframe(1).f_code is QueueWatch._sweep.__code__
        for entry in original_iter(queues):
            iterated[0] += not by_sweep
            yield entry

    def bind(triton: Triton) -> None:
        triton.bind("many", recorder, **IO, config=ModelConfig(max_batch_size=2, sequence_batcher=idle))

    async def infer(client: Any, sequence_id: int, value: int, **flags: bool) -> int:
        tensor = httpaio.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
        result = await client.infer("many", [tensor], sequence_id=sequence_id, **flags)
        return int(result.as_numpy("OUTPUT")[0][0])

    async def scenario(triton: Triton) -> Tuple[int, int, int, List[int]]:
        scheduler = _scheduler(triton, "many")
        async with httpaio.InferenceServerClient(http_url(triton), conn_limit=300) as client:
            assert await infer(client, 1, 1, sequence_start=True) == await infer(client, 2, 1, sequence_start=True) == 1
            backlog = [
                asyncio.ensure_future(infer(client, 1000 + n, n, sequence_start=True, sequence_end=True))
                for n in range(200)
            ]
            deadline = time.monotonic() + 30
            while scheduler.pending != 200:
                assert time.monotonic() < deadline, f"{scheduler.pending} requests queued, not 200"
                await asyncio.sleep(0.005)
            monkeypatch.setattr(PriorityQueues, "__iter__", counting_iter)
            looked_at, batches = scheduler._sequences.looked_at, len(recorder.batches)
            for step in range(2, 12):
                assert await asyncio.gather(infer(client, 1, 1), infer(client, 2, 2)) == [step, 2 * step - 1]
            counts = (iterated[0], scheduler._sequences.looked_at - looked_at, len(recorder.batches) - batches)
            monkeypatch.setattr(PriorityQueues, "__iter__", original_iter)
            await infer(client, 1, 0, sequence_end=True)
            await infer(client, 2, 0, sequence_end=True)
            return (*counts, await asyncio.gather(*backlog))

    with running_triton(bind) as triton:
        iterated_entries, looked_at, batches, backlog = asyncio.run(scenario(triton))
    assert backlog == list(range(200))  # then the backlog ran, each sequence in a slot freed for it
    assert 10 <= batches <= 20
    assert iterated_entries == 0  # the queue's entries, of which 200 are the backlog's: each batch scanned them
    assert looked_at <= 2 * 20  # a sequence for each request run, and at most one stale heap item each


def test_requests_run_past_a_waiting_sequence_leave_the_queue() -> None:
    """A sequence waiting for a slot holds the queue's front; the requests run behind it do not stay in it.

    The queue dropped entries that left it from its front only: while the backlog's request waited there, every
    request the slot holder ran since stayed in the queue (memory without bound, and time to iterate it).
    """

    def bind(triton: Triton) -> None:
        triton.bind(
            "one_slot", accumulate, **IO, config=ModelConfig(max_batch_size=1, sequence_batcher=SequenceBatcher())
        )

    with running_triton(bind) as triton, concurrent.futures.ThreadPoolExecutor(1) as pool:
        http = httpclient.InferenceServerClient(http_url(triton))
        http.infer("one_slot", [_input(httpclient, 0)], sequence_id=1, sequence_start=True)
        waiting = _send(pool, triton, "one_slot", 2, 7, sequence_start=True, sequence_end=True)
        _wait_pending(triton, "one_slot", 1)
        for _ in range(2500):
            http.infer("one_slot", [_input(httpclient, 1)], sequence_id=1)
        queues = _scheduler(triton, "one_slot")._queues
        held = sum(len(level.ready) + len(level.delayed) for level in queues._levels)
        result = http.infer("one_slot", [_input(httpclient, 1)], sequence_id=1, sequence_end=True)
        assert waiting.result(10) == 7
    assert result.as_numpy("OUTPUT").tolist() == [[2501]]
    assert held <= 1 + 1025  # the waiting request, and at most 1,025 that left before they are dropped at once


def test_a_sequence_is_idle_from_its_last_request_even_while_that_one_runs() -> None:
    # tritonserver 2.51 (sequence idle 200 ms, a model that takes 600 ms): a request sent 400 ms after the START,
    # while the START still runs, is refused (must specify START), and so is one sent right after the START's answer;
    # the START itself is answered. Ours kept the sequence until its requests were done, and took both.
    gate = threading.Event()
    entered = threading.Event()

    def held(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        entered.set()
        assert gate.wait(30)
        return accumulate(requests)

    idle = ModelConfig(max_batch_size=1, sequence_batcher=SequenceBatcher(max_sequence_idle_microseconds=100_000))
    with running_triton(lambda triton: triton.bind("held", held, **IO, config=idle)) as triton:
        client = httpclient.InferenceServerClient(http_url(triton), concurrency=2)
        started = client.async_infer("held", [_input(httpclient, 3)], sequence_id=1, sequence_start=True)
        try:
            assert entered.wait(30)
            slots = _scheduler(triton, "held")._sequences
            wait_until(lambda: not slots._live, "the running sequence to end idle")
            with pytest.raises(InferenceServerException, match="sequence 1 to model 'held' must specify the START"):
                client.infer("held", [_input(httpclient, 1)], sequence_id=1)
        finally:
            gate.set()
        assert started.get_result().as_numpy("OUTPUT").tolist() == [[3]]
        states = _scheduler(triton, "held").instances[0].sequence_states
        wait_until(lambda: len(states) == 0, "the ended sequence's state to be dropped after its last request")
        # Its slot, the only one, was freed once the START ran: a new sequence runs, with a state of its own.
        result = client.infer("held", [_input(httpclient, 4)], sequence_id=1, sequence_start=True, sequence_end=True)
        assert result.as_numpy("OUTPUT").tolist() == [[4]]


def test_a_sequence_spans_the_frontend_processes(frontends_server: Triton) -> None:
    """Each request of one sequence through another frontend process: the sequence and its state are the hub's."""
    pool = frontends_server._runtime._pool
    assert pool is not None
    pids = [frontend.pid for frontend in pool._frontends]  # with 3, the hub serves no connection itself
    connections: Dict[int, http.client.HTTPConnection] = {}
    opened = []
    try:
        for _ in range(8 * len(pids)):
            connection = http.client.HTTPConnection("127.0.0.1", frontends_server.http_port, timeout=30)
            opened.append(connection)
            connection.connect()
            connections.setdefault(serving_pid(connection.sock, pids), connection)
            if len(connections) == len(pids):
                break
        assert sorted(connections) == sorted(pids)
        totals = []
        for index in range(4):  # in turn through each frontend
            pid = pids[index % len(pids)]
            parameters = {"sequence_id": "spanning", **_flags(index, 4)}
            body = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [index + 1]}]}
            connections[pid].request(
                "POST", "/v2/models/accumulate_process/infer", json.dumps({**body, "parameters": parameters})
            )
            response = connections[pid].getresponse()
            answer = json.loads(response.read())
            assert response.status == 200, (pid, answer)
            totals.append(answer["outputs"][0]["data"][0])
        assert totals == [1, 3, 6, 10]
    finally:
        for connection in opened:
            connection.close()
