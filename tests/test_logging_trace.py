"""Logging and trace extensions: settings read and changed over HTTP and gRPC; OpenTelemetry spans."""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import logging
from typing import Any, Callable, Dict, List

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config import EnsembleStep, Tensor
from pytriton.options.log_trace import TraceConfig, TraceSettings, parse_trace_config
from pytriton.triton import Triton, TritonSecurityConfig
from tests.conftest import HTTP_AUTH, grpc_url, http_url
from tests.http_helpers import get_json, post_json, request

MODEL_SETTING = "/v2/models/identity/trace/setting"
INFER = {"inputs": [{"name": "IN", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
# GET /v2/logging of a server started without log options (tritonserver 2.51's defaults).
DEFAULT_LOG_SETTINGS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}
OTEL_SDK = importlib.util.find_spec("opentelemetry") is not None and importlib.util.find_spec("opentelemetry.sdk")
needs_otel = pytest.mark.skipif(not OTEL_SDK, reason="opentelemetry-sdk is not installed (pip install '.[otel]')")


@pytest.fixture
def start_triton(start_triton: Callable[..., Triton]) -> Callable[..., Triton]:
    """Servers that restrict nothing: this module tests the logging and trace APIs themselves.

    Their restriction behind the access token is tested with the others' in test_access_control.
    """
    return functools.partial(start_triton, security_config=TritonSecurityConfig(restricted_endpoints=[]))


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    for item in requests:
        with item.traced_span("in-callable"):  # a child of the request's span when traced, else nothing
            pass
    return [{"OUT": item.data["IN"]} for item in requests]


def _bind(triton: Triton) -> None:
    for name in ("identity", "other"):
        triton.bind(
            name,
            _identity,
            inputs=[Tensor(name="IN", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
        )


def test_logging_endpoint_reads_and_changes_settings(
    start_triton: Callable[..., Triton], pytriton_logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    triton = start_triton(_bind, allow_grpc=False, allow_metrics=False)
    port = triton.http_port
    status, document = get_json(port, "/v2/logging")
    assert status == 200
    assert document == DEFAULT_LOG_SETTINGS
    status, document = post_json(
        port, "/v2/logging", {"log_info": False, "log_warning": False, "log_format": "ISO8601"}
    )
    assert status == 200 and document["log_info"] is False and document["log_format"] == "ISO8601"
    assert pytriton_logger.level == logging.ERROR
    assert not pytriton_logger.isEnabledFor(logging.WARNING)
    with caplog.at_level(logging.WARNING, logger="pytriton"):
        status, document = post_json(port, "/v2/logging", {"log_verbose_level": 2, "log_warning": True})
        assert pytriton_logger.level == logging.DEBUG
    assert status == 200 and document["log_verbose_level"] == 2
    assert "verbose logging slows inference down" in caplog.text
    # Info stays off while debug and warnings are on.
    record = logging.LogRecord("pytriton", logging.INFO, __file__, 1, "quiet", None, None)
    assert not pytriton_logger.filter(record)
    assert get_json(port, "/v2/logging")[1]["log_info"] is False


@pytest.mark.parametrize(
    ("change", "status", "message"),
    [
        ({"log_file": "other.log"}, 501, "log file location can not be updated through network protocol"),
        ({"log_format": "fancy"}, 503, "invalid argument for --log_format, got: fancy"),
        # Triton's HTTP frontend reads the values with TritonJson: its words, its 500 a 400 here (the client's mistake)
        # (tritonserver 2.51, probed); its gRPC frontend's words differ (tests/test_wire_fidelity.py).
        ({"log_info": "yes"}, 400, "attempt to access JSON non-boolean as boolean"),
        ({"log_warning": 1}, 400, "attempt to access JSON non-boolean as boolean"),
        ({"log_verbose_level": -1}, 400, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_verbose_level": "1"}, 400, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_verbose_level": True}, 400, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_format": 5}, 400, "attempt to access JSON non-string as string"),
        ({"log_format": "xml", "log_info": "x"}, 400, "attempt to access JSON non-boolean as boolean"),
        ({"log_file": 5, "log_info": "x"}, 501, "log file location can not be updated through network protocol"),
    ],
)
def test_logging_endpoint_refuses_bad_changes(
    start_triton: Callable[..., Triton], pytriton_logger: logging.Logger, change: Any, status: int, message: str
) -> None:
    triton = start_triton(_bind, allow_grpc=False, allow_metrics=False)
    assert post_json(triton.http_port, "/v2/logging", change) == (status, {"error": message})
    assert get_json(triton.http_port, "/v2/logging")[1]["log_info"] is True


@pytest.mark.parametrize(
    ("change", "status", "applied"),
    [
        ({"log_warning": False, "log_format": "bad"}, 503, {"log_warning": False}),
        ({"log_format": "bad", "log_warning": False}, 503, {"log_warning": False}),  # Triton's order, not the body's
        ({"log_info": False, "log_verbose_level": -1}, 400, {"log_info": False}),
        ({"log_verbose_level": 3, "log_error": "x"}, 400, {}),  # the error comes before the level
        (
            {"log_error": False, "log_verbose_level": 2, "log_format": 7},
            400,
            {"log_error": False, "log_verbose_level": 2},
        ),
    ],
)
def test_a_refused_logging_change_leaves_the_settings_before_it_changed(
    start_triton: Callable[..., Triton], pytriton_logger: logging.Logger, change: Any, status: int, applied: Any
) -> None:
    # Triton's frontends apply the settings one at a time in their order (info, warning, error, verbose level,
    # format) and stop at the first refused: those before it stay changed (tritonserver 2.51, probed over HTTP
    # and gRPC). This server applied none of them.
    triton = start_triton(_bind, allow_metrics=False)
    before = get_json(triton.http_port, "/v2/logging")[1]
    assert post_json(triton.http_port, "/v2/logging", change)[0] == status
    assert get_json(triton.http_port, "/v2/logging")[1] == {**before, **applied}


@pytest.mark.parametrize(
    ("change", "message", "applied"),
    [
        (
            {"log_warning": False, "log_format": "bad"},
            "invalid argument for log_format, got: bad",
            {"log_warning": False},
        ),
        ({"log_verbose_level": "1", "log_info": False}, "expect int32 for 'log_verbose_level'", {"log_info": False}),
        ({"log_error": "no", "log_info": False}, "expect boolean for 'log_error'", {"log_info": False}),
        ({"log_format": None, "log_error": False}, "expect string for 'log_format'", {"log_error": False}),  # no value
    ],
)
def test_a_refused_log_settings_change_leaves_the_settings_before_it_changed(
    start_triton: Callable[..., Triton], pytriton_logger: logging.Logger, change: Any, message: str, applied: Any
) -> None:
    # As over HTTP (above), and in the same order: tritonserver 2.51's gRPC LogSettings, probed.
    triton = start_triton(_bind, allow_metrics=False)
    before = get_json(triton.http_port, "/v2/logging")[1]
    asked = service_pb2.LogSettingsRequest()
    for key, value in change.items():
        kind = "bool_param" if isinstance(value, bool) else "string_param" if isinstance(value, str) else "uint32_param"
        if value is None:
            asked.settings[key].SetInParent()  # the setting with no value at all
        else:
            setattr(asked.settings[key], kind, value)
    with grpc.insecure_channel(grpc_url(triton)) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).LogSettings(asked, timeout=10)
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    assert get_json(triton.http_port, "/v2/logging")[1] == {**before, **applied}


def test_log_settings_over_clients(start_triton: Callable[..., Triton], pytriton_logger: logging.Logger) -> None:
    triton = start_triton(_bind, allow_metrics=False)
    http = httpclient.InferenceServerClient(http_url(triton))
    grpc = grpcclient.InferenceServerClient(grpc_url(triton))
    assert http.get_log_settings()["log_error"] is True
    assert http.update_log_settings({"log_error": False})["log_error"] is False
    settings = grpc.get_log_settings(as_json=True)["settings"]
    assert settings["log_error"] == {"bool_param": False}
    assert settings["log_format"] == {"string_param": "default"}
    updated = grpc.update_log_settings({"log_verbose_level": 1, "log_error": True}, as_json=True)["settings"]
    assert updated["log_verbose_level"] == {"uint32_param": 1} and updated["log_error"] == {"bool_param": True}
    assert http.get_log_settings()["log_verbose_level"] == 1
    http.close()
    grpc.close()


def test_runtime_log_changes_end_with_their_server(
    start_triton: Callable[..., Triton], pytriton_logger: logging.Logger
) -> None:
    # In nvidia-pytriton 0.7 each Triton runs a tritonserver of its own, whose log settings end with it: a second
    # Triton in the process reports the settings it was started with (probed). Its log follows them, and the
    # application's own handler keeps its format.
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    formatter = logging.Formatter("APP %(levelname)s %(message)s")
    handler.setFormatter(formatter)
    pytriton_logger.setLevel(logging.INFO)
    level, filters = pytriton_logger.level, list(pytriton_logger.filters)
    pytriton_logger.addHandler(handler)
    try:
        first = start_triton(_bind, allow_grpc=False, allow_metrics=False)
        change = {"log_info": False, "log_verbose_level": 1, "log_format": "ISO8601"}
        assert post_json(first.http_port, "/v2/logging", change)[0] == 200
        assert (pytriton_logger.level, handler.formatter) != (level, formatter)
        first.stop()
        assert (pytriton_logger.level, pytriton_logger.filters, handler.formatter) == (level, filters, formatter)
        second = start_triton(_bind, allow_grpc=False, allow_metrics=False)
        assert get_json(second.http_port, "/v2/logging")[1] == DEFAULT_LOG_SETTINGS
        pytriton_logger.info("an info record")
        pytriton_logger.debug("a debug record")
        assert post_json(second.http_port, "/v2/logging", {"log_format": "default"})[0] == 200
        assert handler.formatter is formatter  # "default" is the handlers' own format
        assert "APP INFO an info record" in stream.getvalue() and "a debug record" not in stream.getvalue()
    finally:
        pytriton_logger.removeHandler(handler)


def test_log_switches_apply_to_the_records_of_pytritons_module_loggers(
    start_triton: Callable[..., Triton], pytriton_logger: logging.Logger
) -> None:
    # Most of the server logs on its modules' loggers (`pytriton.transport.http.connection`, ...), whose records a
    # filter on `pytriton` does not see: with log_warning off and log_info on, their warnings were still logged,
    # and with log_info off and verbose on, their info records. As Triton, a severity switched off is off.
    child = logging.getLogger("pytriton.transport.http.connection")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    pytriton_logger.addHandler(handler)
    try:
        triton = start_triton(_bind, allow_grpc=False, allow_metrics=False)
        assert post_json(triton.http_port, "/v2/logging", {"log_warning": False})[0] == 200
        child.warning("a warning switched off")
        child.info("an info record")
        change = {"log_warning": True, "log_info": False, "log_verbose_level": 1}
        assert post_json(triton.http_port, "/v2/logging", change)[0] == 200
        child.info("an info record switched off")
        child.debug("a debug record")
        later = logging.getLogger(f"pytriton.imported_later_{id(stream)}")  # a module's, made after the change
        later.info("an info record switched off")
        triton.stop()
        assert child.filters == [] and handler.filters == []  # its server's filter ends with it
    finally:
        pytriton_logger.removeHandler(handler)
    ours = ("a warning switched off", "an info record", "an info record switched off", "a debug record")
    logged = [line for line in stream.getvalue().splitlines() if line.partition(" ")[2] in ours]
    assert logged == ["INFO an info record", "DEBUG a debug record"]


def test_a_servers_log_changes_end_with_it_while_another_changed_them_since(
    start_triton: Callable[..., Triton], pytriton_logger: logging.Logger
) -> None:
    # Two servers in one process share the logger: the last one changed rules, and once both stop, their
    # changes are gone whichever stops first.
    level = pytriton_logger.level
    first = start_triton(_bind, allow_grpc=False, allow_metrics=False)
    second = start_triton(_bind, allow_grpc=False, allow_metrics=False)
    assert post_json(first.http_port, "/v2/logging", {"log_verbose_level": 1})[0] == 200
    assert post_json(second.http_port, "/v2/logging", {"log_info": False, "log_warning": False})[0] == 200
    assert pytriton_logger.level == logging.ERROR
    first.stop()
    assert pytriton_logger.level == logging.ERROR and not pytriton_logger.isEnabledFor(logging.WARNING)
    second.stop()
    assert pytriton_logger.level == level and pytriton_logger.isEnabledFor(logging.WARNING)


def test_trace_config_is_parsed_as_triton_does() -> None:
    config = parse_trace_config(
        [
            "mode=opentelemetry",
            "rate=1",
            "level=TIMESTAMPS",
            "count=5",
            "opentelemetry,resource=team=a",
            "triton,file=x",
        ]
    )
    assert (config.mode, config.rate, config.count, config.level) == ("opentelemetry", 1, 5, ("TIMESTAMPS",))
    assert config.setting("resource") == "team=a" and config.setting("bsp_schedule_delay") == "5000"
    assert config.file == "x"
    # Lists from environment variables arrive split at their commas.
    split = parse_trace_config(["mode=opentelemetry", "opentelemetry", "url=localhost:4318/v1/traces"])
    assert split.setting("url") == "localhost:4318/v1/traces"
    assert parse_trace_config(["level=TIMESTAMPS", "level=OFF"]).level == ()
    assert parse_trace_config(None) == TraceConfig()
    for bad in (["mode=zipkin"], ["level=loud"], ["rate"], ["rate=x"], [",rate=1"]):
        with pytest.raises(PyTritonValidationError):
            parse_trace_config(bad)


def test_trace_sampling_follows_rate_and_count() -> None:
    # a trace file: Triton refuses a change that leaves a level on in mode triton without one
    settings = TraceSettings(TraceConfig(level=("TIMESTAMPS",), rate=2, count=2, file="/nonexistent/trace.json"))
    # Triton's: the rate-th request of each run of settings is traced (the 2nd and 4th here), not the 1st
    assert [settings.sample("m") for _ in range(6)] == [False, True, False, True, False, False]
    assert not settings.enabled("m")
    settings.update({"trace_count": ["-1"], "trace_rate": ["1"]}, "m")
    assert settings.enabled("m") and settings.sample("m") and settings.sample("m")
    assert not settings.enabled("other")


def test_trace_setting_endpoints(start_triton: Callable[..., Triton]) -> None:
    # A trace level in mode triton needs a trace file, as Triton's does (test_wire_fidelity.py); none is written.
    triton = start_triton(
        _bind, allow_grpc=False, allow_metrics=False, trace_config=["triton,file=/nonexistent/trace.json"]
    )
    port = triton.http_port
    assert get_json(port, "/v2/trace/setting") == (
        200,
        {
            "trace_level": ["OFF"],
            "trace_rate": "1000",
            "trace_count": "-1",
            "log_frequency": "0",
            "trace_file": "/nonexistent/trace.json",
            "trace_mode": "triton",
        },
    )
    status, document = post_json(port, "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"], "trace_rate": "10"})
    assert status == 200 and document["trace_level"] == ["TIMESTAMPS"] and document["trace_rate"] == "10"
    status, document = post_json(port, "/v2/models/identity/trace/setting", {"trace_rate": "3", "trace_count": "7"})
    assert status == 200 and (document["trace_rate"], document["trace_count"]) == ("3", "7")
    assert document["trace_level"] == ["TIMESTAMPS"]
    assert get_json(port, "/v2/models/other/trace/setting")[1]["trace_rate"] == "10"
    status, document = post_json(port, "/v2/models/identity/trace/setting", {"trace_rate": None})
    assert document["trace_rate"] == "10" and document["trace_count"] == "7"
    status, document = post_json(port, "/v2/trace/setting", {"trace_rate": None, "trace_level": ["OFF"]})
    assert (document["trace_rate"], document["trace_level"]) == ("1000", ["OFF"])
    assert post_json(port, "/v2/models/nope/trace/setting", {}) == (
        400,
        {"error": "Request for unknown model : nope"},
    )
    assert post_json(port, "/v2/trace/setting", {"trace_file": "x"})[0] == 501
    assert post_json(port, "/v2/trace/setting", {"trace_level": ["OFF", "TIMESTAMPS"]})[0] == 400
    assert post_json(port, "/v2/trace/setting", {"trace_count": "-2"})[0] == 400
    assert request(port, "PUT", "/v2/trace/setting")[0] == 405


def test_a_change_of_the_servers_settings_takes_the_startup_count_unless_a_count_was_set(
    start_triton: Callable[..., Triton],
) -> None:
    # tritonserver 2.51 (nvidia-pytriton 0.7 started with count=2): once the count ran out, a change of the
    # server's rate alone was taken and the count was 2 again, as every server setting never set over the network
    # takes its startup value; a count set over the network is kept (1 left stays 1). This server kept 0 (and,
    # refusing a setting with a count of 0, refused the change).
    config = ["triton,file=/nonexistent/trace.json", "level=TIMESTAMPS", "rate=1", "count=2"]
    triton = start_triton(_bind, allow_grpc=False, allow_metrics=False, trace_config=config)
    port = triton.http_port
    for _ in range(3):
        assert post_json(port, "/v2/models/identity/infer", INFER)[0] == 200
    assert get_json(port, "/v2/trace/setting")[1]["trace_count"] == "0"
    status, document = post_json(port, "/v2/trace/setting", {"trace_rate": "2"})
    assert (status, document["trace_rate"], document["trace_count"]) == (200, "2", "2")
    assert post_json(port, "/v2/trace/setting", {"trace_count": "1"})[0] == 200
    assert post_json(port, "/v2/models/identity/infer", INFER)[0] == 200  # the 1st of 2: not sampled
    status, document = post_json(port, "/v2/trace/setting", {"trace_rate": "1"})
    assert (status, document["trace_count"]) == (200, "1")
    assert post_json(port, "/v2/models/identity/infer", INFER)[0] == 200
    assert post_json(port, "/v2/trace/setting", {"trace_rate": "2"}) == (
        400,
        {"error": "Attempting to set invalid trace setting :"},
    )
    status, document = post_json(port, "/v2/trace/setting", {"trace_count": None, "trace_rate": "2"})
    assert (status, document["trace_count"]) == (200, "2")  # cleared: the startup count again


def test_a_model_with_settings_of_its_own_counts_down_a_copy_of_the_servers_count(
    start_triton: Callable[..., Triton],
) -> None:
    # tritonserver 2.51 (nvidia-pytriton 0.7): a model given a setting of its own (here a rate) copies the server's
    # trace_count then, and its requests count the copy down: after two of its requests the server still had 5
    # and the model 3; a request of another model took the server's to 4, not the model's; a change of the
    # server's settings copies its count to the model again. This server counted one count for both.
    triton = start_triton(
        _bind, allow_grpc=False, allow_metrics=False, trace_config=["triton,file=/nonexistent/trace.json"]
    )
    port = triton.http_port

    def counts() -> List[str]:
        return [get_json(port, path)[1]["trace_count"] for path in ("/v2/trace/setting", MODEL_SETTING)]

    on = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "5"}
    assert post_json(port, "/v2/trace/setting", on)[0] == 200
    assert post_json(port, MODEL_SETTING, {"trace_rate": "1"})[0] == 200
    for _ in range(2):
        assert post_json(port, "/v2/models/identity/infer", INFER)[0] == 200
    assert counts() == ["5", "3"]
    assert post_json(port, "/v2/models/other/infer", INFER)[0] == 200
    assert counts() == ["4", "3"]
    assert post_json(port, "/v2/trace/setting", {"trace_rate": "1"})[0] == 200
    assert counts() == ["4", "4"]
    assert post_json(port, MODEL_SETTING, {"trace_rate": None})[0] == 200  # none of its own: the server's again
    assert post_json(port, "/v2/models/identity/infer", INFER)[0] == 200
    assert counts() == ["3", "3"]


def test_a_change_that_leaves_tracing_on_with_no_count_left_is_refused(start_triton: Callable[..., Triton]) -> None:
    # tritonserver 2.51 (nvidia-pytriton 0.7): a setting that traces with trace_count 0, set so or run out, is
    # invalid, and its refusal names no reason; turning tracing off, or giving a count, is taken. This server took
    # them, and showed a count of 0 that would trace nothing.
    triton = start_triton(
        _bind, allow_grpc=False, allow_metrics=False, trace_config=["triton,file=/nonexistent/trace.json"]
    )
    port = triton.http_port
    refused = (400, {"error": "Attempting to set invalid trace setting :"})
    on = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
    assert post_json(port, "/v2/trace/setting", {**on, "trace_count": "0"}) == refused
    assert post_json(port, "/v2/trace/setting", {**on, "trace_count": "1"})[0] == 200
    assert post_json(port, "/v2/models/identity/trace/setting", {"trace_count": "0"}) == refused
    assert post_json(port, "/v2/models/other/infer", INFER)[0] == 200  # the count runs out
    assert get_json(port, "/v2/trace/setting")[1]["trace_count"] == "0"
    assert post_json(port, "/v2/trace/setting", {"trace_rate": "2"}) == refused
    assert post_json(port, "/v2/models/identity/trace/setting", {"trace_rate": "2"}) == refused
    status, document = post_json(
        port, "/v2/models/identity/trace/setting", {"trace_count": "0", "trace_level": ["OFF"]}
    )
    assert (status, document["trace_count"], document["trace_level"]) == (200, "0", ["OFF"])
    assert post_json(port, "/v2/models/identity/trace/setting", {"trace_count": None, "trace_level": None})[0] == 200
    assert post_json(port, "/v2/trace/setting", {"trace_rate": "2", "trace_count": "-1"})[0] == 200


@pytest.mark.parametrize(
    ("change", "status", "message"),
    [
        # tritonserver 2.51's HTTP frontend reads trace_level as an array of strings and the others as strings,
        # in TritonJson: its words (its 500 a 400 here, the client's mistake; probed against nvidia-pytriton 0.7).
        ({"trace_rate": 5}, 400, "attempt to access JSON non-string as string"),
        ({"log_frequency": ["1"]}, 400, "attempt to access JSON non-string as string"),
        ({"trace_count": -1}, 400, "attempt to access JSON non-string as string"),
        ({"trace_level": "TIMESTAMPS"}, 400, "attempt to access JSON non-array as array"),
        ({"trace_level": [1]}, 400, "attempt to access JSON non-string as string"),
        # field by field, each one's own checks before the next field is read; trace_file before all
        ({"trace_count": 5, "trace_rate": "abc"}, 400, "Unable to parse 'trace_rate', got: abc"),
        ({"trace_level": ["OFF", "OFF"], "trace_rate": 5}, 400, "Expect only one trace level 'OFF' is specified"),
        ({"trace_rate": 5, "trace_file": None}, 501, "trace file location can not be updated through network protocol"),
        # where 2.51 is lax: it takes "-1" as 4294967295 (measured), a rate that traces next to nothing
        ({"trace_rate": "-1"}, 400, "Unable to parse 'trace_rate'. Expecting value >= 0, got:-1"),
        ({"log_frequency": "-2"}, 400, "Unable to parse 'log_frequency'. Expecting value >= 0, got:-2"),
    ],
)
def test_trace_setting_endpoint_refuses_json_types(
    start_triton: Callable[..., Triton], change: Any, status: int, message: str
) -> None:
    triton = start_triton(_bind, allow_grpc=False, allow_metrics=False)
    for path in ("/v2/trace/setting", "/v2/models/identity/trace/setting"):
        assert post_json(triton.http_port, path, change) == (status, {"error": message})
        assert get_json(triton.http_port, path)[1]["trace_rate"] == "1000"


@pytest.mark.parametrize("body", [[1], 5, None, "x"])
def test_settings_endpoints_find_no_setting_in_a_body_that_is_no_object(
    start_triton: Callable[..., Triton], body: Any
) -> None:
    # Triton's HTTP frontend looks settings up with TritonJson's Find, which finds none there: a 200 that
    # changes nothing (tritonserver 2.51, probed), where this server answered 400.
    triton = start_triton(_bind, allow_grpc=False, allow_metrics=False)
    for path in ("/v2/logging", "/v2/trace/setting", "/v2/models/identity/trace/setting"):
        assert post_json(triton.http_port, path, body) == get_json(triton.http_port, path)


def test_trace_setting_endpoint_ignores_an_empty_level(start_triton: Callable[..., Triton]) -> None:
    # Triton's HTTP frontend changes nothing for `"trace_level": []` (its gRPC frontend clears the setting).
    triton = start_triton(_bind, allow_grpc=False, allow_metrics=False, trace_config=["triton,file=/nonexistent/t"])
    path = "/v2/models/identity/trace/setting"
    assert post_json(triton.http_port, path, {"trace_level": ["TIMESTAMPS"]})[1]["trace_level"] == ["TIMESTAMPS"]
    assert post_json(triton.http_port, path, {"trace_level": []})[1]["trace_level"] == ["TIMESTAMPS"]
    assert post_json(triton.http_port, path, {"trace_level": None})[1]["trace_level"] == ["OFF"]


def test_trace_settings_over_clients(start_triton: Callable[..., Triton]) -> None:
    triton = start_triton(_bind, allow_metrics=False, trace_config=["rate=5", "triton,file=/nonexistent/trace.json"])
    http = httpclient.InferenceServerClient(http_url(triton))
    grpc = grpcclient.InferenceServerClient(grpc_url(triton))
    # Triton lists the extension whose endpoints these are, over both protocols.
    assert "trace" in http.get_server_metadata()["extensions"]
    assert "trace" in grpc.get_server_metadata(as_json=True)["extensions"]
    assert http.get_trace_settings()["trace_rate"] == "5"
    settings = grpc.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_rate"] == {"value": ["5"]} and settings["trace_level"] == {"value": ["OFF"]}
    updated = grpc.update_trace_settings("identity", {"trace_level": ["TIMESTAMPS"], "trace_count": "2"}, as_json=True)
    assert updated["settings"]["trace_level"] == {"value": ["TIMESTAMPS"]}
    assert updated["settings"]["trace_count"] == {"value": ["2"]}
    cleared = grpc.update_trace_settings("identity", {"trace_count": None}, as_json=True)["settings"]
    assert cleared["trace_count"] == {"value": ["-1"]}
    assert http.get_trace_settings(model_name="identity")["trace_level"] == ["TIMESTAMPS"]
    with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
        grpc.get_trace_settings(model_name="nope")
    http.close()
    grpc.close()


@needs_otel
def test_opentelemetry_settings_are_listed_as_tritons(start_triton: Callable[..., Triton]) -> None:
    # tritonserver 2.51 (measured): gRPC lists every value of a setting given more than once (its HTTP body repeats
    # the key, of which JSON readers keep the last), and the batch span processor's defaults follow the settings
    # given, bsp_max_export_batch_size first. gRPC listed only the last resource, and the defaults in reverse.
    given = ["resource=a=b", "bsp_schedule_delay=10", "url=localhost:1/v1/traces", "resource=c=d"]
    entries = ["mode=opentelemetry", *(f"opentelemetry,{entry}" for entry in given)]
    triton = start_triton(_bind, allow_metrics=False, trace_config=entries)
    document = get_json(triton.http_port, "/v2/trace/setting")[1]
    mode_settings = ["resource", "bsp_schedule_delay", "url", "bsp_max_export_batch_size", "bsp_max_queue_size"]
    assert list(document) == ["trace_level", "trace_rate", "trace_count", "trace_mode", *mode_settings]
    assert document["resource"] == "c=d"
    grpc = grpcclient.InferenceServerClient(grpc_url(triton))
    settings = grpc.get_trace_settings(as_json=True)["settings"]
    assert settings["resource"] == {"value": ["a=b", "c=d"]} and settings["bsp_schedule_delay"] == {"value": ["10"]}
    updated = grpc.update_trace_settings(settings={"trace_rate": "3"}, as_json=True)["settings"]
    assert updated["resource"] == {"value": ["a=b", "c=d"]} and updated["trace_rate"] == {"value": ["3"]}
    grpc.close()


def test_opentelemetry_exports_request_queue_and_compute_spans(start_triton: Callable[..., Triton]) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    triton = start_triton(
        _bind,
        allow_grpc=False,
        allow_metrics=False,
        trace_config=["mode=opentelemetry", "rate=1", "level=TIMESTAMPS", "opentelemetry,resource=team=serving"],
    )
    exporter = InMemorySpanExporter()
    triton._runtime.tracing.add_span_processor(SimpleSpanProcessor(exporter))
    port = triton.http_port
    for _ in range(2):
        assert post_json(port, "/v2/models/identity/infer", INFER)[0] == 200
    spans = exporter.get_finished_spans()
    names = ["compute", "compute", "in-callable", "in-callable", "queue", "queue", "request", "request"]
    assert sorted(span.name for span in spans) == names
    computes = {span.context.span_id for span in spans if span.name == "compute"}
    assert all(span.parent.span_id in computes for span in spans if span.name == "in-callable")
    roots = [span for span in spans if span.name == "request"]
    assert roots[0].attributes["triton.model_name"] == "identity"
    assert roots[0].resource.attributes["team"] == "serving"
    for child in (span for span in spans if span.name in ("queue", "compute")):
        parent = next(root for root in roots if root.context.span_id == child.parent.span_id)
        assert parent.start_time <= child.start_time <= child.end_time <= parent.end_time
    # Switching the level off detaches the span sources: nothing per request is left to pay.
    status, document = post_json(port, "/v2/trace/setting", {"trace_level": ["OFF"]})
    assert status == 200 and document["trace_mode"] == "opentelemetry"
    assert all(model.scheduler.spans is None for model in triton._runtime.engine.models())
    exporter.clear()
    assert post_json(port, "/v2/models/identity/infer", INFER)[0] == 200
    assert exporter.get_finished_spans() == ()
    # A model's own settings: one trace for `identity` only, then its count runs out.
    post_json(port, "/v2/models/identity/trace/setting", {"trace_level": ["TIMESTAMPS"], "trace_count": "1"})
    for name in ("identity", "identity", "other"):
        assert post_json(port, f"/v2/models/{name}/infer", INFER)[0] == 200
    assert sorted(span.name for span in exporter.get_finished_spans()) == ["compute", "in-callable", "queue", "request"]
    assert json.loads(request(port, "GET", "/v2/models/identity/trace/setting")[2])["trace_count"] == "0"


@needs_otel
def test_a_model_bound_again_by_a_load_stays_traced(start_triton: Callable[..., Triton]) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    triton = start_triton(
        _bind, allow_grpc=False, allow_metrics=False, trace_config=["mode=opentelemetry", "rate=1", "level=TIMESTAMPS"]
    )
    exporter = InMemorySpanExporter()
    triton._runtime.tracing.add_span_processor(SimpleSpanProcessor(exporter))
    port = triton.http_port
    override = {"parameters": {"config": json.dumps({"max_batch_size": 2})}}
    assert post_json(port, "/v2/repository/models/identity/load", override, HTTP_AUTH) == (200, None)
    assert post_json(port, "/v2/models/identity/infer", INFER)[0] == 200
    assert sorted(span.name for span in exporter.get_finished_spans()) == ["compute", "in-callable", "queue", "request"]


def test_tracing_off_observes_nothing(start_triton: Callable[..., Triton]) -> None:
    triton = start_triton(_bind, allow_grpc=False, allow_metrics=False)
    assert all(model.scheduler.spans is None for model in triton._runtime.engine.models())


@needs_otel
def test_a_failed_request_has_error_spans(start_triton: Callable[..., Triton]) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    def fail(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        with requests[0].traced_span("before-failing"):
            raise ValueError("no")

    def bind(triton: Triton) -> None:
        tensors = {"inputs": [Tensor(name="IN", dtype=np.float32, shape=(-1,))]}
        triton.bind("fail", fail, outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))], **tensors)

    triton = start_triton(
        bind, allow_grpc=False, allow_metrics=False, trace_config=["mode=opentelemetry", "rate=1", "level=TIMESTAMPS"]
    )
    exporter = InMemorySpanExporter()
    triton._runtime.tracing.add_span_processor(SimpleSpanProcessor(exporter))
    assert post_json(triton.http_port, "/v2/models/fail/infer", INFER)[0] == 500
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"request", "queue", "compute", "before-failing"}
    assert spans["compute"].status.status_code is StatusCode.ERROR
    assert spans["request"].status.description == "ValueError: no"


@needs_otel
def test_opentelemetry_nests_an_ensembles_steps_under_its_compute_span(start_triton: Callable[..., Triton]) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    def bind(triton: Triton) -> None:
        _bind(triton)
        tensors = {
            "inputs": [Tensor(name="IN", dtype=np.float32, shape=(-1,))],
            "outputs": [Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
        }
        steps = [
            EnsembleStep("identity", input_map={"IN": "IN"}, output_map={"OUT": "mid"}),
            EnsembleStep("other", input_map={"IN": "mid"}, output_map={"OUT": "OUT"}),
        ]
        triton.bind_ensemble("ens", steps=steps, **tensors)

    triton = start_triton(
        bind, allow_grpc=False, allow_metrics=False, trace_config=["mode=opentelemetry", "rate=1", "level=TIMESTAMPS"]
    )
    exporter = InMemorySpanExporter()
    triton._runtime.tracing.add_span_processor(SimpleSpanProcessor(exporter))
    assert post_json(triton.http_port, "/v2/models/ens/infer", INFER)[0] == 200
    spans = exporter.get_finished_spans()
    roots = {span.attributes["triton.model_name"]: span for span in spans if span.name == "request"}
    assert sorted(roots) == ["ens", "identity", "other"]
    assert roots["ens"].parent is None
    ensemble_compute = next(
        span for span in spans if span.name == "compute" and span.parent.span_id == roots["ens"].context.span_id
    )
    for step in ("identity", "other"):
        assert roots[step].parent.span_id == ensemble_compute.context.span_id
    names = ["compute"] * 3 + ["in-callable"] * 2 + ["queue"] * 3 + ["request"] * 3
    assert sorted(span.name for span in spans) == names


def test_bind_trace_config_sets_the_models_own_trace_settings(start_triton: Callable[..., Triton]) -> None:
    def bind(triton: Triton) -> None:
        io = {
            "inputs": [Tensor(name="IN", dtype=np.float32, shape=(-1,))],
            "outputs": [Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
        }
        triton.bind("identity", _identity, **io, trace_config=["rate=1", "level=TIMESTAMPS", "count=3"])
        triton.bind("other", _identity, **io)
        with pytest.raises(PyTritonValidationError, match="trace mode and its settings are the server's here"):
            triton.bind("otel", _identity, **io, trace_config=["mode=opentelemetry"])

    triton = start_triton(bind, allow_grpc=False, allow_metrics=False, trace_config=["rate=5"])
    model = get_json(triton.http_port, "/v2/models/identity/trace/setting")[1]
    assert (model["trace_rate"], model["trace_level"], model["trace_count"]) == ("1", ["TIMESTAMPS"], "3")
    other = get_json(triton.http_port, "/v2/models/other/trace/setting")[1]
    assert (other["trace_rate"], other["trace_level"]) == ("5", ["OFF"])
