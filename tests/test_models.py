"""Binding checks (pytriton/models.py): a Tensor the engine cannot serve is refused with a message that says
what is accepted (nvidia-pytriton 0.7 refuses these too, with a TypeError or a model load error); the forms it
serves are accepted, and dtype names such as 'float32' and 'bfloat16' as well."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from pytriton.decorators import batch
from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonValidationError,
)
from pytriton.model_config import DynamicBatcher, EnsembleStep, ModelConfig, QueuePolicy, Tensor, TimeoutAction
from pytriton.triton import Triton, TritonConfig
from tests.conftest import grpc_url, running_triton
from tests.http_helpers import post_json, request

SHAPES = "expected a tuple of dims, each an int >= 1 or -1 for any size (without the batch axis), e.g. (-1,)"
DTYPES = "expected a numpy type or dtype (np.float32, np.dtype('int64'), 'float32'), bytes or object for BYTES"


@pytest.fixture
def triton() -> Iterator[Triton]:
    with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as server:
        yield server


def _bind(triton: Triton, tensor: Tensor) -> None:
    output = Tensor(name="y", dtype=np.float32, shape=(-1,))
    triton.bind("m", lambda requests: requests, inputs=[tensor], outputs=[output], config=ModelConfig(max_batch_size=4))


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((None,), f"model 'm': input 'x' has shape=(None,) (-1, not None, marks a dim of any size); {SHAPES}"),
        (-1, f"model 'm': input 'x' has shape=-1; {SHAPES}"),
        ((0,), f"model 'm': input 'x' has shape=(0,); {SHAPES}"),
        ((-2, 3), f"model 'm': input 'x' has shape=(-2, 3); {SHAPES}"),
        (("3",), f"model 'm': input 'x' has shape=('3',); {SHAPES}"),
        ((2.5,), f"model 'm': input 'x' has shape=(2.5,); {SHAPES}"),
        ((True,), f"model 'm': input 'x' has shape=(True,); {SHAPES}"),
    ],
)
def test_a_shape_the_engine_cannot_serve_says_what_is_accepted(triton: Triton, shape: Any, message: str) -> None:
    with pytest.raises(PyTritonModelConfigError) as raised:
        _bind(triton, Tensor(name="x", dtype=np.float32, shape=shape))
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("dtype", "hint"),
    [
        ("FP32", " ('FP32' is Triton's name of np.float32: use that)"),
        ("TYPE_INT64", " ('TYPE_INT64' is Triton's name of np.int64: use that)"),
        ("BYTES", " ('BYTES' is Triton's name of bytes: use that)"),
        ("TYPE_STRING", " ('TYPE_STRING' is Triton's name of bytes: use that)"),
        ("BF16", " ('BF16' is Triton's name of 'bfloat16': use that)"),
        (np.complex64, ""),
        ("no such type", ""),
    ],
)
def test_a_dtype_the_engine_cannot_serve_says_what_is_accepted(triton: Triton, dtype: Any, hint: str) -> None:
    with pytest.raises(PyTritonModelConfigError) as raised:
        _bind(triton, Tensor(name="x", dtype=dtype, shape=(-1,)))
    assert str(raised.value).startswith(f"model 'm': input 'x' has dtype={dtype!r}; {DTYPES}")
    assert str(raised.value).endswith("or 'bfloat16'" + hint)


@pytest.mark.parametrize(
    "tensor",
    [
        Tensor(name="x", dtype=np.float32, shape=[-1, 2]),
        Tensor(name="x", dtype=np.dtype("float32"), shape=(np.int64(-1),)),
        Tensor(name="x", dtype="float32", shape=(3,)),
        Tensor(name="x", dtype=bytes, shape=(1,)),
        Tensor(name="x", dtype=object, shape=(-1,)),
        Tensor(name="x", dtype="bfloat16", shape=(-1,)),
    ],
    ids=["list", "numpy-int-dim", "dtype-name", "bytes", "object", "bfloat16"],
)
def test_accepted_forms(triton: Triton, tensor: Tensor) -> None:
    _bind(triton, tensor)


def test_an_empty_shape_is_refused_as_triton_refuses_to_load_it(triton: Triton) -> None:
    """Triton 2.51 refuses `dims: []` ("model input 'x' must specify 'dims'"); NVIDIA's bind then fails to load."""
    with pytest.raises(PyTritonModelConfigError) as raised:
        _bind(triton, Tensor(name="x", dtype=np.float32, shape=()))
    needs = "Triton needs at least one dim: (1,) for one value per request"
    assert str(raised.value) == f"model 'm': input 'x' has shape=(); {needs}"


def test_an_optional_output_is_refused_as_nvidia_pytriton_refuses_it(triton: Triton) -> None:
    """An output cannot be optional in Triton's config; 0.7 raises this error and type, not silence."""
    with pytest.raises(PyTritonValidationError, match=r"^Output tensors cannot be optional\.$"):
        triton.bind(
            "m",
            lambda requests: requests,
            inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,), optional=True)],
        )


def _bind_batcher(triton: Triton, batcher: DynamicBatcher) -> None:
    tensors = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    triton.bind("m", lambda requests: requests, inputs=tensors, outputs=tensors, config=ModelConfig(batcher=batcher))


_DELAY = QueuePolicy(timeout_action=TimeoutAction.DELAY, default_timeout_microseconds=10)


@pytest.mark.parametrize(
    ("batcher", "message"),
    [
        (
            DynamicBatcher(preserve_ordering=True, priority_levels=2, default_priority_level=1),
            "Only one priority level is allowed when 'preserve_ordering' is true for m",
        ),
        (
            DynamicBatcher(preserve_ordering=True, default_queue_policy=_DELAY),
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m",
        ),
        (
            DynamicBatcher(
                preserve_ordering=True, priority_levels=1, default_priority_level=1, priority_queue_policy={1: _DELAY}
            ),
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m",
        ),
        (
            DynamicBatcher(default_queue_policy=QueuePolicy(max_queue_size=-1)),
            "default_queue_policy.max_queue_size must be >= 0, got -1 for m",
        ),
        (
            DynamicBatcher(
                priority_levels=2,
                default_priority_level=1,
                priority_queue_policy={2: QueuePolicy(default_timeout_microseconds=-5)},
            ),
            "priority_queue_policy[2].default_timeout_microseconds must be >= 0, got -5 for m",
        ),
    ],
    ids=["ordering-levels", "ordering-delay", "ordering-level-delay", "queue-size", "timeout"],
)
def test_batcher_settings_triton_refuses_to_load_are_refused_at_bind(
    triton: Triton, batcher: DynamicBatcher, message: str
) -> None:
    """tritonserver 2.51 fails NVIDIA's bind with these (its words, `model_config_utils.cc`); served here, they
    showed a negative `max_queue_size` on the wire or an ordering the queue policy breaks."""
    with pytest.raises(PyTritonModelConfigError) as raised:
        _bind_batcher(triton, batcher)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    "batcher",
    [
        DynamicBatcher(preserve_ordering=True, priority_levels=1, default_priority_level=1),
        DynamicBatcher(preserve_ordering=True, default_queue_policy=QueuePolicy(timeout_action=TimeoutAction.DELAY)),
        DynamicBatcher(preserve_ordering=True, default_queue_policy=QueuePolicy(default_timeout_microseconds=10)),
    ],
    ids=["one-level", "delay-without-timeout", "reject-with-timeout"],
)
def test_preserve_ordering_with_what_triton_allows_binds(triton: Triton, batcher: DynamicBatcher) -> None:
    _bind_batcher(triton, batcher)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (ModelConfig(max_batch_size=0), "max_batch_size must be >= 1 when batching is enabled"),
        (
            ModelConfig(batcher=DynamicBatcher(priority_levels=2, default_priority_level=3)),
            r"default_priority_level must be between 1 and priority_levels \(2\)",
        ),
        (
            ModelConfig(batcher=DynamicBatcher(priority_queue_policy={1: QueuePolicy()})),
            "priority_queue_policy needs priority_levels",
        ),
        (
            ModelConfig(
                batcher=DynamicBatcher(
                    priority_levels=2, default_priority_level=1, priority_queue_policy={5: QueuePolicy()}
                )
            ),
            r"priority_queue_policy level 5 is outside 1\.\.priority_levels",
        ),
    ],
    ids=["max-batch-size", "default-level", "policy-without-levels", "policy-level"],
)
def test_batching_parameters_nvidia_pytriton_refuses_at_bind_raise_its_type(
    triton: Triton, config: ModelConfig, message: str
) -> None:
    """0.7 raises PyTritonBadParameterError for these in bind: code written for it catches that type."""
    tensors = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    with pytest.raises(PyTritonBadParameterError, match=message):
        triton.bind("m", lambda requests: requests, inputs=tensors, outputs=tensors, config=config)


def test_an_infer_func_that_is_no_callable_is_refused_as_nvidia_pytriton_0_7_refuses_it(triton: Triton) -> None:
    """0.7 raises PyTritonValidationError with these words (code written for it may catch that type)."""
    tensors = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    with pytest.raises(
        PyTritonValidationError, match=r"^inference_fn has to be either callable or sequence of callables$"
    ):
        triton.bind("m", 5, inputs=tensors, outputs=tensors)  # type: ignore[arg-type]


def test_a_model_bound_twice_is_refused_in_nvidia_pytriton_0_7s_words(triton: Triton) -> None:
    tensors = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    triton.bind("m", lambda requests: requests, inputs=tensors, outputs=tensors)
    with pytest.raises(PyTritonInvalidOperationError) as error:
        triton.bind("m", lambda requests: requests, inputs=tensors, outputs=tensors)
    assert str(error.value).startswith("Cannot add model with the same name twice.")  # 0.7's message
    assert "'m' version 1 is already bound" in str(error.value)


def test_version_0_is_served_as_0_7_serves_it() -> None:
    # nvidia-pytriton 0.7 (tritonserver 2.51) serves model_version=0: metadata `"versions":["0"]`, and inference
    # at the latest version or at /versions/0 answers `"model_version":"0"`; here bind refused it
    def bind(triton: Triton) -> None:
        tensors = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
        triton.bind("v0", lambda requests: [{"x": r["x"]} for r in requests], tensors, tensors, model_version=0)

    body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    with running_triton(bind) as triton:
        assert b'"versions":["0"]' in request(triton.http_port, "GET", "/v2/models/v0")[2]
        for path in ("/v2/models/v0/infer", "/v2/models/v0/versions/0/infer"):
            status, answer = post_json(triton.http_port, path, body)
            assert (status, answer["model_version"]) == (200, "0")
        client = grpcclient.InferenceServerClient(grpc_url(triton))
        tensor = grpcclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
        assert client.infer("v0", [tensor], model_version="0").get_response().model_version == "0"
        client.close()
        step = EnsembleStep("v0", input_map={"x": "x"}, output_map={"x": "x"}, model_version=0)
        tensors = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
        triton.bind_ensemble("e", [step], tensors, tensors)
        assert post_json(triton.http_port, "/v2/models/e/infer", body)[0] == 200
        with pytest.raises(PyTritonBadParameterError, match="model_version must be an integer >= 0, got -1"):
            triton.bind(
                "minus",
                lambda requests: requests,
                [Tensor(name="x", dtype=np.float32, shape=(-1,))],
                [],
                model_version=-1,
            )


def test_batcher_none_is_no_dynamic_batcher_not_a_batcher_set(triton: Triton, caplog: pytest.LogCaptureFixture) -> None:
    # batcher=None is 0.7's way to write no dynamic_batching: neither "set" on a model that does not batch (warned
    # of as having no effect) nor on an ensemble (refused as a batcher of its own)
    tensors = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    triton.bind("plain", lambda requests: requests, tensors, tensors, config=ModelConfig(batching=False, batcher=None))
    assert "ModelConfig.batcher" not in caplog.text
    step = EnsembleStep("plain", input_map={"x": "x"}, output_map={"x": "x"})
    triton.bind_ensemble("e", [step], tensors, tensors, config=ModelConfig(batching=False, batcher=None))


def test_an_undecorated_callable_that_takes_no_requests_is_warned_of_at_bind(
    triton: Triton, caplog: pytest.LogCaptureFixture
) -> None:
    # nvidia-pytriton issue #20: `def infer(**inputs)` bound without @batch failed every request with "takes 0
    # positional arguments but 1 was given", a message that never names the decorator it lacks
    def infer(**inputs: np.ndarray) -> Any:
        return {"y": inputs["x"]}

    tensors = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    outputs = [Tensor(name="y", dtype=np.float32, shape=(-1,))]
    triton.bind("undecorated", infer, tensors, outputs, config=ModelConfig(max_batch_size=4))
    assert "model 'undecorated': infer_func " in caplog.text
    assert ".infer takes no positional argument" in caplog.text
    assert "@pytriton.decorators.batch" in caplog.text
    caplog.clear()
    triton.bind("decorated", batch(infer), tensors, outputs, config=ModelConfig(max_batch_size=4))
    triton.bind("plain", lambda requests: [{"y": r["x"]} for r in requests], tensors, outputs)
    assert "takes no positional argument" not in caplog.text
    triton.run()
    body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [2.0]}]}
    status, answer = post_json(triton.http_port, "/v2/models/undecorated/infer", body)
    assert status == 500 and "takes 0 positional arguments but 1 was given" in answer["error"]
    assert post_json(triton.http_port, "/v2/models/decorated/infer", body)[1]["outputs"][0]["data"] == [2.0]
