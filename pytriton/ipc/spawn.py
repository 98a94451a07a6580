"""Processes the server starts and stops: how one ended, in words, and a stop that waits, then kills.

Both kinds of helper process use it: model instances (core/process_instances/) and frontends (runtime/).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Optional


def exit_of(process: subprocess.Popen, when: str) -> str:  # type: ignore[type-arg]
    """How a process ended, in words (or that it has yet to end)."""
    code = process.poll()
    if code is None:
        return f"it closed its channel {when}"
    return f"it {exit_status(code)} {when}"


def exit_status(code: int) -> str:
    """A return code in words: 'exited with status 1', 'was killed by signal SIGKILL'."""
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"was killed by signal {name}"
    return f"exited with status {code}"


# How long a process told to exit gets before it is killed, unless the stop's deadline comes sooner.
EXIT_GRACE_S = 2.0
# The least it gets even past the deadline: an idle process told to exit is not killed mid-step of its exit.
# A healthy one exits in ~65 ms on an idle machine, ~0.3 s when three exit at once on two busy cores.
LEAST_GRACE_S = 0.5


async def stop_process(
    process: subprocess.Popen,  # type: ignore[type-arg]
    kill: bool,
    grace_s: Optional[float] = None,
    deadline: Optional[float] = None,
) -> int:
    """Wait for a process to end; its return code.

    With `kill` it gets SIGKILL now, else once `grace_s` (None: EXIT_GRACE_S, read now) is over, or at
    `deadline` (time.monotonic()) when that comes sooner, though never sooner than LEAST_GRACE_S from now.
    """
    if kill and process.poll() is None:
        process.kill()
    if grace_s is None:
        grace_s = EXIT_GRACE_S
    now = time.monotonic()
    end = now + grace_s
    if deadline is not None:
        end = min(end, max(deadline, now + min(LEAST_GRACE_S, grace_s)))
    delay = 0.001
    while process.poll() is None:
        if time.monotonic() >= end:
            process.kill()
            end = float("inf")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    return process.returncode


def die_with_parent(parent_pid: int) -> None:
    """Be killed when the server process dies, however it dies (Linux); exit now if it is gone already."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(1)
