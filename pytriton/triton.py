"""The Triton server facade: bind models, then run (background) or serve (blocking)."""

from __future__ import annotations

import atexit
import copy
import dataclasses
import logging
import os
import pathlib
import weakref
from typing import Any, Callable, List, Optional, Sequence, Union

from pytriton.context import attach_context
from pytriton.core.spec import ModelSpec
from pytriton.exceptions import PyTritonInvalidOperationError
from pytriton.instances import ProcessInstances
from pytriton.lifecycle import DefaultTritonLifecyclePolicy, TritonLifecyclePolicy, VertextAILifecyclePolicy
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.models import as_callables, build_model, rebound_config, warn_of_callables_without_requests
from pytriton.options.frontends import frontend_processes, resolve_frontends
from pytriton.options.limits import ServerLimits
from pytriton.options.model_trace import model_trace_setting
from pytriton.options.openai import ensure_sendable, resolve_openai_port
from pytriton.runtime.logging_setup import LogUse, configure_logging, release_logging
from pytriton.runtime.options import resolve_options
from pytriton.runtime.server import ServerRuntime
from pytriton.security import (
    DEFAULT_PROTECTED_ENDPOINTS,
    TRITON_ACCESS_HEADER,
    VALID_TRITON_ENDPOINTS,
    TritonSecurityConfig,
)
from pytriton.triton_base import MONITORING_PERIOD_S, MONITORING_PERIOD_SEC, Binding, ServerState, TritonBase
from pytriton.triton_config import TritonConfig, resolve_config

LOGGER = logging.getLogger("pytriton")

# The model endpoints, as nvidia-pytriton names them.
MODEL_URL = "/v2/models/{model_name}"
MODEL_READY_URL = f"{MODEL_URL}/ready/"
MODEL_CONFIG_URL = f"{MODEL_URL}/config/"
MODEL_INFER_URL = f"{MODEL_URL}/infer/"

__all__ = [  # noqa: F822 - RemoteTriton comes from __getattr__
    "DEFAULT_PROTECTED_ENDPOINTS",
    "MODEL_CONFIG_URL",
    "MODEL_INFER_URL",
    "MODEL_READY_URL",
    "MODEL_URL",
    "MONITORING_PERIOD_S",
    "MONITORING_PERIOD_SEC",
    "TRITON_ACCESS_HEADER",
    "VALID_TRITON_ENDPOINTS",
    "DefaultTritonLifecyclePolicy",
    "RemoteTriton",
    "Triton",
    "TritonBase",
    "TritonConfig",
    "TritonLifecyclePolicy",
    "TritonSecurityConfig",
    "VertextAILifecyclePolicy",
]


def __getattr__(name: str) -> Any:
    """RemoteTriton, imported when first asked for (it pulls in the client package)."""
    if name == "RemoteTriton":
        from pytriton.remote_triton import RemoteTriton

        return RemoteTriton
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Triton(TritonBase):
    """A Triton-protocol server for Python models, running in this process.

    Examples:
        with Triton() as triton:
            triton.bind(model_name="Identity", infer_func=fn, inputs=[...], outputs=[...])
            triton.serve()
    """

    def __init__(
        self,
        *,
        config: Optional[TritonConfig] = None,
        workspace: Union[str, pathlib.Path, None] = None,
        triton_lifecycle_policy: Optional[TritonLifecyclePolicy] = None,
        security_config: Optional[TritonSecurityConfig] = None,
        limits: Optional[ServerLimits] = None,
        frontends: Optional[int] = None,
        openai_port: Optional[int] = None,
    ) -> None:
        """Create a server; options come from `config`, then PYTRITON_TRITON_CONFIG_* variables, then defaults.

        Args:
            config: server options.
            workspace: accepted for compatibility; this engine writes no model store, so nothing is created.
            triton_lifecycle_policy: when the server starts: on `__enter__` by default, at `run()`/`serve()`
                with `launch_triton_on_startup=False` (the default with allow_vertex_ai).
            security_config: the APIs restricted to an access token, and the token; by default a generated
                token guards shared-memory, model-repository, statistics, trace and logging.
            limits: request size, timeout and connection limits; without it, PYTRITON_LIMIT_* variables over
                safe defaults (see `pytriton.runtime.limits`).
            frontends: processes that serve the HTTP and gRPC ports, each on a core of its own, this one (which
                keeps the models) among them; without it PYTRITON_FRONTENDS, else 1: this process serves them
                itself (docs/configuration.md, "Frontend processes").
            openai_port: serve the OpenAI API (/v1, models bound with `openai=`) on a port of its own (0: a free
                one) instead of the HTTP port; without it PYTRITON_OPENAI_PORT, else the HTTP port (docs/openai.md).
        """
        self._config = resolve_config(config)
        # before the options are read: their warnings (an option with no effect) go where the rest of the log goes
        self._log_use: Optional[LogUse] = configure_logging(self._config.log_verbose, self._config.log_file)
        self._security_config = security_config or TritonSecurityConfig()
        token = self._security_config.access_token
        self._options = dataclasses.replace(
            resolve_options(
                self._config,
                limits,
                access_token=token,
                token_endpoints=self._security_config.restricted_endpoints or (),
            ),
            frontends=resolve_frontends(frontends),
            openai_api_key=self._security_config.openai_api_key,
            openai_port=resolve_openai_port(openai_port),
        )
        if triton_lifecycle_policy is None:
            # only an explicit allow_vertex_ai counts, as in 0.7; self._config holds it cast ("false" is false)
            vertex_ai = config is not None and config.allow_vertex_ai is not None and bool(self._config.allow_vertex_ai)
            triton_lifecycle_policy = VertextAILifecyclePolicy if vertex_ai else DefaultTritonLifecyclePolicy
        options = self._options
        scheme, address, port = ("http", options.http_address, options.http_port)
        if not options.http_enabled:
            scheme, address, port = ("grpc", options.grpc_address, options.grpc_port)
        super().__init__(
            url=f"{scheme}://{address}:{port}",
            workspace=workspace,
            triton_lifecycle_policy=triton_lifecycle_policy,
            access_token=token,
        )
        self._runtime = ServerRuntime(self._options)
        self._finished = self._runtime.stopped  # the runtime sets it when a model fails unrecoverably
        self._pid = os.getpid()  # the process the server lives in: its loop's thread is not in a fork of it
        # A server never started holds its loop's thread until it is stopped; stop() before run() does not stop it
        # (0.7 can still run then): it ends with this object, or at exit.
        weakref.finalize(self, _release_unstarted, self._runtime, self._log_use)

    def run(self) -> None:
        """Start serving in the background and return once every port accepts connections."""
        self._launch()
        self.connect()
        self._serving()

    def add_route(self, path: str, handler: Callable[..., Any], methods: Sequence[str] = ("POST",)) -> None:
        """Serve `handler` at `path` on the HTTP port (before or after run()); docs/composition.md.

        `handler(request: RouteRequest)` (pytriton.routes) returns a RouteResponse, a JSON-able value, str or
        bytes; an `async def` handler runs on the event loop, a plain one in a worker thread. A path segment
        `{name}` matches any one segment (`request.path_params["name"]`). Inside it, pytriton.compose calls
        bound models in-process. Paths under /v1 and /v2 are refused; the access rules of the API "custom"
        apply (TritonSecurityConfig.restricted_endpoints, http_restricted_api).
        """
        self._runtime.routes.add_route(path, handler, methods)

    def mount(self, prefix: str, app: Any) -> None:
        """Serve an ASGI app for every path under `prefix` on the HTTP port (its scope's root_path is `prefix`)."""
        self._runtime.routes.mount(prefix, app)

    def get_access_token(self) -> Optional[str]:
        """The token the restricted APIs expect (None when nothing is restricted)."""
        return self._security_config.access_token

    @property
    def failure(self) -> Optional[str]:
        """Why the server stopped on its own (a model raised PyTritonUnrecoverableError); None otherwise.

        After `serve()` returns, `sys.exit(1 if triton.failure else 0)` lets an orchestrator restart the process.
        """
        return self._runtime.failure

    def urls(self) -> List[str]:
        """The URLs the server listens on (http://..., grpc://..., metrics)."""
        return self._runtime.urls()

    @property
    def http_port(self) -> Optional[int]:
        """The port HTTP listens on (useful with http_port=0), once running."""
        return self._runtime.http_port

    @property
    def grpc_port(self) -> Optional[int]:
        """The port gRPC listens on (useful with grpc_port=0), once running."""
        return self._runtime.grpc_port

    @property
    def metrics_port(self) -> Optional[int]:
        """The port metrics are served on (useful with metrics_port=0), once running."""
        return self._runtime.metrics_port

    @property
    def openai_port(self) -> Optional[int]:
        """The port of the OpenAI API: its own (`openai_port`), else the HTTP port; once running."""
        return self._runtime.openai_port

    def _launch(self) -> None:
        """Open the ports and serve, unless already serving."""
        if self._state is ServerState.STOPPED:
            raise PyTritonInvalidOperationError("Cannot run a stopped Triton server")
        self._check_in_the_serving_process()
        if not self._runtime.running:
            self._runtime.start()
            self._started()
            atexit.register(self._stop_at_exit)

    def _stop_at_exit(self) -> None:
        """At exit, a server still running stops as stop() stops it, as in 0.7: the requests in flight are answered.

        Not in a process forked from this one, which exits without the server's threads: the server is its parent's.
        """
        if os.getpid() == self._pid:
            self.stop()

    def _serving(self) -> None:
        """serve() or run() was called: log the startup line (once), with the models bound by now."""
        self._runtime.announce()

    def _hurry(self) -> None:
        """A second signal: the stop under way answers what is still open now."""
        self._runtime.hurry()

    def _wait_for_server(self) -> None:
        """Wait for the models' warm-ups; a server that was never started cannot become ready."""
        if not self._runtime.running:
            raise TimeoutError("Triton Inference Server is not running: start it with run() or serve()")
        self._runtime.wait_warmed_up()

    def _bind_model(self, binding: Binding) -> None:
        """Add a model to the engine and let decorators find its config."""
        self._check_in_the_serving_process()
        model_name = binding.model_name
        if binding.openai is not None and frontend_processes(self._options.frontends):
            ensure_sendable(binding.openai)  # here, not later on the loop, where the frontends would lose it
        processes: Optional[ProcessInstances] = None
        callables: List[Callable[..., Any]] = []
        if isinstance(binding.infer_func, ProcessInstances):
            processes = binding.infer_func
        else:
            callables = as_callables(binding.infer_func)
            warn_of_callables_without_requests(model_name, callables)
        spec, triton_model_config = build_model(
            model_name=model_name,
            model_version=binding.model_version,
            inputs=binding.inputs,
            outputs=binding.outputs,
            config=binding.config,
            instance_count=processes.count if processes is not None else len(callables),
            strict=binding.strict,
            openai=binding.openai,
        )
        if spec.response_cache and self._options.cache_capacity_bytes is None:
            LOGGER.warning(
                "model '%s' asks for the response cache, but no cache is configured: set "
                "TritonConfig(cache_config=['local,size=<bytes>']) to enable it",
                model_name,
            )
        trace = model_trace_setting(model_name, binding.trace_config, self._options.trace)
        for fn in callables:  # before the model is added: its warm-up may call decorators that read it
            self.triton_context.model_configs[fn] = copy.deepcopy(triton_model_config)
            attach_context(fn, self.triton_context)
        context = self.triton_context

        def config_for(bound: ModelSpec) -> TritonModelConfig:
            return rebound_config(triton_model_config, bound)

        def on_bind(bound: ModelSpec) -> None:  # a load bound the model again: decorators read its new config
            for fn in callables:
                context.model_configs[fn] = config_for(bound)

        try:
            if processes is not None:
                plan = processes.plan(model_name, copy.deepcopy(triton_model_config))
                self._runtime.add_process_model(spec, plan, trace, config_for)
            else:
                self._runtime.add_model(spec, callables, trace, on_bind)
        except ValueError as error:
            raise PyTritonInvalidOperationError(str(error)) from None
        if self.is_connected():
            self._runtime.wait_warmed_up()  # as in PyTriton 0.7, a model bound while serving is ready on return

    def _bind_ensemble(self, spec: ModelSpec) -> None:
        """Serve an ensemble over the models bound already."""
        self._check_in_the_serving_process()
        try:
            self._runtime.add_ensemble(spec)
        except ValueError as error:
            raise PyTritonInvalidOperationError(str(error)) from None

    def _is_alive_impl(self) -> bool:
        """Whether the engine runs (in this process) and no model failed unrecoverably."""
        return self._runtime.running and self._runtime.in_this_process and self._runtime.failure is None

    def _check_in_the_serving_process(self) -> None:
        """Refuse to bind to or start a server from a process forked from the one it lives in (its loop is not here)."""
        if os.getpid() != self._pid:
            raise PyTritonInvalidOperationError(
                f"The Triton server runs in process {self._pid}, and this process ({os.getpid()}) was forked from it: "
                "bind models to it and run it in that process"
            )

    def _in_a_request(self) -> bool:
        """Inside a callable or a handler, or on the server's event loop (an `async def` one)."""
        return self._runtime.on_loop_thread() or super()._in_a_request()

    def _stop_server(self) -> None:
        """Drain the engine and close the ports (also ends the loop thread of a server never started)."""
        atexit.unregister(self._stop_at_exit)
        try:
            self._runtime.stop()
        finally:
            if self._log_use is not None:  # a later server's records go where its own options say
                release_logging(self._log_use)
                self._log_use = None


def _release_unstarted(runtime: ServerRuntime, log_use: Optional[LogUse]) -> None:
    """End the loop of a runtime never started, and what its options added to the log (one started: stop())."""
    if not runtime.running and not runtime.stopped.is_set():
        runtime.stop()
        if log_use is not None:
            release_logging(log_use)
