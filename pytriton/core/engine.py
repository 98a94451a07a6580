"""The engine: the model registry and the server's state, shared by every transport."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import logging
import re
import time
from typing import Awaitable, Callable, Dict, List, Optional, Sequence, Set, Tuple, TypeVar

from pytriton.core.cache import ResponseCache
from pytriton.core.errors import InferenceError, Status
from pytriton.core.instances import ModelInstance
from pytriton.core.model import ModelState, RepositoryEntry, ServedModel
from pytriton.core.scheduling.ensemble import check_ensemble, steps_on
from pytriton.core.shared_memory.cuda import CudaSharedMemory
from pytriton.core.shared_memory.system import SystemSharedMemory
from pytriton.core.spec import ModelSpec
from pytriton.core.warmup import warm_up

LOGGER = logging.getLogger(__name__)

# Starts the instances of a binding of a model again, for the spec a config override gives it (same callable).
Binder = Callable[[ModelSpec], Awaitable[List[ModelInstance]]]
# A load's config override: the model's spec as bound to the spec it is bound again with (InferenceError if not).
SpecChange = Callable[[ModelSpec], ModelSpec]
M = TypeVar("M")
# States in which a model version takes no request: Triton's "not available".
_OUT_OF_SERVICE = (ModelState.UNLOADING, ModelState.UNAVAILABLE)
# How long a binding replaced by a load may take to finish the requests it holds before they fail.
_RETIRE_TIMEOUT_S = 300.0


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
        # Each bound version's spec as bound and how to start its instances again (None: it cannot be).
        self._bound: Dict[Tuple[str, int], Tuple[ModelSpec, Optional[Binder]]] = {}
        self._gone: Dict[str, Set[int]] = {}  # versions removed for good: the index shows them unloaded
        self._retiring: Dict[asyncio.Task[None], ServedModel] = {}  # replaced bindings finishing their requests
        self._repository_lock: Optional[asyncio.Lock] = None  # one load or unload at a time
        self._unloading: Dict[str, asyncio.Task[None]] = {}  # unloads whose requests still finish, by model name
        self._loading: Dict[str, int] = {}  # models whose loads (how many) wait for their unload to end
        self._unloaded_with_step: Set[str] = set()  # ensembles unloaded with a step's model, until it loads
        self._unloads_asked: Dict[str, int] = {}  # by model name: a load that waited sees an unload asked after it
        # Unloaded versions whose load failed, and why, until one loads: the index gives it, a strict server is not
        # ready meanwhile, and an unload changes neither (tritonserver 2.51, measured).
        self._load_failures: Dict[Tuple[str, int], str] = {}
        self.server_name = server_name
        self.cuda_memory = CudaSharedMemory()
        self.system_memory = SystemSharedMemory()
        self.live = True
        self.phase = Phase.SERVING
        # Moves with every change of the model table or of which versions are out of service (what the frontend
        # processes mirror): comparing it tells a frontend's mirror current without walking the models.
        self.models_generation = 0
        # Called after a model version is added or removed (the frontend processes mirror the table).
        self.models_changed: Optional[Callable[[], object]] = None
        # Called after a load bound a model version again (what follows the served models, such as tracing).
        self.rebound: Optional[Callable[[], None]] = None
        # Called with each model version as it is made, before its first request (bound, or bound again by a
        # load): what observes every request of it (the metrics' summaries and histograms).
        self.model_made: List[Callable[[ServedModel], None]] = []

    @property
    def has_cache(self) -> bool:
        """Whether a response cache is configured."""
        return self._cache is not None

    @property
    def response_cache(self) -> Optional[ResponseCache]:
        """The response cache every model with `response_cache` shares (None: none is configured)."""
        return self._cache

    def check_new(self, spec: ModelSpec) -> None:
        """Raise ValueError if the model version is bound already."""
        if spec.version in self._models.get(spec.name, {}):
            raise ValueError(  # 0.7's sentence first
                "Cannot add model with the same name twice. "
                f"Model '{spec.name}' version {spec.version} is already bound."
            )

    def add_model(
        self,
        spec: ModelSpec,
        instances: List[ModelInstance],
        binder: Optional[Binder] = None,
        on_unrecoverable: Optional[Callable[[str], None]] = None,
    ) -> ServedModel:
        """Serve a new model version on its instances (threads, or processes that are up already).

        `binder` starts instances of the same callable again, for a load with a config override.
        `on_unrecoverable`: what a PyTritonUnrecoverableError of its callable does, instead of stopping the server
        (a RemoteTriton's model: its binding ends, the server goes on).
        """
        self.check_new(spec)
        if spec.ensemble is not None:
            spec = check_ensemble(spec, self)
        versions = self._models.setdefault(spec.name, {})
        spec = dataclasses.replace(
            spec, max_tensor_elements=self._max_tensor_elements, max_response_bytes=self._max_response_bytes
        )
        self._bound[(spec.name, spec.version)] = (spec, binder)
        self._gone.get(spec.name, set()).discard(spec.version)
        model = self._serve(spec, instances, on_unrecoverable)
        versions[spec.version] = model
        self.models_generation += 1
        if self.models_changed is not None:
            self.models_changed()
        return model

    def _serve(
        self,
        spec: ModelSpec,
        instances: List[ModelInstance],
        on_unrecoverable: Optional[Callable[[str], None]] = None,
    ) -> ServedModel:
        """A served model of a spec on its instances, warming up when its spec asks for it."""
        if not spec.decoupled and any(instance.kind.streams for instance in instances):
            LOGGER.warning(
                "model '%s' version %d: the inference callable is a generator but the model is not decoupled, so "
                "every request will fail; bind it with ModelConfig(decoupled=True) to stream its responses",
                spec.name,
                spec.version,
            )
        model = ServedModel(spec, instances, self._cache, on_unrecoverable or self._on_unrecoverable)
        # The callable's inner calls (core/composition/); an ensemble's steps.
        model.scheduler.models = self if spec.ensemble is None else _EnsembleSteps(self)
        for made in self.model_made:
            made(model)
        if spec.warmup:
            model.state = ModelState.LOADING
            task = asyncio.get_running_loop().create_task(warm_up(model))
            self._warmups.add(task)
            task.add_done_callback(self._warmups.discard)
        if self._hung_call_ns and self._watchdog is None:
            self._watch_calls()
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
        """The model version a request names (the latest available when the version is empty), in Triton's words.

        Raises:
            InferenceError: NOT_FOUND for an unknown model or one with no available version (unloaded),
                UNAVAILABLE for a named version that is unloaded.
        """
        versions = self._models.get(name)
        if versions and not version:  # the usual case: the latest version, in service
            model = versions[max(versions)]
            if model.state not in _OUT_OF_SERVICE:
                return model
        return find_available(self._models, name, version, _in_service, lambda: name in self._gone)

    def step_model(self, name: str, version: str = "") -> ServedModel:
        """As `model`, but also a version still unloading: where an ensemble's steps find their model.

        As Triton's ensemble holds its step models, a step model unloaded while a run is under way serves that
        run to its end; the ensemble, unloaded with it, takes no new run meanwhile.
        """
        versions = self._models.get(name)
        if versions and (version.isdigit() or not version):
            model = versions.get(int(version)) if version else versions[max(versions)]
            if model is not None and model.ensemble_runs_only:
                return model
        return self.model(name, version)

    def out_of_service(self) -> List[Tuple[str, int]]:
        """The model versions that take no request: unloaded or unloading, and those removed for good."""
        versions = [(model.spec.name, model.spec.version) for model in self.models() if not _in_service(model)]
        versions += [(name, version) for name, numbers in self._gone.items() for version in numbers]
        return sorted(versions)

    def statistics_of(self, name: str = "", version: str = "") -> List[ServedModel]:
        """The model versions a statistics request names: all, every version of one model, or one version.

        Unloaded versions have none, as in Triton.

        Raises:
            InferenceError: INVALID_ARGUMENT, with Triton's message, for an unknown or unloaded model or version.
        """
        # gRPC's version string, refused as Triton does: before the name is read, so without a name too (where
        # a version that is a number is then ignored).
        wanted = _version_number(version) if version else None
        if not name:
            return [model for model in self.models() if _in_service(model)]
        versions = {number: model for number, model in self._models.get(name, {}).items() if _in_service(model)}
        if not versions:
            raise InferenceError.invalid(f"requested model '{name}' is not available")
        if wanted is None:
            return [versions[number] for number in sorted(versions)]
        model = versions.get(wanted)
        if model is None:
            raise InferenceError.invalid(f"requested model version is not available for model '{name}'")
        return [model]

    def models(self) -> List[ServedModel]:
        """Every model version, by name then version."""
        return [self._models[name][v] for name in sorted(self._models) for v in sorted(self._models[name])]

    def versions_of(self, name: str) -> List[ServedModel]:
        """Every version of one model (unloaded ones too), by version: none for an unknown name."""
        versions = self._models.get(name, {})
        return [versions[number] for number in sorted(versions)]

    def model_ready(self, name: str, version: str = "") -> bool:
        """Whether a model version exists and takes requests.

        Raises:
            InferenceError: INVALID_ARGUMENT for a version that is no number, whatever the model, as Triton answers.
        """
        try:
            return self.model(name, version).ready
        except InferenceError as error:
            if error.status not in (Status.NOT_FOUND, Status.UNAVAILABLE):
                raise
            return False

    def repository(self) -> List[RepositoryEntry]:
        """The repository index: every model version bound, those removed for good shown unloaded, as Triton."""
        entries = [
            RepositoryEntry(model.spec.name, model.spec.version_str, ModelState.LOADING.value, False, "")
            if model.spec.name in self._loading
            else RepositoryEntry(
                model.spec.name,
                model.spec.version_str,
                model.state.value,
                model.ready,
                self._load_failures.get((model.spec.name, model.spec.version), "unloaded")
                if model.state is ModelState.UNAVAILABLE
                else "",
            )
            for model in self.models()
        ]
        for name, versions in self._gone.items():
            for version in versions:
                entries.append(RepositoryEntry(name, str(version), ModelState.UNAVAILABLE.value, False, "unloaded"))
        return sorted(entries, key=lambda entry: (entry.name, int(entry.version)))

    @property
    def accepting(self) -> bool:
        """Whether new requests are taken (while serving and in the lame duck before a drain)."""
        return self.phase in (Phase.SERVING, Phase.LEAVING)

    @property
    def ready(self) -> bool:
        """Server readiness: accepting requests and, with strict readiness, every model ready.

        An unloaded model (UNAVAILABLE) does not count, as in Triton, unless its load failed since; one still
        unloading does (it is not ready).
        """
        if not self.live or self.phase is not Phase.SERVING:
            return False
        if not self._strict_readiness:
            return True
        if self._load_failures:
            return False
        return all(model.ready for model in self.models() if model.state is not ModelState.UNAVAILABLE)

    def _lock(self) -> asyncio.Lock:
        """The lock that makes loads and unloads take turns (made on the loop: Python 3.9's binds one)."""
        if self._repository_lock is None:
            self._repository_lock = asyncio.Lock()
        return self._repository_lock

    async def unload(self, name: str) -> None:
        """Stop serving a model: refuse its new requests and answer at once, as Triton does.

        The model shows UNLOADING while its queued and running requests finish (in the background, up to 30 s),
        then UNAVAILABLE; its instances then stop (threads, processes), unless a RemoteTriton bound them. A load
        of the model waits for that. The ensembles with a step on the model are unloaded with it, as in Triton:
        they take no new request at once, and their runs under way finish first, on the model, which takes
        their steps' requests (`step_model`) while it refuses everyone else's. An unknown model is no error:
        Triton answers such an unload with success.
        """
        self._unloads_asked[name] = self._unloads_asked.get(name, 0) + 1
        async with self._lock():
            await self._unload(name)

    async def _unload(self, name: str) -> None:
        """`unload`, under the lock."""
        self._unloaded_with_step.discard(name)
        ensembles = self._ensembles_on(name)
        leaving = [model for model in self._models.get(name, {}).values() if _in_service(model)]
        if not leaving and not ensembles:
            return
        for model in ensembles:
            self._unloaded_with_step.add(model.spec.name)  # loaded again with the model, as in Triton
            model.scheduler.refuse()
            idle = model.scheduler.open_requests == (0, 0)
            model.state = ModelState.UNAVAILABLE if idle else ModelState.UNLOADING
        running = [model for model in ensembles if model.state is ModelState.UNLOADING]
        for model in leaving:
            if running:  # refused once their runs ended: until then they call it
                model.ensemble_runs_only = True
            else:
                model.scheduler.refuse()
            idle = not running and model.scheduler.open_requests == (0, 0)  # nothing to wait for
            model.state = ModelState.UNAVAILABLE if idle else ModelState.UNLOADING
        self.models_generation += 1
        await self._changed()
        task = asyncio.get_running_loop().create_task(self._finish_unload(leaving, running))
        for unloaded in {name, *(model.spec.name for model in running)}:  # a load of either waits for it
            self._unloading[unloaded] = task
            task.add_done_callback(functools.partial(self._unloaded, unloaded))

    def _ensembles_on(self, name: str) -> List[ServedModel]:
        """The ensembles in service with a step on a model, or on such an ensemble (Triton's dependents)."""
        found: List[ServedModel] = []
        names = {name}
        grew = True
        while grew:
            grew = False
            for model in self.models():
                if model not in found and _in_service(model) and any(steps_on(model.spec, n) for n in names):
                    found.append(model)
                    names.add(model.spec.name)
                    grew = True
        return found

    async def _finish_unload(self, models: List[ServedModel], ensembles: Sequence[ServedModel] = ()) -> None:
        """Let the ensembles on the models, then the models, finish their requests; then stop the models' instances.

        Each is marked unavailable once drained. Only instances a binder can start again stop (a load then binds
        new ones, with fresh statistics, as Triton loads a new model); a RemoteTriton's stay.
        """
        for model in ensembles:
            await _drain(model, timeout_s=30.0)
            model.state = ModelState.UNAVAILABLE
        if ensembles and self.models_changed is not None:
            self.models_changed()
        for model in models:
            model.ensemble_runs_only = False
            await _drain(model, timeout_s=30.0)
            model.state = ModelState.UNAVAILABLE
        if self.models_changed is not None:
            self.models_changed()
        for model in models:
            if self._bound[(model.spec.name, model.spec.version)][1] is not None:
                await model.scheduler.close_instances()

    def _unloaded(self, name: str, task: asyncio.Task[None]) -> None:
        """An unload's drain ended: forget it (and log what it raised)."""
        if self._unloading.get(name) is task:
            del self._unloading[name]
        if not task.cancelled() and task.exception() is not None:
            LOGGER.warning("unloading model '%s' did not end cleanly: %s", name, task.exception())

    async def _changed(self) -> None:
        """Tell the frontend processes that the models changed; return once they know."""
        if self.models_changed is not None:
            changed = self.models_changed()
            if asyncio.isfuture(changed):
                await changed

    async def remove(
        self, name: str, version: int, timeout_s: float, abandoned: Optional[asyncio.Future[None]] = None
    ) -> None:
        """Stop serving a model version for good: drain it (up to `timeout_s`), stop its instances, forget it.

        The repository index shows it unloaded from then on, and requests for it get Triton's words for that.
        `abandoned` settles when no instance can serve the model any more: the drain ends then.
        """
        versions = self._models.get(name, {})
        model = versions.get(version)
        if model is None:
            return
        model.state = ModelState.UNLOADING
        self.models_generation += 1
        await _drain(model, timeout_s, abandoned)
        model.state = ModelState.UNAVAILABLE
        await model.scheduler.close_instances()
        if versions.get(version) is model:
            del versions[version]
            if not versions:
                del self._models[name]
            self._bound.pop((name, version), None)
            self._gone.setdefault(name, set()).add(version)
            self.models_generation += 1
        if self._cache is not None:
            self._cache.forget(name)  # a model bound later under this name must not get its answers
        if self.models_changed is not None:
            self.models_changed()

    async def load(self, name: str, change: Optional[SpecChange] = None) -> None:
        """Serve a model again, with its config as bound or as a config override `change` makes it.

        A load without an override undoes an earlier one (Triton keeps it while the model's files are unchanged:
        docs/binding_models.md says why not here). A version whose spec changes is bound
        again: new instances of the same callable, a new scheduler and fresh statistics; requests go to the
        new binding from now on, those it held finish on the old one, whose instances then stop.

        Raises:
            InferenceError: Triton's "failed to load" for an unknown model or an override that cannot apply; the
                model then goes on as it was.
        """
        named = (name, *sorted(self._steps_of(name)))  # an ensemble loads its unloaded steps: they count too
        asked = [self._unloads_asked.get(each, 0) for each in named]
        for waited in named:
            await self._after_unload(waited)  # not under the lock: the other models' loads and unloads go on meanwhile
        async with self._lock():
            try:
                await self._load_with_ensembles(name, change)
            finally:
                # An unload asked after this load, while it waited, found nothing to do: it comes after the load
                # now, as when the lock ordered them (the last call asked decides).
                for each, before in zip(named, asked):
                    if self._unloads_asked.get(each, 0) != before:
                        await self._unload(each)
            await self._changed()  # the frontend processes learn the new specs before the answer

    async def _load_with_ensembles(self, name: str, change: Optional[SpecChange]) -> None:
        """`load` under the lock: the model, then the ensembles it breaks out, and those that come back with it."""
        self._unloaded_with_step.discard(name)
        await self._load_one(name, change, ())
        await self._unload_broken_ensembles(name)
        back = True
        while back:  # as Triton, they come back with their steps (an ensemble over one once that one is back)
            back = False
            for ensemble in sorted(self._unloaded_with_step):
                if all(self._in_service(step) for step in self._steps_of(ensemble)):
                    self._unloaded_with_step.discard(ensemble)
                    try:
                        await self._load_one(ensemble, None, ())
                    except InferenceError as error:  # its steps changed: it stays unloaded, as in Triton
                        LOGGER.error("%s", error.message.rstrip())
                        continue
                    back = True

    async def _after_unload(self, name: str) -> None:
        """Wait for a model's unload under way to end: its requests to finish (the index shows it LOADING meanwhile).

        As a load of nvidia-pytriton 0.7's models waits (tritonserver 2.51 loads a plain Python-backend model's new
        instance at once, measured, and unloads the old one once its requests end).
        """
        unloading = self._unloading.get(name)
        if unloading is None:
            return
        self._loading[name] = self._loading.get(name, 0) + 1
        try:
            await asyncio.shield(unloading)
        finally:
            self._loading[name] -= 1
            if not self._loading[name]:
                del self._loading[name]

    async def _unload_broken_ensembles(self, name: str) -> None:
        """Unload the ensembles that a model's new binding breaks (its new max_batch_size is below theirs).

        As Triton, which checks the ensembles on a model again when it loads the model: the load succeeds, each
        ensemble the check fails is unloaded (its error logged), and the ensembles on it with it.
        """
        for model in self.models():
            if not (_in_service(model) and steps_on(model.spec, name)):
                continue
            try:
                check_ensemble(model.spec, self)
            except ValueError as error:
                LOGGER.error("ensemble '%s' is unloaded: %s", model.spec.name, error)
                await self._unload(model.spec.name)

    def _in_service(self, name: str) -> bool:
        """Whether some version of a model takes requests."""
        return any(_in_service(model) for model in self._models.get(name, {}).values())

    def _steps_of(self, name: str) -> Set[str]:
        """The models an ensemble's steps run (none for a model that is no ensemble)."""
        return {
            step.model_name
            for (bound_name, _), (spec, _) in self._bound.items()
            if bound_name == name and spec.ensemble is not None
            for step in spec.ensemble.steps
        }

    async def _load_one(self, name: str, change: Optional[SpecChange], outer: Tuple[str, ...]) -> None:
        """`load` of one model, under the lock; an ensemble's unloaded step models first, as Triton loads them."""
        await self._after_unload(name)
        versions = self._models.get(name)
        if not versions:
            raise InferenceError.internal(f"failed to load '{name}', failed to poll from model repository")
        for step in sorted(self._steps_of(name)):
            if step in self._models and step not in outer and not self._in_service(step):
                await self._load_one(step, None, (*outer, name))
        targets = []
        for version in sorted(versions):
            bound, binder = self._bound[(name, version)]
            target = change(bound) if change is not None else bound
            if target != versions[version].spec and bound.ensemble is not None:
                raise InferenceError.invalid(
                    f"failed to load '{name}' version {version}: an ensemble takes no config override "
                    "(bind it again with its new config)"
                )
            if target != versions[version].spec and binder is None:
                raise InferenceError.invalid(
                    f"failed to load '{name}' version {version}: it was bound by a RemoteTriton, whose "
                    "instances cannot start again: it takes no config override"
                )
            if target.ensemble is not None:
                try:
                    target = check_ensemble(target, self)
                except ValueError as error:
                    raise InferenceError.invalid(f"load failed for model '{name}': {error}\n") from None
            targets.append((version, target, binder))
        for version, target, binder in targets:
            await self._load_version(versions, versions[version], target, binder)

    async def _load_version(
        self, versions: Dict[int, ServedModel], model: ServedModel, spec: ModelSpec, binder: Optional[Binder]
    ) -> None:
        """Serve one version with `spec`: as it is when unchanged and served, else on new instances from `binder`.

        An unloaded version's instances have stopped: it is bound again, with fresh statistics, as Triton loads
        a new model. One without a binder (a RemoteTriton's) serves again on its instances, its statistics reset.
        """
        unloaded = model.state in _OUT_OF_SERVICE
        if binder is None or (spec == model.spec and not unloaded):
            if unloaded:
                model.scheduler.resume()
                model.stats.reset()
                model.state = ModelState.READY
                self.models_generation += 1
            return
        try:
            instances = await binder(spec)
        except Exception as error:  # noqa: BLE001 - the instances did not start: the model goes on as it was
            failure = (
                error
                if isinstance(error, InferenceError)
                else InferenceError.invalid(f"failed to load '{spec.name}' version {spec.version}: {error}")
            )
            if unloaded:  # it stays unavailable: the index gives the reason, as Triton's does
                self._load_failures[(spec.name, spec.version)] = failure.message
            raise failure from None
        self._load_failures.pop((spec.name, spec.version), None)
        replacement = self._serve(spec, instances)
        if unloaded:  # tritonserver 2.51's failure counters go on from the unloaded model's (`ModelStats.reset`)
            replacement.stats.failures_by_reason = model.stats.failures_by_reason
        if spec.warmup:
            await self.warmed_up()  # as Triton, the new binding serves once it is loaded
        versions[spec.version] = replacement
        self.models_generation += 1
        if self.rebound is not None:
            self.rebound()
        if unloaded:  # its unload stopped its instances
            LOGGER.info("model '%s' version %d loaded again", spec.name, spec.version)
            return
        LOGGER.info("model '%s' version %d bound again with its config override", spec.name, spec.version)
        model.retire(replacement)
        task = asyncio.get_running_loop().create_task(_retire(model))
        self._retiring[task] = model
        task.add_done_callback(self._retired)

    def _retired(self, task: asyncio.Task[None]) -> None:
        """A replaced binding stopped: forget it (and log what stopping it raised)."""
        self._retiring.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            LOGGER.warning("a model binding replaced by a load did not stop cleanly: %s", task.exception())

    def _every_model(self) -> List[ServedModel]:
        """Every model version served, and the bindings replaced by a load that still finish their requests."""
        return self.models() + list(self._retiring.values())

    # The engine's part of the server's stop, in order (runtime/stopping.py runs them): refuse, until_idle
    # (up to a deadline), cut_off, close.

    def refuse(self) -> None:
        """Refuse new requests from now on (readiness false, UNAVAILABLE); queued and running ones go on."""
        self.phase = Phase.DRAINING
        for task in list(self._warmups):
            task.cancel()
        for model in self._every_model():
            model.scheduler.refuse()

    def open_requests(self) -> Tuple[int, int]:
        """The requests of every model waiting in a queue, and those whose batch is running."""
        counts = [model.scheduler.open_requests for model in self._every_model()]
        return sum(queued for queued, _ in counts), sum(running for _, running in counts)

    async def until_idle(self) -> None:
        """Return once no model has a request queued or running."""
        for model in self._every_model():
            await model.scheduler.until_idle()

    def cut_off(self) -> int:
        """Answer every request still queued or running with UNAVAILABLE now; return how many there were."""
        return sum(model.scheduler.cut_off() for model in self._every_model())

    async def close(self, deadline: Optional[float] = None) -> None:
        """Stop the instances (threads after their calls), unmap shared memory, log the failures held back.

        `deadline` (time.monotonic(): the end of the server's stop) is when instance processes that were
        told to exit and have not are killed, if that comes before their usual grace is over.
        """
        await asyncio.gather(*self._unloading.values(), return_exceptions=True)  # cut off: they end at once
        await asyncio.gather(*(model.scheduler.close_instances(deadline) for model in self._every_model()))
        for model in self.models():
            model.scheduler.failures.flush()
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._cache is not None:
            self._cache.clear()
        self.system_memory.unregister(force=True)  # unmap what clients registered
        if self.cuda_memory.status():  # unmap what clients registered (CUDA calls: off the loop)
            await asyncio.get_running_loop().run_in_executor(None, self.cuda_memory.unregister)
        self.phase = Phase.STOPPED
        self.live = False


class _EnsembleSteps:
    """Where an ensemble's runs find their step models (`Engine.step_model`)."""

    def __init__(self, engine: Engine) -> None:
        """The step models of `engine`."""
        self._engine = engine

    def model(self, name: str, version: str = "") -> ServedModel:
        """The step model version named, also one still unloading."""
        return self._engine.step_model(name, version)


def _in_service(model: ServedModel) -> bool:
    """Whether a model version may take requests (a warming one answers that it is not ready yet)."""
    return model.state not in _OUT_OF_SERVICE


def find_available(
    models: Dict[str, Dict[int, M]],
    name: str,
    version: str,
    in_service: Callable[[M], bool],
    was_bound: Callable[[], bool],
) -> M:
    """The model version a request names in a table of versions by name, the latest in service when none is named.

    `was_bound()` tells whether a model missing from the table was bound once (removed for good).

    Raises:
        InferenceError: as find_version, and Triton's words for a model or version out of service.
    """
    try:
        model = find_version(models, name, version)
    except InferenceError as error:
        if error.status is Status.NOT_FOUND and name not in models and was_bound():
            raise _unloaded(name, version) from None
        raise
    if in_service(model):
        return model
    available = [] if version else [number for number, other in models[name].items() if in_service(other)]
    if not available:
        raise _unloaded(name, version)
    return models[name][max(available)]


async def _retire(model: ServedModel) -> None:
    """Let a replaced binding finish the requests it holds, then stop its instances."""
    await _drain(model, _RETIRE_TIMEOUT_S)
    model.state = ModelState.UNAVAILABLE
    await model.scheduler.close_instances()


def _unloaded(name: str, version: str) -> InferenceError:
    """The error of a request for a model (or a version of it) that is unloaded, in Triton's words."""
    if version:
        return InferenceError.unavailable(
            f"Request for unknown model: '{name}' version {version} is not at ready state"
        )
    return InferenceError.not_found(f"Request for unknown model: '{name}' has no available versions")


async def _drain(model: ServedModel, timeout_s: float, abandoned: Optional[asyncio.Future[None]] = None) -> None:
    """Refuse a model's new requests, let queued and running ones finish up to `timeout_s`, fail the rest.

    The rest fail at once when `abandoned` settles (no instance is left to run them).
    """
    model.scheduler.refuse()
    idle = asyncio.ensure_future(model.scheduler.until_idle())
    waited: Set[asyncio.Future[None]] = {idle} if abandoned is None else {idle, asyncio.shield(abandoned)}
    _, pending = await asyncio.wait(waited, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    for future in pending:
        future.cancel()
    model.scheduler.cut_off()


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
        raise InferenceError.not_found(f"Request for unknown model: '{name}' version {number} is not found")
    return model


_LONG_MAX = 2**63 - 1  # the largest version std::stol reads
# What std::stol reads: leading C whitespace, a sign, ASCII digits; what follows is ignored ("1.0" is version 1).
_STOL = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def _version_number(version: str) -> int:
    """A requested model version as a number, read as Triton's std::stol reads it, or INVALID_ARGUMENT in its words.

    Triton's HTTP routes only take digits (anything else is a 404 there); its gRPC services parse the string.
    """
    match = _STOL.match(version)
    number = int(match.group(1)) if match else None
    if number is None or not -_LONG_MAX - 1 <= number <= _LONG_MAX:  # out of range: stol's answer names it too
        raise InferenceError.invalid(
            f"failed to get model version from specified version string '{version}' (details: stol), version "
            "should be an integral value > 0"
        )
    if number < 0:
        raise InferenceError.invalid(
            f"invalid model version specified '{version}' , version should be an integral value > 0"
        )
    return number
