"""Model input and output definition."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class Tensor:
    """Model input or output: shape (without the batch axis), dtype, optional name.

    Examples:
        Tensor(dtype=np.float32, shape=(-1,))
        Tensor(name="text", dtype=bytes, shape=(1,))
    """

    shape: tuple  # type: ignore[type-arg]
    dtype: Any
    name: Optional[str] = None
    optional: Optional[bool] = False

    def __post_init__(self) -> None:
        """Normalize an np.dtype instance to its scalar type, as PyTriton does."""
        if isinstance(self.dtype, np.dtype):
            object.__setattr__(self, "dtype", self.dtype.type)
