"""Model warm-up: the requests of ModelConfig.model_warmup, run on every instance before the model is ready."""

from __future__ import annotations

import logging
from typing import Dict

import numpy as np

from pytriton.core.instances import StreamStop
from pytriton.core.model import ModelState, ServedModel
from pytriton.proxy.types import Request

LOGGER = logging.getLogger("pytriton")


async def warm_up(model: ServedModel) -> None:
    """Run each warm-up request on each instance in turn, then mark the model ready.

    A request that fails is logged and the warm-up goes on (as in PyTriton: warm-up never keeps a model from
    serving). Each instance gets its own copy of the inputs, which callables may change in place.
    """
    spec = model.spec
    for index, instance in enumerate(model.scheduler.instances):
        for number, inputs in enumerate(spec.warmup, start=1):
            request = Request(data=_copy(inputs))
            try:
                async for _ in instance.steps([request], StreamStop()):
                    pass
            except Exception as error:  # noqa: BLE001 - logged; the warm-up goes on
                message = str(error)
                LOGGER.warning(
                    "model '%s': warmup request %d failed for inference function %d: %s",
                    spec.name,
                    number,
                    index,
                    f"{type(error).__name__}: {message}" if message else type(error).__name__,
                )
    if model.state is ModelState.LOADING:
        model.state = ModelState.READY
    count = len(spec.warmup)
    LOGGER.debug(
        "model '%s' warmed up (%d %s on each instance)", spec.name, count, "request" if count == 1 else "requests"
    )


def _copy(inputs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """A fresh copy of a warm-up request's arrays."""
    return {name: array.copy() for name, array in inputs.items()}
