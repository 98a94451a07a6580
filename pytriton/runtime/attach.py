"""Where RemoteTriton attaches: a local socket through which another process binds models into this server.

The socket is a Unix socket, never a network one. On Linux it lives in the abstract namespace
(`pytriton-<uid>-<port>` after a NUL byte, one per HTTP and gRPC port): no file is left behind, whatever kills the
server, and every process in the server's network namespace can reach it (in a Kubernetes pod, every container of
the pod; with `--network=host`, every container of the host). Elsewhere it is a file in a directory only its owner
may enter (`$TMPDIR/pytriton-<uid>`).

Who may bind, twice checked:
- credentials: both ends check who the other is (SO_PEERCRED). The server accepts only processes of its own
  user (or root), and RemoteTriton talks only to a server of its own user (or root), so another user can
  neither bind nor replace a model, nor pose as the server to receive a model's tensors.
- the token: when the server restricts its model-repository API (the default), a binding must carry that
  API's token. A RemoteTriton given no `access_token` (and `pytriton token`) reads it from the server (Linux):
  the server keeps it in a memfd, and the RemoteTriton opens `/proc/<server pid>/fd/<n>` (TOKEN_WHERE says n; the pid
  is the socket's peer). The kernel lets only processes that could read the server's memory do that:
  its user, in a PID namespace that sees the server. A process that merely shares its network namespace
  (another container of the pod, running as the same uid or as root) must be given the token.

A RemoteTriton binding is one control connection (ATTACH_BIND: the model, then BOUND or BIND_FAILED; later
(METRICS, updates) from the RemoteTriton's process, made outside its callables) and one connection per instance
(ATTACH_INSTANCE), over which the server sends jobs exactly as to a process instance it spawned
(`core/process_instances/instance.py`), custom metrics included. When the control connection closes (the
RemoteTriton stopped, or its process died) the server unloads the model and keeps its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import os
import socket
import stat
import struct
import sys
import tempfile
from typing import Any, Awaitable, Callable, Dict, List, Optional, Set, Tuple

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

from pytriton import __version__
from pytriton.core.custom_metrics import REGISTRY
from pytriton.core.engine import Engine, Phase
from pytriton.core.instances import ModelInstance
from pytriton.core.process_instances.instance import ProcessInstance
from pytriton.core.process_instances.protocol import METRICS, READY
from pytriton.core.spec import ModelSpec
from pytriton.core.waiters import wake
from pytriton.exceptions import PyTritonValidationError
from pytriton.ipc.channel import BlockingChannel, ChannelClosed, LoopChannel, Message
from pytriton.options.routes import CustomRoutes
from pytriton.runtime.frontends.acceptor import Acceptor
from pytriton.runtime.remote_routes import AttachRoute, ServedRoute

LOGGER = logging.getLogger("pytriton")

# Control connection: (ATTACH_BIND, AttachBind) -> (ACCEPTED, bind id), the instances attach, then (BOUND,);
# (BIND_FAILED, message) at any step. Instance connection: (ATTACH_INSTANCE, bind id, instance index,
# callable kind, pid), then jobs. Token connection: (TOKEN_WHERE,) -> (TOKEN_AT, the server's descriptor
# of its token's memfd, or None when no token is needed or none can be read).
ATTACH_BIND, ATTACH_INSTANCE, ACCEPTED, BOUND, BIND_FAILED, TOKEN_WHERE, TOKEN_AT = 21, 22, 23, 24, 25, 26, 27
# Route connection (runtime/remote_routes.py): (ATTACH_ROUTE, AttachRoute) -> (ACCEPTED, 0) or
# (BIND_FAILED, message, "invalid" when the path is refused, else "refused"), then the route's requests.
ATTACH_ROUTE = 28
_ABSTRACT = sys.platform.startswith("linux")
_PEERCRED = struct.Struct("3i")
# How long a binding may take to open its instance connections.
_ATTACH_TIMEOUT_S = 30.0
_STOPPING = "the server is stopping"
# The longest token kept in a memfd (tokens are short; a longer one is given to RemoteTriton explicitly).
_MAX_TOKEN_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class AttachBind:
    """A model that a RemoteTriton binds, resolved on its side, with the number of its instances."""

    version: str
    spec: ModelSpec
    instance_count: int
    token: Optional[str]
    arena_budget: int
    # What the RemoteTriton's process changed in custom metrics so far (families defined outside callables,
    # updates made outside a call): added once the binding is accepted. Later ones travel with its answers.
    metrics: Tuple[Any, ...] = ()


def attach_address(port: int) -> str:
    """The socket address of the server whose HTTP or gRPC port is `port` (for this user)."""
    if _ABSTRACT:
        return f"\0pytriton-{os.getuid()}-{port}"
    return os.path.join(_private_directory(), f"{port}.sock")


def _private_directory() -> str:
    """A directory only this user may enter, created if missing; refused if anyone else owns or can enter it."""
    path = os.path.join(tempfile.gettempdir(), f"pytriton-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    status = os.lstat(path)
    if status.st_uid != os.getuid() or status.st_mode & 0o077:
        raise PermissionError(f"{path} must belong to this user and be closed to others (chmod 700)")
    return path


def peer_is_trusted(sock: socket.socket) -> bool:
    """Whether the process at the other end runs as this user or as root."""
    if not hasattr(socket, "SO_PEERCRED"):
        return True  # macOS: the socket's directory admits this user only
    _, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return uid in (os.getuid(), 0)


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end as this process's PID namespace sees it (0: unseen, or unknown)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return 0
    pid, _, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return int(pid)


def ask_token(sock: socket.socket, timeout_s: float) -> Optional[str]:
    """The token of the server at the other end of `sock` (connected to its attach socket), which it closes.

    None when the server keeps none (it restricts no model-repository API with a token), when this process may
    not read it (another user, or a PID namespace that does not see the server), or when the server does not
    answer (another version).
    """
    channel = BlockingChannel(sock)
    try:
        channel.sock.settimeout(timeout_s)
        channel.send((TOKEN_WHERE,))
        head = channel.receive().head
        pid = peer_pid(channel.sock)
    except (ChannelClosed, OSError):
        return None
    finally:
        channel.close()
    if head[0] != TOKEN_AT or not isinstance(head[1], int):
        return None
    return read_peer_token(pid, head[1])


def read_peer_token(pid: int, fd: int) -> Optional[str]:
    """The token in descriptor `fd` of process `pid`, or None if this process may not read it (or it is not one)."""
    if pid <= 0 or fd < 0:
        return None
    try:
        token_fd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # not this user's, or a PID namespace that does not see the server
    try:
        status = os.fstat(token_fd)
        if not stat.S_ISREG(status.st_mode) or not 0 < status.st_size <= _MAX_TOKEN_BYTES:
            return None
        return os.pread(token_fd, status.st_size, 0).decode()
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(token_fd)


def _token_memfd(token: str) -> Optional[int]:
    """A memfd holding `token`, sealed, for RemoteTriton processes that may read this process's descriptors."""
    if not _ABSTRACT or not hasattr(os, "memfd_create") or len(token.encode()) > _MAX_TOKEN_BYTES:
        return None
    try:
        fd = os.memfd_create("pytriton-access-token", os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0))
    except OSError as error:
        LOGGER.warning("RemoteTriton: cannot keep the access token for processes of this user (%s)", error)
        return None
    try:
        os.write(fd, token.encode())
        seals = sum(getattr(fcntl, name, 0) for name in ("F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE", "F_SEAL_SEAL"))
        if seals and hasattr(fcntl, "F_ADD_SEALS"):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except OSError:
        pass  # unsealed is still private to the server
    return fd


class _Binding:
    """A model being bound (or bound) through one control connection."""

    def __init__(self, bind_id: int, request: AttachBind, control: LoopChannel) -> None:
        self.bind_id = bind_id
        self.request = request
        self.control = control
        self.instances: Dict[int, ProcessInstance] = {}
        self.complete: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # no instance serves any more
        self.bound = False


class AttachServer:
    """Accepts RemoteTriton connections on the server's loop and binds their models into the engine."""

    def __init__(
        self,
        engine: Engine,
        model_token: Optional[str],
        unload_timeout_s: float,
        synced: Optional[Callable[[], Awaitable[None]]] = None,
        routes: Optional[CustomRoutes] = None,
    ) -> None:
        """Serve `engine`; `model_token`: the model-repository token, if that API is restricted.

        `synced()` returns once the frontend processes know the models (a binding is answered BOUND only then);
        `routes`: the HTTP port's custom routes, which RemoteTriton processes may add to.
        """
        self._engine = engine
        self._routes = routes
        self._served_routes: Set[ServedRoute] = set()
        self._synced = synced
        self._model_token = model_token
        self._unload_timeout_s = unload_timeout_s
        self._acceptors: List[Acceptor] = []
        self._paths: List[str] = []
        self._bindings: Dict[int, _Binding] = {}
        self._next_id = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._token_fd: Optional[int] = None
        self._stopped = False

    def start(self, ports: List[int]) -> None:
        """Listen on the attach address of each port (on the loop); a taken address is logged, not fatal."""
        if self._model_token is not None:
            self._token_fd = _token_memfd(self._model_token)
        for port in dict.fromkeys(ports):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                address = attach_address(port)
                if not _ABSTRACT:
                    _remove_stale(address)
                sock.bind(address)
                sock.listen(64)
                sock.setblocking(False)
            except OSError as error:
                sock.close()
                LOGGER.warning("RemoteTriton cannot attach through port %d: %s", port, error)
                continue
            if not _ABSTRACT:
                self._paths.append(address)
            acceptor = Acceptor(sock, self._accepted_fd, "RemoteTriton connections")
            acceptor.start()
            self._acceptors.append(acceptor)

    async def stop(self) -> None:
        """Stop listening and drop every connection (the engine has stopped the models already)."""
        self._stopped = True  # a connection accepted before still sends its first message
        for acceptor in self._acceptors:
            acceptor.stop()
        self._acceptors.clear()
        for path in self._paths:
            _remove_stale(path)
        for binding in list(self._bindings.values()):
            binding.control.close()
        for served in list(self._served_routes):
            served.close()
        for task in list(self._tasks):
            task.cancel()
        if self._token_fd is not None:
            os.close(self._token_fd)
            self._token_fd = None

    # -- connections ----------------------------------------------------------------------------

    def _accepted_fd(self, fd: int) -> None:
        self._accepted(socket.socket(fileno=fd))

    def _accepted(self, sock: socket.socket) -> None:
        """A new connection: refuse strangers, then read its first message."""
        if not peer_is_trusted(sock):
            LOGGER.warning("RemoteTriton: refused a connection from a process of another user")
            sock.close()
            return
        loop = asyncio.get_running_loop()
        channel: LoopChannel

        def first(message: Message) -> None:
            self._first_message(channel, message)

        channel = LoopChannel(sock, loop, first, lambda: None)

    def _first_message(self, channel: LoopChannel, message: Message) -> None:
        """Dispatch a connection by what it says first."""
        for fd in message.fds:
            os.close(fd)
        head = message.head
        if head[0] == ATTACH_BIND and isinstance(head[1], AttachBind):
            self._track(self._bind(channel, head[1]))
        elif head[0] == ATTACH_INSTANCE:
            self._attach_instance(channel, head)
        elif head[0] == ATTACH_ROUTE and isinstance(head[1], AttachRoute):
            self._add_route(channel, head[1])
        elif head[0] == TOKEN_WHERE:
            _send(channel, (TOKEN_AT, self._token_fd))  # the client closes the connection
        else:
            channel.close()

    def _track(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _bind(self, control: LoopChannel, request: AttachBind) -> None:
        """Bind a model once its instances have attached; unload it when the control connection closes."""
        failure = self._refusal(request)
        if failure is not None:
            _send(control, (BIND_FAILED, failure))
            control.close()
            return
        self._next_id += 1
        binding = _Binding(self._next_id, request, control)
        self._bindings[binding.bind_id] = binding
        closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        control.handle(_control_message, lambda: wake(closed))
        REGISTRY.apply_updates(request.metrics)
        _send(control, (ACCEPTED, binding.bind_id))
        try:
            attached = asyncio.shield(binding.complete)
            await asyncio.wait({attached, closed}, timeout=_ATTACH_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            if not binding.complete.done():
                if closed.done():  # the RemoteTriton left mid-bind (its process died): the name is free at once
                    await self._drop(binding)
                    return
                raise asyncio.TimeoutError
            if self._stopping():
                raise ValueError(_STOPPING)
            instances: List[ModelInstance] = [binding.instances[i] for i in range(request.instance_count)]
            self._engine.add_model(request.spec, instances, on_unrecoverable=lambda why: _unrecoverable(why, closed))
            if self._synced is not None:
                await self._synced()  # a client may call the model on any frontend once RemoteTriton returns
        except (asyncio.TimeoutError, ValueError) as error:
            message = str(error) or "its instances did not attach in time"
            _send(control, (BIND_FAILED, message))
            await self._drop(binding)
            return
        binding.bound = True
        spec = request.spec
        count = request.instance_count
        LOGGER.info(
            "RemoteTriton bound model '%s' version %d (%d %s)",
            spec.name,
            spec.version,
            count,
            "instance" if count == 1 else "instances",
        )
        _send(control, (BOUND,))
        await closed
        LOGGER.info("RemoteTriton closed: unloading model '%s' version %d", spec.name, spec.version)
        # A RemoteTriton that died leaves its queued requests nobody to run them: they fail at once, not at the timeout.
        await self._engine.remove(spec.name, spec.version, self._unload_timeout_s, binding.gone)
        await self._drop(binding)

    def _add_route(self, channel: LoopChannel, request: AttachRoute) -> None:
        """Serve a RemoteTriton's route through its connection, until the connection closes."""
        refusal = self._credentials_refusal(request.version, request.token)
        if refusal is None and self._routes is None:
            refusal = "this server serves no custom routes"
        if refusal is not None:
            _send(channel, (BIND_FAILED, refusal, "refused"))
            channel.close()
            return
        assert self._routes is not None
        served = ServedRoute(channel, request.path, self._routes, request.arena_budget)
        try:
            served.route = self._routes.add_route(request.path, served, request.methods)
        except PyTritonValidationError as error:
            _send(channel, (BIND_FAILED, str(error), "invalid"))
            channel.close()
            return
        self._served_routes.add(served)
        channel.handle(served.on_message, lambda: self._route_closed(served))
        LOGGER.info("RemoteTriton added route '%s' (%s)", request.path, ", ".join(sorted(served.route.methods)))
        _send(channel, (ACCEPTED, 0))

    def _route_closed(self, served: ServedRoute) -> None:
        self._served_routes.discard(served)
        served.on_closed()

    def _refusal(self, request: AttachBind) -> Optional[str]:
        """Why a binding is refused, or None."""
        refusal = self._credentials_refusal(request.version, request.token)
        if refusal is not None:
            return refusal
        try:
            self._engine.check_new(request.spec)
        except ValueError as error:
            return str(error)
        name = request.spec.name
        for binding in self._bindings.values():
            if binding.request.spec.name == name:
                if not binding.bound:
                    return f"model '{name}' is being bound already"
                return (
                    f"model '{name}' version {binding.request.spec.version} is bound already through another "
                    f"RemoteTriton: one RemoteTriton binding serves a model name at a time"
                )
        return None

    def _credentials_refusal(self, version: str, token: Optional[str]) -> Optional[str]:
        """Why a RemoteTriton of that version with that token may not bind models or add routes now, or None."""
        if self._stopping():
            return _STOPPING
        if version != __version__:
            return f"the server runs pytriton {__version__}, the RemoteTriton pytriton {version}"
        if self._model_token is not None:
            if token is None:
                return (
                    "the server restricts its model repository to an access token and this RemoteTriton has none: "
                    "pass RemoteTriton(access_token=...) with the server's token (Triton.get_access_token(), "
                    "pytriton serve --access-token); only a process that may read the server's /proc/<pid>/fd "
                    "(its user, in its PID namespace) finds it without"
                )
            if not hmac.compare_digest(token.encode(), self._model_token.encode()):
                return "the access token does not match the server's"
        return None

    def _stopping(self) -> bool:
        """Whether the server's stop has begun: it takes no new model or route any more."""
        return self._stopped or self._engine.phase is not Phase.SERVING

    def _attach_instance(self, channel: LoopChannel, head: Tuple[Any, ...]) -> None:
        """An instance connection of a binding: it serves jobs from now on."""
        _, bind_id, index, kind, pid = head
        binding = self._bindings.get(bind_id)
        if binding is None or binding.bound or not 0 <= index < binding.request.instance_count:
            channel.close()
            return
        instance = ProcessInstance(
            binding.request.spec.name,
            index,
            (None, channel, (READY, kind, pid)),
            binding.request.arena_budget,
            on_gone=lambda _: self._instance_gone(binding),
        )
        binding.instances[index] = instance
        if len(binding.instances) == binding.request.instance_count and not binding.complete.done():
            binding.complete.set_result(None)

    def _instance_gone(self, binding: _Binding) -> None:
        """An instance connection closed under a live binding: with none left, the RemoteTriton is gone."""
        if all(not instance.alive for instance in binding.instances.values()):
            wake(binding.gone)
            binding.control.close()

    async def _drop(self, binding: _Binding) -> None:
        """Forget a binding: close its connections."""
        self._bindings.pop(binding.bind_id, None)
        await asyncio.gather(*(instance.close() for instance in binding.instances.values()))
        binding.control.close()


def _unrecoverable(reason: str, closed: asyncio.Future[None]) -> None:
    """A RemoteTriton's callable raised PyTritonUnrecoverableError: end its binding, not the server.

    As nvidia-pytriton 0.7, whose server goes on while that RemoteTriton stops (its serve() returns).
    """
    LOGGER.error("%s: unloading it and closing its RemoteTriton's binding; the server goes on", reason)
    wake(closed)


def _control_message(message: Message) -> None:
    """What a bound RemoteTriton says on its control connection: what its process changed in custom metrics."""
    for fd in message.fds:
        os.close(fd)
    head = message.head
    if head[0] == METRICS:
        REGISTRY.apply_updates(head[1])


def _send(channel: LoopChannel, head: Any) -> None:
    """Send on a control connection that may have closed already."""
    if not channel.closed:
        try:
            channel.send(head)
        except ConnectionError:
            pass


def _remove_stale(path: str) -> None:
    """Remove a socket file that nobody listens on any more (left by a server that was killed)."""
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass
    finally:
        probe.close()
