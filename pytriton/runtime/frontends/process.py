"""A frontend process: the HTTP and gRPC servers on a loop of their own, the models' work done by the hub.

It runs `python -m pytriton.runtime.frontends.process FD PARENT_PID` (a fresh interpreter, never a fork of
the hub: a fork would inherit its threads mid-flight and any CUDA context), with the listening sockets the
hub bound passed down at the numbers its INIT message names. The hub drives its life: it answers the hub's
calls to mirror state (models, shared-memory regions) and to leave, stop and hurry, and it ends when the
hub's channel closes, at once: a frontend never outlives its hub (and the kernel kills it with its parent).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import signal
import socket
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pytriton.core.logs.log_budget import LogBudget
from pytriton.core.request_spans import FixedStamps
from pytriton.core.spec import ModelSpec
from pytriton.ipc.calls import Handler
from pytriton.ipc.channel import BlockingChannel, ChannelClosed, LoopChannel
from pytriton.ipc.spawn import die_with_parent
from pytriton.runtime.frontends.forwarding import ForwardingApp, ForwardingServicer
from pytriton.runtime.frontends.log_records import follow_levels, send_others_to_hub, send_to_hub
from pytriton.runtime.frontends.protocol import CLOSED, READY, START_FAILED, Init, Region
from pytriton.runtime.frontends.remote import HubLink, RemoteEngine
from pytriton.runtime.logging_setup import configure_logging
from pytriton.runtime.loop_thread import new_event_loop
from pytriton.transport.inflate import InflationBudget
from pytriton.transport.receive_budget import ReceiveBudget
from pytriton.transport.receive_buffers import RECEIVE_BUFFERS

LOGGER = logging.getLogger("pytriton")


def _held_back_lost(count: int, kind: str) -> None:
    LOGGER.warning(
        "... and more connections were lost on their way to this frontend process (%d; the last: %s)", count, kind
    )


class FrontendProcess:
    """The servers of one frontend process, over an engine whose models run on the hub."""

    def __init__(self, init: Init, channel: LoopChannel, loop: asyncio.AbstractEventLoop) -> None:
        """Build the servers (nothing is served before `start`)."""
        self._init = init
        self._loop = loop
        self.ended = loop.create_future()
        handlers: Dict[str, Handler] = {
            "change_models": self._change_models,
            "change_regions": self._change_regions,
            "held_regions": self._held_regions,
            "log_levels": self._log_levels,
            "trace_stamps": self._trace_stamps,
            "steer": self._steer,
            "leave": self._leave,
            "stop": self._stop,
            "hurry": self._hurry,
            "ping": self._ping,
        }
        self.link = HubLink(channel, loop, handlers, on_connection=self._adopt, on_closed=self._end)
        self.engine = RemoteEngine(self.link, init.options.server_id)
        self.engine.set_models(init.models, init.unloaded)
        # Records are made where the hub's loggers would make them, and the hub's log settings apply to them there.
        self._levels = follow_levels(init.log_levels, {})
        send_to_hub(LOGGER, self.link.outbox.post, lambda: self.link.closed, loop)  # logged as the hub's records
        send_others_to_hub(self.link.outbox.post, lambda: self.link.closed, loop, init.number)
        self._stamps = FixedStamps(init.trace_stamps)  # the transports', as the hub says
        self._servers: List[Any] = []
        self._by_kind: Dict[str, Any] = {}
        self._lost_connections = LogBudget(_held_back_lost)

    async def start(self) -> None:
        """Serve on the sockets the hub passed down."""
        from pytriton.transport.http.app import HttpFrontend
        from pytriton.transport.http.server import AsgiServer
        from pytriton.transport.openai.app import OpenAIApp

        init, options = self._init, self._init.options
        budget = InflationBudget(options.limits.max_inflated_bytes)
        receive_budget = ReceiveBudget(options.limits.received_bytes())
        # Large bodies and gRPC messages land in shared memory, which the hub reads in place.
        RECEIVE_BUFFERS.allocate = self.link.buffers.allocate
        if init.http:
            app = HttpFrontend(
                self.engine,
                server_version=init.server_version,
                header_forward_pattern=options.http_header_forward_pattern,
                max_body_bytes=options.limits.max_body_bytes,
                max_json_bytes=options.limits.max_json_bytes,
                inflation_budget=budget,
                access=options.http_access,
                trace_stamps=self._stamps,
                openai=None
                if options.openai_port is not None  # the hub serves the OpenAI API's own port
                else OpenAIApp(
                    self.engine,
                    api_key=options.openai_api_key,
                    max_body_bytes=options.limits.max_json_bytes,
                    access=options.http_access,
                ),
            )
            limits = options.limits
            forwarding = ForwardingApp(app, self.link.calls, limits.max_body_bytes, limits.max_json_bytes)
            server = AsgiServer(
                forwarding,
                None,
                limits=options.limits,
                header_names=bool(options.http_header_forward_pattern),
                receive_budget=receive_budget,
            )
            await server.start()
            server.connections.on_closed = functools.partial(self._closed, "http")
            self._servers.append(server)
            self._by_kind["http"] = server
        if init.grpc:
            from pytriton.transport.grpc.server import GrpcFrontend

            calls = self.link.calls
            grpc_server = GrpcFrontend(
                self.engine,
                options,
                server_version=init.server_version,
                inflation_budget=budget,
                receive_budget=receive_budget,
                listen=False,
                servicer=lambda servicer: ForwardingServicer(servicer, calls),
                trace_stamps=self._stamps,
            )
            await grpc_server.start()
            connections = grpc_server.connections
            assert connections is not None
            connections.on_closed = functools.partial(self._closed, "grpc")
            self._servers.append(grpc_server)
            self._by_kind["grpc"] = grpc_server

    def _adopt(self, kind: str, fd: int, over_cap: bool) -> None:
        """Serve a connection the hub accepted (closed at once when this process no longer serves its kind).

        `fd` -1: its descriptor never arrived (none left here); the hub counted it, so it is said closed.
        """
        if fd < 0:
            self._closed(kind)
            if self._lost_connections.admit(kind):
                LOGGER.warning("a %s connection was lost on its way to this frontend process: no descriptor left", kind)
            return
        sock = socket.socket(fileno=fd)
        server = self._by_kind.get(kind)
        if server is None:
            sock.close()
            self._closed(kind)
            return
        sock.setblocking(False)
        server.adopt(sock, over_cap)

    def _closed(self, kind: str) -> None:
        """A connection closed: the hub counts every frontend's against the caps."""
        if not self.link.closed:
            self.link.outbox.post((CLOSED, kind))

    async def _log_levels(self, levels: Dict[str, int]) -> None:
        """A level of the hub's loggers changed (by its log settings, or the application): make records as it does."""
        self._levels = follow_levels(levels, self._levels)

    async def _trace_stamps(self, stamps: bool) -> None:
        """The hub starts or stops writing trace files (a model bound with a file of its own): time requests or not."""
        self._stamps.stamps = stamps

    async def _change_models(
        self, changed: List[ModelSpec], removed: List[Tuple[str, int]], unloaded: List[Tuple[str, int]]
    ) -> None:
        self.engine.change_models(changed, removed, unloaded)

    async def _change_regions(self, changed: List[Region], removed: List[str], fds: Sequence[int] = ()) -> None:
        """Follow the hub's registrations since it last told this frontend: `changed` mapped (again), `removed` not.

        `fds`: the hub's descriptors of the `changed` regions' segments, in order, used here (unmapped, as the hub
        uses its own) rather than what their keys name now. Without them (the hub had none to spare, or the kernel
        dropped them: none left here) the keys are opened.
        """
        memory = self.engine.system_memory
        for name in removed:
            memory.unregister(name, force=True)  # the hub unregistered it: nothing here holds it back
        if len(fds) != len(changed):
            for fd in fds:
                os.close(fd)
            fds = ()
        for index, region in enumerate(changed):
            memory.unregister(region[0], force=True)  # registered again with other values: mapped anew
            self._map(region, fds[index] if fds else None)

    async def _held_regions(self) -> List[str]:
        """The regions this frontend's in-flight requests will write outputs into: the hub keeps them registered."""
        return self.engine.system_memory.held_names()

    def _map(self, region: Region, fd: Optional[int]) -> None:
        """Map one region the hub registered, from its descriptor `fd` (taken) or else its key.

        One that cannot be mapped here is logged (its requests fail here).
        """
        try:
            if fd is None:
                self.engine.system_memory.register(*region)
            else:
                self.engine.system_memory.adopt(*region, fd)
        except Exception as error:  # noqa: BLE001 - the hub mapped it; a request naming it will fail here
            LOGGER.warning("frontend %d cannot map shared memory region '%s': %s", self._init.number, region[0], error)

    async def _steer(self) -> None:
        await asyncio.gather(*(server.steer() for server in self._servers))

    async def _leave(self) -> None:
        await asyncio.gather(*(server.leave() for server in self._servers))

    async def _stop(self, sending_s: float) -> None:
        for server in reversed(self._servers):
            try:
                await server.stop(sending_s)
            except Exception:
                LOGGER.exception("error while stopping a frontend")
        self._servers.clear()
        self._by_kind.clear()
        self.engine.system_memory.unregister(force=True)
        self._loop.call_soon(self._end)

    def _end(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)

    async def _hurry(self) -> None:
        for server in self._servers:
            server.hurry()

    async def _ping(self) -> None:
        """Nothing: the answer tells the hub that this loop turns (pool.PING_PERIOD_S)."""


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: FD (this process's end of the hub's channel) and the hub's pid."""
    fd, parent_pid = (int(arg) for arg in (argv or sys.argv[1:])[:2])
    die_with_parent(parent_pid)
    # The hub stops its frontends itself (after its lame duck and drain): a Ctrl-C in the terminal reaches the
    # whole process group, and must not close connections the hub still answers through them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    blocking = BlockingChannel(sock)
    try:
        message = blocking.receive()
    except ChannelClosed:
        return 1
    init: Init = message.head[1]
    configure_logging(init.options.log_verbose, init.options.log_file, warn=False)  # type: ignore[arg-type]
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(_serve(init, sock, loop))
    finally:
        loop.close()


async def _serve(init: Init, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> int:
    """Start the servers, say so, and serve until told to stop or until the hub is gone."""
    channel = LoopChannel(sock, loop, lambda _message: None, lambda: None)
    frontend = FrontendProcess(init, channel, loop)
    try:
        await frontend.start()
    except Exception as error:  # noqa: BLE001 - the hub reports it
        channel.send((START_FAILED, f"{type(error).__name__}: {error}"))
        return 1
    channel.send((READY, os.getpid()))
    # What is alive now lives as long as the process: out of the collector's reach, as in the hub (runtime/server.py).
    gc.freeze()
    await frontend.ended
    frontend.link.outbox.flush()
    frontend.link.close()
    return 0


if __name__ == "__main__":
    # Run the module's own copy, not __main__'s: what travels pickled must be found there by name.
    from pytriton.runtime.frontends.process import main as module_main

    sys.exit(module_main())
