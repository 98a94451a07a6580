"""A process named by its pid and its start time: this machine's pid_max can be 32768, so a pid is soon taken again
by another process, and a killed child stays a zombie until it is reaped."""

from __future__ import annotations

from typing import Optional


def started_at(pid: int) -> Optional[bytes]:
    """The process's start time (clock ticks after boot), None once it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else fields[19]


def alive(pid: int, started: Optional[bytes]) -> bool:
    """Whether the process that had `pid` and started at `started` still runs."""
    return started is not None and started_at(pid) == started
