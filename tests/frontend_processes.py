"""Which frontend process serves a connection, read from /proc: the tests of several frontends need to know."""

from __future__ import annotations

import http.client
import os
import socket
import time
from typing import Dict, Iterator, List, Optional, Set, Tuple

FRONTEND_MODULE = b"pytriton.runtime.frontends.process"


def frontend_pids(parent: Optional[int] = None) -> List[int]:
    """The frontend processes of the server in process `parent` (this one by default), by pid."""
    parent = os.getpid() if parent is None else parent
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except OSError:
            continue
        if ppid == parent and FRONTEND_MODULE in command:
            found.append(int(entry))
    return sorted(found)


def _socket_inodes(pid: int) -> Set[int]:
    """The inodes of the sockets process `pid` holds."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _tcp_sockets() -> Iterator[Tuple[int, int, str, int]]:
    """Each TCP socket of this network namespace: (local port, remote port, state, inode), from Linux's /proc."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
                    yield int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16), state, inode
        except OSError:
            continue


def listening_inodes(ports: List[int]) -> Set[int]:
    """The inodes of the sockets listening on `ports` in this network namespace.

    A socket's inode is its own while it exists: unlike a port, which a server of another test may bind as soon as
    it is free, it says whose listener it is.
    """
    return {inode for local, _, state, inode in _tcp_sockets() if state == "0A" and local in ports}  # 0A: LISTEN


def _server_side_inode(server_port: int, client_port: int) -> Optional[int]:
    """The inode of the server's end of the loopback TCP connection from `client_port` to `server_port`."""
    for local, remote, _, inode in _tcp_sockets():
        if local == server_port and remote == client_port:
            return inode
    return None


def serving_pid(client: socket.socket, pids: List[int], timeout_s: float = 10.0) -> int:
    """The pid, among `pids`, of the frontend that serves the connection of `client` (waits until one does)."""
    server_port = client.getpeername()[1]
    client_port = client.getsockname()[1]
    deadline = time.monotonic() + timeout_s
    while True:
        inode = _server_side_inode(server_port, client_port)
        if inode is not None:
            owners: Dict[int, bool] = {pid: inode in _socket_inodes(pid) for pid in pids}
            holding = [pid for pid, holds in owners.items() if holds]
            if len(holding) == 1:
                return holding[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no frontend among {pids} serves the connection from port {client_port}")
        time.sleep(0.01)


def one_connection_each(port: int, pids: List[int], timeout_s: float = 60.0) -> Dict[int, http.client.HTTPConnection]:
    """An HTTP connection to `port` that each frontend process of `pids` serves, by pid (extra ones are closed)."""
    found: Dict[int, http.client.HTTPConnection] = {}
    for _ in range(16 * len(pids)):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
        connection.connect()
        pid = serving_pid(connection.sock, pids)
        if pid in found:
            connection.close()
        else:
            found[pid] = connection
        if len(found) == len(pids):
            return found
    for connection in found.values():
        connection.close()
    raise AssertionError(f"connections reached {sorted(found)} of {pids}")
