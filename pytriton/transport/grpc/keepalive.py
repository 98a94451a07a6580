"""Pings of one gRPC connection, both ways, by grpc's rules and TritonConfig's grpc_keepalive_* / grpc_http2_* options.

The server pings the client every keepalive time (only while calls are in progress unless
permit_without_calls, and at most max_pings_without_data times until headers or data go out) and
closes the connection when a ping is not acknowledged within the keepalive timeout. A client that
pings more often than min_recv_ping_interval_without_data (two hours while no call is in progress,
unless permit_without_calls) earns a strike; one strike over max_ping_strikes ends the connection
(GOAWAY ENHANCE_YOUR_CALM "too_many_pings", as grpc answers, after acknowledging that ping too). Headers,
data or a WINDOW_UPDATE going out clear both counts (grpc's ResetPingClock).
"""

from __future__ import annotations

import asyncio
import os
from typing import Callable, Optional

from pytriton.options.server import GrpcKeepalive
from pytriton.transport.grpc import frames as h2

# grpc's interval for pings received while no call is in progress, unless permit_without_calls.
_IDLE_PING_INTERVAL_S = 7200.0


class Keepalive:
    """The keepalive pings of one connection and the ping strikes of its client."""

    __slots__ = (
        "_abort",
        "_ack_timer",
        "_busy",
        "_last_ping",
        "_loop",
        "_pings_without_data",
        "_send",
        "_settings",
        "_strikes",
        "_timer",
    )

    def __init__(
        self,
        settings: GrpcKeepalive,
        loop: asyncio.AbstractEventLoop,
        *,
        send: Callable[[bytes], None],
        busy: Callable[[], bool],
        abort: Callable[[], None],
    ) -> None:
        """Pings that go out through `send`; `busy()` says whether calls are in progress; `abort()` closes."""
        self._settings = settings
        self._loop = loop
        self._send = send
        self._busy = busy
        self._abort = abort
        self._timer: Optional[asyncio.TimerHandle] = None
        self._ack_timer: Optional[asyncio.TimerHandle] = None
        self._pings_without_data = 0
        self._strikes = 0
        self._last_ping: Optional[float] = None

    def start(self) -> None:
        """Start pinging every keepalive time (when it is not 0)."""
        if self._settings.time_ms > 0:
            self._timer = self._loop.call_later(self._settings.time_ms / 1000, self._tick)

    def stop(self) -> None:
        """Stop every timer (the connection is closing)."""
        for timer in (self._timer, self._ack_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._ack_timer = None

    def data_sent(self) -> None:
        """Headers, data or a WINDOW_UPDATE went out: pings are welcome again (grpc's ping strikes restart)."""
        self._pings_without_data = 0
        self._strikes = 0
        self._last_ping = None

    def ping_received(self, now: float) -> bool:
        """A client's ping at loop time `now` (to be acknowledged); False when it is one strike too many."""
        settings = self._settings
        last, self._last_ping = self._last_ping, now
        if last is None:
            return True
        allowed = (
            settings.min_recv_ping_interval_without_data_ms / 1000
            if settings.permit_without_calls or self._busy()
            else _IDLE_PING_INTERVAL_S
        )
        if now - last < allowed:
            self._strikes += 1
            return not (settings.max_ping_strikes and self._strikes > settings.max_ping_strikes)
        return True

    def ack_received(self) -> None:
        """The client acknowledged a ping: it is alive."""
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None

    def _tick(self) -> None:
        """Ping the client, unless a ping is unanswered, no call is in progress, or too many went without data."""
        settings = self._settings
        self._timer = self._loop.call_later(settings.time_ms / 1000, self._tick)
        if self._ack_timer is not None or not (settings.permit_without_calls or self._busy()):
            return
        if settings.max_pings_without_data and self._pings_without_data >= settings.max_pings_without_data:
            return
        self._pings_without_data += 1
        self._send(h2.frame(h2.PING, 0, 0, os.urandom(8)))
        self._ack_timer = self._loop.call_later(settings.timeout_ms / 1000, self._abort)
