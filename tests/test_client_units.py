"""Client pieces that need no server: urls, exceptions, config parsing, readiness plans, stream messages, exports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

import pytriton.client
from pytriton.client import AsyncioModelClient, FuturesModelClient, ModelClient
from pytriton.client import exceptions as errors
from pytriton.client._config import parse_model_config
from pytriton.client._errors import client_error
from pytriton.client._polling import Deadline, Pause, Probe, readiness_plan
from pytriton.client._request import name_inputs
from pytriton.client._state import ModelRef
from pytriton.client._stream import stream_outputs, stream_request
from pytriton.client.client import DEFAULT_INFERENCE_TIMEOUT_S
from pytriton.client.utils import ModelState, TritonUrl, create_client_from_url, get_model_state
from pytriton.model_config.parser import ModelConfigParser


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("localhost", ("http", "localhost", 8000)),
        ("localhost:9000", ("http", "localhost", 9000)),
        ("127.0.0.1:9000", ("http", "127.0.0.1", 9000)),
        ("http://localhost", ("http", "localhost", 8000)),
        ("HTTP://localhost:1234", ("http", "localhost", 1234)),
        ("grpc://localhost", ("grpc", "localhost", 8001)),
        ("grpc://example.com:1234", ("grpc", "example.com", 1234)),
        ("grpc://[::1]:1234", ("grpc", "::1", 1234)),
    ],
)
def test_url_parsing(url: str, expected: tuple) -> None:  # type: ignore[type-arg]
    parsed = TritonUrl.from_url(url)
    assert (parsed.scheme, parsed.hostname, parsed.port) == expected


def test_url_forms() -> None:
    assert TritonUrl.from_url("grpc://[::1]").without_scheme == "[::1]:8001"
    assert TritonUrl.from_url("localhost").with_scheme == "http://localhost:8000"


@pytest.mark.parametrize("url", ["https://localhost", "ftp://localhost:21", "http://localhost:port", "://x", 8000])
def test_invalid_urls(url: object) -> None:
    with pytest.raises(errors.PyTritonClientInvalidUrlError) as invalid:
        TritonUrl.from_url(url)  # type: ignore[arg-type]
    assert str(invalid.value).startswith(f"Invalid url {url}")  # 0.7's words (the url as it is), then why
    with pytest.raises(errors.PyTritonClientInvalidUrlError):
        ModelClient(url, "model")  # type: ignore[arg-type]
    with pytest.raises(errors.PyTritonClientInvalidUrlError):
        AsyncioModelClient(url, "model")  # type: ignore[arg-type]
    with pytest.raises(errors.PyTritonClientInvalidUrlError):
        FuturesModelClient(url, "model")  # type: ignore[arg-type]


def test_exception_hierarchy() -> None:
    assert issubclass(errors.PyTritonClientInvalidUrlError, errors.PyTritonClientValueError)
    for name in (
        "PyTritonClientValueError",
        "PyTritonClientTimeoutError",
        "PyTritonClientModelUnavailableError",
        "PyTritonClientClosedError",
        "PyTritonClientModelDoesntSupportBatchingError",
        "PyTritonClientInferenceServerError",
        "PyTritonClientQueueFullError",
    ):
        assert issubclass(getattr(errors, name), errors.PyTritonClientError)
    error = errors.PyTritonClientTimeoutError("took too long")
    assert error.message == str(error) == "took too long"


def test_server_errors_are_translated() -> None:
    queue_full = InferenceServerException("Exceeds maximum queue size", status="StatusCode.UNAVAILABLE")
    assert isinstance(client_error(queue_full, 1.0), errors.PyTritonClientQueueFullError)
    deadline = InferenceServerException("Deadline Exceeded", status="StatusCode.DEADLINE_EXCEEDED")
    assert isinstance(client_error(deadline, 1.0), errors.PyTritonClientTimeoutError)
    assert isinstance(client_error(TimeoutError(), 1.0), errors.PyTritonClientTimeoutError)
    failure = client_error(InferenceServerException("model broke", status="500"), 1.0)
    assert isinstance(failure, errors.PyTritonClientInferenceServerError)
    assert "model broke" in str(failure)


def test_default_timeouts() -> None:
    client = ModelClient("localhost:1", "model")
    try:
        assert DEFAULT_INFERENCE_TIMEOUT_S == 60.0
        assert client._inference_timeout_s == 60.0
        assert client._init_timeout_s == 300.0
    finally:
        client.close()


def test_grpc_style_config_with_defaults_left_out() -> None:
    config = parse_model_config(
        {
            "name": "m",
            "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": ["-1"]}],
            "output": [
                {"name": "flag", "data_type": "TYPE_BOOL", "dims": ["1"]},
                {"name": "score", "data_type": "TYPE_FP16", "dims": ["2", "3"], "optional": True},
            ],
            "model_transaction_policy": {"decoupled": True},
            "dynamic_batching": {"default_queue_policy": {"max_queue_size": 2}},
        }
    )
    assert config.model_name == "m"
    assert config.max_batch_size == 0 and not config.batching
    assert config.decoupled
    assert config.inputs is not None and config.outputs is not None
    assert (config.inputs[0].dtype, config.inputs[0].shape) == (np.bytes_, (-1,))
    assert [spec.dtype for spec in config.outputs] == [np.bool_, np.float16]
    assert config.outputs[0].dtype is np.dtype("bool")  # an np.dtype, as nvidia-pytriton's parser gives it
    assert config.outputs[1].shape == (2, 3) and config.outputs[1].optional
    assert config.batcher is not None and config.batcher.default_queue_policy is not None
    assert config.batcher.default_queue_policy.max_queue_size == 2


def test_model_config_parser_reads_a_dict_and_a_config_pbtxt(tmp_path: Path) -> None:
    config_path = tmp_path / "config.pbtxt"
    config_path.write_text(
        'name: "m"\nmax_batch_size: 8\n'
        'input { name: "a" data_type: TYPE_FP32 dims: [ -1 ] }\n'
        'output { name: "b" data_type: TYPE_BOOL dims: [ 1 ] }\n'
        "dynamic_batching { max_queue_delay_microseconds: 100 }\n"
    )
    from_file = ModelConfigParser.from_file(config_path=config_path)
    assert (from_file.model_name, from_file.max_batch_size, from_file.batching) == ("m", 8, True)
    assert from_file.batcher is not None and from_file.batcher.max_queue_delay_microseconds == 100
    assert from_file.inputs is not None and from_file.outputs is not None
    assert (from_file.inputs[0].dtype, from_file.inputs[0].shape) == (np.float32, (-1,))
    assert from_file.outputs[0].dtype == np.dtype("bool")
    from_dict = ModelConfigParser.from_dict(
        {"name": "n", "input": [{"name": "x", "data_type": "TYPE_INT8", "dims": [2]}]}
    )
    assert from_dict.model_name == "n" and from_dict.inputs is not None and from_dict.inputs[0].dtype == np.int8


def test_inputs_are_named_and_checked_as_nvidia_pytriton_does(caplog: pytest.LogCaptureFixture) -> None:
    config = parse_model_config({"name": "m", "input": [{"name": "a", "data_type": "TYPE_FP32", "dims": [1]}]})
    one = np.zeros(1, np.float32)
    assert list(name_inputs(config, (one, one), {})) == ["a"]  # the extra one is dropped, as NVIDIA drops it
    assert "model m has 1 input, but 2 were given: the last one is not sent" in caplog.text
    for text in (np.array(["x"]), np.array(["x"], dtype=object)):
        with pytest.raises(RuntimeError) as raised:  # NVIDIA's type for it
            name_inputs(config, (text,), {})
        assert isinstance(raised.value, errors.PyTritonClientValueError)


def test_importing_the_client_package_gives_its_submodules_as_nvidia_pytriton_does() -> None:
    script = (
        "import pytriton.client\n"
        "assert pytriton.client.exceptions.PyTritonClientTimeoutError\n"
        "assert pytriton.client.utils.DEFAULT_HTTP_PORT == 8000 and pytriton.client.utils.DEFAULT_GRPC_PORT == 8001\n"
        "assert pytriton.client.utils.ModelConfigParser and pytriton.client.utils.InferenceServerException\n"
        "assert pytriton.client.asyncio_utils and pytriton.client.warnings.NotSupportedTimeoutWarning\n"
        "from pytriton.client.client import PyTritonClientTimeoutError, TritonUrl, wait_for_model_ready\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_readiness_plan_probes_the_server_then_the_model_until_the_deadline() -> None:
    model = ModelRef("m")
    plan = readiness_plan(Deadline(60.0), model)
    assert plan.send(None) == Probe()
    assert plan.send(False) == Pause(0.05)
    assert plan.send(None) == Probe()
    assert plan.send(False) == Pause(0.1)  # pauses double, up to 1 s
    assert plan.send(None) == Probe()
    assert plan.send(True) == Probe(model)
    with pytest.raises(StopIteration):
        plan.send(True)
    expired = readiness_plan(Deadline(0.0), model, server=False)
    assert expired.send(None) == Probe(model)  # a deadline of zero still allows one probe
    with pytest.raises(errors.PyTritonClientTimeoutError) as timed_out:
        expired.send(False)
    assert str(timed_out.value) == "Waiting for model m/<latest> to be ready timed out."  # 0.7's words
    forever = readiness_plan(Deadline(None, pause_s=0.25))
    assert forever.send(None) == Probe()
    assert [forever.send(False), forever.send(None), forever.send(False)] == [Pause(0.25), Probe(), Pause(0.25)]


def test_stream_request_asks_for_an_empty_final_response() -> None:
    config = parse_model_config({"name": "m", "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["1"]}]})
    inputs = {"x": np.array([1.0], np.float32), "s": np.array([b"ab"], dtype=object)}
    request = stream_request("m", None, "7", inputs, config, {"flag": True, "n": 2, "s": "v"})
    assert request.parameters["triton_enable_empty_final_response"].bool_param
    assert request.parameters["flag"].bool_param and request.parameters["n"].int64_param == 2
    assert request.parameters["s"].string_param == "v"
    assert [(i.name, i.datatype, list(i.shape)) for i in request.inputs] == [("x", "FP32", [1]), ("s", "BYTES", [1])]
    assert request.raw_input_contents[1] == b"\x02\x00\x00\x00ab"
    assert [output.name for output in request.outputs] == ["y"]


def test_final_stream_response_ends_the_stream_and_drops_its_outputs() -> None:
    reply = service_pb2.ModelStreamInferResponse()
    response = reply.infer_response
    response.outputs.add(name="y", datatype="FP32", shape=[1])
    response.raw_output_contents.append(np.array([4.0], np.float32).tobytes())
    assert stream_outputs(reply, 1.0) == {"y": np.array([4.0], np.float32)}
    response.parameters["triton_final_response"].bool_param = True
    assert stream_outputs(reply, 1.0) is None
    with pytest.raises(errors.PyTritonClientInferenceServerError, match="boom"):
        stream_outputs(service_pb2.ModelStreamInferResponse(error_message="boom"), 1.0)


def test_model_state_from_repository_index() -> None:
    class Client:
        def get_model_repository_index(self, headers: object = None) -> list:  # type: ignore[type-arg]
            return [
                {"name": "m", "version": "1", "state": "READY"},
                {"name": "m", "version": "10", "state": "LOADING"},
                {"name": "n", "version": "1", "state": "UNAVAILABLE"},
            ]

    assert get_model_state(Client(), "m") is ModelState.LOADING
    assert get_model_state(Client(), "m", "1") is ModelState.READY
    assert get_model_state(Client(), "missing") is ModelState.UNAVAILABLE


def test_create_client_from_url() -> None:
    client = create_client_from_url("localhost:1", network_timeout_s=1.0)
    try:
        assert type(client).__module__.startswith("tritonclient.http")
    finally:
        client.close()


def test_exports_and_no_import_side_effects() -> None:
    assert sorted(pytriton.client.__all__) == [
        "AsyncioDecoupledModelClient",
        "AsyncioModelClient",
        "DecoupledModelClient",
        "FuturesModelClient",
        "ModelClient",
    ]
    code = "import sys, pytriton.client; assert 'tritonclient' not in sys.modules and 'gevent' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
