"""A process's established TCP connections to or from a port, read from /proc (no psutil in the test extras)."""

from __future__ import annotations

import os
from typing import Set, Union

_ESTABLISHED = "01"
# /proc/net/tcp's columns: the local address is the second, the remote the third (address:port, in hex).
_LOCAL, _REMOTE = 1, 2


def established(pid: Union[int, str], port: int, *, served: bool) -> int:
    """How many established connections process `pid` ("self" for this one) holds on `port`.

    `served`: those it serves on its own port `port`; else those it opened to port `port` of another.
    """
    inodes = _socket_inodes(pid)
    column = _LOCAL if served else _REMOTE
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if int(fields[column].rsplit(":", 1)[1], 16) == port and fields[3] == _ESTABLISHED:
                    count += fields[9] in inodes
    return count


def _socket_inodes(pid: Union[int, str]) -> Set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes
