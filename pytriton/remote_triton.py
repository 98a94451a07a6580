"""RemoteTriton: bind models from this process into a pytriton server running in another process on this host.

As in nvidia-pytriton 0.7, the models are served by the running server (started by `Triton().serve()` or
`pytriton serve`) while their callables run here, and they are unloaded when the RemoteTriton closes;
the server keeps its own models. The callables are served exactly as process instances are: each
instance answers the server's jobs over a local socket of its own, tensors through shared memory
(see `pytriton.runtime.attach` for who may attach, and how that is checked). Custom routes added here
(`add_route`) are served by the server, their handlers run here (`pytriton.runtime.remote_routes`), and
custom metrics made here reach the server's metrics port.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import logging
import os
import pathlib
import select
import socket
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from pytriton import __version__
from pytriton.client._loop_guard import would_wait_for_this_loop
from pytriton.client._url import TritonUrl
from pytriton.client.exceptions import PyTritonClientTimeoutError
from pytriton.context import attach_context
from pytriton.core.custom_metrics import REGISTRY
from pytriton.core.process_instances.host import InstanceHost
from pytriton.core.process_instances.protocol import METRICS
from pytriton.core.spec import ModelSpec
from pytriton.exceptions import PyTritonBadParameterError, PyTritonInvalidOperationError, PyTritonValidationError
from pytriton.instances import DEFAULT_SHM_BUDGET_BYTES, ProcessInstances
from pytriton.ipc.channel import BlockingChannel, ChannelClosed
from pytriton.lifecycle import TritonLifecyclePolicy
from pytriton.models import as_callables, build_model, warn_of_callables_without_requests
from pytriton.runtime.attach import (
    ACCEPTED,
    ATTACH_BIND,
    ATTACH_INSTANCE,
    ATTACH_ROUTE,
    BOUND,
    AttachBind,
    ask_token,
    attach_address,
    peer_is_trusted,
    peer_pid,
)
from pytriton.runtime.remote_routes import AttachRoute, RouteHost
from pytriton.triton_base import Binding, TritonBase

LOGGER = logging.getLogger("pytriton")

# How long connect() waits for a server that is starting (nvidia-pytriton's DEFAULT_TRITON_STARTUP_TIMEOUT_S).
_STARTUP_TIMEOUT_S = 120.0
# How long one step of a binding (the server's answer) may take.
_ANSWER_TIMEOUT_S = 60.0
# How long stop() waits for the server to drain a model and release its instances, and how often it looks.
_RELEASE_TIMEOUT_S = 120.0
_RELEASE_POLL_S = 0.05


_workspace_warned = threading.Event()


def _warn_workspace_once() -> None:
    """Say once per process that RemoteTriton's `workspace` is not used."""
    if not _workspace_warned.is_set():
        _workspace_warned.set()
        LOGGER.warning(
            "RemoteTriton: workspace is not used; the server is reached through a local socket of its network "
            "namespace, not through files (containers attach when they share the server's network namespace, "
            "e.g. one Kubernetes pod, and are given access_token unless they may read the server's /proc entry)"
        )


def _hung_up(sock: socket.socket) -> bool:
    """Whether the other end of `sock` closed it, even with data still unread here."""
    if not hasattr(select, "poll"):
        return False
    poller = select.poll()
    try:
        poller.register(sock.fileno(), _HANG_UP)
        return any(events & _HANG_UP for _, events in poller.poll(0))
    except (OSError, ValueError):  # closed here already
        return True


_HANG_UP = getattr(select, "POLLRDHUP", 0) | getattr(select, "POLLHUP", 0)


class ServerNotFoundError(PyTritonInvalidOperationError, PyTritonClientTimeoutError, TimeoutError):
    """No server to attach to came up within connect()'s wait.

    Also nvidia-pytriton 0.7's exceptions for it, so that code written for 0.7 catches it: its RemoteTriton raises
    PyTritonClientTimeoutError there, and its connect() documents TimeoutError.
    """


class _RemoteModel:
    """A model this RemoteTriton binds: its spec, its callables, and once bound its connections."""

    def __init__(self, spec: ModelSpec, callables: List[Callable[..., Any]]) -> None:
        self.spec = spec
        self.callables = callables
        self.control: Optional[BlockingChannel] = None
        self.hosts: List[Tuple[InstanceHost, threading.Thread]] = []
        self.watcher: Optional[threading.Thread] = None
        self.gone = threading.Event()  # the server closed the binding (it stopped, or unloaded the model)


class _RemoteRoute:
    """A custom route this RemoteTriton adds to the server; once added, its connection and the thread serving it."""

    def __init__(self, path: str, handler: Callable[..., Any], methods: Tuple[str, ...]) -> None:
        self.path = path
        self.handler = handler
        self.methods = methods
        self.host: Optional[RouteHost] = None
        self.thread: Optional[threading.Thread] = None


class RemoteTriton(TritonBase):
    """Binds models into a running pytriton server on this host; they are unloaded when it closes.

    Examples:
        with RemoteTriton(url="localhost") as triton:
            triton.bind(model_name="AddSub", infer_func=fn, inputs=[...], outputs=[...])
            triton.serve()
    """

    def __init__(
        self,
        url: str,
        workspace: Union[str, pathlib.Path, None] = None,
        access_token: Optional[str] = None,
    ) -> None:
        """Attach to the server at `url` (http or grpc, default ports 8000 and 8001).

        Args:
            url: the server's HTTP or gRPC url; it must be on this host (attachment is local).
            workspace: accepted for compatibility and not used (a warning says so once): nvidia-pytriton's
                cross-container mode shared socket files through it; here the server is reached through
                an abstract socket of its network namespace, which needs no shared folder.
            access_token: the server's access token (for its model-repository API); without one, the token
                is read from the server when this process may (its user, same host and PID namespace, Linux).

        Raises:
            PyTritonInvalidOperationError: created on the event loop of the server at `url` (in its process).
        """
        if workspace is not None:
            _warn_workspace_once()
        self._triton_url = TritonUrl.from_url(url)
        if would_wait_for_this_loop(self._triton_url):
            raise PyTritonInvalidOperationError(
                f"RemoteTriton created on the event loop of the server at {self._triton_url.without_scheme}, which "
                "runs in this process (an async def callable or route handler): it would wait for the loop it "
                "blocks. Bind the model on that server's Triton (triton.bind works there)."
            )
        super().__init__(
            url=self._triton_url.with_scheme,
            workspace=workspace,
            triton_lifecycle_policy=TritonLifecyclePolicy(launch_triton_on_startup=True, local_model_store=False),
            access_token=access_token,
        )
        self._models: List[_RemoteModel] = []
        self._routes: List[_RemoteRoute] = []
        self._started()  # the server is somebody else's: there is nothing to start
        atexit.register(self.stop)

    def _bind_model(self, binding: Binding) -> None:
        """Bind a model (at once when connected, else at connect()).

        Raises:
            PyTritonInvalidOperationError: the server refused the model (e.g. its name is taken).
        """
        if isinstance(binding.infer_func, ProcessInstances):
            raise PyTritonBadParameterError("RemoteTriton runs its callables in this process: pass the callable")
        if binding.trace_config:
            LOGGER.warning("RemoteTriton: trace_config applies to the server's own models only; it is ignored")
        callables = as_callables(binding.infer_func)
        warn_of_callables_without_requests(binding.model_name, callables)
        spec, triton_model_config = build_model(
            model_name=binding.model_name,
            model_version=binding.model_version,
            inputs=binding.inputs,
            outputs=binding.outputs,
            config=binding.config,
            instance_count=len(callables),
            strict=binding.strict,
            openai=binding.openai,
        )
        for fn in callables:
            self.triton_context.model_configs[fn] = copy.deepcopy(triton_model_config)
            attach_context(fn, self.triton_context)
        model = _RemoteModel(spec, callables)
        with self._state_lock:
            self._models.append(model)
            if self.is_connected():
                self._attach(model)

    def add_route(self, path: str, handler: Callable[..., Any], methods: Sequence[str] = ("POST",)) -> None:
        """Serve `handler`, which runs in this process, at `path` on the server's HTTP port, until this closes.

        As `Triton.add_route` (docs/composition.md): `handler(request: RouteRequest)` returns a RouteResponse, a
        JSON-able value, str or bytes; an `async def` handler runs on an event loop of the route's own, a plain
        one in a worker thread. The server forwards each request here and the answer back, and applies its own
        access rules of the API "custom". pytriton.compose calls the server's models (those bound here too) from
        the handler. A client that leaves cancels an async handler; a sync one's model calls fail from then on.

        Raises:
            PyTritonValidationError: the server refused the path (reserved, malformed, or served already).
            PyTritonInvalidOperationError: the server refused the route (the access token, another version).
        """
        if not callable(handler):
            raise PyTritonValidationError(f"route '{path}': the handler must be callable")
        route = _RemoteRoute(path, handler, tuple(str(method).upper() for method in methods))
        with self._state_lock:
            if self.is_connected():
                self._attach_route(route)
            self._routes.append(route)

    def mount(self, prefix: str, app: Any) -> None:
        """Not available on a RemoteTriton: an ASGI app is served by the server's own process.

        Raises:
            PyTritonInvalidOperationError: always.
        """
        raise PyTritonInvalidOperationError(
            f"RemoteTriton cannot mount an ASGI app (at '{prefix}'): an app's receive() and send() do not cross "
            "processes. Serve its paths with RemoteTriton.add_route handlers, or mount it with Triton.mount in "
            "the server's own process"
        )

    def _wait_for_server(self) -> None:
        """Bind every model bound so far into the server, and add every route, waiting for a starting server."""
        for model in self._models:
            if model.control is None:
                self._attach(model)
        for route in self._routes:
            if route.host is None:
                self._attach_route(route)

    def _is_alive_impl(self) -> bool:
        """Whether the server still serves every model bound here, and every route added here."""
        return all(not model.gone.is_set() for model in self._models) and all(
            route.host is None or not route.host.gone.is_set() for route in self._routes
        )

    def _stop_server(self) -> None:
        """Unload the models from the server (it lets their requests finish) and stop serving them."""
        atexit.unregister(self.stop)
        self._ship_metrics()
        for model in self._models:
            if model.control is not None:
                with contextlib.suppress(OSError):
                    model.control.sock.shutdown(socket.SHUT_RDWR)
        for route in self._routes:
            if route.host is not None:
                with contextlib.suppress(OSError):
                    route.host.channel.sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + _RELEASE_TIMEOUT_S
        for route in self._routes:
            if route.thread is not None:
                route.thread.join(max(deadline - time.monotonic(), 0))
        for model in self._models:
            for host, thread in model.hosts:
                # A call still running once the server closed its instance was cut off there (its drain is over):
                # as a thread instance's, one that never returns does not hold the stop.
                while thread.is_alive() and time.monotonic() < deadline:
                    if host.running_requests and _hung_up(host.channel.sock):
                        break
                    thread.join(min(_RELEASE_POLL_S, max(deadline - time.monotonic(), 0)))
            if model.control is not None:
                model.control.close()

    def _ship_metrics(self) -> None:
        """Send what this process changed in custom metrics outside its callables since their last answers."""
        updates = REGISTRY.take_updates()
        if not updates:
            return
        for model in self._models:
            if model.control is not None and not model.gone.is_set():
                with contextlib.suppress(ChannelClosed, OSError):
                    model.control.send((METRICS, updates))
                    return

    # -- binding --------------------------------------------------------------------------------

    def _attach(self, model: _RemoteModel) -> None:
        """Bind one model: the control connection, one connection per instance, then the server's BOUND."""
        control = BlockingChannel(self._connect_to_server(wait=True))
        control.sock.settimeout(_ANSWER_TIMEOUT_S)
        token = self._access_token if self._access_token is not None else self._server_token()
        metrics: Tuple[Any, ...] = ()
        if peer_pid(control.sock) != os.getpid():  # a server of this process counts this process's metrics itself
            REGISTRY.start_shipping(None)
            metrics = tuple(REGISTRY.take_updates())
        request = AttachBind(__version__, model.spec, len(model.callables), token, DEFAULT_SHM_BUDGET_BYTES, metrics)
        try:
            control.send((ATTACH_BIND, request))
            bind_id = self._answer(control, ACCEPTED, model)[1]
            for index, fn in enumerate(model.callables):
                channel = BlockingChannel(self._connect_to_server(wait=False))
                host = InstanceHost(channel, fn, DEFAULT_SHM_BUDGET_BYTES, (model.spec.name, model.spec.version_str))
                channel.send((ATTACH_INSTANCE, bind_id, index, host.kind.value, os.getpid()))
                thread = threading.Thread(
                    target=host.serve, name=f"pytriton-remote-{model.spec.name}-{index}", daemon=True
                )
                thread.start()
                model.hosts.append((host, thread))
            self._answer(control, BOUND, model)
        except BaseException:
            control.close()
            raise
        control.sock.settimeout(None)
        model.control = control
        model.watcher = threading.Thread(target=self._watch, args=(model,), daemon=True)
        model.watcher.start()
        LOGGER.info("model '%s' bound into the server at %s", model.spec.name, self._triton_url.with_scheme)

    def _attach_route(self, route: _RemoteRoute) -> None:
        """Add one route to the server through a connection of its own, then serve its requests in a thread."""
        channel = BlockingChannel(self._connect_to_server(wait=True))
        try:
            channel.sock.settimeout(_ANSWER_TIMEOUT_S)
            token = self._access_token if self._access_token is not None else self._server_token()
            attach = AttachRoute(__version__, route.path, route.methods, token, DEFAULT_SHM_BUDGET_BYTES)
            channel.send((ATTACH_ROUTE, attach))
            try:
                head = channel.receive().head
            except (ChannelClosed, OSError) as error:
                raise PyTritonInvalidOperationError(
                    f"the server closed the connection of route '{route.path}': {error}"
                ) from None
            if head[0] != ACCEPTED:
                reason = head[1] if len(head) > 1 else "an unexpected answer"
                refused = PyTritonValidationError if len(head) > 2 and head[2] == "invalid" else None
                message = f"the server refused route '{route.path}': {reason}"
                raise refused(message) if refused is not None else PyTritonInvalidOperationError(message)
            channel.sock.settimeout(None)
        except BaseException:
            channel.close()
            raise
        route.host = RouteHost(channel, route.handler, DEFAULT_SHM_BUDGET_BYTES)
        route.thread = threading.Thread(target=route.host.serve, name=f"pytriton-route-{route.path}", daemon=True)
        route.thread.start()
        LOGGER.info("route '%s' added to the server at %s", route.path, self._triton_url.with_scheme)

    def _server_token(self) -> Optional[str]:
        """The server's model-repository token, read from the server itself where the kernel lets this process."""
        # None also from a server of another version: its refusal of the binding says why.
        return ask_token(self._connect_to_server(wait=False), _ANSWER_TIMEOUT_S)

    def _answer(self, control: BlockingChannel, expected: int, model: _RemoteModel) -> Any:
        """The server's next answer on a control connection, or its refusal raised."""
        try:
            head = control.receive().head
        except (ChannelClosed, OSError) as error:
            message = f"the server closed the binding of '{model.spec.name}': {error}"
            raise PyTritonInvalidOperationError(message) from None
        if head[0] != expected:
            reason = head[1] if len(head) > 1 else "an unexpected answer"
            raise PyTritonInvalidOperationError(f"the server refused model '{model.spec.name}': {reason}")
        return head

    def _watch(self, model: _RemoteModel) -> None:
        """Wait for the end of a binding (the server stopped or dropped it)."""
        assert model.control is not None
        with contextlib.suppress(ChannelClosed, OSError):
            while True:
                model.control.receive()
        model.gone.set()

    def _connect_to_server(self, wait: bool) -> socket.socket:
        """A connection to the server's attach socket, once it checks out as this user's (or root's)."""
        address = attach_address(self._triton_url.port)
        deadline = time.monotonic() + (_STARTUP_TIMEOUT_S if wait else 0)
        delay = 0.05
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(address)
                break
            except OSError as error:
                sock.close()
                if time.monotonic() >= deadline:
                    raise ServerNotFoundError(
                        f"no pytriton server to attach to at {self._triton_url.with_scheme} on this host ({error}); "
                        "RemoteTriton attaches to a server of this user on this machine"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        if not peer_is_trusted(sock):
            sock.close()
            raise PyTritonInvalidOperationError(
                f"the process listening for {self._triton_url.with_scheme} belongs to another user; not attaching"
            )
        return sock
