"""The Triton context a binding attaches to its callable: the model configs that decorators read.

It lives apart from `pytriton.decorators` (which re-exports it, as NVIDIA's PyTriton does) so that
serving a model does not import wrapt and the decorators.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import weakref
from typing import Any, Callable, Dict, Iterator, List, MutableMapping, Optional

from pytriton.model_config.triton_model_config import TritonModelConfig

LOGGER = logging.getLogger(__name__)


class ModelConfigDict(MutableMapping):  # type: ignore[type-arg]
    """Model configs of inference callables, keyed by the callable.

    The callables themselves are held weakly where they can be: every callable bound to a server carries the
    server's context, so a strong hold would let one that lives on (a module-level function) keep all the
    others, and what they hold, alive after the server stopped.
    """

    def __init__(self) -> None:
        """Create an empty mapping."""
        self._data: Dict[str, TritonModelConfig] = {}
        self._keys: List[Callable[[], Optional[Callable[..., Any]]]] = []

    def __getitem__(self, infer_callable: Callable[..., Any]) -> TritonModelConfig:
        """Get the model config of an inference callable."""
        return self._data[self._get_model_config_key(infer_callable)]

    def __setitem__(self, infer_callable: Callable[..., Any], item: TritonModelConfig) -> None:
        """Set the model config of an inference callable."""
        self._keys.append(_reference(infer_callable))
        self._data[self._get_model_config_key(infer_callable)] = item

    def __delitem__(self, infer_callable: Callable[..., Any]) -> None:
        """Delete the model config of an inference callable."""
        del self._data[self._get_model_config_key(infer_callable)]

    def __len__(self) -> int:
        """Number of model configs."""
        return len(self._data)

    def __iter__(self) -> Iterator[Callable[..., Any]]:
        """Iterate over the inference callables (those still alive)."""
        return iter([fn for fn in (reference() for reference in self._keys) if fn is not None])

    @staticmethod
    def _get_model_config_key(infer_callable: Callable[..., Any]) -> str:
        """The key of a callable: a bound `__call__` is keyed by its object."""
        key: Any = infer_callable
        if inspect.ismethod(key) and key.__name__ == "__call__":
            key = key.__self__
        return str(key)


def _reference(infer_callable: Callable[..., Any]) -> Callable[[], Optional[Callable[..., Any]]]:
    """A weak reference to a callable (to a bound method: to its object and function); strong if it takes none."""
    try:
        if inspect.ismethod(infer_callable):
            return weakref.WeakMethod(infer_callable)
        return weakref.ref(infer_callable)
    except TypeError:
        return lambda: infer_callable


@dataclasses.dataclass
class TritonContext:
    """Triton context definition class."""

    model_configs: ModelConfigDict = dataclasses.field(default_factory=ModelConfigDict)

    def __reduce__(self) -> Any:
        """Pickle as an empty context: the server's configs stay with it (they hold its callables weakly).

        A callable bound to one model carries the server's context; bound again with `ProcessInstances` (or
        sent to a RemoteTriton) it is pickled with it, and each process attaches a context of its own.
        """
        return (TritonContext, ())


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
