"""How a bound model's instances start again, for a load that binds it again with a config override.

The callable stays the one bound: thread instances take the callables bound (one per instance), process
instances the pickled callable or factory, started in new processes.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Callable, List, Optional

from pytriton.core.doorbell import inbox_of
from pytriton.core.engine import Binder
from pytriton.core.errors import InferenceError
from pytriton.core.instances import Instance, ModelInstance
from pytriton.core.process_instances.spawn import ProcessPlan, StartError
from pytriton.core.spec import ModelSpec
from pytriton.core.tensors.datatypes import BYTES

# Called with the new spec once a model's instances are bound again (the decorators' model config follows it).
OnBind = Callable[[ModelSpec], None]


def thread_binder(callables: List[Callable[..., Any]], on_bind: Optional[OnBind] = None) -> Binder:
    """Instances in threads of this process, one per callable bound: as many as were bound, or fewer."""

    async def bind(spec: ModelSpec) -> List[ModelInstance]:
        count = spec.instance_count
        if count > len(callables):
            bound = len(callables)
            raise _too_many(spec, f"it was bound with {bound} callable{'' if bound == 1 else 's'} (one per instance)")
        instances = [
            Instance(
                fn,
                f"pytriton-{spec.name}-{spec.version}-{index}",
                (spec.name, spec.version_str),
                count_strings=answers_strings(spec),
            )
            for index, fn in enumerate(callables[:count])
        ]
        if any(instance.kind.uses_thread for instance in instances):
            inbox_of(asyncio.get_running_loop())  # where their results come back
        if on_bind is not None:
            on_bind(spec)
        return list(instances)

    return bind


def process_binder(plan: ProcessPlan, config_for: Optional[Callable[[ModelSpec], Any]] = None) -> Binder:
    """Instances in processes of their own, started from the plan the model was bound with.

    Fewer instances take the first ones' callables and environments; more need one callable for all and one
    environment for all (an environment made per index cannot be made again here). `config_for(spec)` is the
    model config the processes' decorators read.
    """

    async def bind(spec: ModelSpec) -> List[ModelInstance]:
        from pytriton.core.process_instances.instance import start_instances

        count = spec.instance_count
        if count > plan.count:
            if len(set(plan.payloads)) != 1 or any(env != plan.environments[0] for env in plan.environments):
                raise _too_many(spec, f"its {plan.count} process instances differ in callable or environment")
            resized = dataclasses.replace(
                plan, count=count, payloads=plan.payloads[:1] * count, environments=plan.environments[:1] * count
            )
        else:
            resized = dataclasses.replace(
                plan, count=count, payloads=plan.payloads[:count], environments=plan.environments[:count]
            )
        resized = dataclasses.replace(resized, model_version=spec.version_str)
        if config_for is not None:
            resized = dataclasses.replace(resized, model_config=config_for(spec))
        try:
            return list(await start_instances(resized))
        except StartError as error:
            raise InferenceError.invalid(
                f"failed to load '{spec.name}' version {spec.version}: an instance did not start: {error}"
            ) from None

    return bind


def answers_strings(spec: ModelSpec) -> bool:
    """Whether a model declares a BYTES output: its thread instances count long object arrays ahead."""
    return any(output.datatype == BYTES for output in spec.outputs)


def _too_many(spec: ModelSpec, why: str) -> InferenceError:
    """The error of an instance count the binding cannot have."""
    return InferenceError.invalid(
        f"failed to load '{spec.name}' version {spec.version}: 'instance_group' asks for {spec.instance_count} "
        f"instances, but {why}; bind a list of callables or ProcessInstances(...) to have more"
    )
