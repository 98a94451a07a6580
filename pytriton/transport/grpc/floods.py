"""Flood counters of one HTTP/2 connection: frames a client may send cheaply but that cost the server.

Each kind of frame a client can repeat at no cost to itself (but not to the server, which must answer
or look it up) spends a token of a bucket: `burst` tokens at first, refilled at `rate` a second. An
empty bucket ends the connection with GOAWAY ENHANCE_YOUR_CALM (resets: once its calls in progress are
answered, session.py). The figures are nghttp2's where it has
them (stream resets: 1000 then 33/s, against CVE-2023-44487 "rapid reset"; "glitches": 10,000 then
330/s); a well-behaved gRPC client never comes near any of them. Checking costs a clock read and a few
float operations, and only frames that are not on a call's way (HEADERS and DATA carrying data) pay it.
WINDOW_UPDATE frames past those a connection earned (`window_updates_earned`) are glitches.
"""

from __future__ import annotations

from pytriton.transport.grpc import frames as h2

# (burst, refill per second) of each counter.
RESET_LIMIT = (1000, 33.0)  # RST_STREAM frames received on a live stream
PING_LIMIT = (1000, 100.0)  # PING frames (grpc's ping strikes also apply)
SETTINGS_LIMIT = (1000, 100.0)  # SETTINGS frames, acknowledgements included
# Frames that move nothing forward: empty DATA without END_STREAM, empty CONTINUATION, PRIORITY, unknown
# types, frames dropped on closed streams, streams refused or reset by the server for an error.
GLITCH_LIMIT = (10_000, 330.0)
# WINDOW_UPDATE frames a connection earns (each one past them is a glitch): a client opens windows again for what
# it received. grpc's C-core sends about one a call on the stream and one on the connection as it starts reading
# the response (an increment of 5), then about one of each a message it reads: 2-4 a call and one per 32 bytes
# sent leave its calls of any size free, and a flood of WINDOW_UPDATEs of 1 (on the connection, or on any stream,
# closed or open), which took a core of the server for as long as it went on, earns nothing.
WINDOW_UPDATES_FREE = 1000
WINDOW_UPDATES_PER_CALL = 4
BYTES_PER_WINDOW_UPDATE = 32


class FloodGauge:
    """A token bucket for one kind of frame: `spend` is False once the client sent too many too fast."""

    __slots__ = ("_burst", "_rate", "_tokens", "_updated", "what")

    def __init__(self, limit: tuple[int, float], what: str) -> None:
        """A full bucket of `limit` = (burst, refill per second) for frames described as `what`."""
        self._burst, self._rate = limit
        self._tokens = float(self._burst)
        self._updated = 0.0
        self.what = what

    def spend(self, now: float) -> bool:
        """Take a token at loop time `now`; False when none is left."""
        tokens = self._tokens + (now - self._updated) * self._rate
        self._updated = now
        if tokens > self._burst:
            tokens = self._burst
        if tokens < 1.0:
            self._tokens = tokens
            return False
        self._tokens = tokens - 1.0
        return True

    def check(self, now: float) -> None:
        """Take a token; raise the connection error that ends a flood when none is left."""
        if not self.spend(now):
            raise h2.Http2Error(h2.ENHANCE_YOUR_CALM, f"too many {self.what}")


def window_updates_earned(calls: int, bytes_sent: int) -> int:
    """The WINDOW_UPDATEs (and SETTINGS) a connection of `calls` that was sent `bytes_sent` bytes earned."""
    return WINDOW_UPDATES_FREE + WINDOW_UPDATES_PER_CALL * calls + bytes_sent // BYTES_PER_WINDOW_UPDATE


class FloodGauges:
    """The counters of one connection."""

    __slots__ = ("glitches", "pings", "resets", "settings")

    def __init__(self) -> None:
        """Full buckets."""
        self.resets = FloodGauge(RESET_LIMIT, "stream resets")
        self.pings = FloodGauge(PING_LIMIT, "PING frames")
        self.settings = FloodGauge(SETTINGS_LIMIT, "SETTINGS frames")
        self.glitches = FloodGauge(GLITCH_LIMIT, "frames that carry nothing")
