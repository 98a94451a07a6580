"""Model input and output definition."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Tensor:
    """Model input or output: shape (without the batch axis), dtype, optional name.

    Beyond PyTriton 0.7's fields, as Triton's model configuration has them: an input's `format`
    ("FORMAT_NCHW" or "FORMAT_NHWC", for an image of 3 dims), and an output's classification labels, given
    as a list (`labels`) or as a text file of one label a line (`label_filename`, read when the model is
    bound). A client that asks for an output's top classes (`class_count`) gets "score:index:label".

    Examples:
        Tensor(dtype=np.float32, shape=(-1,))
        Tensor(name="text", dtype=bytes, shape=(1,))
        Tensor(name="image", dtype=np.float32, shape=(3, 224, 224), format="FORMAT_NCHW")
        Tensor(name="scores", dtype=np.float32, shape=(1000,), label_filename="labels.txt")
    """

    shape: tuple  # type: ignore[type-arg]
    dtype: Any
    name: Optional[str] = None
    optional: Optional[bool] = False
    format: Optional[str] = None
    labels: Optional[Sequence[str]] = None
    label_filename: Optional[str] = None

    def __post_init__(self) -> None:
        """Normalize an np.dtype instance to its scalar type, as PyTriton does."""
        if isinstance(self.dtype, np.dtype):
            object.__setattr__(self, "dtype", self.dtype.type)
