"""TritonBase: what a Triton in this process and a RemoteTriton share: binding, connecting, serving, stopping.

The lifecycle is one state machine (`ServerState`): a Triton is IDLE until its server starts (on `__enter__`,
`run()` or `serve()`, after its TritonLifecyclePolicy), SERVING once it does, CONNECTED once `connect()`
found it ready, and STOPPED for good after `stop()`.
"""

from __future__ import annotations

import enum
import pathlib
import threading
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, TypeVar, Union

from pytriton.context import TritonContext
from pytriton.core.composition.path import CURRENT
from pytriton.core.custom_metrics import current_model
from pytriton.core.spec import ModelSpec
from pytriton.exceptions import PyTritonInvalidOperationError
from pytriton.instances import ProcessInstances
from pytriton.lifecycle import DefaultTritonLifecyclePolicy, TritonLifecyclePolicy
from pytriton.model_config.ensemble import EnsembleStep
from pytriton.model_config.model_config import ModelConfig
from pytriton.model_config.tensor import Tensor
from pytriton.models import build_ensemble, validate_model_name
from pytriton.options.openai import OpenAIOption
from pytriton.runtime.signals import stop_on_signals, wait_in_main_thread

_Triton = TypeVar("_Triton", bound="TritonBase")

MONITORING_PERIOD_S = 10.0
# The seeds' name for serve()'s period and their default.
MONITORING_PERIOD_SEC = 5.0


# How often a stop() waiting for another's to end looks again (so that a signal's handler runs meanwhile).
_STOP_POLL_S = 0.5


class ServerState(enum.Enum):
    """Where a Triton is in its lifecycle; it only moves forward."""

    IDLE = "idle"
    SERVING = "serving"
    CONNECTED = "connected"
    STOPPED = "stopped"


class Binding(NamedTuple):
    """The arguments of one `bind` call, checked, with a config."""

    model_name: str
    infer_func: Union[Callable[..., Any], Sequence[Callable[..., Any]], ProcessInstances]
    inputs: Sequence[Tensor]
    outputs: Sequence[Tensor]
    model_version: int
    config: ModelConfig
    strict: bool
    trace_config: Optional[List[str]]
    openai: Optional[OpenAIOption] = None


class TritonBase:
    """Binding models and the lifecycle of a Triton server; subclasses say how to start, check and stop it."""

    def __init__(
        self,
        url: str,
        workspace: Union[str, pathlib.Path, None] = None,
        triton_lifecycle_policy: TritonLifecyclePolicy = DefaultTritonLifecyclePolicy,
        access_token: Optional[str] = None,
    ) -> None:
        """Keep the settings of a server at `url`; nothing starts yet.

        Args:
            url: the server's URL (`<scheme>://<host>:<port>`).
            workspace: accepted for compatibility; nothing is written to it.
            triton_lifecycle_policy: when the server starts (on `__enter__` by default).
            access_token: the token the server's restricted APIs expect, if any.
        """
        self._url = url
        self._workspace = workspace
        self._triton_lifecycle_policy = triton_lifecycle_policy
        self._access_token = access_token
        self._state = ServerState.IDLE
        self._state_lock = threading.RLock()
        # Set when serving ends (stop(), a signal, an unrecoverable model error): wakes serve().
        self._finished = threading.Event()
        self._stopping_thread: Optional[int] = None  # the thread whose stop() call stops the server
        self.triton_context = TritonContext()

    def bind(
        self,
        model_name: str,
        infer_func: Union[Callable[..., Any], Sequence[Callable[..., Any]], ProcessInstances],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: Optional[ModelConfig] = None,
        strict: bool = False,
        trace_config: Optional[List[str]] = None,
        *,
        openai: Optional[OpenAIOption] = None,
    ) -> None:
        """Serve an inference callable (or a list of them: one per instance) as a model, before or while serving.

        Args:
            model_name: name of the model; alphanumerics, dots, underscores and dashes.
            infer_func: inference callable, or a list of callables for a multi-instance model (threads of this
                process), or `pytriton.instances.ProcessInstances(...)` for instances in processes of their own.
            inputs: model inputs.
            outputs: model outputs.
            model_version: version of the model.
            config: model configuration (batching, batcher, cache, decoupled, warm-up).
            strict: check the callable's outputs against the declared dtypes and shapes.
            trace_config: the model's trace settings (TritonConfig.trace_config's format); None: the server's.
            openai: serve the model through the OpenAI API too (`pytriton.openai`: OpenAIChat, OpenAICompletions,
                OpenAIEmbeddings), on the HTTP port under /v1; None: not (docs/openai.md).

        Raises:
            PyTritonInvalidOperationError: the server was stopped.
        """
        if self._state is ServerState.STOPPED:
            raise PyTritonInvalidOperationError("Cannot bind a model to a stopped Triton server")
        validate_model_name(model_name)
        config = config or ModelConfig()
        self._bind_model(
            Binding(model_name, infer_func, inputs, outputs, model_version, config, strict, trace_config, openai)
        )

    def bind_ensemble(
        self,
        model_name: str,
        steps: Sequence[EnsembleStep],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: Optional[ModelConfig] = None,
    ) -> None:
        """Serve an ensemble (Triton's `ensemble_scheduling`): a graph of models bound already, as one model.

        Each step runs a bound model on ensemble tensors once all of them are available (independent steps run
        at once); the ensemble's inputs are the first tensors, its outputs are gathered from the steps'. A step
        is a request like a client's: it joins its model's queue and batches with the model's other requests.
        The model config shows `platform: "ensemble"` and the steps; a step's error fails the request. A decoupled
        step's responses each flow through the steps after it, and the ensemble is then decoupled (streamed).

        Args:
            model_name: name of the ensemble.
            steps: `pytriton.model_config.EnsembleStep`s: the model each runs, and its input and output maps
                (model tensor name -> ensemble tensor name).
            inputs: the ensemble's inputs.
            outputs: the ensemble's outputs (an output's `labels` serve a client's `class_count`).
            model_version: version of the ensemble.
            config: `max_batch_size` (each step's model must allow as much, or not batch); an ensemble has no
                batcher, instances, warm-up, cache or decoupled mode of its own (it is decoupled when a step's
                model is).

        Raises:
            PyTritonInvalidOperationError: the ensemble is refused (Triton's message: an unknown step model or
                tensor, an ensemble output no step writes, a tensor written twice, a cycle, a step reading tensors
                of two decoupled origins...), or the server was
                stopped.
        """
        if self._state is ServerState.STOPPED:
            raise PyTritonInvalidOperationError("Cannot bind a model to a stopped Triton server")
        spec = build_ensemble(
            model_name=model_name,
            model_version=model_version,
            steps=steps,
            inputs=inputs,
            outputs=outputs,
            config=config or ModelConfig(),
        )
        self._bind_ensemble(spec)

    def _bind_ensemble(self, spec: ModelSpec) -> None:
        """Serve an ensemble's spec: a subclass that can says how."""
        raise PyTritonInvalidOperationError(
            f"ensemble '{spec.name}': a {type(self).__name__} binds no ensembles; bind it on the Triton that serves "
            "its steps' models"
        )

    def connect(self) -> None:
        """Wait until the server is ready to serve the bound models.

        Raises:
            TimeoutError: the server is not running (or does not become ready).
            PyTritonInvalidOperationError: the server was stopped.
        """
        with self._state_lock:
            if self._state is ServerState.CONNECTED:
                return
            if self._state is ServerState.STOPPED:
                raise PyTritonInvalidOperationError("Cannot connect to a stopped Triton server")
            self._wait_for_server()
            self._state = ServerState.CONNECTED

    def serve(
        self, monitoring_period_s: float = MONITORING_PERIOD_S, *, monitoring_period_sec: Optional[float] = None
    ) -> None:
        """Serve until SIGINT/SIGTERM, `stop()`, or an unrecoverable model error; then stop cleanly.

        Args:
            monitoring_period_s: how often to check that the server is still alive, in seconds.
            monitoring_period_sec: the same, under the name the PyTriton 0.5 documents use.
        """
        period = monitoring_period_s if monitoring_period_sec is None else monitoring_period_sec
        with stop_on_signals(self._finished, self._hurry):  # from before the ports open, until the stop ends
            self._launch()
            self.connect()
            self._serving()
            while self.is_alive() and not wait_in_main_thread(self._finished, period):
                pass
            self.stop()

    def stop(self) -> bool:
        """Stop serving: refuse new requests, finish in-flight ones (up to exit_timeout_secs), close ports.

        Returns:
            Whether a running server was stopped (False when it was not running or already stopped). A server
            never started stays as it was: models may still be bound and it may still run, as in PyTriton 0.7.
            Called from a callable or a route handler, it returns at once and the stop goes on: the request it
            was called from is answered before the server stops. Called again while a stop is under way (from
            another thread), it returns False once that stop has ended; from a signal's handler that interrupted
            that stop, it returns False at once (the stop goes on once the handler returns).
        """
        with self._state_lock:
            if self._state is ServerState.IDLE:
                return False
            under_way = self._state is ServerState.STOPPED
            self._state = ServerState.STOPPED
            if not under_way:
                self._stopping_thread = threading.get_ident()
        in_a_request = self._in_a_request()
        if under_way:  # by another call: this one too returns once the server has stopped (serve() returns then)
            # ...unless that call is this thread's, which a signal's handler interrupted: it goes on once this returns
            waits = not in_a_request and self._stopping_thread != threading.get_ident()
            while waits and not self._finished.wait(_STOP_POLL_S):
                pass
            return False
        if in_a_request:
            # The stop waits for the requests in flight, this one among them (and, on the event loop, for the
            # loop): it goes on in a thread of its own (which the interpreter's exit waits for), and this request
            # is answered as the drain expects.
            threading.Thread(target=self._end_serving, name="pytriton-stop").start()
        else:
            self._end_serving()
        return True

    def _end_serving(self) -> None:
        """Stop the server, then wake serve()."""
        try:
            self._stop_server()
        finally:
            self._finished.set()

    def _in_a_request(self) -> bool:
        """Whether this runs inside a request the server serves: in a callable or a route handler."""
        return current_model() is not None or CURRENT.get() is not None

    def is_alive(self) -> bool:
        """Whether the server runs and no model failed unrecoverably."""
        return self._state in (ServerState.SERVING, ServerState.CONNECTED) and self._is_alive_impl()

    def is_connected(self) -> bool:
        """Whether `connect()` found the server ready (and it has not been stopped since)."""
        return self._state is ServerState.CONNECTED

    def __enter__(self: _Triton) -> _Triton:
        """Start and connect when the lifecycle policy launches the server on startup (the default)."""
        if self._triton_lifecycle_policy.launch_triton_on_startup:
            self._launch()
            self.connect()
        return self

    def __exit__(self, *_: Any) -> None:
        """Stop the server when leaving the context."""
        self.stop()

    def _started(self) -> None:
        """Record that the server now runs (subclasses call it once their server started)."""
        with self._state_lock:
            if self._state is ServerState.IDLE:
                self._state = ServerState.SERVING

    def _launch(self) -> None:
        """Start the server unless it runs (a server this object does not run: nothing to do)."""

    def _serving(self) -> None:
        """serve() or run() was called and the server is ready: a subclass may say so (its startup line)."""

    def _hurry(self) -> None:
        """A second SIGINT/SIGTERM while stopping: a subclass may stop at once instead of draining."""

    def _bind_model(self, binding: Binding) -> None:
        """Serve a checked binding."""
        raise NotImplementedError

    def _wait_for_server(self) -> None:
        """Return once the server is ready; raise TimeoutError if it is not running or does not get ready."""
        raise NotImplementedError

    def _is_alive_impl(self) -> bool:
        """Whether the server still serves (called only while SERVING or CONNECTED)."""
        return True

    def _stop_server(self) -> None:
        """Stop the server and release what it holds (also when it never started)."""
