"""pytriton.decorators: each decorator on its own, its errors, and decorated callables served end to end."""

from __future__ import annotations

import asyncio
import gc
import inspect
import itertools
import warnings
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, cast

import numpy as np
import pytest
import tritonclient.http as httpclient
import wrapt
from tritonclient.utils import InferenceServerException

from pytriton.constants import TRITON_CONTEXT_FIELD_NAME
from pytriton.decorators import (
    ConstantPadder,
    InferenceRequest,
    InferenceRequests,
    InferenceResult,
    InferenceResults,
    ModelConfigDict,
    TritonContext,
    batch,
    convert_output,
    fill_optionals,
    first_value,
    get_inference_request_batch_size,
    get_model_config,
    get_triton_context,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
    triton_context,
)
from pytriton.exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonValidationError
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig
from pytriton.proxy.types import Request
from pytriton.triton import Triton, TritonConfig
from tests.conftest import http_url, running_triton

NOT_BOUND = "Wrapped function or object must bound with triton to get  __triton_context__"
_names = itertools.count()

TensorDecl = Tuple[str, Any, Tuple[int, ...]]


def _tensors(decls: Sequence[TensorDecl]) -> List[Tensor]:
    return [Tensor(name=name, dtype=dtype, shape=shape) for name, dtype, shape in decls]


@pytest.fixture
def bind() -> Iterator[Callable[..., Any]]:
    """Bind callables to a real (not started) Triton, so they get the model config binding gives them."""
    triton = Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False))

    def _bind(
        fn: Any,
        inputs: Sequence[TensorDecl] = (("a", np.int64, (-1,)),),
        outputs: Sequence[TensorDecl] = (("out", np.int64, (-1,)),),
        **config: Any,
    ) -> Any:
        triton.bind(f"model_{next(_names)}", fn, _tensors(inputs), _tensors(outputs), config=ModelConfig(**config))
        return fn

    yield _bind
    triton.stop()


def _inject(fn: Any, config: TritonModelConfig) -> Any:
    """Attach a hand-made model config, as binding does."""
    context = TritonContext()
    context.model_configs[fn] = config
    target = getattr(fn, "__self__", fn)
    target.__triton_context__ = context
    return fn


def _assert_dicts_equal(actual: Dict[str, Any], expected: Dict[str, Any]) -> None:
    assert list(actual) == list(expected)
    for name, value in expected.items():
        if isinstance(value, np.ndarray):
            assert isinstance(actual[name], np.ndarray), name
            assert actual[name].dtype == value.dtype, name
            np.testing.assert_array_equal(actual[name], value)
        else:
            assert type(actual[name]) is type(value), name
            assert actual[name] == value, name


# --- type aliases, ModelConfigDict, context lookup -------------------------------------------------------------


def test_type_aliases() -> None:
    assert InferenceRequest == Dict[str, np.ndarray]
    assert InferenceResult == Dict[str, np.ndarray]
    assert List[InferenceRequest] in InferenceRequests.__args__  # type: ignore[attr-defined]
    assert Tuple[InferenceResult, ...] in InferenceResults.__args__  # type: ignore[attr-defined]


def test_model_config_dict_keys() -> None:
    def fn() -> None:
        pass

    class Model:
        def __call__(self) -> None:
            pass

        def method(self) -> None:
            pass

    model, other = Model(), Model()
    assert ModelConfigDict._get_model_config_key(fn) == str(fn)
    assert ModelConfigDict._get_model_config_key(model) == str(model)
    assert ModelConfigDict._get_model_config_key(model.__call__) == str(model)
    assert ModelConfigDict._get_model_config_key(model.method) == str(model.method)

    configs = ModelConfigDict()
    configs[fn] = TritonModelConfig(model_name="fn")
    configs[model] = TritonModelConfig(model_name="model")
    configs[other.method] = TritonModelConfig(model_name="other")
    assert configs[fn].model_name == "fn"
    assert configs[model.__call__].model_name == "model"
    assert configs[other.method].model_name == "other"
    assert len(configs) == 3
    assert list(configs) == [fn, model, other.method]
    del configs[fn]
    assert len(configs) == 2
    with pytest.raises(KeyError):
        configs[fn]
    with pytest.raises(KeyError):
        configs[other]


def test_get_triton_context_prefers_instance() -> None:
    def fn() -> None:
        pass

    class Holder:
        pass

    holder = Holder()
    with pytest.raises(PyTritonValidationError, match=NOT_BOUND):
        get_triton_context(fn, None)
    fn.__triton_context__ = "from-fn"  # type: ignore[attr-defined]
    holder.__triton_context__ = "from-instance"  # type: ignore[attr-defined]
    assert cast(Any, get_triton_context(fn, None)) == "from-fn"
    assert cast(Any, get_triton_context(fn, holder)) == "from-instance"
    with pytest.raises(PyTritonValidationError, match=NOT_BOUND):
        get_triton_context(fn, object())


def test_get_model_config_from_binding(bind: Callable[..., Any]) -> None:
    def fn(requests: Any) -> Any:
        return requests

    bind(fn, max_batch_size=5)
    config = get_model_config(fn, None)
    assert isinstance(config, TritonModelConfig)
    assert config.max_batch_size == 5
    assert [spec.name for spec in config.inputs or []] == ["a"]
    assert isinstance(get_triton_context(fn, None), TritonContext)


def test_get_model_config_from_any_level_of_decorator_stack() -> None:
    seen = []

    @wrapt.decorator
    def spy(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        seen.append(get_model_config(wrapped, instance).model_name)
        return wrapped(*args, **kwargs)

    @spy
    @batch
    @spy
    def fn(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        return {"out": inputs["a"]}

    _inject(fn, TritonModelConfig(model_name="stacked"))
    fn([Request({"a": np.zeros((1, 1))})])
    assert seen == ["stacked", "stacked"]


def test_get_inference_request_batch_size() -> None:
    assert get_inference_request_batch_size({"a": np.zeros((3, 2)), "b": np.zeros((3,))}) == 3
    assert get_inference_request_batch_size(Request({"x": np.zeros((7, 1))})) == 7  # type: ignore[arg-type]


@pytest.mark.parametrize("scalar", [np.float32(1.0), np.array(1.0)])
def test_get_inference_request_batch_size_of_an_input_without_axes_is_nvidias_value_error(scalar: Any) -> None:
    """0.7 unpacks the shape (`batch_size, *_dims = shape`): ValueError, not IndexError, for a 0-d input."""
    with pytest.raises(ValueError, match=r"^not enough values to unpack \(expected at least 1, got 0\)$"):
        get_inference_request_batch_size({"a": scalar})


# --- convert_output ----------------------------------------------------------------------------------------------

_TWO_OUTPUTS = TritonModelConfig(
    model_name="two",
    outputs=[TensorSpec("x", (-1,), np.float32), TensorSpec("y", (-1,), np.float32)],
)


def test_convert_output_dict_is_returned_as_is() -> None:
    outputs = {"z": np.zeros(1)}
    assert convert_output(outputs) is outputs


@pytest.mark.parametrize("container", [list, tuple])
def test_convert_output_sequence_follows_config_order(container: Any) -> None:
    x, y = np.zeros(1), np.ones(1)
    converted = convert_output(container([x, y]), model_config=_TWO_OUTPUTS)
    assert list(converted) == ["x", "y"]
    assert converted["x"] is x and converted["y"] is y


def test_convert_output_reads_config_of_wrapped() -> None:
    def fn() -> None:
        pass

    _inject(fn, _TWO_OUTPUTS)
    assert list(convert_output([1, 2], fn, None)) == ["x", "y"]


def test_convert_output_errors() -> None:
    with pytest.raises(PyTritonValidationError, match=r"^Outputs length different than config outputs length$"):
        convert_output([np.zeros(1)], model_config=_TWO_OUTPUTS)
    with pytest.raises(PyTritonValidationError, match=r"^Unsupported output type <class 'numpy.ndarray'>\.$"):
        convert_output(np.zeros(1), model_config=_TWO_OUTPUTS)  # type: ignore[arg-type]

    def unbound() -> None:
        pass

    with pytest.raises(PyTritonValidationError, match=NOT_BOUND):
        convert_output([np.zeros(1), np.zeros(1)], unbound, None)


# --- @batch ------------------------------------------------------------------------------------------------------


def _three_requests() -> List[Request]:
    return [
        Request({"b": np.array([[7, 5], [8, 6]]), "a": np.array([[1], [2]])}, {}),
        Request({"a": np.array([[3], [4], [5]]), "b": np.array([[1, 2], [1, 2], [11, 12]])}, {}),
        Request({"b": np.array([[1, 2]]), "a": np.array([[6]])}, {}),
    ]


def test_batch_concatenates_and_splits() -> None:
    calls: List[Dict[str, np.ndarray]] = []

    @batch
    def fn(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        calls.append(inputs)
        return {"sum": inputs["a"] + inputs["b"], "a10": inputs["a"] * 10}

    results = fn(_three_requests())
    assert len(calls) == 1
    np.testing.assert_array_equal(calls[0]["a"], [[1], [2], [3], [4], [5], [6]])
    assert calls[0]["b"].shape == (6, 2)
    assert len(results) == 3
    for request, result in zip(_three_requests(), results):
        _assert_dicts_equal(result, {"sum": request["a"] + request["b"], "a10": request["a"] * 10})


def test_batch_passes_a_lone_writable_request_uncopied_and_copies_a_read_only_one() -> None:
    # np.concatenate of one array copied it: a second 1 GiB for a 1 GiB tensor, and seconds holding the GIL.
    seen: List[np.ndarray] = []

    @batch
    def fn(x: np.ndarray) -> Dict[str, np.ndarray]:
        seen.append(x)
        x += 1  # a callable may write into its inputs
        return {"y": x}

    own = np.zeros((1, 4), np.float32)
    (result,) = fn([{"x": own}])
    assert seen[-1] is own and np.shares_memory(result["y"], own)
    np.testing.assert_array_equal(result["y"], np.ones((1, 4)))
    read_only = np.frombuffer(bytes(16), np.float32).reshape(1, 4)
    (result,) = fn([{"x": read_only}])
    assert not np.shares_memory(seen[-1], read_only) and not read_only.any()
    np.testing.assert_array_equal(result["y"], np.ones((1, 4)))


def test_batch_accepts_plain_dicts_and_passes_extra_kwargs() -> None:
    @batch
    def fn(**inputs: Any) -> Dict[str, np.ndarray]:
        assert inputs.pop("extra") == "kept"
        return {"out": inputs["a"] + 1}

    results = fn([{"a": np.array([1, 2])}, {"a": np.array([3])}], extra="kept")
    _assert_dicts_equal(results[0], {"out": np.array([2, 3])})
    _assert_dicts_equal(results[1], {"out": np.array([4])})


def test_batch_refuses_a_lone_request_with_a_0_dimensional_input_before_calling() -> None:
    """As 0.7's np.concatenate does: the callable is never called with an input that has no batch axis."""
    calls: List[Dict[str, Any]] = []

    @batch
    def fn(**inputs: Any) -> Dict[str, Any]:
        calls.append(inputs)
        return inputs

    with pytest.raises(ValueError, match=r"^zero-dimensional arrays cannot be concatenated$"):
        fn([Request({"a": np.array(1.0)})])
    assert calls == []


def test_batch_rejects_requests_with_different_inputs() -> None:
    @batch
    def fn(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        raise AssertionError("not called")

    requests = [Request({"a": np.zeros((1, 1))}), Request({"a": np.zeros((1, 1)), "b": np.zeros((1, 1))})]
    with pytest.raises(PyTritonValidationError, match=r"^Cannot batch requests with different set of inputs keys$"):
        fn(requests)


def test_batch_list_outputs_use_bound_model_config(bind: Callable[..., Any]) -> None:
    @batch
    def fn(**inputs: np.ndarray) -> List[np.ndarray]:
        return [inputs["a"] * 2, inputs["a"] * 3]

    bind(fn, inputs=[("a", np.int64, (1,))], outputs=[("double", np.int64, (1,)), ("triple", np.int64, (1,))])
    results = fn([Request({"a": np.array([[1], [2]])}), Request({"a": np.array([[5]])})])
    _assert_dicts_equal(results[0], {"double": np.array([[2], [4]]), "triple": np.array([[3], [6]])})
    _assert_dicts_equal(results[1], {"double": np.array([[10]]), "triple": np.array([[15]])})


def test_batch_list_outputs_need_binding() -> None:
    @batch
    def fn(**inputs: np.ndarray) -> List[np.ndarray]:
        return [inputs["a"]]

    with pytest.raises(PyTritonValidationError, match=NOT_BOUND):
        fn([Request({"a": np.zeros((1, 1))})])


def test_batch_rejects_outputs_with_wrong_batch_size() -> None:
    @batch
    def fn(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        return {"ok": inputs["a"], "short": inputs["a"][:1]}

    with pytest.raises(
        ValueError,
        match=r"^Received output tensors with different batch sizes: short: \(1, 1\)\. Expected batch size: 6\. $",
    ):
        fn(_three_requests())


def test_batch_rejects_unsupported_output_type() -> None:
    @batch
    def fn(**inputs: np.ndarray) -> Any:
        return inputs["a"]

    with pytest.raises(PyTritonValidationError, match="Unsupported output type"):
        fn(_three_requests())


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ([[1], [2]], "a list ([[1], [2]])"),
        ((1, 2), "a tuple ((1, 2))"),
        (np.int64(3), f"a numpy.int64 ({np.int64(3)!r})"),
    ],
)
def test_batch_names_an_output_that_is_no_numpy_array(value: Any, what: str) -> None:
    @batch
    def fn(**inputs: np.ndarray) -> Dict[str, Any]:
        return {"ok": inputs["a"], "wrong": value}

    # Not "AttributeError: 'list' object has no attribute 'shape'" from inside @batch.
    message = (
        "Not all values returned by the model callable are numpy arrays: output `wrong` is "
        f"{what}; return it as a numpy array (np.asarray(...))"
    )
    with pytest.raises(PyTritonValidationError) as raised:
        fn(_three_requests())
    assert str(raised.value) == message


def test_batch_names_the_model_of_an_output_that_is_no_numpy_array(bind: Callable[..., Any]) -> None:
    @batch
    def fn(**inputs: np.ndarray) -> Dict[str, Any]:
        return {"out": inputs["a"].tolist()}

    bind(fn)
    model = get_model_config(fn, None).model_name
    with pytest.raises(PyTritonValidationError, match=f"^Not all values returned by `{model}` model callable"):
        fn([Request({"a": np.array([[1]])})])


def test_batch_refuses_an_output_without_a_batch_axis() -> None:
    @batch
    def fn(**inputs: np.ndarray) -> Dict[str, Any]:
        return {"total": np.array(inputs["a"].sum())}

    # It was "IndexError: tuple index out of range".
    with pytest.raises(PyTritonValidationError, match=r"^Output `total` .* is a 0-dimensional array \(array\(21\)\)"):
        fn(_three_requests())


def test_batch_generator_splits_each_step() -> None:
    @batch
    def fn(**inputs: np.ndarray) -> Iterator[Dict[str, np.ndarray]]:
        for step in range(1, 3):
            yield {"out": inputs["a"] * step}

    steps = fn(_three_requests())
    assert inspect.isgenerator(steps)
    steps = list(steps)
    assert len(steps) == 2
    for step, results in enumerate(steps, start=1):
        assert [result["out"].tolist() for result in results] == [
            [[1 * step], [2 * step]],
            [[3 * step], [4 * step], [5 * step]],
            [[6 * step]],
        ]


# --- @sample -----------------------------------------------------------------------------------------------------


def test_sample_passes_first_request_as_kwargs() -> None:
    calls = []

    @sample
    def fn(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        calls.append(set(inputs))
        return {"out": inputs["a"] * 2 + inputs["b"]}

    results = fn([Request({"a": np.array([1, 2]), "b": np.array([10, 10])})])
    assert calls == [{"a", "b"}]
    assert len(results) == 1
    _assert_dicts_equal(results[0], {"out": np.array([12, 14])})


def test_sample_tuple_output_uses_model_config(bind: Callable[..., Any]) -> None:
    @sample
    def fn(**inputs: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        return inputs["a"] + 1, inputs["a"] - 1

    bind(fn, outputs=[("plus", np.int64, (-1,)), ("minus", np.int64, (-1,))], batching=False)
    (result,) = fn([Request({"a": np.array([5, 6])})])
    _assert_dicts_equal(result, {"plus": np.array([6, 7]), "minus": np.array([4, 5])})


def test_sample_errors() -> None:
    @sample
    def wrong_length(**inputs: np.ndarray) -> List[np.ndarray]:
        return [inputs["a"]]

    _inject(wrong_length, _TWO_OUTPUTS)
    with pytest.raises(PyTritonValidationError, match="Outputs length different than config outputs length"):
        wrong_length([Request({"a": np.zeros(1)})])

    @sample
    def unbound(**inputs: np.ndarray) -> List[np.ndarray]:
        return [inputs["a"]]

    with pytest.raises(PyTritonValidationError, match=NOT_BOUND):
        unbound([Request({"a": np.zeros(1)})])


def test_sample_generator_wraps_each_step() -> None:
    @sample
    def fn(**inputs: np.ndarray) -> Iterator[Dict[str, np.ndarray]]:
        yield {"out": inputs["a"]}
        yield {"out": inputs["a"] + 1}

    steps = list(fn([Request({"a": np.array([1])})]))
    assert [[result["out"].tolist() for result in step] for step in steps] == [[[1]], [[2]]]


# --- @group_by_keys ----------------------------------------------------------------------------------------------


def test_group_by_keys_groups_and_keeps_order() -> None:
    groups: List[List[List[str]]] = []

    @group_by_keys
    def fn(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        groups.append([sorted(request.keys()) for request in requests])
        return [{"n": np.array([len(requests)]), **request.data} for request in requests]

    requests = [
        Request({"a": np.array([1]), "b": np.array([1])}),
        Request({"b": np.array([2])}),
        Request({"b": np.array([3]), "a": np.array([3])}),
        Request({"a": np.array([4])}),
        Request({"b": np.array([5])}),
    ]
    results = fn(requests)
    assert groups == [[["a"]], [["a", "b"], ["a", "b"]], [["b"], ["b"]]]
    assert [result["n"].tolist() for result in results] == [[2], [2], [2], [1], [2]]
    for request, result in zip(requests, results):
        for name, value in request.items():
            np.testing.assert_array_equal(result[name], value)


def test_group_by_keys_with_batch_handles_mixed_requests() -> None:
    @group_by_keys
    @batch
    def fn(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        total = inputs["a"] + inputs.get("b", np.zeros_like(inputs["a"]))
        return {"total": total}

    results = fn([Request({"a": np.array([1])}), Request({"a": np.array([2]), "b": np.array([10])})])
    assert [result["total"].tolist() for result in results] == [[1], [12]]


# --- @group_by_values and ConstantPadder -------------------------------------------------------------------------


def test_group_by_values_groups_by_one_key() -> None:
    calls: List[Dict[str, np.ndarray]] = []

    @group_by_values("p")
    def fn(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        calls.append(inputs)
        assert len(np.unique(inputs["p"])) == 1
        return {"out": inputs["x"] * inputs["p"], "p": inputs["p"]}

    p = np.array([[2], [1], [2], [3], [1]])
    x = np.array([[1, 1], [2, 2], [3, 3], [4, 4], [5, 5]])
    result = fn(x=x, p=p)
    assert [call["p"][:, 0].tolist() for call in calls] == [[1, 1], [2, 2], [3]]
    assert [call["x"][:, 0].tolist() for call in calls] == [[2, 5], [1, 3], [4]]
    _assert_dicts_equal(result, {"out": x * p, "p": p})


def test_group_by_values_groups_by_several_keys_with_strings() -> None:
    calls: List[Tuple[List[Any], List[Any]]] = []

    @group_by_values("a", "s")
    def fn(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        calls.append((inputs["a"].ravel().tolist(), inputs["s"].tolist()))
        return {"a": inputs["a"], "s": inputs["s"]}

    a = np.array([[1], [1], [1], [2], [1]])
    s = np.array([["x", "x"], ["y", "x"], ["x", "x"], ["x", "x"], ["y", "x"]], dtype=object)
    result = fn(a=a, s=s)
    assert calls == [
        ([1, 1], [["x", "x"], ["x", "x"]]),
        ([1, 1], [["y", "x"], ["y", "x"]]),
        ([2], [["x", "x"]]),
    ]
    _assert_dicts_equal(result, {"a": a, "s": s})


def test_group_by_values_with_bytes_dtype_keys_and_special_kwargs() -> None:
    calls: List[Any] = []

    @group_by_values("s")
    def fn(**inputs: Any) -> Dict[str, np.ndarray]:
        calls.append((inputs["s"].ravel().tolist(), inputs["__triton_context__"]))
        return {"out": inputs["n"] * 2}

    s = np.array([[b"bb"], [b"a"], [b"bb"]])
    result = fn(s=s, n=np.array([1, 2, 3]), __triton_context__="ctx")
    assert calls == [([b"a"], "ctx"), ([b"bb", b"bb"], "ctx")]
    _assert_dicts_equal(result, {"out": np.array([2, 4, 6])})


def test_group_by_values_below_batch(bind: Callable[..., Any]) -> None:
    group_sizes = []

    @batch
    @group_by_values("p")
    def fn(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        group_sizes.append(len(inputs["p"]))
        return {"out": inputs["x"] + inputs["p"]}

    results = fn(
        [
            Request({"x": np.array([[1], [2]]), "p": np.array([[10], [20]])}),
            Request({"x": np.array([[3]]), "p": np.array([[10]])}),
        ]
    )
    assert sorted(group_sizes) == [1, 2]
    assert [result["out"].tolist() for result in results] == [[[11], [22]], [[13]]]


def test_group_by_values_must_be_below_batch() -> None:
    @group_by_values("a")
    @batch
    def fn(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        raise AssertionError("not called")

    with pytest.raises(
        PyTritonRuntimeError, match=r"^The @group_by_values decorator must be used after the @batch decorator\.$"
    ):
        fn([{"a": np.zeros((1,))}])


def test_group_by_values_with_constant_padder() -> None:
    @group_by_values("n", pad_fn=ConstantPadder(-1))
    def fn(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        n = int(inputs["n"][0, 0])
        rows = len(inputs["n"])
        return {
            "ints": np.full((rows, n), n),
            "bytes": np.array([[b"x" * n]] * rows),
            "text": np.array([["t" * n] * n] * rows),
        }

    result = fn(n=np.array([[1], [3], [2], [1]]))
    np.testing.assert_array_equal(result["ints"], [[1, -1, -1], [3, 3, 3], [2, 2, -1], [1, -1, -1]])
    assert result["bytes"].dtype == np.dtype("S3")
    assert result["bytes"].ravel().tolist() == [b"x", b"xxx", b"xx", b"x"]
    assert result["text"].dtype == np.dtype("U3")
    assert result["text"].tolist() == [["t", "", ""], ["ttt"] * 3, ["tt", "tt", ""], ["t", "", ""]]


def test_constant_padder_pads_each_name() -> None:
    padded = ConstantPadder(7)(
        [
            {"a": np.ones((1, 2), np.int32), "b": np.zeros((2, 1))},
            {"a": np.ones((1, 4), np.int32)},
            {"b": np.zeros((1, 3))},
        ]
    )
    assert isinstance(padded, list)
    assert [list(batch_dict) for batch_dict in padded] == [["a", "b"], ["a"], ["b"]]
    _assert_dicts_equal(
        padded[0],
        {"a": np.array([[1, 1, 7, 7]], np.int32), "b": np.array([[0.0, 7.0, 7.0], [0.0, 7.0, 7.0]])},
    )
    _assert_dicts_equal(padded[1], {"a": np.array([[1, 1, 1, 1]], np.int32)})
    _assert_dicts_equal(padded[2], {"b": np.array([[0.0, 0.0, 0.0]])})


def test_constant_padder_pads_objects_with_empty_bytes() -> None:
    padded = ConstantPadder(7)(
        [{"s": np.array([[b"x"]], dtype=object)}, {"s": np.array([[b"y", b"zz"]], dtype=object)}]
    )
    assert padded[0]["s"].dtype == object
    assert padded[0]["s"].tolist() == [[b"x", b""]]
    assert padded[1]["s"].tolist() == [[b"y", b"zz"]]


def test_constant_padder_leaves_out_none_values() -> None:
    """0.7 reads each name with `batch.get(name)` and skips None: a sub-batch may hold None for an output."""
    padded = ConstantPadder(7)([{"a": None, "b": np.ones((1, 1))}, {"a": np.ones((1, 2)), "b": np.ones((1, 3))}])
    assert [list(batch_dict) for batch_dict in padded] == [["b"], ["a", "b"]]
    _assert_dicts_equal(padded[0], {"b": np.array([[1.0, 7.0, 7.0]])})
    _assert_dicts_equal(padded[1], {"a": np.ones((1, 2)), "b": np.ones((1, 3))})


@pytest.mark.parametrize(
    "first, second",
    [
        (np.ones((1, 2), np.float32), np.ones((1, 2), np.float64)),
        (np.array([[b"x"]]), np.array([["x"]])),
        (np.ones((1, 1), np.int64), np.array([[b"x"]], dtype=object)),
    ],
)
def test_constant_padder_rejects_different_dtypes(first: np.ndarray, second: np.ndarray) -> None:
    with pytest.raises(
        PyTritonRuntimeError, match=r"^All input arrays for given input name must have the same dtype\.$"
    ):
        ConstantPadder()([{"a": first}, {"a": second}])


# --- @fill_optionals ---------------------------------------------------------------------------------------------

_FILL_INPUTS: Sequence[TensorDecl] = (("a", np.int64, (2,)), ("b", np.float32, (-1,)))


def test_fill_optionals_tiles_defaults_over_batch(bind: Callable[..., Any]) -> None:
    @fill_optionals(a=np.array([7, 8]), b=np.array([0.5], np.float32))
    def fn(requests: List[Request]) -> List[Request]:
        return requests

    bind(fn, inputs=_FILL_INPUTS)
    given_a = np.array([[1, 2], [3, 4]])
    results = fn([Request({"a": given_a}), Request({"b": np.ones((3, 4), np.float32)})])
    assert results[0]["a"] is given_a
    _assert_dicts_equal(results[0].data, {"a": given_a, "b": np.array([[0.5], [0.5]], np.float32)})
    _assert_dicts_equal(results[1].data, {"b": np.ones((3, 4), np.float32), "a": np.array([[7, 8], [7, 8], [7, 8]])})


def test_fill_optionals_without_batching(bind: Callable[..., Any]) -> None:
    default = np.array([7, 8])

    @fill_optionals(a=default)
    def fn(requests: List[Request]) -> List[Request]:
        return requests

    bind(fn, inputs=_FILL_INPUTS, batching=False)
    (result,) = fn([Request({"b": np.ones((3,), np.float32)})])
    assert result["a"] is default


def test_fill_optionals_on_callable_object(bind: Callable[..., Any]) -> None:
    class Model:
        @fill_optionals(b=np.array([1.5, 2.5], np.float32))
        def __call__(self, requests: List[Request]) -> List[Request]:
            return requests

    model = bind(Model(), inputs=_FILL_INPUTS)
    (result,) = model([Request({"a": np.zeros((2, 2), np.int64)})])
    np.testing.assert_array_equal(result["b"], [[1.5, 2.5], [1.5, 2.5]])


@pytest.mark.parametrize(
    "defaults, message",
    [
        ({"z": np.zeros(2), "y": np.zeros(1), "a": np.zeros(2, np.int64)}, r"^Could not found y, z inputs$"),
        ({"a": [1, 2], "b": 3}, r"^Could not use a=\[1, 2\], b=3 defaults as they are not NumPy arrays$"),
        (
            {"a": np.array([1, 2], np.int32), "b": np.array([1.0], np.float32)},
            r"^Could not use a: dtype=int32 expected_dtype=<class 'numpy\.int64'> defaults "
            r"as they have different than input signature dtypes$",
        ),
        (
            {"a": np.array([[1, 2]]), "b": np.array([1.0, 2.0, 3.0], np.float32)},
            r"^Could not use a: shape=\(1, 2\) expected_shape=\(2,\) defaults "
            r"as they have different than input signature shapes$",
        ),
        (
            {"b": np.array([[1.0]], np.float32)},
            r"^Could not use b: shape=\(1, 1\) expected_shape=\(-1,\) defaults",
        ),
    ],
)
def test_fill_optionals_rejects_bad_defaults(bind: Callable[..., Any], defaults: Dict[str, Any], message: str) -> None:
    @fill_optionals(**defaults)
    def fn(requests: List[Request]) -> List[Request]:
        raise AssertionError("not called")

    bind(fn, inputs=_FILL_INPUTS)
    with pytest.raises(PyTritonBadParameterError, match=message):
        fn([Request({"a": np.zeros((1, 2), np.int64)})])


def test_fill_optionals_needs_binding() -> None:
    @fill_optionals(a=np.array([1]))
    def fn(requests: List[Request]) -> List[Request]:
        return requests

    with pytest.raises(PyTritonValidationError, match=NOT_BOUND):
        fn([Request({"a": np.zeros((1, 1))})])


# --- @first_value ------------------------------------------------------------------------------------------------

_BATCHING = TritonModelConfig(model_name="batching", inputs=[], outputs=[])


def _first_value_fn(*keys: str, **options: Any) -> Any:
    @first_value(*keys, **options)
    def fn(**inputs: Any) -> Dict[str, Any]:
        return inputs

    return _inject(fn, _BATCHING)


@pytest.mark.parametrize(
    "keys, inputs, expected",
    [
        (["b"], {"a": np.array([1, 2]), "b": np.array([4, 4])}, {"a": np.array([1, 2]), "b": np.int64(4)}),
        (["b"], {"b": np.array([[[1.5]], [[1.5]]])}, {"b": np.float64(1.5)}),
        (["b"], {"b": np.array([[[1], [2]], [[1], [2]]])}, {"b": np.array([[1], [2]])}),
        (["b"], {"b": np.array(["v", "v"], dtype=object)}, {"b": "v"}),
        (["b"], {"b": np.array([[[b"v"]], [[b"v"]]], dtype=object)}, {"b": b"v"}),
        (["b", "missing"], {"b": np.array([[3], [3]])}, {"b": np.int64(3)}),
        (["a", "b"], {"a": np.array([2, 2]), "b": np.array([1, 1])}, {"a": np.int64(2), "b": np.int64(1)}),
    ],
)
def test_first_value_on_kwargs(keys: List[str], inputs: Dict[str, Any], expected: Dict[str, Any]) -> None:
    _assert_dicts_equal(_first_value_fn(*keys)(**inputs), expected)


def test_first_value_without_squeezing() -> None:
    result = _first_value_fn("b", squeeze_single_values=False)(b=np.array([[2.5], [2.5]]))
    _assert_dicts_equal(result, {"b": np.array([2.5])})


def test_first_value_strict_and_not_strict() -> None:
    with pytest.raises(
        PyTritonRuntimeError,
        match=r"^The values on the 'b' input are not equal\. To proceed, either disable strict mode in @first_value "
        r"wrapper or ensure that the values always are consistent\. The current values of 'b' are array",
    ):
        _first_value_fn("b")(b=np.array([[1], [2]]))
    with pytest.raises(PyTritonRuntimeError, match="The values on the 's' input are not equal"):
        _first_value_fn("s")(s=np.array([["x"], ["y"]], dtype=object))
    _assert_dicts_equal(_first_value_fn("b", strict=False)(b=np.array([[1], [2]])), {"b": np.int64(1)})


def test_first_value_on_requests() -> None:
    @first_value("b")
    def fn(requests: List[Request], extra: str) -> Tuple[List[Request], str]:
        return requests, extra

    _inject(fn, _BATCHING)
    requests, extra = fn([Request({"b": np.array([[3], [3]])}), Request({"a": np.ones(1), "b": np.array([[4]])})], "e")
    assert extra == "e"
    assert requests[0]["b"] == 3 and isinstance(requests[0]["b"], np.int64)
    assert requests[1]["b"] == 4
    np.testing.assert_array_equal(requests[1]["a"], [1.0])


def test_first_value_below_batch(bind: Callable[..., Any]) -> None:
    seen = []

    @batch
    @first_value("t")
    def fn(**inputs: Any) -> Dict[str, np.ndarray]:
        seen.append(inputs["t"])
        return {"out": inputs["a"] * inputs["t"]}

    bind(fn, inputs=[("a", np.int64, (1,)), ("t", np.int64, (1,))])
    results = fn(
        [Request({"a": np.array([[1]]), "t": np.array([[3]])}), Request({"a": np.array([[2]]), "t": np.array([[3]])})]
    )
    assert seen == [3]
    assert [result["out"].tolist() for result in results] == [[[3]], [[6]]]


def test_first_value_rejects_special_keys() -> None:
    with pytest.raises(
        PyTritonBadParameterError,
        match=r"^The keys __triton_context__ are not allowed as keys for @first_value wrapper\. "
        r"The set of not allowed keys are __triton_context__$",
    ):
        first_value("a", "__triton_context__")


def test_first_value_needs_batching_model(bind: Callable[..., Any]) -> None:
    @first_value("a")
    def fn(**inputs: Any) -> Dict[str, Any]:
        raise AssertionError("not called")

    bind(fn, batching=False)
    with pytest.raises(
        PyTritonRuntimeError, match=r"^The @first_value decorator can only be used with models that support batching\.$"
    ):
        fn(a=np.array([1, 1]))

    @first_value("a")
    def unbound(**inputs: Any) -> Dict[str, Any]:
        raise AssertionError("not called")

    with pytest.raises(PyTritonValidationError, match=NOT_BOUND):
        unbound(a=np.array([1, 1]))


# --- @pad_batch --------------------------------------------------------------------------------------------------


def _pad_batch_fn(config: TritonModelConfig) -> Any:
    @pad_batch
    def fn(**inputs: Any) -> Dict[str, Any]:
        return inputs

    return _inject(fn, config)


@pytest.mark.parametrize(
    "preferred, rows, expected_rows",
    [
        ([6, 2, 4], 3, 4),
        ([6, 2, 4], 4, 4),
        ([6, 2, 4], 7, 8),
        ([6, 2, 4], 5, 6),
        ([4, 2], 1, 2),
        (None, 3, 8),
        ([2], 1, 2),
    ],
)
def test_pad_batch_repeats_last_row(preferred: Optional[List[int]], rows: int, expected_rows: int) -> None:
    fn = _pad_batch_fn(
        TritonModelConfig(model_name="pad", max_batch_size=8, batcher=DynamicBatcher(preferred_batch_size=preferred))
    )
    a = np.arange(rows).reshape(rows, 1)
    b = np.arange(2 * rows).reshape(rows, 2)
    result = fn(a=a, b=b, __triton_context__="untouched")
    assert result["__triton_context__"] == "untouched"
    assert result["a"].shape == (expected_rows, 1) and result["b"].shape == (expected_rows, 2)
    np.testing.assert_array_equal(result["a"][:rows], a)
    np.testing.assert_array_equal(result["a"][rows:], np.repeat(a[-1:], expected_rows - rows, axis=0))
    np.testing.assert_array_equal(result["b"][rows:], np.repeat(b[-1:], expected_rows - rows, axis=0))


def test_pad_batch_without_batcher_uses_max_batch_size(bind: Callable[..., Any]) -> None:
    @pad_batch
    def fn(**inputs: Any) -> Dict[str, Any]:
        return inputs

    bind(fn, max_batch_size=5)
    assert fn(a=np.array([1, 2]))["a"].tolist() == [1, 2, 2, 2, 2]


def test_pad_batch_over_max_batch_size_fails() -> None:
    fn = _pad_batch_fn(TritonModelConfig(model_name="pad", max_batch_size=2))
    with pytest.raises(IndexError):
        fn(a=np.zeros((3, 1)))


def test_pad_batch_of_an_empty_batch_raises_nvidias_value_error() -> None:
    fn = _pad_batch_fn(TritonModelConfig(model_name="pad", max_batch_size=8))
    with pytest.raises(ValueError, match=r"^negative dimensions are not allowed$"):
        fn(a=np.zeros((0, 1)))


def test_pad_batch_below_batch_needs_outputs_of_request_size() -> None:
    """As in NVIDIA's PyTriton: @batch checks output batch sizes, so padded outputs must be cut back."""

    @batch
    @pad_batch
    def padded_outputs(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
        assert inputs["a"].shape == (4, 1)
        return {"out": inputs["a"]}

    _inject(padded_outputs, TritonModelConfig(model_name="pad", max_batch_size=4))
    with pytest.raises(ValueError, match="Expected batch size: 3"):
        padded_outputs([Request({"a": np.ones((3, 1))})])


# --- @triton_context ---------------------------------------------------------------------------------------------


def test_triton_context_is_passed_as_kwarg(bind: Callable[..., Any]) -> None:
    @triton_context
    def fn(requests: Any, **kwargs: Any) -> Any:
        return kwargs

    bind(fn)
    kwargs = fn([])
    assert list(kwargs) == [TRITON_CONTEXT_FIELD_NAME]
    assert isinstance(kwargs["triton_context"], TritonContext)
    assert kwargs["triton_context"].model_configs[fn].model_name.startswith("model_")


def test_triton_context_on_method_reads_instance(bind: Callable[..., Any]) -> None:
    class Model:
        @triton_context
        def infer(self, requests: Any, **kwargs: Any) -> Any:
            return self, kwargs[TRITON_CONTEXT_FIELD_NAME]

    model = Model()
    bind(model.infer)
    obj, context = model.infer([])
    assert obj is model
    assert context is model.__triton_context__
    assert context.model_configs[model.infer].max_batch_size == 4


def test_triton_context_needs_binding() -> None:
    @triton_context
    def fn(**kwargs: Any) -> None:
        raise AssertionError("not called")

    with pytest.raises(PyTritonValidationError, match=f"^{NOT_BOUND}$"):
        fn()


# --- end to end: decorated callables served over HTTP ------------------------------------------------------------


@batch
def _doubled(**inputs: np.ndarray) -> List[np.ndarray]:
    return [inputs["x"] * 2]


@sample
def _sampled(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
    return {"y": inputs["x"][::-1].copy()}


@fill_optionals(scale=np.array([2], dtype=np.int64))
@batch
@group_by_values("scale")
@first_value("scale")
def _scaled(**inputs: Any) -> Dict[str, np.ndarray]:
    assert isinstance(inputs["scale"], np.int64)
    return {"y": inputs["x"] * inputs["scale"]}


@triton_context
@batch
def _with_context(triton_context: TritonContext, **inputs: np.ndarray) -> Dict[str, np.ndarray]:
    config = triton_context.model_configs[_with_context]
    rows = len(inputs["x"])
    return {"y": np.full((rows, 1), config.max_batch_size, dtype=np.int64)}


@batch
def _wrong_batch_size(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
    return {"y": inputs["x"][:1]}


class _Offset:
    def __init__(self, offset: int) -> None:
        self.offset = offset

    @batch
    def infer(self, **inputs: np.ndarray) -> Tuple[np.ndarray]:
        return (inputs["x"] + self.offset,)


class _Negate:
    @batch
    def __call__(self, **inputs: np.ndarray) -> List[np.ndarray]:
        return [-inputs["x"]]


# `async def` callables under the decorators: awaited on the server's loop (NVIDIA's decorators take sync ones only).
@batch
async def _async_doubled(**inputs: np.ndarray) -> List[np.ndarray]:
    await asyncio.sleep(0)
    return [inputs["x"] * 2]


@sample
async def _async_sampled(**inputs: np.ndarray) -> Dict[str, np.ndarray]:
    await asyncio.sleep(0)
    return {"y": inputs["x"][::-1].copy()}


@fill_optionals(scale=np.array([2], dtype=np.int64))
@group_by_keys
@batch
@group_by_values("scale")
@first_value("scale")
async def _async_scaled(**inputs: Any) -> Dict[str, np.ndarray]:
    await asyncio.sleep(0)
    return {"y": inputs["x"] * inputs["scale"]}


_X: List[TensorDecl] = [("x", np.int64, (-1,))]
_Y: List[TensorDecl] = [("y", np.int64, (-1,))]


def _bind_models(triton: Triton) -> None:
    triton.bind("doubled", _doubled, _tensors(_X), _tensors(_Y), config=ModelConfig(max_batch_size=8))
    triton.bind("sampled", _sampled, _tensors(_X), _tensors(_Y), config=ModelConfig(batching=False))
    triton.bind(
        "scaled",
        _scaled,
        [
            Tensor(name="x", dtype=np.int64, shape=(-1,)),
            Tensor(name="scale", dtype=np.int64, shape=(1,), optional=True),
        ],
        _tensors(_Y),
        config=ModelConfig(max_batch_size=8),
    )
    triton.bind(
        "context",
        _with_context,
        _tensors(_X),
        [Tensor(name="y", dtype=np.int64, shape=(1,))],
        config=ModelConfig(max_batch_size=6),
    )
    triton.bind("wrong", _wrong_batch_size, _tensors(_X), _tensors(_Y), config=ModelConfig(max_batch_size=8))
    triton.bind("offset", _Offset(100).infer, _tensors(_X), _tensors(_Y), config=ModelConfig(max_batch_size=8))
    triton.bind("negate", _Negate(), _tensors(_X), _tensors(_Y), config=ModelConfig(max_batch_size=8))
    triton.bind("async_doubled", _async_doubled, _tensors(_X), _tensors(_Y), config=ModelConfig(max_batch_size=8))
    triton.bind("async_sampled", _async_sampled, _tensors(_X), _tensors(_Y), config=ModelConfig(batching=False))
    triton.bind(
        "async_scaled",
        _async_scaled,
        [
            Tensor(name="x", dtype=np.int64, shape=(-1,)),
            Tensor(name="scale", dtype=np.int64, shape=(1,), optional=True),
        ],
        _tensors(_Y),
        config=ModelConfig(max_batch_size=8),
    )


@pytest.fixture(scope="module")
def client() -> Iterator[httpclient.InferenceServerClient]:
    with running_triton(_bind_models, allow_grpc=False, allow_metrics=False) as triton:
        with httpclient.InferenceServerClient(http_url(triton)) as http_client:
            yield http_client


def _infer(client: httpclient.InferenceServerClient, model: str, **arrays: np.ndarray) -> np.ndarray:
    inputs = []
    for name, array in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = client.infer(model, inputs)
    output = result.as_numpy("y")
    assert output is not None
    return np.asarray(output)


def test_e2e_batch_with_list_output(client: httpclient.InferenceServerClient) -> None:
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
    np.testing.assert_array_equal(_infer(client, "doubled", x=x), x * 2)


def test_e2e_batch_splits_concurrent_requests(client: httpclient.InferenceServerClient) -> None:
    arrays = [np.full((rows, 2), rows, dtype=np.int64) for rows in (1, 3, 2, 1)]
    pending = []
    for x in arrays:
        tensor = httpclient.InferInput("x", list(x.shape), "INT64")
        tensor.set_data_from_numpy(x)
        pending.append(client.async_infer("doubled", [tensor]))
    for x, request in zip(arrays, pending):
        np.testing.assert_array_equal(request.get_result().as_numpy("y"), x * 2)


def test_e2e_sample_without_batching(client: httpclient.InferenceServerClient) -> None:
    np.testing.assert_array_equal(_infer(client, "sampled", x=np.array([1, 2, 3], np.int64)), [3, 2, 1])


def test_e2e_fill_optionals_group_by_values_first_value(client: httpclient.InferenceServerClient) -> None:
    x = np.array([[1, 1], [2, 2], [3, 3]], dtype=np.int64)
    np.testing.assert_array_equal(_infer(client, "scaled", x=x), x * 2)
    scale = np.array([[3], [10], [3]], dtype=np.int64)
    np.testing.assert_array_equal(_infer(client, "scaled", x=x, scale=scale), x * scale)


def test_e2e_triton_context(client: httpclient.InferenceServerClient) -> None:
    np.testing.assert_array_equal(_infer(client, "context", x=np.zeros((2, 1), np.int64)), [[6], [6]])


def test_e2e_decorated_bound_method(client: httpclient.InferenceServerClient) -> None:
    x = np.array([[1, 2]], dtype=np.int64)
    np.testing.assert_array_equal(_infer(client, "offset", x=x), x + 100)


def test_e2e_decorated_callable_object(client: httpclient.InferenceServerClient) -> None:
    x = np.array([[1, -2], [3, 0]], dtype=np.int64)
    np.testing.assert_array_equal(_infer(client, "negate", x=x), -x)


def test_e2e_decorator_error_reaches_client(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="Received output tensors with different batch sizes"):
        _infer(client, "wrong", x=np.zeros((3, 1), np.int64))


def test_e2e_async_callables_under_the_decorators(client: httpclient.InferenceServerClient) -> None:
    x = np.array([[1, 1], [2, 2], [3, 3]], dtype=np.int64)
    np.testing.assert_array_equal(_infer(client, "async_doubled", x=x), x * 2)
    np.testing.assert_array_equal(_infer(client, "async_sampled", x=np.array([1, 2, 3], np.int64)), [3, 2, 1])
    np.testing.assert_array_equal(_infer(client, "async_scaled", x=x), x * 2)
    scale = np.array([[3], [10], [3]], dtype=np.int64)
    np.testing.assert_array_equal(_infer(client, "async_scaled", x=x, scale=scale), x * scale)


def test_group_by_keys_awaits_each_group_of_an_async_callable_in_request_order() -> None:
    @group_by_keys
    async def infer(requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, np.ndarray]]:
        await asyncio.sleep(0)
        return [{"y": request["x"] + (100 if "z" in request else 0)} for request in requests]

    requests = [{"x": np.array([1])}, {"x": np.array([2]), "z": np.array([0])}, {"x": np.array([3])}]
    results = asyncio.run(infer(requests))
    assert [result["y"].tolist() for result in results] == [[1], [102], [3]]


def test_group_by_keys_closes_the_groups_left_when_one_raises() -> None:
    started: List[int] = []

    @group_by_keys
    async def infer(requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, np.ndarray]]:
        started.append(len(requests))
        raise ValueError("no")

    requests = [{"x": np.array([1])}, {"x": np.array([2]), "z": np.array([0])}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" from the group left unawaited
        with pytest.raises(ValueError, match=r"^no$"):
            asyncio.run(infer(requests))
        gc.collect()
    assert started == [1]


def test_batch_async_generator_splits_each_step_and_closes_the_callables_generator() -> None:
    closed: List[bool] = []

    @batch
    async def infer(**inputs: np.ndarray) -> AsyncIterator[Dict[str, np.ndarray]]:
        try:
            for step in range(3):
                yield {"y": inputs["x"] + step}
        finally:
            closed.append(True)

    async def first_two() -> List[List[List[int]]]:
        steps = infer([{"x": np.array([[1]])}, {"x": np.array([[2], [3]])}])
        taken = []
        async for step in steps:
            taken.append([request["y"].ravel().tolist() for request in step])
            if len(taken) == 2:
                break
        await steps.aclose()  # as the server closes a stream whose requests were all cancelled
        return taken

    assert asyncio.run(first_two()) == [[[1], [2, 3]], [[2], [3, 4]]]
    assert closed == [True]
