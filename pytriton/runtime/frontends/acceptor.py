"""The hub accepts every connection of a port and hands it to a frontend process, each in turn.

Why not let the frontends accept: with one listening socket shared by several processes, whichever process
wakes first takes every connection that waits (uvloop accepts until EAGAIN; libuv's UV_TCP_SINGLE_ACCEPT did
not change it here): 32 connections opened at once all went to one of two frontends, run after run. With a
socket of its own in each process (SO_REUSEPORT) the kernel spreads them by a hash, unevenly for few clients
(16 +- 3 of 32 for two), loses the connections queued on a frontend that dies, and lets any other process of
the same user that sets SO_REUSEPORT on the port take a share of its clients. Accepting here costs the hub
one `accept` and one `sendmsg` per connection, and connections live long.

The attach socket (runtime/attach.py) accepts through it too.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Callable

LOGGER = logging.getLogger("pytriton")

# Connections taken per wake-up of the listening socket, so that a burst cannot hold the hub's loop.
_PER_WAKE = 64
# How long accepting pauses when the process is out of descriptors (the connections wait in the backlog).
_PAUSE_S = 0.1


class Acceptor:
    """Accepts connections on a listening socket on the running loop; `hand_over(fd)` takes each.

    Out of descriptors (or kernel memory), accepting pauses for _PAUSE_S at a time, the connections waiting in the
    backlog: the listening socket stays readable, and a reader that only logged the error was called again at once,
    for ever (a core at 100% and tens of thousands of log lines a second). The first failure of a run of them is
    logged at WARNING, the others at DEBUG, and the first connection accepted after them at INFO.
    """

    def __init__(self, sock: socket.socket, hand_over: Callable[[int], None], what: str = "connections") -> None:
        """Accept on `sock` (bound and listening) once started; `what` names what it accepts, in the log."""
        self._sock = sock
        self._fd = sock.fileno()
        self._hand_over = hand_over
        self._what = what
        self._loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        self._accepting = False
        self._paused: asyncio.TimerHandle | None = None
        self._failing = False  # the last accept failed for want of descriptors or memory

    def start(self) -> None:
        """Start accepting."""
        self._sock.setblocking(False)
        self._accepting = True
        self._loop.add_reader(self._fd, self._accept)

    def _accept(self) -> None:
        """Take what waits (a bounded number), handing each connection over."""
        for _ in range(_PER_WAKE):
            try:
                fd, _ = self._sock._accept()  # type: ignore[attr-defined]  # the descriptor, without a socket object
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._pause(error)
                    return
                raise
            if self._failing:
                self._failing = False
                LOGGER.info("accepting %s again", self._what)
            self._hand_over(fd)

    def _pause(self, error: OSError) -> None:
        """Stop watching the socket for _PAUSE_S: what failed will not succeed before something is freed."""
        log = LOGGER.debug if self._failing else LOGGER.warning
        log("cannot accept %s for now: %s; retrying every %.1f s", self._what, error, _PAUSE_S)
        self._failing = True
        self._loop.remove_reader(self._fd)
        self._paused = self._loop.call_later(_PAUSE_S, self._resume)

    def _resume(self) -> None:
        self._paused = None
        if self._accepting:
            self._loop.add_reader(self._fd, self._accept)

    def stop(self) -> None:
        """Accept no more, and close the listening socket (what waits in its backlog is refused)."""
        if self._accepting:
            self._accepting = False
            self._loop.remove_reader(self._fd)
        if self._paused is not None:
            self._paused.cancel()
        self._sock.close()
