"""The engine: the model registry and the server's state, shared by every transport."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from typing import Callable, Dict, List, Optional, Set, Tuple, TypeVar

from pytriton.core.cache import ResponseCache
from pytriton.core.cuda_memory import CudaSharedMemory
from pytriton.core.errors import InferenceError, Status
from pytriton.core.instances import ModelInstance
from pytriton.core.model import ModelState, ServedModel
from pytriton.core.spec import ModelSpec
from pytriton.core.system_memory import SystemSharedMemory
from pytriton.core.warmup import warm_up

LOGGER = logging.getLogger(__name__)


class Phase(enum.Enum):
    """Where the server is in its life; readiness is true in SERVING only."""

    SERVING = "serving"
    LEAVING = "leaving"  # stopping: unready so that balancers look elsewhere, but still serving (lame duck)
    DRAINING = "draining"  # refusing new requests, finishing those in progress
    STOPPED = "stopped"


class Engine:
    """Owns every served model; all methods run on the engine's event loop unless noted."""

    def __init__(
        self,
        *,
        cache_capacity_bytes: Optional[int],
        strict_readiness: bool,
        on_unrecoverable: Callable[[str], None],
        max_tensor_elements: int = 0,
        max_response_bytes: int = 0,
        hung_call_warning_s: float = 0.0,
        server_name: str = "triton",
    ) -> None:
        """Create an engine with no models; the limits apply to every model (0: none)."""
        self._models: Dict[str, Dict[int, ServedModel]] = {}
        self._cache = ResponseCache(cache_capacity_bytes) if cache_capacity_bytes else None
        self._strict_readiness = strict_readiness
        self._on_unrecoverable = on_unrecoverable
        self._max_tensor_elements = max_tensor_elements
        self._max_response_bytes = max_response_bytes
        self._hung_call_ns = int(hung_call_warning_s * 1e9)
        self._watchdog: Optional[asyncio.TimerHandle] = None
        self._warmups: Set[asyncio.Task[None]] = set()
        self.server_name = server_name
        self.cuda_memory = CudaSharedMemory()
        self.system_memory = SystemSharedMemory()
        self.live = True
        self.phase = Phase.SERVING
        # Called after a model version is added or removed (the frontend processes mirror the table).
        self.models_changed: Optional[Callable[[], object]] = None

    @property
    def has_cache(self) -> bool:
        """Whether a response cache is configured."""
        return self._cache is not None

    def check_new(self, spec: ModelSpec) -> None:
        """Raise ValueError if the model version is bound already."""
        if spec.version in self._models.get(spec.name, {}):
            raise ValueError(f"model '{spec.name}' version {spec.version} is already bound")

    def add_model(self, spec: ModelSpec, instances: List[ModelInstance]) -> ServedModel:
        """Serve a new model version on its instances (threads, or processes that are up already)."""
        self.check_new(spec)
        versions = self._models.setdefault(spec.name, {})
        spec = dataclasses.replace(
            spec, max_tensor_elements=self._max_tensor_elements, max_response_bytes=self._max_response_bytes
        )
        if not spec.decoupled and any(instance.kind.streams for instance in instances):
            LOGGER.warning(
                "model '%s' version %d: the inference callable is a generator but the model is not decoupled, so "
                "every request will fail; bind it with ModelConfig(decoupled=True) to stream its responses",
                spec.name,
                spec.version,
            )
        model = ServedModel(spec, instances, self._cache, self._on_unrecoverable)
        versions[spec.version] = model
        if spec.warmup:
            model.state = ModelState.LOADING
            task = asyncio.get_running_loop().create_task(warm_up(model))
            self._warmups.add(task)
            task.add_done_callback(self._warmups.discard)
        if self._hung_call_ns and self._watchdog is None:
            self._watch_calls()
        if self.models_changed is not None:
            self.models_changed()
        return model

    async def warmed_up(self) -> None:
        """Return once every model's warm-up has finished."""
        while self._warmups:
            await asyncio.wait(set(self._warmups))

    def _watch_calls(self) -> None:
        """Log, once per call, an instance whose call has run longer than hung_call_warning_s; check again later."""
        now = time.monotonic_ns()
        for model in self.models():
            for index, instance in enumerate(model.scheduler.instances):
                started = instance.call_started_ns
                if started and started != instance.reported_call_ns and now - started >= self._hung_call_ns:
                    instance.reported_call_ns = started
                    LOGGER.warning(
                        "model '%s' version %d: instance %d (%s) has been running one call for %.1f s; "
                        "requests for it wait until the call returns",
                        model.spec.name,
                        model.spec.version,
                        index,
                        instance.label,
                        (now - started) / 1e9,
                    )
        period_s = min(self._hung_call_ns / 2e9, 1.0)
        self._watchdog = asyncio.get_running_loop().call_later(period_s, self._watch_calls)

    def model(self, name: str, version: str = "") -> ServedModel:
        """The model version a request names (latest when the version is empty), or NOT_FOUND."""
        return find_version(self._models, name, version)

    def statistics_of(self, name: str = "", version: str = "") -> List[ServedModel]:
        """The model versions a statistics request names: all, every version of one model, or one version.

        Raises:
            InferenceError: INVALID_ARGUMENT, with Triton's message, for an unknown model or version.
        """
        if not name:
            return self.models()
        versions = self._models.get(name)
        if not versions:
            raise InferenceError.invalid(f"requested model '{name}' is not available")
        if not version:
            return [versions[number] for number in sorted(versions)]
        model = versions.get(int(version)) if version.isdigit() else None
        if model is None:
            raise InferenceError.invalid(f"requested model version is not available for model '{name}'")
        return [model]

    def models(self) -> List[ServedModel]:
        """Every model version, by name then version."""
        return [self._models[name][v] for name in sorted(self._models) for v in sorted(self._models[name])]

    def model_ready(self, name: str, version: str = "") -> bool:
        """Whether a model version exists and takes requests.

        Raises:
            InferenceError: INVALID_ARGUMENT for a version that is no number, whatever the model, as Triton answers.
        """
        try:
            return self.model(name, version).ready
        except InferenceError as error:
            if error.status is not Status.NOT_FOUND:
                raise
            return False

    @property
    def accepting(self) -> bool:
        """Whether new requests are taken (while serving and in the lame duck before a drain)."""
        return self.phase in (Phase.SERVING, Phase.LEAVING)

    @property
    def ready(self) -> bool:
        """Server readiness: accepting requests and, with strict readiness, every model ready."""
        if not self.live or self.phase is not Phase.SERVING:
            return False
        return not self._strict_readiness or all(model.ready for model in self.models())

    async def unload(self, name: str) -> None:
        """Stop serving a model: refuse new requests, let queued ones finish, then mark it unavailable."""
        for model in self._models_named(name):
            model.state = ModelState.UNLOADING
            await _drain(model, timeout_s=30.0)
            model.state = ModelState.UNAVAILABLE

    async def remove(self, name: str, version: int, timeout_s: float) -> None:
        """Stop serving a model version for good: drain it (up to `timeout_s`), stop its instances, forget it."""
        versions = self._models.get(name, {})
        model = versions.get(version)
        if model is None:
            return
        model.state = ModelState.UNLOADING
        await _drain(model, timeout_s)
        model.state = ModelState.UNAVAILABLE
        await model.scheduler.close_instances()
        if versions.get(version) is model:
            del versions[version]
            if not versions:
                del self._models[name]
        if self._cache is not None:
            self._cache.forget(name)  # a model bound later under this name must not get its answers
        if self.models_changed is not None:
            self.models_changed()

    def load(self, name: str) -> None:
        """Serve an unloaded model again."""
        for model in self._models_named(name):
            model.scheduler.resume()
            model.state = ModelState.READY

    def _models_named(self, name: str) -> List[ServedModel]:
        """Every version of a bound model, or NOT_FOUND."""
        versions = self._models.get(name)
        if not versions:
            raise InferenceError.not_found(f"failed to load '{name}', failed to poll from model repository")
        return list(versions.values())

    # The engine's part of the server's stop, in order (runtime/stopping.py runs them): refuse, until_idle
    # (up to a deadline), cut_off, close.

    def refuse(self) -> None:
        """Refuse new requests from now on (readiness false, UNAVAILABLE); queued and running ones go on."""
        self.phase = Phase.DRAINING
        for task in list(self._warmups):
            task.cancel()
        for model in self.models():
            model.scheduler.refuse()

    def open_requests(self) -> Tuple[int, int]:
        """The requests of every model waiting in a queue, and those whose batch is running."""
        counts = [model.scheduler.open_requests for model in self.models()]
        return sum(queued for queued, _ in counts), sum(running for _, running in counts)

    async def until_idle(self) -> None:
        """Return once no model has a request queued or running."""
        for model in self.models():
            await model.scheduler.until_idle()

    def cut_off(self) -> int:
        """Answer every request still queued or running with UNAVAILABLE now; return how many there were."""
        return sum(model.scheduler.cut_off() for model in self.models())

    async def close(self, deadline: Optional[float] = None) -> None:
        """Stop the instances (threads after their calls), unmap shared memory, log the failures held back.

        `deadline` (time.monotonic(): the end of the server's stop) is when instance processes that were
        told to exit and have not are killed, if that comes before their usual grace is over.
        """
        await asyncio.gather(*(model.scheduler.close_instances(deadline) for model in self.models()))
        for model in self.models():
            model.scheduler.failures.flush()
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._cache is not None:
            self._cache.clear()  # its responses may view instance processes' shared memory: let it go
        self.system_memory.unregister()  # unmap what clients registered
        if self.cuda_memory.status():  # unmap what clients registered (CUDA calls: off the loop)
            await asyncio.get_running_loop().run_in_executor(None, self.cuda_memory.unregister)
        self.phase = Phase.STOPPED
        self.live = False


async def _drain(model: ServedModel, timeout_s: float) -> None:
    """Refuse a model's new requests, let queued and running ones finish up to `timeout_s`, fail the rest."""
    model.scheduler.refuse()
    try:
        await asyncio.wait_for(model.scheduler.until_idle(), timeout=timeout_s)
    except asyncio.TimeoutError:
        pass
    model.scheduler.cut_off()


M = TypeVar("M")


def find_version(models: Dict[str, Dict[int, M]], name: str, version: str) -> M:
    """The model version a request names in a table of versions by name (latest when `version` is empty).

    Raises:
        InferenceError: NOT_FOUND, or INVALID_ARGUMENT for a version that is no number, in Triton's words.
    """
    number = _version_number(version) if version else None  # Triton parses it before it looks for the model
    versions = models.get(name)
    if not versions:
        raise InferenceError.not_found(f"Request for unknown model: '{name}' is not found")
    if number is None:
        return versions[max(versions)]
    model = versions.get(number)
    if model is None:
        raise InferenceError.not_found(f"Request for unknown model: '{name}' version {version} is not found")
    return model


def _version_number(version: str) -> int:
    """A requested model version as a number, or INVALID_ARGUMENT in Triton's words.

    Triton's HTTP routes only take digits (anything else is a 404 there); its gRPC services parse the string.
    """
    try:
        number = int(version)
    except ValueError:
        raise InferenceError.invalid(
            f"failed to get model version from specified version string '{version}' (details: stol), version "
            "should be an integral value > 0"
        ) from None
    if number < 0:
        raise InferenceError.invalid(
            f"invalid model version specified '{version}' , version should be an integral value > 0"
        )
    return number
