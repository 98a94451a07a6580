"""Binding checks (pytriton/models.py): a Tensor the engine cannot serve is refused with a message that says
what is accepted (nvidia-pytriton 0.7 refuses these too, with a TypeError or a model load error); the forms it
serves are accepted, and dtype names such as 'float32' and 'bfloat16' as well."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest

from pytriton.exceptions import PyTritonInvalidOperationError, PyTritonModelConfigError, PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

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
