"""Processes the server starts and stops: the start and its handshake, how one ended, a stop that waits, then kills.

Both kinds of helper process use it: model instances (core/process_instances/) and frontends (runtime/). A
helper is a fresh interpreter (`python -m MODULE FD PARENT_PID`), never a fork of the server: a fork would
inherit the server's threads mid-flight and any CUDA context (which CUDA forbids using across fork).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Mapping, Optional, Sequence, Tuple

from pytriton.ipc.channel import LoopChannel, Message
from pytriton.ipc.tensors import Buffer

# A helper started: the process, its channel (the caller hands it over with `handle`), its first message.
Started = Tuple["subprocess.Popen[bytes]", LoopChannel, Message]


class HelperDidNotStart(RuntimeError):
    """A helper process ended, or was silent too long, before its first message; the message says which."""


async def start_helper(
    module: str,
    first: Tuple[Any, Sequence[Buffer]],
    timeout_s: float,
    env: Optional[Mapping[str, str]] = None,
    own_group: bool = False,
) -> Started:
    """Start `python -m module FD PARENT_PID` over a socket pair, send it `first` (head, body), await its answer.

    With `own_group` it leads a process group of its own, which `kill_group` ends once it has.

    Raises:
        HelperDidNotStart: it ended, or did not answer within `timeout_s` (it is killed then).
    """
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    command = [sys.executable, "-m", module, str(theirs.fileno()), str(os.getpid())]
    try:
        process = subprocess.Popen(command, pass_fds=[theirs.fileno()], env=env, start_new_session=own_group)
    finally:
        theirs.close()
    answer: asyncio.Future[Message] = loop.create_future()

    def on_message(message: Message) -> None:
        if not answer.done():
            answer.set_result(message)

    def on_closed() -> None:
        if not answer.done():
            answer.set_exception(HelperDidNotStart(exit_of(process, "before it was ready")))

    channel = LoopChannel(ours, loop, on_message, on_closed)
    try:
        channel.send(first[0], first[1])
        message = await asyncio.wait_for(answer, timeout_s)
    except BaseException as error:
        channel.close()  # says on_closed, which ends the answer if nothing did
        if not answer.cancelled():
            answer.exception()  # retrieved: nobody awaits it now (asyncio would log it "never retrieved")
        await stop_process(process, kill=True)
        if own_group:
            kill_group(process)
        if isinstance(error, asyncio.TimeoutError):
            raise HelperDidNotStart(f"it was not ready within {timeout_s:g} s") from None
        raise
    return process, channel, message


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


def kill_group(process: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGKILL what is left of the process group a helper started with `own_group` led (what its code forked).

    Once the helper is reaped its pid cannot be reused while the group has members, so this reaches only them.
    """
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # no member left


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
