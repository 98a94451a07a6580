"""Inference callable decorators and the Triton context they read, as in NVIDIA's PyTriton."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Dict, Iterator, List, MutableMapping

from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config.triton_model_config import TritonModelConfig


class ModelConfigDict(MutableMapping):  # type: ignore[type-arg]
    """Model configs of inference callables, keyed by the callable."""

    def __init__(self) -> None:
        """Create an empty mapping."""
        self._data: Dict[str, TritonModelConfig] = {}
        self._keys: List[Callable[..., Any]] = []

    def __getitem__(self, infer_callable: Callable[..., Any]) -> TritonModelConfig:
        """Get the model config of an inference callable."""
        return self._data[self._get_model_config_key(infer_callable)]

    def __setitem__(self, infer_callable: Callable[..., Any], item: TritonModelConfig) -> None:
        """Set the model config of an inference callable."""
        self._keys.append(infer_callable)
        self._data[self._get_model_config_key(infer_callable)] = item

    def __delitem__(self, infer_callable: Callable[..., Any]) -> None:
        """Delete the model config of an inference callable."""
        del self._data[self._get_model_config_key(infer_callable)]

    def __len__(self) -> int:
        """Number of model configs."""
        return len(self._data)

    def __iter__(self) -> Iterator[Callable[..., Any]]:
        """Iterate over inference callables."""
        return iter(self._keys)

    @staticmethod
    def _get_model_config_key(infer_callable: Callable[..., Any]) -> str:
        """The key of a callable: a bound `__call__` is keyed by its object."""
        key: Any = infer_callable
        if inspect.ismethod(key) and key.__name__ == "__call__":
            key = key.__self__
        return str(key)


@dataclasses.dataclass
class TritonContext:
    """Triton context definition class."""

    model_configs: ModelConfigDict = dataclasses.field(default_factory=ModelConfigDict)


def get_triton_context(wrapped: Any, instance: Any) -> TritonContext:
    """Retrieve the Triton context that binding attached to a callable."""
    caller = instance or wrapped
    if not hasattr(caller, "__triton_context__"):
        raise PyTritonValidationError("Wrapped function or object must bound with triton to get  __triton_context__")
    return caller.__triton_context__  # type: ignore[no-any-return]


def get_model_config(wrapped: Any, instance: Any) -> TritonModelConfig:
    """Retrieve the TritonModelConfig of a bound callable."""
    return get_triton_context(wrapped, instance).model_configs[wrapped]
