"""Model instances in processes of their own, opt-in per model: `triton.bind(..., infer_func=ProcessInstances(...))`.

By default (a callable or a list of callables) each instance is a thread of the server's process, as in
NVIDIA's PyTriton: instances share one GIL, and a crash in one takes the server down. A model bound with
`ProcessInstances` runs each instance in its own Python process: pure-Python work runs on as many cores
as there are instances, and a process that dies fails only the batch it held and is started again.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

from pytriton.context import attach_model_config
from pytriton.core.process_instances.spawn import ProcessPlan, dump_callable, environments
from pytriton.exceptions import PyTritonBadParameterError

# Shared memory each instance may use per direction (inputs, outputs); a larger batch travels over its socket.
DEFAULT_SHM_BUDGET_BYTES = 256 * 1024 * 1024
DEFAULT_START_TIMEOUT_S = 120.0

Environment = Union[None, Mapping[str, str], Sequence[Mapping[str, str]], Callable[[int], Mapping[str, str]]]


class ProcessInstances:
    """Run a model's instances in processes of their own.

    Examples:
        # a module-level function, a class instance's method, or a closure over a model loaded in __main__:
        triton.bind(model_name="m", infer_func=ProcessInstances(infer_fn, count=2), inputs=..., outputs=...)

        # one instance per GPU, each loading its weights in its own process:
        triton.bind(
            model_name="resnet",
            infer_func=ProcessInstances(
                factory=load_model, count=2, env=lambda index: {"CUDA_VISIBLE_DEVICES": str(index)}
            ),
            inputs=...,
            outputs=...,
        )

    Args:
        infer_func: the inference callable, the same in every instance, or a list of them (one per instance).
            It is pickled in the server (cloudpickle: functions of `__main__` and closures are sent by value,
            with the objects they use; importable ones by reference) and unpickled in each process.
        factory: instead of `infer_func`, a callable with no arguments that each process calls once to
            build its inference callable: for models that must load their weights in the process (CUDA
            cannot use a context made before a fork, nor share one between processes).
        count: the number of instances (default: the length of the `infer_func` list, else 1).
        env: environment variables for the processes: one mapping for all, a list with one per
            instance, or a function of the instance index (0-based; PYTRITON_INSTANCE_INDEX also holds it).
        shm_budget_bytes: shared memory each instance may use for a batch's inputs, and as much for its
            outputs; larger batches, or any when shared memory cannot be had, travel over the socket.
        start_timeout_s: how long a process may take to load its callable.
    """

    def __init__(
        self,
        infer_func: Union[Callable[..., Any], Sequence[Callable[..., Any]], None] = None,
        *,
        factory: Optional[Callable[[], Callable[..., Any]]] = None,
        count: Optional[int] = None,
        env: Environment = None,
        shm_budget_bytes: int = DEFAULT_SHM_BUDGET_BYTES,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> None:
        """Describe the instances; nothing starts until the model is bound."""
        if (infer_func is None) == (factory is None):
            raise PyTritonBadParameterError("ProcessInstances takes an infer_func or a factory (one of them)")
        targets = list(infer_func) if isinstance(infer_func, (list, tuple)) else [infer_func or factory]
        if count is None:
            count = len(targets)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise PyTritonBadParameterError(f"ProcessInstances count must be a positive integer, got {count!r}")
        if len(targets) == 1:
            targets = targets * count
        elif len(targets) != count:
            instances = f"{count} instance{'' if count == 1 else 's'}"
            raise PyTritonBadParameterError(f"ProcessInstances got {len(targets)} callables for {instances}")
        for target in targets:
            if not callable(target):
                raise PyTritonBadParameterError(f"ProcessInstances: {target!r} is not callable")
        if not isinstance(shm_budget_bytes, int) or isinstance(shm_budget_bytes, bool) or shm_budget_bytes < 0:
            raise PyTritonBadParameterError(
                f"ProcessInstances shm_budget_bytes must be an integer >= 0, got {shm_budget_bytes!r}"
            )
        # `not > 0` also refuses NaN, which would pass `<= 0` and fail the server's start instead.
        seconds = isinstance(start_timeout_s, (int, float)) and not isinstance(start_timeout_s, bool)
        if not seconds or not start_timeout_s > 0:
            raise PyTritonBadParameterError(
                f"ProcessInstances start_timeout_s must be a number of seconds > 0, got {start_timeout_s!r}"
            )
        try:
            self._environments = environments(env, count)
        except (TypeError, ValueError) as error:
            raise PyTritonBadParameterError(f"ProcessInstances env: {error}") from None
        self.targets = targets
        self.factory = factory is not None
        self.count = count
        self.shm_budget_bytes = shm_budget_bytes
        self.start_timeout_s = start_timeout_s

    def plan(self, model_name: str, model_config: Any) -> ProcessPlan:
        """Pickle what each process runs (PyTritonBadParameterError when it cannot travel)."""
        payloads = {}
        for target in self.targets:
            if id(target) not in payloads:
                try:
                    payloads[id(target)] = dump_callable(target)
                except Exception as error:  # noqa: BLE001 - anything pickling raises: say what and what to do
                    raise PyTritonBadParameterError(
                        f"model '{model_name}': {target!r} cannot be sent to an instance process "
                        f"({type(error).__name__}: {error}); make it importable (a module-level function or "
                        "class) or pass ProcessInstances(factory=...) that builds it in the process"
                    ) from None
        return ProcessPlan(
            model_name=model_name,
            payloads=tuple(payloads[id(target)] for target in self.targets),
            factory=self.factory,
            count=self.count,
            environments=self._environments,
            arena_budget=self.shm_budget_bytes,
            start_timeout_s=self.start_timeout_s,
            model_config=model_config,
            prepare=attach_model_config,
        )

    def __repr__(self) -> str:
        kind = "factory" if self.factory else "infer_func"
        return f"ProcessInstances({kind}={self.targets[0]!r}, count={self.count})"
