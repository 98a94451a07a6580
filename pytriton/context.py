"""The Triton context a binding attaches to its callable: the model configs that decorators read.

It lives apart from `pytriton.decorators` (which re-exports it, as NVIDIA's PyTriton does) so that
serving a model does not import wrapt and the decorators.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from typing import Any, Callable, Dict, Iterator, List, MutableMapping

from pytriton.model_config.triton_model_config import TritonModelConfig

LOGGER = logging.getLogger(__name__)


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


def attach_model_config(fn: Callable[..., Any], model_config: TritonModelConfig) -> None:
    """Attach a context holding `fn`'s model config to `fn` (in an instance process, for its decorators)."""
    context = TritonContext()
    context.model_configs[fn] = model_config
    attach_context(fn, context)


def attach_context(fn: Callable[..., Any], context: TritonContext) -> None:
    """Let decorators find the model config, as PyTriton does: on the callable or its bound object."""
    target: Any = getattr(fn, "__self__", fn)
    try:
        target.__triton_context__ = context
    except (AttributeError, TypeError):
        LOGGER.debug("cannot attach __triton_context__ to %r; context decorators will not work on it", fn)
