"""Starting an instance process: what it runs (the callable, pickled in the server), its environment, its handshake.

The process is a fresh interpreter (`python -m pytriton.core.process_instances.host`), never a fork of the server:
a fork would inherit the server's threads mid-flight and any CUDA context (which CUDA forbids using
across fork), and a spawn through multiprocessing would run the user's script again in the child.
The callable travels pickled by cloudpickle, which sends functions of `__main__` and closures by value
(with the model objects they use) and importable ones by reference; a `factory` is called in the
child instead, for models that must load their weights there (one GPU per instance).
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import os
import subprocess
import sys
from typing import Any, Callable, List, Mapping, Optional, Tuple

import cloudpickle

from pytriton.core.process_instances.protocol import INIT, START_FAILED, Init
from pytriton.ipc.channel import LoopChannel
from pytriton.ipc.spawn import HelperDidNotStart, kill_group, start_helper, stop_process

INSTANCE_INDEX_VARIABLE = "PYTRITON_INSTANCE_INDEX"


@dataclasses.dataclass(frozen=True)
class ProcessPlan:
    """How to start each process instance of one model."""

    model_name: str
    payloads: Tuple[bytes, ...]  # per instance: the pickled callable, or factory
    factory: bool
    count: int
    environments: Tuple[Mapping[str, str], ...]  # one per instance
    arena_budget: int
    start_timeout_s: float
    model_config: Any = None  # TritonModelConfig, for the decorators that read it
    # Called in the process with the loaded callable and `model_config` (importable: it travels by reference).
    prepare: Optional[Callable[[Any, Any], None]] = None
    model_version: str = ""  # the version its custom metrics are labelled with


class StartError(RuntimeError):
    """An instance process did not come up; the message holds its traceback or exit status."""


def dump_callable(obj: Any) -> bytes:
    """Pickle a callable or factory for an instance process (raises what pickling raised)."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=5).dump(obj)
    return buffer.getvalue()


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, plus wrapt's decorator wrappers (@batch and friends), which pickle by their proxy otherwise."""

    def reducer_override(self, obj: Any) -> Any:
        """Reduce a wrapt FunctionWrapper to the wrapper and the function it wraps; a bound one to getattr."""
        kind = type(obj)
        if kind.__module__.startswith(("wrapt", "_wrappers")):
            module, name = getattr(obj, "__module__", ""), getattr(obj, "__qualname__", "")
            importable = module in sys.modules and module != "__main__"  # __main__ is another module over there
            if importable and name and _attribute(sys.modules[module], name) is obj:
                return _attribute, (importlib.import_module(module), name)  # importable: by reference
            if kind.__name__ == "FunctionWrapper":
                return _rewrap, (obj.__wrapped__, obj._self_wrapper, obj._self_enabled)
            if kind.__name__ == "BoundFunctionWrapper" and obj._self_instance is not None:
                return getattr, (obj._self_instance, obj.__name__)
        return super().reducer_override(obj)


def _attribute(owner: Any, dotted: str) -> Any:
    """`owner.a.b` for "a.b" (None when missing)."""
    for part in dotted.split("."):
        owner = getattr(owner, part, None)
    return owner


def _rewrap(wrapped: Any, wrapper: Any, enabled: Any) -> Any:
    """Apply a wrapt wrapper again, in the instance process."""
    import wrapt

    return wrapt.FunctionWrapper(wrapped, wrapper, enabled)


# A started instance process: the process, its channel, and its READY message (tag, callable kind, pid).
Started = Tuple["subprocess.Popen[bytes]", LoopChannel, Tuple[int, str, int]]


async def spawn(plan: ProcessPlan, index: int) -> Started:
    """Start instance `index` and wait until its callable is loaded (StartError if it is not)."""
    environment = {**os.environ, **plan.environments[index], INSTANCE_INDEX_VARIABLE: str(index)}
    init = Init(
        plan.model_name,
        index,
        plan.factory,
        list(sys.path),
        plan.model_config,
        plan.arena_budget,
        plan.prepare,
        plan.model_version,
    )
    try:
        process, channel, message = await start_helper(
            "pytriton.core.process_instances.host",
            ((INIT, init), [plan.payloads[index]]),
            plan.start_timeout_s,
            environment,
            own_group=True,  # what the user's code forks goes with it at the stop (kill_group)
        )
    except HelperDidNotStart as error:
        raise StartError(str(error)) from None
    head = message.head
    if head[0] == START_FAILED:
        channel.close()
        await stop_process(process, kill=False)
        kill_group(process)
        raise StartError(f"loading its callable failed:\n{head[1].rstrip()}")
    return process, channel, head


def environments(env: Any, count: int) -> Tuple[Mapping[str, str], ...]:
    """One environment per instance from None, a mapping (the same for all), a sequence or a function of the index."""
    if env is None:
        found: List[Mapping[str, str]] = [{} for _ in range(count)]
    elif isinstance(env, Mapping):
        found = [dict(env) for _ in range(count)]
    elif callable(env):
        found = [dict(env(index)) for index in range(count)]
    else:
        found = [dict(item) for item in env]
        if len(found) != count:
            raise ValueError(f"env lists {len(found)} environments for {count} instance{'' if count == 1 else 's'}")
    for environment in found:
        for key, value in environment.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"environment variables are strings, got {key!r}={value!r}")
            # What the OS cannot take would otherwise fail the server's start with only "embedded null byte".
            if not key or "=" in key or "\0" in key or "\0" in value:
                raise ValueError(f"{key!r}={value!r} is not an environment variable (a name without '=', no NUL)")
    return tuple(found)
