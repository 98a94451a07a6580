"""The frontend processes of a server, from the hub: started, handed connections, kept in step, restarted, stopped.

To the runtime the pool is one more frontend (start, leave, stop, hurry). Behind it, each process serves
the HTTP and gRPC connections the hub accepts for it (acceptor.py), one after the other, and sends its
requests here (hub.py). The state a frontend needs to check requests (the models' specs, the client
shared-memory regions registered) is mirrored into every process whenever it changes, before the call that
changed it is answered: a region registered through one frontend serves a request that lands on another.
A frontend that dies fails only its own connections; it is logged and started again. With one process, the
hub's own servers take a share of the connections too (options/frontends.HUB_SHARE and HUB_KEEPS), and every
connection while that process starts again.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import functools
import itertools
import logging
import os
import socket
import subprocess
import time
from typing import Any, Awaitable, Callable, Deque, Dict, List, Optional, Tuple

from pytriton.core.engine import Engine
from pytriton.ipc.channel import MAX_FDS, ChannelClosed
from pytriton.ipc.spawn import HelperDidNotStart, exit_status, start_helper, stop_process
from pytriton.options.frontends import HUB_KEEPS, HUB_SHARE
from pytriton.options.http_routes import ROUTES, find_route
from pytriton.options.log_trace import ServerSettings
from pytriton.options.server import ServerOptions
from pytriton.runtime.frontends.acceptor import Acceptor
from pytriton.runtime.frontends.forwarding import run_grpc, run_http
from pytriton.runtime.frontends.hub import FrontendLink
from pytriton.runtime.frontends.log_records import LEVELS
from pytriton.runtime.frontends.protocol import CONNECTION, INIT, START_FAILED, Init, Region
from pytriton.transport.http.app import path_segments

LOGGER = logging.getLogger("pytriton")

START_TIMEOUT_S = 60.0
# A frontend that dies sooner than this after it started waits before it is started again (then longer).
_STABLE_S = 10.0
_FIRST_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 10.0
# A frontend that has not answered a call of the hub's mirroring (or its holds of regions) this long is taken for
# hung (stopped, its loop wedged): killed, and started again. The calls that wait for it hold every later one.
TELL_TIMEOUT_S = 30.0
# How often the hub asks each frontend whether its loop turns, and how long one may leave that unanswered before no
# new connection goes to it (until it answers): one stopped (SIGSTOP, a debugger) or wedged took its share of the
# new connections, whose clients waited for as long as it did. It is not killed for it (TELL_TIMEOUT_S is for calls
# that hold others).
PING_PERIOD_S = 1.0
UNRESPONSIVE_S = 10.0
# Accepted connections held while no frontend is up (all restarting), then refused.
_MAX_HELD = 1024
# How long a connection over the cap by the count waits for the frontends' answers before it is placed as counted:
# a frontend answers within a loop turn or two; one that does not (wedged, dying) must not hold connections long.
RECOUNT_WAIT_S = 0.5
# The route of a system shared-memory unregister: the frontends' holds are asked for first.
_SYSTEM_UNREGISTER = dict(ROUTES)["/v2/systemsharedmemory[/region/{region}]/unregister"]

# A region the hub registered, and the number of that registration (SystemSharedMemory.registration).
Registered = Tuple[Region, int]

# What the frontends were told of the hub's state, as generations that move with every change of it: the model
# table and its versions out of service (Engine.models_generation), the regions (SystemSharedMemory.generation),
# its loggers' levels, which the runtime log settings set too (LevelWatch); and whether trace files are written (the
# frontends then time their requests). Comparing them costs the same at 1 model as at 1,600.
Mirror = Tuple[int, int, int, bool]


class StartError(RuntimeError):
    """A frontend process did not come up; the message says how it ended."""


class _State(enum.Enum):
    STARTING = "starting"
    UP = "up"
    RESTARTING = "restarting"
    STOPPED = "stopped"


class _Frontend:
    """One frontend process as the hub sees it."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.state = _State.STARTING
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.link: Optional[FrontendLink] = None
        self.started = 0.0
        self.mirror: Optional[Mirror] = None  # what it was last told
        # The specs it was last told, by (name, version): held, so that no new spec takes an old one's id.
        self.specs: Dict[Tuple[str, int], Any] = {}
        self.regions: Dict[str, Registered] = {}  # the regions it was last told, by name
        self.asked: Optional[float] = None  # when the ping it has not answered yet was sent (time.monotonic())
        self.unresponsive = False  # that ping is UNRESPONSIVE_S old: no new connection goes to it

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0


class FrontendPool:
    """N frontend processes serving the HTTP and gRPC ports that the hub listens on."""

    def __init__(
        self,
        engine: Engine,
        options: ServerOptions,
        count: int,
        *,
        server_version: str,
        http_socket: Optional[socket.socket],
        grpc_socket: Optional[socket.socket],
        hub_app: Any,
        hub_servicer: Any,
        settings: ServerSettings,
    ) -> None:
        """A pool of `count` processes for the listening sockets given (the hub bound them); nothing starts yet.

        `hub_app` and `hub_servicer` answer what the frontends forward (forwarding.py).
        """
        self._engine = engine
        self._options = options
        self._server_version = server_version
        self._sockets = {"http": http_socket, "grpc": grpc_socket}
        self._hub_app = hub_app
        self._hub_servicer = hub_servicer
        self._settings = settings
        self._frontends = [_Frontend(number) for number in range(count)]
        self._acceptors: List[Acceptor] = []
        self._turn = itertools.cycle(range(count))
        self._held: List[Tuple[str, int]] = []  # connections accepted while no frontend was up
        # Connections placed once the count is fresh (`_recount`), by kind in the order they came.
        self._recounted: Dict[str, Deque[int]] = {"http": collections.deque(), "grpc": collections.deque()}
        self._recounting: Optional[asyncio.Task[None]] = None
        self._caps = {"http": options.limits.max_connections, "grpc": options.limits.grpc_max_connections}
        self._here: Dict[str, Any] = {}  # the hub's own servers, by kind (serve_here)
        self._here_open = {"http": 0, "grpc": 0}  # connections the hub's own servers adopted and still serve
        # Connections accepted since the start, and of them those the hub's own servers took, by kind.
        self.accepted = {"http": 0, "grpc": 0}
        self.served_here = {"http": 0, "grpc": 0}
        self._restarts: Dict[int, asyncio.Task[None]] = {}
        self._sync_lock = asyncio.Lock()
        # Model specs sent to frontends since their start, on changes (what a bind, load or unload costs them).
        self.specs_sent = 0
        # Regions (registered or unregistered) sent to frontends since their start, on changes.
        self.regions_sent = 0
        self._regions: Tuple[int, Dict[str, Registered]] = (0, {})  # _region_table's, at that generation of the regions
        self._stopping = False
        self._watch: Optional[asyncio.Task[None]] = None
        self._levels = LEVELS
        self._resync: Optional[asyncio.Future[None]] = None  # a sync for a level set in the hub, under way

    def serve_here(self, servers: Dict[str, Any]) -> None:
        """Before the start: the hub's own servers by kind (started, not listening) adopt a share of the connections.

        They keep 1 in HUB_SHARE of their port's open connections and at least HUB_KEEPS[kind] (a new one goes to
        them while they hold fewer, so a client alone gets them), and take every one while no frontend is up;
        hub_servers.py keeps what they change in step with the frontends.
        """
        self._here = dict(servers)
        for kind, server in servers.items():
            server.connections.on_closed = functools.partial(self._closed_here, kind)

    # -- life -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every process; accept connections once all are up (StartError names one that is not)."""
        began = time.monotonic()
        results = await asyncio.gather(*(self._start(frontend) for frontend in self._frontends), return_exceptions=True)
        failed = [result for result in results if isinstance(result, BaseException)]
        if failed:
            await self.stop(0.0)
            raise failed[0]
        for kind, sock in self._sockets.items():
            if sock is not None:
                acceptor = Acceptor(sock, lambda fd, kind=kind: self._hand_over(kind, fd))  # type: ignore[misc]
                acceptor.start()
                self._acceptors.append(acceptor)
        self._watch = asyncio.get_running_loop().create_task(self._ping_all())
        pids = ", ".join(str(frontend.pid) for frontend in self._frontends)
        LOGGER.info(
            "%s HTTP and gRPC (%s %s)%s, up in %.2f s",
            "frontend processes serve" if len(self._frontends) > 1 else "a frontend process serves",
            "pids" if len(self._frontends) > 1 else "pid",
            pids,
            f", and this process 1 in {HUB_SHARE} of the connections" if self._here else "",
            time.monotonic() - began,
        )

    async def _start(self, frontend: _Frontend) -> None:
        """Start one frontend process and wait until it serves."""
        loop = asyncio.get_running_loop()
        mirror = self._mirror()
        specs = self._spec_table()
        init = Init(
            frontend.number,
            self._options,
            self._server_version,
            self._sockets["http"] is not None,
            self._sockets["grpc"] is not None,
            list(specs.values()),
            self._engine.out_of_service(),
            mirror[3],
            self._levels.levels,
        )
        try:
            process, channel, message = await start_helper(
                "pytriton.runtime.frontends.process", ((INIT, init), ()), START_TIMEOUT_S
            )
        except HelperDidNotStart as error:
            raise StartError(f"frontend {frontend.number} did not start: {error}") from None
        if message.head[0] == START_FAILED:
            channel.close()
            await stop_process(process, kill=True)
            raise StartError(f"frontend {frontend.number} did not start: {message.head[1]}")
        handlers: Dict[str, Callable[..., Awaitable[Any]]] = {"http": self._forward_http, "grpc": self._forward_grpc}
        link = FrontendLink(self._engine, channel, loop, handlers)
        channel.handle(link.on_message, lambda: self._on_closed(frontend, link))
        frontend.process, frontend.link, frontend.started = process, link, time.monotonic()
        frontend.asked, frontend.unresponsive = None, False
        frontend.mirror = mirror
        frontend.specs = specs  # what Init carried: a model bound while the process started is told by _tell
        frontend.regions = {}
        # The regions go with descriptors, which Init cannot carry; sent now, before any connection is handed over.
        regions_told, _ = self._send_regions(frontend)
        frontend.state = _State.UP
        LOGGER.debug("frontend %d is up (pid %d)", frontend.number, process.pid)
        if channel.closed:
            self._on_closed(frontend, link)
            return
        await asyncio.gather(*regions_told, return_exceptions=True)  # one that failed is sent again on its restart
        await self._tell(frontend)  # anything that changed while it started
        self._hand_held()

    async def steer(self) -> None:
        """Every frontend's answers ask their clients to reconnect from now on; return once all do.

        A frontend silent for TELL_TIMEOUT_S is killed (as by `_answer`): the lame duck waited for it, unready never.
        """
        await self._broadcast("steer", answered=True)

    async def leave(self) -> None:
        """Keep serving, but ask every client to reconnect elsewhere (the lame duck before a stop); as `steer`."""
        await self._broadcast("leave", answered=True)

    def hurry(self) -> None:
        """Stop waiting for answers still leaving (a second signal)."""
        for frontend in self._up():
            assert frontend.link is not None
            frontend.link.calls.call("hurry")

    async def stop(self, sending_s: float = 0.0) -> None:
        """Accept nothing more; each frontend finishes what it sends (up to `sending_s`) and exits."""
        self._stopping = True
        for task in (self._watch, self._resync):
            if task is not None:
                task.cancel()
        for acceptor in self._acceptors:
            acceptor.stop()
        self._acceptors.clear()
        for _, fd in self._held:
            os.close(fd)
        self._held.clear()
        if self._recounting is not None:
            self._recounting.cancel()  # at its wait: it places nothing more
        for queue in self._recounted.values():
            for fd in queue:
                os.close(fd)
            queue.clear()
        for task in self._restarts.values():
            task.cancel()
        deadline = time.monotonic() + sending_s + 2.0
        # Its answer comes once its answers under way are sent; one that never comes (a frontend stopped, its loop
        # wedged) held the stop until the caller gave up on it, past exit_timeout_secs: it is killed at the deadline.
        told = asyncio.ensure_future(self._broadcast("stop", sending_s))
        await asyncio.wait([told], timeout=max(deadline - time.monotonic(), 0.0))
        told.cancel()
        await asyncio.gather(*(self._ended(frontend, deadline) for frontend in self._frontends))

    async def _ended(self, frontend: _Frontend, deadline: float) -> None:
        """Wait for a stopped frontend to exit (killed at `deadline`), and let its channel go."""
        frontend.state = _State.STOPPED
        if frontend.process is not None:
            await stop_process(frontend.process, kill=False, deadline=deadline)
        if frontend.link is not None:
            frontend.link.channel.close()

    # -- connections ----------------------------------------------------------------------------

    def _hand_over(self, kind: str, fd: int) -> None:
        """Give an accepted connection to the hub's own server below its share, else to the next frontend up.

        While no frontend is up, the hub's own server takes it, or (without one) it is held.
        The caps on connections (max_connections, grpc_max_connections) count every frontend's: the frontend
        is told when a connection is one over, and answers it as a server of one process does. One over by the
        count waits until the count is fresh, and those of its kind that come after it wait behind it (`_recount`).
        """
        self.accepted[kind] += 1
        queue = self._recounted[kind]
        if queue or (self._open(kind) >= self._caps[kind] and self._up()):
            queue.append(fd)
            if self._recounting is None or self._recounting.done():
                self._recounting = asyncio.ensure_future(self._recount())
            return
        self._place(kind, fd)

    async def _recount(self) -> None:
        """Place the connections over the cap by the count, in the order they came, once the count is fresh.

        A frontend tells the hub of each connection that closed; counted before those arrived (a client that
        closed its connections and opened others at once), a connection was over the cap where the frontend it went
        to had none that it could close for it: refused, with the server under its cap. Each frontend answers a
        ping after the closes it told before, so once all have (or RECOUNT_WAIT_S passed), the count holds them.
        The connections that came after one waiting wait too: placed before it, a client's new connection was the
        one it then closed for its place, before the client's call.
        """
        while any(self._recounted.values()):
            await self._settle()
            for kind, queue in self._recounted.items():
                while queue:
                    self._place(kind, queue.popleft())

    async def _settle(self) -> None:
        """Return once every frontend up has answered a ping (or RECOUNT_WAIT_S passed)."""
        pings = [asyncio.ensure_future(up.link.calls.call("ping")) for up in self._up() if up.link is not None]
        if pings:
            answered, late = await asyncio.wait(pings, timeout=RECOUNT_WAIT_S)
            for ping in answered:
                ping.exception()  # retrieved: a frontend gone meanwhile is dealt with by _on_closed
            for ping in late:
                ping.cancel()

    def _place(self, kind: str, fd: int) -> None:
        """`_hand_over`'s choice of the server that serves the connection."""
        here = self._here.get(kind)
        responsive = [frontend for frontend in self._up() if not frontend.unresponsive]
        if here is not None and (self._here_takes(kind) or not responsive):
            sock = socket.socket(fileno=fd)
            sock.setblocking(False)
            over_cap = self._open(kind) >= self._caps[kind]
            self._here_open[kind] += 1
            self.served_here[kind] += 1
            here.adopt(sock, over_cap)
            return
        for _ in range(len(self._frontends)):
            frontend = self._frontends[next(self._turn)]
            link = frontend.link
            if frontend.unresponsive and responsive:
                continue
            if frontend.state is _State.UP and link is not None and not link.closed:
                over_cap = self._open(kind) >= self._caps[kind]
                try:
                    link.outbox.send_now((CONNECTION, kind, over_cap), fds=[fd], give=True)
                except ChannelClosed:
                    return  # it died just now: so did this connection, as its others
                link.open[kind] += 1
                return
        if len(self._held) < _MAX_HELD:
            self._held.append((kind, fd))
        else:
            os.close(fd)

    def _open(self, kind: str) -> int:
        """The connections of a kind served now, by every frontend and the hub's own server."""
        return self._here_open[kind] + sum(up.link.open[kind] for up in self._up() if up.link is not None)

    def _here_takes(self, kind: str) -> bool:
        """Whether the next connection goes to the hub's own server: below HUB_KEEPS, or 1 for HUB_SHARE - 1 others."""
        here = self._here_open[kind]
        return here < HUB_KEEPS[kind] or here * (HUB_SHARE - 1) <= self._open(kind) - here

    def _closed_here(self, kind: str) -> None:
        self._here_open[kind] -= 1

    def _hand_held(self) -> None:
        """Hand over the connections accepted while no frontend was up."""
        held, self._held = self._held, []
        for kind, fd in held:
            self._hand_over(kind, fd)

    # -- liveness -------------------------------------------------------------------------------

    async def _ping_all(self) -> None:
        """Every PING_PERIOD_S, ask each frontend up that answered the last ping; note one that leaves it unanswered.

        A logger's level set in the hub since (by the application: the log settings' changes tell them at once)
        is told them then.
        """
        while True:
            await asyncio.sleep(PING_PERIOD_S)
            self._follow_levels()
            now = time.monotonic()
            for frontend in self._up():
                link = frontend.link
                assert link is not None
                if frontend.asked is None:
                    frontend.asked = now
                    answer = asyncio.ensure_future(link.calls.call("ping"))
                    answer.add_done_callback(functools.partial(self._pinged, frontend, link))
                elif not frontend.unresponsive and now - frontend.asked >= UNRESPONSIVE_S:
                    frontend.unresponsive = True
                    LOGGER.warning(
                        "frontend %d (pid %d) has answered nothing for %g s (stopped? its loop wedged?): "
                        "it is handed no new connection until it does",
                        frontend.number,
                        frontend.pid,
                        UNRESPONSIVE_S,
                    )

    def _follow_levels(self) -> None:
        """Tell the frontends the hub's loggers' levels where one changed since they were told."""
        generation = self._levels.check()
        if self._resync is not None and not self._resync.done():
            return
        if any(frontend.mirror is not None and frontend.mirror[2] != generation for frontend in self._up()):
            self._resync = asyncio.ensure_future(self.sync())

    def _pinged(self, frontend: _Frontend, link: FrontendLink, answer: asyncio.Future[Any]) -> None:
        """A ping's answer (or its channel's end)."""
        if not answer.cancelled():
            answer.exception()  # retrieved: a frontend that died meanwhile is dealt with by _on_closed
        if frontend.link is not link:  # started again meanwhile
            return
        frontend.asked = None
        if frontend.unresponsive:
            frontend.unresponsive = False
            LOGGER.info(
                "frontend %d (pid %d) answers again: it is handed new connections again", frontend.number, frontend.pid
            )

    # -- death ----------------------------------------------------------------------------------

    def _on_closed(self, frontend: _Frontend, link: FrontendLink) -> None:
        """A frontend's channel closed: unless the pool is stopping, it died; start it again."""
        link.close()
        if self._stopping or frontend.state is not _State.UP or frontend.link is not link:
            return
        frontend.state = _State.RESTARTING
        self._restarts[frontend.number] = asyncio.get_running_loop().create_task(self._restart(frontend))

    async def _restart(self, frontend: _Frontend) -> None:
        """Log how the frontend ended, then start it again (with a backoff when it keeps dying)."""
        process = frontend.process
        code = await stop_process(process, kill=False, grace_s=1.0) if process is not None else None
        how = exit_status(code) if code is not None else "closed its channel"
        LOGGER.error(
            "frontend %d (pid %d) %s; its connections were closed; starting it again",
            frontend.number,
            frontend.pid,
            how,
        )
        delay = _FIRST_BACKOFF_S if time.monotonic() - frontend.started < _STABLE_S else 0.0
        try:
            while not self._stopping:
                if delay:
                    await asyncio.sleep(delay)
                try:
                    await self._start(frontend)
                except StartError as error:
                    delay = min(max(delay * 2, _FIRST_BACKOFF_S), _MAX_BACKOFF_S)
                    LOGGER.error(
                        "frontend %d did not start again (%s); next try in %.1f s", frontend.number, error, delay
                    )
                    continue
                LOGGER.info("frontend %d is serving again (pid %d)", frontend.number, frontend.pid)
                return
        finally:
            self._restarts.pop(frontend.number, None)

    # -- what the frontends ask the hub ---------------------------------------------------------

    async def _forward_http(self, scope: Dict[str, Any], body: bytes) -> Any:
        answer = await self.mirrored("http", scope, lambda: run_http(self._hub_app, scope, body))
        await self.sync()
        return answer

    async def _forward_grpc(self, name: str, request: bytes, metadata: Any) -> Any:
        answer = await self.mirrored("grpc", name, lambda: run_grpc(self._hub_servicer, name, request, metadata))
        await self.sync()
        return answer

    async def mirrored(self, kind: str, what: Any, run: Callable[[], Awaitable[Any]]) -> Any:
        """Run a request that may change what the frontends mirror (`what`: its scope, or its RPC's name).

        A system shared-memory unregister runs under the frontends' holds of their regions. Whoever runs it
        calls `sync` before its answer leaves.
        """
        if kind == "http":
            found = find_route(path_segments(what))
            unregisters = found is not None and found[0] == _SYSTEM_UNREGISTER
        else:
            unregisters = what == "SystemSharedMemoryUnregister"
        return await (self._with_frontends_holds(run) if unregisters else run())

    async def _with_frontends_holds(self, unregister: Callable[[], Awaitable[Any]]) -> Any:
        """Run a system shared-memory unregister while the hub holds the regions the frontends' requests hold.

        The hub registers and unregisters; the requests that write outputs into regions are the frontends'. So
        each frontend is asked first, and a region one of them holds is refused as Triton refuses a region in use
        (500 / INTERNAL "currently in use"). A request that takes a region between that answer and the
        unregister's mirroring fails with "Unable to find" (it never writes into a region unregistered).
        """
        held: List[str] = []
        for names in await asyncio.gather(
            *(
                self._answer(frontend, frontend.link.calls.call("held_regions"))
                for frontend in self._up()
                if frontend.link is not None
            ),
            return_exceptions=True,
        ):
            if isinstance(names, list):  # a frontend that died meanwhile holds nothing any more
                held.extend(names)
        memory = self._engine.system_memory
        memory.hold(held)
        try:
            return await unregister()
        finally:
            memory.release(held)

    # -- mirrored state -------------------------------------------------------------------------

    def _spec_table(self) -> Dict[Tuple[str, int], Any]:
        return {(model.spec.name, model.spec.version): model.spec for model in self._engine.models()}

    def _region_table(self) -> Dict[str, Registered]:
        """The hub's regions by name, built once per change of them (not once per frontend)."""
        memory = self._engine.system_memory
        if self._regions[0] != memory.generation:
            regions = memory.status()
            table = {
                region.name: (
                    (region.name, region.key, region.offset, region.byte_size),
                    memory.registration(region.name),
                )
                for region in regions
            }
            self._regions = (memory.generation, table)
        return self._regions[1]

    def _mirror(self) -> Mirror:
        """The generations of what the frontends must know now (models, regions, log settings), and trace stamps."""
        engine = self._engine
        return (
            engine.models_generation,
            engine.system_memory.generation,
            self._levels.check(),
            self._settings.trace.stamps,
        )

    async def sync(self) -> None:
        """Tell every frontend what changed since it was last told; return once all have it."""
        async with self._sync_lock:
            mirror = self._mirror()
            await asyncio.gather(*(self._tell(frontend, mirror) for frontend in self._up()))

    async def _tell(self, frontend: _Frontend, mirror: Optional[Mirror] = None) -> None:
        """Send one frontend the models and regions where they changed since it was last told (`mirror`: now)."""
        mirror = self._mirror() if mirror is None else mirror
        told = frontend.mirror
        link = frontend.link
        if told == mirror or link is None:
            return
        try:
            await self._answer(frontend, self._tell_now(frontend, told, mirror))
        except Exception:  # noqa: BLE001 - it died meanwhile: it is told everything when it starts again
            return
        frontend.mirror = mirror

    async def _tell_now(self, frontend: _Frontend, told: Optional[Mirror], mirror: Mirror) -> None:
        link = frontend.link
        assert link is not None
        if told is None or told[0] != mirror[0]:
            await self._tell_models(frontend)
        if told is None or told[1] != mirror[1]:
            await self._tell_regions(frontend)
        if told is None or told[2] != mirror[2]:
            await link.calls.call("log_levels", self._levels.levels)
        if told is None or told[3] != mirror[3]:
            await link.calls.call("trace_stamps", mirror[3])

    async def _answer(
        self, frontend: _Frontend, calls: Awaitable[Any], what: str = "took no change of the server's state"
    ) -> Any:
        """What `calls` to a frontend come to; one silent for TELL_TIMEOUT_S is killed (it is started again).

        `what` says what it did not do, in the log.

        Raises:
            TimeoutError: it was silent that long.
        """
        try:
            return await asyncio.wait_for(calls, TELL_TIMEOUT_S)
        except asyncio.TimeoutError:
            process = frontend.process
            if process is not None and frontend.link is not None and not frontend.link.closed:
                LOGGER.error(
                    "frontend %d (pid %d) %s for %g s: killed, to be started again",
                    frontend.number,
                    process.pid,
                    what,
                    TELL_TIMEOUT_S,
                )
                process.kill()
            raise

    async def _tell_models(self, frontend: _Frontend) -> None:
        """Send one frontend the model versions that changed since it was last told, not the whole table.

        The whole table on every change made each bind, load or unload cost as much as all models' specs (pickled
        here, unpickled and compared in each frontend): binding N models one after another cost O(N^2).
        """
        assert frontend.link is not None
        table = self._spec_table()
        told = frontend.specs
        changed = [spec for key, spec in table.items() if told.get(key) is not spec]
        removed = [key for key in told if key not in table]
        await frontend.link.calls.call("change_models", changed, removed, self._engine.out_of_service())
        self.specs_sent += len(changed)
        frontend.specs = table

    async def _tell_regions(self, frontend: _Frontend) -> None:
        """Send one frontend the regions registered and unregistered since it was last told, not the whole list.

        The whole list on every change cost each registration as much as all regions (pickled here, compared and
        looked up in each frontend): registering N regions one after another cost O(N^2).
        """
        calls, sent = self._send_regions(frontend)
        self.regions_sent += sent
        await asyncio.gather(*calls)

    def _send_regions(self, frontend: _Frontend) -> Tuple[List[Awaitable[Any]], int]:
        """Send one frontend what changed in the regions since it was last told (now, in order).

        The calls' answers, and how many regions (registered or unregistered) were sent.

        Each region goes with the hub's descriptor of its segment, which the frontend accesses it through: its key
        may name another file by now (unlinked once registered, and taken), and a frontend started again opened
        that one; and the file may be smaller by now (the client shrank it), which the frontend could not map.
        """
        link = frontend.link
        assert link is not None
        table = self._region_table()
        told = frontend.regions
        # By registration, not values: a name unregistered and registered again for another file under the same key,
        # both before the frontend was told, looked unchanged.
        changed = [registered[0] for name, registered in table.items() if told.get(name) != registered]
        removed = [name for name in told if name not in table]
        frontend.regions = table
        memory = self._engine.system_memory
        calls = []
        for start in range(0, max(len(changed), 1), MAX_FDS):  # a message carries at most MAX_FDS descriptors
            chunk = changed[start : start + MAX_FDS]
            fds: List[int] = []
            try:
                for region in chunk:
                    fds.append(os.dup(memory.descriptor(region[0])))
            except OSError:  # out of descriptors: the frontend opens these by their keys
                for fd in fds:
                    os.close(fd)
                fds = []
            calls.append(link.calls.call("change_regions", chunk, removed if start == 0 else [], fds=fds))
        return calls, len(changed) + len(removed)

    async def _broadcast(self, what: str, *args: Any, answered: bool = False) -> None:
        """Call `what(*args)` on every frontend that is up; return once all have answered (or died).

        With `answered`, one silent for TELL_TIMEOUT_S is killed (`_answer`), and counts as died.
        """
        calls = []
        for frontend in self._up():
            assert frontend.link is not None
            call = frontend.link.calls.call(what, *args)
            calls.append(self._answer(frontend, call, f"did not answer '{what}'") if answered else call)
        await asyncio.gather(*calls, return_exceptions=True)

    def _up(self) -> List[_Frontend]:
        return [frontend for frontend in self._frontends if frontend.state is _State.UP and frontend.link is not None]
