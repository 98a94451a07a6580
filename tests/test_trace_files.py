"""Trace files (trace_config mode=triton): what tritonserver 2.51 writes, per sampled request, in its JSON layout.

The layouts checked here were taken from nvidia-pytriton 0.7 (tritonserver 2.51) with the same requests: one
object naming the trace's model, one per timestamp, one per tensor (level TENSORS); the file a JSON list written
at stop (or when the settings change), `<file>.<n>` once log_frequency records gathered or trace_count ran out.
The checks are those Triton's `qa/common/trace_summary.py` makes of a file (it cannot run here: no network).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Dict, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pytriton.compose import call_model
from pytriton.decorators import batch
from pytriton.instances import ProcessInstances
from pytriton.model_config import EnsembleStep, ModelConfig, Tensor
from pytriton.triton import Triton, TritonSecurityConfig
from tests.conftest import grpc_url, http_url, running_triton
from tests.http_helpers import get_json, post_json

OPEN = TritonSecurityConfig(restricted_endpoints=[])
HTTP_STAMPS = ["HTTP_RECV_START", "HTTP_RECV_END"]
CORE_STAMPS = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
]


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request.data["IN"]} for request in requests]


def _add_sub(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [
        {"SUM": request.data["A"] + request.data["B"], "DIFF": request.data["A"] - request.data["B"]}
        for request in requests
    ]


def _bind(triton: Triton) -> None:
    io = {
        "inputs": [Tensor(name="IN", dtype=np.float32, shape=(-1,))],
        "outputs": [Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
        "config": ModelConfig(max_batch_size=8),
    }
    triton.bind("ident", _identity, **io)
    triton.bind(
        "addsub",
        _add_sub,
        inputs=[Tensor(name="A", dtype=np.int32, shape=(4,)), Tensor(name="B", dtype=np.int32, shape=(4,))],
        outputs=[Tensor(name="SUM", dtype=np.int32, shape=(4,)), Tensor(name="DIFF", dtype=np.int32, shape=(4,))],
        config=ModelConfig(max_batch_size=8),
    )


def _config(path: pathlib.Path, *entries: str) -> List[str]:
    return [f"triton,file={path}", *entries]


def _http_infer(triton: Triton, value: float = 1.0, request_id: str = "") -> None:
    body: Dict[str, Any] = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [value, 0.5]}]}
    if request_id:
        body["id"] = request_id
    status, _ = post_json(triton.http_port, "/v2/models/ident/infer", body)
    assert status == 200


def _grpc_infer(triton: Triton, request_id: str = "") -> None:
    with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
        tensor = grpcclient.InferInput("IN", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
        client.infer("ident", [tensor], request_id=request_id)


def _traces(objects: List[Dict[str, Any]]) -> Dict[int, Dict[str, Any]]:
    """The objects merged per trace id, as trace_summary.py merges them: model, timestamps by name, tensors."""
    traces: Dict[int, Dict[str, Any]] = {}
    for item in objects:
        trace = traces.setdefault(item["id"], {"stamps": {}, "order": [], "tensors": []})
        if "model_name" in item:
            assert set(item) <= {"id", "model_name", "model_version", "request_id", "parent_id"}
            trace["model"] = item
        elif "timestamps" in item:
            assert set(item) == {"id", "timestamps"} and len(item["timestamps"]) == 1
            stamp = item["timestamps"][0]
            assert set(stamp) == {"name", "ns"} and isinstance(stamp["ns"], int)
            trace["stamps"][stamp["name"]] = stamp["ns"]
            trace["order"].append(stamp["name"])
        else:
            assert set(item) == {"id", "activity", "tensor"}
            assert set(item["tensor"]) == {"name", "data", "shape", "dtype"}
            trace["tensors"].append((item["activity"], item["tensor"]))
    return traces


def _summary_spans(trace: Dict[str, Any]) -> None:
    """trace_summary.py's spans of one trace: each must end at or after its start (it raises otherwise)."""
    stamps = trace["stamps"]
    pairs = [("REQUEST_START", "REQUEST_END")]
    if trace["model"]["model_name"] != "ens":  # an ensemble's record has no compute timestamps, as in 2.51
        pairs += [("QUEUE_START", "COMPUTE_START"), ("COMPUTE_START", "COMPUTE_END")]
        pairs += [("COMPUTE_START", "COMPUTE_INPUT_END"), ("COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START")]
        pairs += [("COMPUTE_OUTPUT_START", "COMPUTE_END")]
    if "HTTP_RECV_START" in stamps:  # trace_summary.py's frontend spans need the start and the end
        pairs += [("HTTP_RECV_START", "HTTP_RECV_END"), ("HTTP_RECV_END", "REQUEST_START")]
    if "HTTP_RECV_START" in stamps and "HTTP_SEND_END" in stamps:
        pairs += [("HTTP_RECV_START", "HTTP_SEND_END"), ("HTTP_SEND_START", "HTTP_SEND_END")]
        pairs += [("REQUEST_END", "HTTP_SEND_START")]
    if "GRPC_WAITREAD_END" in stamps:
        pairs += [("GRPC_WAITREAD_START", "GRPC_WAITREAD_END"), ("GRPC_WAITREAD_END", "REQUEST_START")]
    if "GRPC_WAITREAD_END" in stamps and "GRPC_SEND_END" in stamps:
        pairs += [("GRPC_WAITREAD_END", "GRPC_SEND_END"), ("GRPC_SEND_START", "GRPC_SEND_END")]
    for start, end in pairs:
        assert stamps[start] <= stamps[end], (start, end, stamps)


def _read(path: pathlib.Path) -> List[Dict[str, Any]]:
    text = path.read_text()
    objects = json.loads(text)
    assert isinstance(objects, list)
    return objects


def test_timestamps_over_http_and_grpc_in_tritons_layout(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "trace.json"
    config = _config(path, "level=TIMESTAMPS", "rate=1")
    with running_triton(_bind, OPEN, trace_config=config) as triton:
        _http_infer(triton, request_id="req-7")
        _grpc_infer(triton, request_id="g-1")
        _http_infer(triton)
        assert not path.exists()  # log_frequency 0: written when the server stops, as by Triton
    objects = _read(path)
    traces = _traces(objects)
    assert sorted(traces) == [1, 2, 3]
    first, second, third = traces[1], traces[2], traces[3]
    assert first["model"] == {"id": 1, "model_name": "ident", "model_version": 1, "request_id": "req-7"}
    assert second["model"] == {"id": 2, "model_name": "ident", "model_version": 1, "request_id": "g-1"}
    assert third["model"] == {"id": 3, "model_name": "ident", "model_version": 1}  # no id: no request_id key
    http_order = [*HTTP_STAMPS, *CORE_STAMPS, "INFER_RESPONSE_COMPLETE", "REQUEST_END"]
    assert first["order"] == [*http_order, "HTTP_SEND_START", "HTTP_SEND_END"]
    assert third["order"] == first["order"]
    assert set(second["stamps"]) == {
        *CORE_STAMPS,
        "INFER_RESPONSE_COMPLETE",
        "REQUEST_END",
        "GRPC_WAITREAD_START",
        "GRPC_WAITREAD_END",
        "GRPC_SEND_START",
        "GRPC_SEND_END",
    }
    for trace in traces.values():
        _summary_spans(trace)
    # Triton writes the objects of each trace together, the model's first of those the core reports.
    ids = [item["id"] for item in objects]
    assert ids == sorted(ids)
    assert objects[2] == {"id": 1, "model_name": "ident", "model_version": 1, "request_id": "req-7"}


def test_tensors_level_writes_inputs_and_outputs(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "trace.json"
    with running_triton(_bind, OPEN, trace_config=_config(path, "level=TENSORS", "rate=1")) as triton:
        body = {
            "inputs": [
                {"name": "A", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]},
                {"name": "B", "datatype": "INT32", "shape": [1, 4], "data": [10, 20, 30, -40]},
            ]
        }
        assert post_json(triton.http_port, "/v2/models/addsub/infer", body)[0] == 200
    # What tritonserver 2.51 wrote for this request (level TENSORS alone: no model object, no timestamps).
    assert _read(path) == [
        {
            "id": 1,
            "activity": "TENSOR_QUEUE_INPUT",
            "tensor": {"name": "A", "data": "1,2,3,4", "shape": "1,4", "dtype": "INT32"},
        },
        {
            "id": 1,
            "activity": "TENSOR_QUEUE_INPUT",
            "tensor": {"name": "B", "data": "10,20,30,-40", "shape": "1,4", "dtype": "INT32"},
        },
        {
            "id": 1,
            "activity": "TENSOR_BACKEND_OUTPUT",
            "tensor": {"name": "SUM", "data": "11,22,33,-36", "shape": "1,4", "dtype": "INT32"},
        },
        {
            "id": 1,
            "activity": "TENSOR_BACKEND_OUTPUT",
            "tensor": {"name": "DIFF", "data": "-9,-18,-27,44", "shape": "1,4", "dtype": "INT32"},
        },
    ]


def test_tensors_and_timestamps_together(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "trace.json"
    config = _config(path, "level=TENSORS", "level=TIMESTAMPS", "rate=1")
    with running_triton(_bind, OPEN, trace_config=config) as triton:
        _http_infer(triton, 1.25)
    objects = _read(path)
    kinds = [item.get("activity") or item.get("timestamps", [{}])[0].get("name") or "MODEL" for item in objects]
    # 2.51's order: the inputs after QUEUE_START, the outputs before INFER_RESPONSE_COMPLETE
    assert kinds[: kinds.index("QUEUE_START") + 2] == [
        *HTTP_STAMPS,
        "MODEL",
        "REQUEST_START",
        "QUEUE_START",
        "TENSOR_QUEUE_INPUT",
    ]
    assert kinds[kinds.index("INFER_RESPONSE_COMPLETE") - 1] == "TENSOR_BACKEND_OUTPUT"
    tensors = _traces(objects)[1]["tensors"]
    assert tensors == [
        ("TENSOR_QUEUE_INPUT", {"name": "IN", "data": "1.25,0.5", "shape": "1,2", "dtype": "FP32"}),
        ("TENSOR_BACKEND_OUTPUT", {"name": "OUT", "data": "1.25,0.5", "shape": "1,2", "dtype": "FP32"}),
    ]


def test_rate_and_count_are_obeyed(tmp_path: pathlib.Path) -> None:
    # rate 3: the 3rd and 6th requests are traced, as by Triton (not the 1st); count 2: then no more. The records
    # of the requests sampled wait for the stop: Triton writes <file>.0 early only when every request counted
    # since the settings were made was traced.
    path = tmp_path / "trace.json"
    with running_triton(_bind, OPEN, trace_config=_config(path, "level=TIMESTAMPS", "rate=3", "count=2")) as triton:
        for value in range(8):
            _http_infer(triton, float(value))
        assert get_json(triton.http_port, "/v2/trace/setting")[1]["trace_count"] == "0"
    traces = _traces(_read(path))
    assert sorted(traces) == [1, 2]
    assert not list(tmp_path.glob("trace.json.*"))


def test_the_rate_th_request_is_traced(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "trace.json"
    with running_triton(_bind, OPEN, trace_config=_config(path, "level=TENSORS", "rate=3")) as triton:
        for value in range(7):
            _http_infer(triton, float(value))
    inputs = [tensor["data"] for activity, tensor in _traces_tensors(_read(path)) if activity == "TENSOR_QUEUE_INPUT"]
    assert inputs == ["2,0.5", "5,0.5"]  # the 3rd and the 6th requests


def test_count_ran_out_writes_a_numbered_file_at_once(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "trace.json"
    with running_triton(_bind, OPEN, trace_config=_config(path, "level=TIMESTAMPS", "rate=1", "count=2")) as triton:
        _http_infer(triton)
        assert not list(tmp_path.iterdir())
        _http_infer(triton)
        numbered = tmp_path / "trace.json.0"
        assert _wait_for(numbered)
        assert sorted(_traces(_read(numbered))) == [1, 2]
        _http_infer(triton)
    assert sorted(os.listdir(tmp_path)) == ["trace.json.0"]  # nothing left to write at stop


def test_log_frequency_rotates_numbered_files(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "trace.json"
    config = _config(path, "level=TIMESTAMPS", "rate=1", "triton,log-frequency=2")
    with running_triton(_bind, OPEN, trace_config=config) as triton:
        _http_infer(triton)
        assert not list(tmp_path.iterdir())
        _http_infer(triton)
        assert _wait_for(tmp_path / "trace.json.0")
        for _ in range(3):
            _http_infer(triton)
        assert _wait_for(tmp_path / "trace.json.1")
        assert not (tmp_path / "trace.json.2").exists()
    assert sorted(os.listdir(tmp_path)) == ["trace.json.0", "trace.json.1", "trace.json.2"]
    assert [sorted(_traces(_read(tmp_path / f"trace.json.{n}"))) for n in range(3)] == [[1, 2], [3, 4], [5]]


def test_a_settings_change_writes_the_records_so_far(tmp_path: pathlib.Path) -> None:
    # Triton's replaced settings write their records: the file opens with them, and is closed at stop.
    path = tmp_path / "trace.json"
    with running_triton(_bind, OPEN, trace_config=_config(path, "level=TIMESTAMPS", "rate=1")) as triton:
        _http_infer(triton)
        _http_infer(triton)
        status, _ = post_json(triton.http_port, "/v2/trace/setting", {"trace_rate": "2"})
        assert status == 200
        assert _wait_for(path)
        assert path.read_text().startswith('[{"id":1,') and not path.read_text().endswith("]")
        for _ in range(4):
            _http_infer(triton)
    assert sorted(_traces(_read(path))) == [1, 2, 3, 4]


def test_a_models_own_settings(tmp_path: pathlib.Path) -> None:
    # A model's settings (its level TENSORS and log_frequency 1): its records go to <file>.<n> on their own.
    path = tmp_path / "trace.json"
    with running_triton(_bind, OPEN, trace_config=_config(path, "level=TIMESTAMPS", "rate=1")) as triton:
        change = {"trace_level": ["TENSORS"], "log_frequency": "1"}
        status, document = post_json(triton.http_port, "/v2/models/ident/trace/setting", change)
        assert status == 200 and document["trace_file"] == str(path)
        _http_infer(triton, 2.0)
        assert _wait_for(tmp_path / "trace.json.0")
        assert _read(tmp_path / "trace.json.0") == [
            {
                "id": 1,
                "activity": "TENSOR_QUEUE_INPUT",
                "tensor": {"name": "IN", "data": "2,0.5", "shape": "1,2", "dtype": "FP32"},
            },
            {
                "id": 1,
                "activity": "TENSOR_BACKEND_OUTPUT",
                "tensor": {"name": "OUT", "data": "2,0.5", "shape": "1,2", "dtype": "FP32"},
            },
        ]
        body = {
            "inputs": [
                {"name": "A", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]},
                {"name": "B", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]},
            ]
        }
        assert post_json(triton.http_port, "/v2/models/addsub/infer", body)[0] == 200
    traces = _traces(_read(path))
    assert list(traces) == [2] and traces[2]["model"]["model_name"] == "addsub"


def test_clients_see_the_same_answers_when_traced(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "trace.json"
    with running_triton(_bind, OPEN, trace_config=_config(path, "level=TIMESTAMPS", "rate=1")) as triton:
        with httpclient.InferenceServerClient(http_url(triton)) as client:
            tensor = httpclient.InferInput("IN", [1, 3], "FP32")
            tensor.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.float32), binary_data=True)
            result = client.infer("ident", [tensor])
            assert result.as_numpy("OUT").tolist() == [[1, 2, 3]]
    _summary_spans(_traces(_read(path))[1])


def _wait_for(path: pathlib.Path) -> bool:
    """Whether the writer thread wrote `path` (whole: a numbered file is written at once) within 5 s."""
    import time

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("frontends", [1, 3])
def test_frontend_timestamps_of_one_process_and_of_frontend_processes(tmp_path: pathlib.Path, frontends: int) -> None:
    # With frontend processes the hub writes the records: the frontends time the receive and the send of each
    # traced request and send the timestamps after the send, as one process's transports add theirs.
    path = tmp_path / "trace.json"
    config = _config(path, "level=TIMESTAMPS", "rate=1")
    with running_triton(_bind, OPEN, trace_config=config, frontends=frontends) as triton:
        for _ in range(4):
            _http_infer(triton)
        _grpc_infer(triton)
        with httpclient.InferenceServerClient(http_url(triton)) as client:  # binary outputs: sent in parts
            tensor = httpclient.InferInput("IN", [1, 3], "FP32")
            tensor.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.float32), binary_data=True)
            assert client.infer("ident", [tensor]).as_numpy("OUT").tolist() == [[1, 2, 3]]
    traces = _traces(_read(path))
    assert sorted(traces) == [1, 2, 3, 4, 5, 6]
    http_order = [*HTTP_STAMPS, *CORE_STAMPS, "INFER_RESPONSE_COMPLETE", "REQUEST_END", "HTTP_SEND_START"]
    grpc_stamps = {"GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"}
    for trace_id, trace in traces.items():
        if trace_id == 5:
            assert set(trace["stamps"]) == {*CORE_STAMPS, "INFER_RESPONSE_COMPLETE", "REQUEST_END", *grpc_stamps}
        else:
            assert trace["order"] == [*http_order, "HTTP_SEND_END"]
            # trace_summary.py's "HTTP infer request" line: from HTTP_RECV_START to HTTP_SEND_END
            assert trace["stamps"]["HTTP_RECV_START"] < trace["stamps"]["HTTP_SEND_END"]
        _summary_spans(trace)


@pytest.mark.parametrize("frontends", [1, 3])
def test_a_response_whose_send_is_not_timed_is_written_at_once(tmp_path: pathlib.Path, frontends: int) -> None:
    # The generate route times no send: the record is written with the request's end (log_frequency 1: at once),
    # not left waiting for a send's timestamps.
    path = tmp_path / "trace.json"
    config = _config(path, "level=TIMESTAMPS", "rate=1", "triton,log-frequency=1")
    with running_triton(_bind, OPEN, trace_config=config, frontends=frontends) as triton:
        assert post_json(triton.http_port, "/v2/models/ident/generate", {"IN": [1.0, 2.0]})[0] == 200
        assert _wait_for(tmp_path / "trace.json.0")
        _http_infer(triton)
        assert _wait_for(tmp_path / "trace.json.1")
        generated = _traces(_read(tmp_path / "trace.json.0"))[1]
        inferred = _traces(_read(tmp_path / "trace.json.1"))[2]
    assert "HTTP_SEND_END" not in generated["stamps"] and set(CORE_STAMPS) <= set(generated["stamps"])
    assert "HTTP_SEND_END" in inferred["stamps"]


def _traces_tensors(objects: List[Dict[str, Any]]) -> List[Any]:
    return [tensor for trace in _traces(objects).values() for tensor in trace["tensors"]]


def test_a_models_own_trace_file_from_bind(tmp_path: pathlib.Path) -> None:
    # A model's trace_config may name a file of its own (tritonserver 2.51 has one file for all): its records go
    # there, the other models' to the server's file; its settings document names it.
    own, server = tmp_path / "own.json", tmp_path / "server.json"

    def bind(triton: Triton) -> None:
        _bind(triton)
        triton.bind(
            "mine",
            _identity,
            inputs=[Tensor(name="IN", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
            trace_config=[f"triton,file={own}", "level=TIMESTAMPS", "rate=1"],
        )

    with running_triton(bind, OPEN, trace_config=_config(server, "level=TIMESTAMPS", "rate=1")) as triton:
        body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        assert post_json(triton.http_port, "/v2/models/mine/infer", body)[0] == 200
        _http_infer(triton)
        assert get_json(triton.http_port, "/v2/models/mine/trace/setting")[1]["trace_file"] == str(own)
        assert get_json(triton.http_port, "/v2/models/ident/trace/setting")[1]["trace_file"] == str(server)
    mine = _traces(_read(own))
    assert list(mine) == [1] and mine[1]["model"]["model_name"] == "mine"
    _summary_spans(mine[1])
    others = _traces(_read(server))
    assert list(others) == [2] and others[2]["model"]["model_name"] == "ident"


@pytest.mark.parametrize("frontends", [1, 3])
@pytest.mark.parametrize("bound", ["before the start", "while serving"])
def test_a_models_own_file_without_a_server_file(tmp_path: pathlib.Path, frontends: int, bound: str) -> None:
    # The model's own file gets its transport's timestamps, from frontend processes too (the hub tells them
    # to time requests once a model with a file of its own is bound).
    own = tmp_path / "own.json"

    def bind_mine(triton: Triton) -> None:
        triton.bind(
            "mine",
            _identity,
            inputs=[Tensor(name="IN", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
            trace_config=[f"triton,file={own}", "level=TIMESTAMPS", "rate=1"],
        )

    def bind(triton: Triton) -> None:
        _bind(triton)
        if bound == "before the start":
            bind_mine(triton)

    config = ["level=TIMESTAMPS", "rate=1"]
    with running_triton(bind, OPEN, trace_config=config, frontends=frontends) as triton:
        if bound == "while serving":
            _http_infer(triton)  # the server's settings name no file: not traced
            bind_mine(triton)
        body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        assert post_json(triton.http_port, "/v2/models/mine/infer", body)[0] == 200
        _grpc_infer(triton)  # not traced either
        with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
            tensor = grpcclient.InferInput("IN", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
            client.infer("mine", [tensor])
    traces = _traces(_read(own))
    # With frontends, each record waits for its frontend's send timestamps (SENT), which two processes post in
    # whatever order they run: the file holds both, in either order (trace_summary.py merges records by id).
    assert sorted(traces) == [1, 2]
    sent = ["HTTP_SEND_START", "HTTP_SEND_END"]
    assert traces[1]["order"] == [*HTTP_STAMPS, *CORE_STAMPS, "INFER_RESPONSE_COMPLETE", "REQUEST_END", *sent]
    assert {"GRPC_WAITREAD_START", "GRPC_SEND_END"} <= set(traces[2]["stamps"])
    for trace in traces.values():
        _summary_spans(trace)
    assert sorted(os.listdir(tmp_path)) == ["own.json"]


def _batch_identity(requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request["IN"] * 2} for request in requests]


def test_process_instances_are_traced(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "trace.json"

    def bind(triton: Triton) -> None:
        triton.bind(
            "ident",
            ProcessInstances(_batch_identity),
            inputs=[Tensor(name="IN", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=8),
        )

    config = _config(path, "level=TIMESTAMPS", "level=TENSORS", "rate=1")
    with running_triton(bind, OPEN, trace_config=config) as triton:
        _http_infer(triton, 3.0)
        _grpc_infer(triton)
    traces = _traces(_read(path))
    assert sorted(traces) == [1, 2]
    for trace in traces.values():
        assert set(CORE_STAMPS) <= set(trace["stamps"])
        _summary_spans(trace)
    assert traces[1]["tensors"][-1] == (
        "TENSOR_BACKEND_OUTPUT",
        {"name": "OUT", "data": "6,1", "shape": "1,2", "dtype": "FP32"},
    )


@batch
def _outer(IN: np.ndarray) -> Dict[str, np.ndarray]:
    return {"OUT": call_model("ident", {"IN": IN + 1})["OUT"]}


def test_a_traced_requests_inner_calls_name_it_their_parent(tmp_path: pathlib.Path) -> None:
    # As Triton's traces of the requests a traced request spawns (BLS): traced with it, whatever the rate.
    path = tmp_path / "trace.json"

    def bind(triton: Triton) -> None:
        _bind(triton)
        triton.bind(
            "outer",
            _outer,
            inputs=[Tensor(name="IN", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=8),
        )

    with running_triton(bind, OPEN, trace_config=_config(path, "level=TIMESTAMPS", "rate=2")) as triton:
        body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        for _ in range(2):
            assert post_json(triton.http_port, "/v2/models/outer/infer", body)[0] == 200
    traces = _traces(_read(path))
    models = {trace_id: trace["model"] for trace_id, trace in traces.items()}
    assert models == {
        1: {"id": 1, "model_name": "outer", "model_version": 1},
        2: {"id": 2, "model_name": "ident", "model_version": 1, "parent_id": 1},
    }
    assert traces[1]["stamps"]["COMPUTE_START"] <= traces[2]["stamps"]["REQUEST_START"]
    assert traces[2]["stamps"]["REQUEST_END"] <= traces[1]["stamps"]["COMPUTE_END"]
    # The inner request's record has no INFER_RESPONSE_COMPLETE: in 2.51 a Python-backend model's BLS request
    # (`InferenceRequest(..., trace=request.trace()).exec()`) is traced without one, as an ensemble's steps are.
    assert traces[2]["order"] == [*CORE_STAMPS, "REQUEST_END"]
    assert "INFER_RESPONSE_COMPLETE" in traces[1]["order"]


def _double(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request.data["IN"] * 2} for request in requests]


def _bind_ensemble(triton: Triton) -> None:
    """`ens`: IN -> `double` -> `ident` -> OUT."""
    _bind(triton)
    io = {
        "inputs": [Tensor(name="IN", dtype=np.float32, shape=(-1,))],
        "outputs": [Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
        "config": ModelConfig(max_batch_size=8),
    }
    triton.bind("double", _double, **io)
    triton.bind_ensemble(
        "ens",
        steps=[
            EnsembleStep("double", input_map={"IN": "IN"}, output_map={"OUT": "mid"}),
            EnsembleStep("ident", input_map={"IN": "mid"}, output_map={"OUT": "OUT"}),
        ],
        **io,
    )


@pytest.mark.parametrize("frontends", [1, 3])
def test_an_ensemble_is_traced_with_its_steps_as_children(tmp_path: pathlib.Path, frontends: int) -> None:
    # As tritonserver 2.51 (nvidia-pytriton 0.7) writes a traced ensemble request: its record has no compute
    # timestamps; each step's record names it its parent and the ensemble request's id, has no
    # INFER_RESPONSE_COMPLETE, and is traced with it whatever the rate (steps are not counted in it).
    path = tmp_path / "trace.json"
    config = _config(path, "level=TIMESTAMPS", "level=TENSORS", "rate=2")
    body = {"id": "e1", "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    with running_triton(_bind_ensemble, OPEN, trace_config=config, frontends=frontends) as triton:
        for _ in range(2):
            status, answer = post_json(triton.http_port, "/v2/models/ens/infer", body)
            assert status == 200 and answer["outputs"][0]["data"] == [2, 4]
        with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
            tensor = grpcclient.InferInput("IN", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.array([[3.0, 4.0]], dtype=np.float32))
            for _ in range(2):
                assert client.infer("ens", [tensor], request_id="g1").as_numpy("OUT").tolist() == [[6, 8]]
    traces = _traces(_read(path))
    assert {trace_id: trace["model"] for trace_id, trace in traces.items()} == {
        1: {"id": 1, "model_name": "ens", "model_version": 1, "request_id": "e1"},
        2: {"id": 2, "model_name": "double", "model_version": 1, "request_id": "e1", "parent_id": 1},
        3: {"id": 3, "model_name": "ident", "model_version": 1, "request_id": "e1", "parent_id": 1},
        4: {"id": 4, "model_name": "ens", "model_version": 1, "request_id": "g1"},
        5: {"id": 5, "model_name": "double", "model_version": 1, "request_id": "g1", "parent_id": 4},
        6: {"id": 6, "model_name": "ident", "model_version": 1, "request_id": "g1", "parent_id": 4},
    }
    sent = ["HTTP_SEND_START", "HTTP_SEND_END"]
    core = ["REQUEST_START", "QUEUE_START", "INFER_RESPONSE_COMPLETE", "REQUEST_END"]
    assert traces[1]["order"] == [*HTTP_STAMPS, *core, *sent]
    grpc_stamps = {"GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"}
    assert set(traces[4]["stamps"]) == {*core, *grpc_stamps}
    for step in (2, 3, 5, 6):
        assert traces[step]["order"] == [*CORE_STAMPS, "REQUEST_END"]
    for parent, first, second in ((1, 2, 3), (4, 5, 6)):
        stamps = [traces[trace_id]["stamps"] for trace_id in (parent, first, second)]
        assert stamps[0]["QUEUE_START"] <= stamps[1]["REQUEST_START"]
        assert stamps[1]["COMPUTE_END"] <= stamps[2]["REQUEST_START"]
        # As in 2.51 (20 requests of 20, probed): the ensemble answers from its last step's response, before that
        # step's request ends, and its own request ends after it. (2.51 stamps the step's COMPUTE_END after the
        # answer too, when its backend's execute returns; here it comes from the batch's compute times, before.)
        assert stamps[2]["COMPUTE_END"] <= stamps[0]["INFER_RESPONSE_COMPLETE"] <= stamps[2]["REQUEST_END"]
        assert stamps[2]["REQUEST_END"] <= stamps[0]["REQUEST_END"]
    for trace in traces.values():
        _summary_spans(trace)

    def tensors(trace_id: int) -> List[Any]:
        return [(activity, tensor["name"], tensor["data"]) for activity, tensor in traces[trace_id]["tensors"]]

    assert tensors(1) == [("TENSOR_QUEUE_INPUT", "IN", "1,2"), ("TENSOR_BACKEND_OUTPUT", "OUT", "2,4")]
    assert tensors(2) == [("TENSOR_QUEUE_INPUT", "IN", "1,2"), ("TENSOR_BACKEND_OUTPUT", "OUT", "2,4")]
    assert tensors(3) == [("TENSOR_QUEUE_INPUT", "IN", "2,4"), ("TENSOR_BACKEND_OUTPUT", "OUT", "2,4")]


def _echo(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": request.data["TEXT"]} for request in requests]


def test_bytes_tensors_stay_valid_json(tmp_path: pathlib.Path) -> None:
    # tritonserver 2.51 wrote "data":"\"ab\",\"c"d\"" for ["ab", 'c"d'] (a file json.load refuses); here the
    # quote is escaped, and an element without one is written as 2.51 writes it.
    path = tmp_path / "trace.json"

    def bind(triton: Triton) -> None:
        triton.bind(
            "echo",
            _echo,
            inputs=[Tensor(name="TEXT", dtype=bytes, shape=(-1,))],
            outputs=[Tensor(name="OUT", dtype=bytes, shape=(-1,))],
            config=ModelConfig(max_batch_size=8),
        )

    with running_triton(bind, OPEN, trace_config=_config(path, "level=TENSORS", "rate=1")) as triton:
        body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 2], "data": ["ab", 'c"d']}]}
        assert post_json(triton.http_port, "/v2/models/echo/infer", body)[0] == 200
    assert '"data":"\\"ab\\",' in path.read_text()
    assert _traces_tensors(_read(path)) == [
        ("TENSOR_QUEUE_INPUT", {"name": "TEXT", "data": '"ab","c"d"', "shape": "1,2", "dtype": "BYTES"}),
        ("TENSOR_BACKEND_OUTPUT", {"name": "OUT", "data": '"ab","c"d"', "shape": "1,2", "dtype": "BYTES"}),
    ]


def _bind_many(triton: Triton) -> None:
    _bind(triton)
    for number in range(30):
        triton.bind(
            f"m{number}",
            _identity,
            inputs=[Tensor(name="IN", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(max_batch_size=8),
        )


def test_a_models_settings_change_looks_at_that_model_only(tmp_path: pathlib.Path) -> None:
    """Setting one model's trace looks at its versions, not at all 32 models (setting N models cost O(N^2))."""
    path = tmp_path / "trace.json"
    with running_triton(_bind_many, OPEN, trace_config=_config(path)) as triton:
        tracing = triton._runtime.tracing
        before = tracing.looked_at
        for number in range(30):
            change = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1000"}
            assert post_json(triton.http_port, f"/v2/models/m{number}/trace/setting", change)[0] == 200
        assert tracing.looked_at - before == 30  # one model each: not 30 x 32
        change = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1"}
        assert post_json(triton.http_port, "/v2/models/ident/trace/setting", change)[0] == 200
        _http_infer(triton, 2.0)
        assert _wait_for(tmp_path / "trace.json.0")  # the model changed last is traced
        before = tracing.looked_at
        assert post_json(triton.http_port, "/v2/trace/setting", {"trace_rate": "5"})[0] == 200
        assert tracing.looked_at - before == 32  # the server's settings: every model
    traces = _traces(_read(tmp_path / "trace.json.0"))
    assert [trace["model"]["model_name"] for trace in traces.values()] == ["ident"]


def _bind_cached(triton: Triton) -> None:
    triton.bind(
        "cached",
        _identity,
        inputs=[Tensor(name="IN", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8, response_cache=True),
    )


@pytest.mark.parametrize("frontends", [1, 3])
def test_a_request_the_cache_answers_is_traced_and_counted(tmp_path: pathlib.Path, frontends: int) -> None:
    # tritonserver 2.51 (nvidia-pytriton 0.7, `local,size=1048576`, level TIMESTAMPS and TENSORS) samples a request
    # its response cache answers: a record without compute timestamps, with its input and the cached output, and
    # one less in trace_count. This server traced no hit: with count 3, the two hits left it at 2 (no file yet).
    path = tmp_path / "trace.json"
    config = _config(path, "level=TIMESTAMPS", "level=TENSORS", "rate=1", "count=3")
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 0.5]}]}
    with running_triton(
        _bind_cached, OPEN, trace_config=config, frontends=frontends, cache_config=["local,size=1048576"]
    ) as triton:
        for _ in range(2):
            assert post_json(triton.http_port, "/v2/models/cached/infer", body)[0] == 200
        with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
            tensor = grpcclient.InferInput("IN", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.array([[1.0, 0.5]], dtype=np.float32))
            assert client.infer("cached", [tensor]).as_numpy("OUT").tolist() == [[1.0, 0.5]]
        assert get_json(triton.http_port, "/v2/trace/setting")[1]["trace_count"] == "0"
        assert _wait_for(tmp_path / "trace.json.0")
    traces = _traces(_read(tmp_path / "trace.json.0"))
    assert sorted(traces) == [1, 2, 3]
    hit_stamps = ["REQUEST_START", "QUEUE_START", "INFER_RESPONSE_COMPLETE", "REQUEST_END"]
    assert traces[2]["order"] == [*HTTP_STAMPS, *hit_stamps, "HTTP_SEND_START", "HTTP_SEND_END"]
    assert traces[3]["order"] == [
        "GRPC_WAITREAD_START",
        "GRPC_WAITREAD_END",
        *hit_stamps,
        "GRPC_SEND_START",
        "GRPC_SEND_END",
    ]
    assert "COMPUTE_START" in traces[1]["stamps"]
    tensor = {"name": "IN", "data": "1,0.5", "shape": "1,2", "dtype": "FP32"}
    for trace in traces.values():
        assert trace["model"]["model_name"] == "cached"
        assert trace["tensors"] == [
            ("TENSOR_QUEUE_INPUT", tensor),
            ("TENSOR_BACKEND_OUTPUT", {**tensor, "name": "OUT"}),
        ]
        _summary_spans_of_a_hit(trace)


def _summary_spans_of_a_hit(trace: Dict[str, Any]) -> None:
    """trace_summary.py's spans that a record without compute timestamps has: each ends at or after its start."""
    stamps = trace["stamps"]
    order = [name for name in trace["order"] if not name.startswith("COMPUTE")]
    assert [stamps[name] for name in order] == sorted(stamps[name] for name in order)
