"""The running server: engine and transports on the background loop, started and stopped as one."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import errno
import gc
import logging
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Protocol, Set

from pytriton import __version__
from pytriton.core import served_loops
from pytriton.core.binders import OnBind, answers_strings, process_binder, thread_binder
from pytriton.core.doorbell import inbox_of
from pytriton.core.engine import Binder, Engine
from pytriton.core.instances import Instance, ModelInstance
from pytriton.core.process_instances.spawn import ProcessPlan, StartError
from pytriton.core.spec import ModelSpec
from pytriton.exceptions import PyTritonRuntimeError
from pytriton.options.limits import ServerLimits
from pytriton.options.log_trace import ServerSettings, TraceSetting
from pytriton.options.routes import CustomRoutes
from pytriton.options.server import ServerOptions
from pytriton.runtime.heap import thaw
from pytriton.runtime.logging_setup import use_default_logging
from pytriton.runtime.loop_thread import LoopThread
from pytriton.runtime.open_files import raise_open_files_limit
from pytriton.runtime.startup_line import model_line, startup_line
from pytriton.runtime.stopping import OVERRUN_S, StopSequence, where_stuck
from pytriton.runtime.tracing import Tracing
from pytriton.transport.inflate import InflationBudget
from pytriton.transport.receive_budget import ReceiveBudget
from pytriton.transport.sockets import bind_socket, bound_port

if TYPE_CHECKING:
    from pytriton.runtime.attach import AttachServer
    from pytriton.runtime.frontends.pool import FrontendPool

LOGGER = logging.getLogger("pytriton")


class Frontend(Protocol):
    """A transport server on the loop."""

    async def start(self) -> None:
        """Start serving."""

    async def stop(self, sending_s: float) -> None:
        """Stop serving; answers still leaving after a short grace get up to `sending_s`."""

    def hurry(self) -> None:
        """Stop waiting for answers still leaving (a second signal)."""

    async def steer(self) -> None:
        """From now on, answers ask their clients to reconnect elsewhere (the lame duck's first step)."""

    async def leave(self) -> None:
        """Keep serving, but ask clients to reconnect elsewhere (the lame duck before a stop)."""


class ServerRuntime:
    """The engine and its frontends, living on one background event loop."""

    def __init__(self, options: ServerOptions) -> None:
        """Start the loop and create the engine on it (no port is opened yet)."""
        options = dataclasses.replace(options, limits=_received_shared(options))
        self.options = options
        raise_open_files_limit(options.limits)  # before any instance or frontend process inherits it
        self._loop = LoopThread()
        self.stopped = threading.Event()
        self.failure: Optional[str] = None
        self.engine: Engine = self._loop.call(
            lambda: Engine(
                cache_capacity_bytes=options.cache_capacity_bytes,
                strict_readiness=options.strict_readiness,
                server_name=options.server_id,
                on_unrecoverable=self._on_unrecoverable,
                max_tensor_elements=options.limits.max_tensor_elements,
                max_response_bytes=options.limits.max_response_bytes,
                hung_call_warning_s=options.limits.hung_call_warning_s,
            )
        )
        self._hurried: asyncio.Event = self._loop.call(asyncio.Event)  # set by hurry(): the stop goes at once
        self.settings = ServerSettings(log_verbose=options.log_verbose, log_file=options.log_file, trace=options.trace)
        # What decompressed requests hold at once, over all of the server's frontends.
        self.inflation_budget = InflationBudget(options.limits.max_inflated_bytes)
        # What large request bodies and messages hold while they arrive, over all of its frontends.
        self.receive_budget = ReceiveBudget(options.limits.received_bytes())
        self.tracing = Tracing(self.settings.trace, self.engine.models, self.engine.versions_of)
        self.engine.rebound = self.tracing.refresh  # a model bound again by a load is traced as before
        self._frontends: List[Frontend] = []
        self.http_port: Optional[int] = None
        self.grpc_port: Optional[int] = None
        self.metrics_port: Optional[int] = None
        self.sagemaker_port: Optional[int] = None
        self.vertex_ai_port: Optional[int] = None
        self._openai_port: Optional[int] = None  # the OpenAI API's own port, when it has one
        self._attach: Optional[AttachServer] = None
        self.routes = CustomRoutes()  # the user's routes and mounted apps on the HTTP port (Triton.add_route)
        self._pool: Optional[FrontendPool] = None  # the frontend processes, when options.frontends > 1
        self._background: Set[asyncio.Task[None]] = set()  # frontend syncs started on the loop, until they end
        self.running = False
        self._announced = False  # whether the startup line was logged; models bound later get a line each

    def announce(self) -> None:
        """Log the startup line (once): where the server listens and the models it serves (serve()/run() call it).

        With nvidia-pytriton's lifecycle the ports open on `__enter__`, before any model is bound; the line
        waits for serve() or run(), when the models are there.
        """
        if self.running and not self._announced:
            self._announced = True
            use_default_logging()  # the application may have configured logging since the ports opened
            LOGGER.info("%s", startup_line(self.urls(), self.engine.models()))

    def add_model(
        self,
        spec: ModelSpec,
        callables: List[Callable[..., Any]],
        trace: Optional[TraceSetting] = None,
        on_bind: Optional[OnBind] = None,
    ) -> None:
        """Serve a model (before or after start), with `trace` overriding the server's trace settings for it.

        `on_bind(spec)` is called when a load binds the model again with a config override.
        """
        self._loop.call(self._add_thread_model, spec, callables, trace, on_bind)
        self._sync_frontends()
        self._refreeze()

    def add_process_model(
        self,
        spec: ModelSpec,
        plan: ProcessPlan,
        trace: Optional[TraceSetting] = None,
        config_for: Optional[Callable[[ModelSpec], Any]] = None,
    ) -> None:
        """Serve a model whose instances run in processes of their own; returns once every one is up.

        `config_for(spec)` is the model config a load with a config override gives the new processes.

        Raises:
            PyTritonRuntimeError: an instance did not start (the message has its traceback).
            ValueError: called on the server's event loop (an async def callable or route handler), where the
                processes' start cannot be waited for.
        """
        if self._loop.is_own_thread():
            raise ValueError(
                f"model '{spec.name}': ProcessInstances are bound from a thread other than the server's event loop "
                "(this async def callable or route handler runs on it): bind them from a plain def one"
            )
        self._loop.run(self._add_process_model(spec, plan, trace, config_for))
        self._sync_frontends()
        self._refreeze()

    def add_ensemble(self, spec: ModelSpec) -> None:
        """Serve an ensemble of models bound already (checked against them as Triton checks it at load).

        Raises:
            ValueError: the ensemble is refused (Triton's message).
        """
        self._loop.call(self._add_ensemble, spec)
        self._sync_frontends()
        self._refreeze()

    def _add_ensemble(self, spec: ModelSpec) -> None:
        model = self.engine.add_model(spec, [])
        if self._announced:
            LOGGER.info("serving %s", model_line(model))

    async def _add_process_model(
        self,
        spec: ModelSpec,
        plan: ProcessPlan,
        trace: Optional[TraceSetting],
        config_for: Optional[Callable[[ModelSpec], Any]],
    ) -> None:
        """Start the instance processes, then add the model (on the loop)."""
        from pytriton.core.process_instances.instance import start_instances

        self.engine.check_new(spec)
        plan = dataclasses.replace(plan, model_version=spec.version_str)  # what its custom metrics are labelled
        try:
            instances: List[ModelInstance] = list(await start_instances(plan))
        except StartError as error:
            raise PyTritonRuntimeError(f"model '{spec.name}' did not start: {error}") from None
        self._add_model(spec, instances, trace, process_binder(plan, config_for))

    def _add_thread_model(
        self,
        spec: ModelSpec,
        callables: List[Callable[..., Any]],
        trace: Optional[TraceSetting],
        on_bind: Optional[OnBind],
    ) -> None:
        """Add a model whose instances are threads of this process (on the loop).

        What their calls need from the system (a pipe for each sync instance, one for the loop) is
        opened now, so that a server out of file descriptors refuses the model here rather than failing
        its requests.

        Raises:
            PyTritonRuntimeError: a pipe could not be opened.
        """
        self.engine.check_new(spec)
        try:
            instances = [
                Instance(
                    fn,
                    f"pytriton-{spec.name}-{spec.version}-{index}",
                    (spec.name, spec.version_str),
                    count_strings=answers_strings(spec),
                )
                for index, fn in enumerate(callables)
            ]
            if any(instance.kind.uses_thread for instance in instances):
                inbox_of(asyncio.get_running_loop())  # where their results come back
        except OSError as error:
            hint = ""
            if error.errno in (errno.EMFILE, errno.ENFILE):
                hint = " (the server is out of file descriptors: each thread instance needs 2; raise `ulimit -n`)"
            raise PyTritonRuntimeError(f"model '{spec.name}' did not start: {error}{hint}") from None
        self._add_model(spec, list(instances), trace, thread_binder(list(callables), on_bind))

    def _add_model(
        self, spec: ModelSpec, instances: List[ModelInstance], trace: Optional[TraceSetting], binder: Binder
    ) -> None:
        """Add a model to the engine and trace it when its trace settings say so (on the loop)."""
        model = self.engine.add_model(spec, instances, binder)
        if trace is not None:
            self.settings.trace.add_model(spec.name, trace)
        self.tracing.refresh()
        if self._announced:
            LOGGER.info("serving %s", model_line(model))

    def _sync_frontends(self) -> None:
        """Return once every frontend process knows the models bound so far (a client may use one at once).

        On the loop's own thread (a model bound from an async def callable) the frontends learn of them once it
        goes on.
        """
        if self._pool is None:
            return
        if self._loop.is_own_thread():
            task = self._loop.loop.create_task(self._pool.sync())
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        else:
            self._loop.run(self._pool.sync())

    def wait_warmed_up(self) -> None:
        """Return once every model bound so far has run its warm-up requests (ModelConfig.model_warmup).

        On the loop's own thread (a model bound from an async def callable) it returns at once: the warm-ups run
        once the loop goes on.
        """
        if not self._loop.is_own_thread():
            self._loop.run(self.engine.warmed_up())

    def _refreeze(self) -> None:
        """A model bound while serving lives as long as the server: out of the collector's reach, as at start."""
        if self.running:
            gc.freeze()

    def start(self) -> None:
        """Open the ports and start the frontends."""
        use_default_logging()
        self._loop.run(self._start())
        self.running = True
        served_loops.serving(self._loop.ident, (port for port in (self.http_port, self.grpc_port) if port))
        # Every object alive now (modules, models, the engine) lives as long as the server: keep the
        # collector from scanning them again and again. Full collections of this heap (tritonclient,
        # grpc, numpy: ~40k objects) take 15-25 ms here and came several times a second under load.
        gc.freeze()

    async def _start(self) -> None:
        """Start every enabled frontend on the loop."""
        options = self.options
        try:
            if options.frontends > 1 and (options.http_enabled or options.grpc_enabled):
                await self._start_frontend_processes()
            if options.http_enabled and self._pool is None:
                self.http_port = await self._start_http()
            if options.grpc_enabled and self._pool is None:
                grpc_frontend = self._grpc_server(listen=True)
                await self._start_frontend(grpc_frontend)
                self.grpc_port = grpc_frontend.port
            if options.metrics_enabled:
                from pytriton.transport.metrics import MetricsFrontend

                metrics_frontend = MetricsFrontend(self.engine, options, self.routes)
                await self._start_frontend(metrics_frontend)
                self.metrics_port = metrics_frontend.port
            if options.openai_port is not None:
                self._openai_port = await self._serve_asgi(
                    self._openai_app(), options.http_address, options.openai_port, "OpenAI API"
                )
                LOGGER.info("the OpenAI API: http://%s:%d/v1", options.http_address, self._openai_port)
            if options.sagemaker is not None:
                self.sagemaker_port = await self._start_sagemaker()
                LOGGER.info(
                    "the SageMaker API: http://%s:%d (/ping, /invocations)", options.http_address, self.sagemaker_port
                )
            if options.vertex_ai is not None:
                self.vertex_ai_port = await self._start_vertex_ai()
                LOGGER.info(
                    "the Vertex AI API: http://%s:%d (health %s, predict %s)",
                    options.http_address,
                    self.vertex_ai_port,
                    options.vertex_ai.health_route,
                    options.vertex_ai.predict_route,
                )
            self._start_attach()
            self.tracing.refresh()
        except BaseException:
            await self._stop_frontends()
            raise

    async def _start_frontend_processes(self) -> None:
        """Listen on the HTTP and gRPC ports here, and serve them from frontend processes (and a share here)."""
        from pytriton.options.frontends import frontend_processes, hub_serves_connections
        from pytriton.runtime.frontends.pool import FrontendPool
        from pytriton.transport.grpc.server import listening_socket
        from pytriton.transport.grpc.servicer import InferenceServicer
        from pytriton.transport.grpc.settings import tls_context

        options = self.options
        if options.grpc_enabled and options.grpc_tls is not None:
            tls_context(options.grpc_tls)  # each frontend loads it: an unreadable certificate fails the start here
        http_socket = grpc_socket = None
        try:
            if options.http_enabled:
                http_socket = _listening_socket(options.http_address, options.http_port, "HTTP")
            if options.grpc_enabled:
                grpc_socket = listening_socket(options)
            hub_servicer = InferenceServicer(
                self.engine,
                server_version=__version__,
                header_forward_pattern=options.grpc_header_forward_pattern,
                settings=self.settings,
                max_stream_requests=options.limits.grpc_max_stream_requests,
            )
            hub_app = self.http_app()
            pool = FrontendPool(
                self.engine,
                options,
                frontend_processes(options.frontends),
                server_version=__version__,
                http_socket=http_socket,
                grpc_socket=grpc_socket,
                hub_app=hub_app,
                hub_servicer=hub_servicer,
                settings=self.settings,
            )
            if hub_serves_connections(options.frontends):
                pool.serve_here(await self._serve_here(hub_app, pool))
            self.http_port = bound_port(http_socket) if http_socket is not None else None
            self.grpc_port = bound_port(grpc_socket) if grpc_socket is not None else None
            await self._start_frontend(pool)
        except BaseException:
            for sock in (http_socket, grpc_socket):
                if sock is not None:
                    sock.close()
            raise
        self._pool = pool
        loop = asyncio.get_running_loop()
        self.engine.models_changed = lambda: loop.create_task(pool.sync())

    async def _serve_here(self, http_app: Any, pool: FrontendPool) -> Dict[str, Any]:
        """This process's own HTTP and gRPC servers for the connections the pool hands it, started, by kind."""
        from pytriton.runtime.frontends.hub_servers import SyncingApp, SyncingServicer

        here: Dict[str, Any] = {}
        if self.options.http_enabled:
            here["http"] = self._asgi_server(SyncingApp(http_app, pool.mirrored, pool.sync), None)
        if self.options.grpc_enabled:
            here["grpc"] = self._grpc_server(
                listen=False, servicer=lambda servicer: SyncingServicer(servicer, pool.mirrored, pool.sync)
            )
        for server in here.values():
            await self._start_frontend(server)
        return here

    def _start_attach(self) -> None:
        """Let RemoteTriton processes of this user bind models through the HTTP and gRPC ports' local sockets."""
        from pytriton.options.access import Category
        from pytriton.runtime.attach import AttachServer

        rule = self.options.http_access.rules.get(Category.MODEL_REPOSITORY)
        synced = self._pool.sync if self._pool is not None else None
        token = rule.value if rule else None
        self._attach = AttachServer(self.engine, token, self.options.exit_timeout_s, synced, self.routes)
        self._attach.start([port for port in (self.http_port, self.grpc_port) if port is not None])

    async def _start_http(self) -> int:
        """Start the HTTP/REST frontend; return its port."""
        return await self._serve_asgi(self.http_app(), self.options.http_address, self.options.http_port)

    def http_app(self) -> Any:
        """The HTTP/REST API (KServe v2) as an ASGI app over the engine; it must be called on `loop`."""
        from pytriton.transport.http.app import HttpFrontend

        options = self.options
        return HttpFrontend(
            self.engine,
            server_version=__version__,
            header_forward_pattern=options.http_header_forward_pattern,
            max_body_bytes=options.limits.max_body_bytes,
            max_json_bytes=options.limits.max_json_bytes,
            inflation_budget=self.inflation_budget,
            access=options.http_access,
            settings=self.settings,
            openai=self._openai_app() if options.openai_port is None else None,
            routes=self.routes,
        )

    def _openai_app(self) -> Any:
        """The OpenAI API (/v1) as an ASGI app over the engine."""
        from pytriton.transport.openai.app import OpenAIApp

        options = self.options
        return OpenAIApp(
            self.engine,
            api_key=options.openai_api_key,
            max_body_bytes=options.limits.max_json_bytes,
            access=options.http_access,
        )

    @property
    def openai_port(self) -> Optional[int]:
        """The port the OpenAI API is served on: its own, else the HTTP port."""
        return self._openai_port if self.options.openai_port is not None else self.http_port

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the engine and its frontends run on."""
        return self._loop.loop

    async def _start_sagemaker(self) -> int:
        """Start the SageMaker frontend (/ping, /invocations); return its port."""
        from pytriton.transport.cloud import SageMakerFrontend

        options = self.options
        assert options.sagemaker is not None
        app = SageMakerFrontend(self.engine, options.sagemaker, self._cloud_api())
        return await self._serve_asgi(app, options.http_address, options.sagemaker.port, "SageMaker")

    async def _start_vertex_ai(self) -> int:
        """Start the Vertex AI frontend (AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE); return its port."""
        from pytriton.transport.cloud import VertexAiFrontend

        options = self.options
        assert options.vertex_ai is not None
        app = VertexAiFrontend(self.engine, options.vertex_ai, self._cloud_api())
        return await self._serve_asgi(app, options.http_address, options.vertex_ai.port, "Vertex AI")

    def _cloud_api(self) -> Any:
        """The HTTP API a cloud frontend's routes lead to: restricted as on the HTTP port, without its settings."""
        from pytriton.transport.http.app import HttpFrontend

        options = self.options
        return HttpFrontend(
            self.engine,
            server_version=__version__,
            max_body_bytes=options.limits.max_body_bytes,
            max_json_bytes=options.limits.max_json_bytes,
            inflation_budget=self.inflation_budget,
            access=options.http_access,
        )

    async def _serve_asgi(self, app: Any, address: str, port: int, name: str = "HTTP") -> int:
        """Serve an ASGI app on a socket bound here (port 0: a free port); return the port."""
        sock = _listening_socket(address, port, name)
        try:
            await self._start_frontend(self._asgi_server(app, sock))
        except BaseException:
            sock.close()
            raise
        return bound_port(sock)

    def _asgi_server(self, app: Any, sock: Optional[socket.socket]) -> Any:
        """An HTTP server of `app` on a listening socket, or (None) for connections handed to it."""
        from pytriton.transport.http.server import AsgiServer

        return AsgiServer(
            app,
            sock,
            limits=self.options.limits,
            header_names=bool(self.options.http_header_forward_pattern),
            receive_budget=self.receive_budget,
        )

    def _grpc_server(self, listen: bool, servicer: Optional[Callable[[Any], Any]] = None) -> Any:
        """The gRPC server, on its port or (not `listen`) for connections handed to it; `servicer` wraps its own."""
        from pytriton.transport.grpc.server import GrpcFrontend

        return GrpcFrontend(
            self.engine,
            self.options,
            server_version=__version__,
            settings=self.settings,
            inflation_budget=self.inflation_budget,
            receive_budget=self.receive_budget,
            listen=listen,
            servicer=servicer,
        )

    async def _start_frontend(self, frontend: Frontend) -> None:
        """Start a frontend and remember it for shutdown."""
        await frontend.start()
        self._frontends.append(frontend)

    async def _stop_frontends(self, sending_s: float = 0.0) -> None:
        """Stop every started frontend, last started first (answers still leaving get up to `sending_s` in all)."""
        deadline = time.monotonic() + sending_s
        for frontend in reversed(self._frontends):  # kept in the list while they stop, for hurry() to reach
            try:
                await frontend.stop(max(deadline - time.monotonic(), 0.0))
            except Exception:
                LOGGER.exception("error while stopping a frontend")
        self._frontends.clear()

    @property
    def in_this_process(self) -> bool:
        """Whether the server's event loop runs in this process (not in a process this one was forked from)."""
        return self._loop.alive

    def on_loop_thread(self) -> bool:
        """Whether the calling thread is the server's event loop's."""
        return self._loop.is_own_thread()

    def stop(self) -> None:
        """Graceful stop: refuse new requests, finish in-flight ones (exit_timeout_secs), close ports."""
        started = time.monotonic()
        use_default_logging()  # the application may have configured logging while it served
        if self._loop.alive:
            budget_s = self.options.limits.lame_duck_s + self.options.exit_timeout_s + OVERRUN_S
            try:
                self._loop.run(self._stop(), timeout=budget_s)
            except concurrent.futures.TimeoutError:
                LOGGER.error(
                    "stopping: not done %.0f s after it began; closing anyway. Where it waits:\n%s",
                    budget_s,
                    where_stuck(self._loop.loop),
                )
            finally:
                self._loop.stop()
        served_loops.stopped(self._loop.ident)
        self.tracing.shutdown()
        if self.running:
            thaw()  # what the server held can be collected now (frozen again at exit: heap.py)
            LOGGER.info("stopped (%.1f s)", time.monotonic() - started)
        self.settings.log.restore()  # runtime log changes end with the server, as a tritonserver's
        self.running = False
        self.stopped.set()

    async def _stop(self) -> None:
        """Lame duck, refuse, drain, cut off what is left, close (see runtime/stopping.py)."""
        options = self.options
        await StopSequence(
            self.engine,
            frontends=self._frontends,
            close_ports=self._close_ports,
            lame_duck_s=options.limits.lame_duck_s,
            exit_timeout_s=options.exit_timeout_s,
            hurried=self._hurried,
            routes=self.routes,
        ).run()

    async def _close_ports(self, sending_s: float) -> None:
        """Stop the attach socket (RemoteTriton's models) and the frontends (answers still leaving get `sending_s`)."""
        if self._attach is not None:
            await self._attach.stop()
        await self._stop_frontends(sending_s)

    def hurry(self) -> None:
        """Make a stop under way (or the next one) end its drain at once; from any thread."""
        if self._loop.alive:
            self._loop.call_soon(self._hurry_now)

    def _hurry_now(self) -> None:
        """On the loop: end the drain, and the wait for answers still leaving, at once."""
        self._hurried.set()
        for frontend in self._frontends:
            frontend.hurry()

    def urls(self) -> List[str]:
        """The URLs the server listens on (http://..., grpc://..., metrics), once running."""
        options = self.options
        found: List[str] = []
        if self.http_port is not None:
            found.append(f"http://{options.http_address}:{self.http_port}")
        if self.grpc_port is not None:
            found.append(f"grpc://{options.grpc_address}:{self.grpc_port}")
        if self.metrics_port is not None:
            found.append(f"http://{options.metrics_address}:{self.metrics_port}/metrics")
        return found

    def _on_unrecoverable(self, reason: str) -> None:
        """A callable raised PyTritonUnrecoverableError: the server must stop (serve() returns)."""
        LOGGER.error("stopping the server: %s", reason)
        self.failure = reason
        self.engine.live = False
        self.stopped.set()


def _received_shared(options: ServerOptions) -> ServerLimits:
    """The limits with max_received_bytes set: the one given, else the default's share of each process holding a budget.

    With frontend processes, each frontend holds one, and this process too when it serves connections of the
    HTTP and gRPC ports (with 2) or ports of its own (the OpenAI API's, SageMaker, Vertex AI).
    """
    from pytriton.options.frontends import frontend_processes, hub_serves_connections

    limits = options.limits
    processes = 1
    if options.frontends > 1 and (options.http_enabled or options.grpc_enabled):
        own_ports = options.openai_port is not None or options.sagemaker is not None or options.vertex_ai is not None
        serves_here = own_ports or hub_serves_connections(options.frontends)
        processes = frontend_processes(options.frontends) + int(serves_here)
    return dataclasses.replace(limits, max_received_bytes=limits.received_bytes(processes))


def _listening_socket(address: str, port: int, name: str) -> socket.socket:
    """A socket bound and listening on address:port (OSError names the endpoint when it cannot be)."""
    try:
        return bind_socket(address, port)
    except OSError as error:
        raise OSError(error.errno, f"{name} cannot listen on {address}:{port}: {error.strerror}") from None
