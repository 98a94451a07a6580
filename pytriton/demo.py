"""The demo model served by `pytriton demo`: add_sub, two FP32 vectors in, their sum and difference out."""

from __future__ import annotations

from typing import Dict

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def add_sub(INPUT0: np.ndarray, INPUT1: np.ndarray) -> Dict[str, np.ndarray]:
    """Element-wise sum and difference of a batch of vectors."""
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


def bind(triton: Triton) -> None:
    """Bind the demo model `add_sub`."""
    triton.bind(
        model_name="add_sub",
        infer_func=add_sub,
        inputs=[
            Tensor(name="INPUT0", dtype=np.float32, shape=(-1,)),
            Tensor(name="INPUT1", dtype=np.float32, shape=(-1,)),
        ],
        outputs=[
            Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,)),
            Tensor(name="OUTPUT1", dtype=np.float32, shape=(-1,)),
        ],
        config=ModelConfig(max_batch_size=64),
    )
