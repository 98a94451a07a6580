"""How one gRPC connection says GOAWAY (RFC 9113 section 6.8): gracefully in two steps, at once, or for an error.

The graceful way (`leave`, while the server is a lame duck) first names the highest stream id, so the
client stops opening streams here without any being refused, and sends a PING; the client
acknowledges it after every stream it opened before it read the GOAWAY, so the final GOAWAY, sent on
that acknowledgement (or after a second without one), names the true last stream.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Optional

from pytriton.core.tensors.raw_tensors import Buffer
from pytriton.core.waiters import wake
from pytriton.transport.grpc import frames as h2

# The PING that follows a graceful GOAWAY, and how long its acknowledgement may take before the final GOAWAY.
GOAWAY_PING = b"goaway\x00\x00"
_GOAWAY_PING_TIMEOUT_S = 1.0


class Goaway:
    """Whether a connection is going away, and the GOAWAY frames that say so."""

    __slots__ = ("_final", "_loop", "_ping_timer", "_write", "last_accepted", "said")

    def __init__(self, loop: asyncio.AbstractEventLoop, write: Callable[[Buffer], None]) -> None:
        """Nothing said yet; frames go out through `write`."""
        self._loop = loop
        self._write = write
        self.said = False  # GOAWAY sent or received: no new call
        self.last_accepted = 0  # the last stream whose request was taken (the final GOAWAY's last stream id)
        self._final: Optional[asyncio.Future[None]] = None  # leave() waits on it
        self._ping_timer: Optional[asyncio.TimerHandle] = None

    async def leave(self, final: Callable[[], None], closed: bool) -> None:
        """The graceful GOAWAY; `final()` (sending the final one) runs on the PING's acknowledgement or a timeout.

        Returns once the final GOAWAY is out (at once when the connection already goes away or is closed).
        """
        if self._final is None:
            self._final = self._loop.create_future()
            if self.said or closed:
                wake(self._final)
            else:
                self._write(h2.goaway(h2.MAX_STREAM_ID, h2.NO_ERROR) + h2.frame(h2.PING, 0, 0, GOAWAY_PING))
                self._ping_timer = self._loop.call_later(_GOAWAY_PING_TIMEOUT_S, final)
        await self._final

    def now(self, debug: bytes = b"") -> None:
        """The final GOAWAY (NO_ERROR, with `debug` data): no new call from here on."""
        if not self.said:
            self.said = True
            self._write(h2.goaway(self.last_accepted, h2.NO_ERROR, debug))
        self.done()

    def error(self, code: int, message: str) -> None:
        """The GOAWAY of a connection error (the connection then closes)."""
        self.said = True
        self._write(h2.goaway(self.last_accepted, code, message.encode()))

    def done(self) -> None:
        """Nothing more to wait for: the final GOAWAY is out, or the connection closed."""
        if self._ping_timer is not None:
            self._ping_timer.cancel()
            self._ping_timer = None
        wake(self._final)
