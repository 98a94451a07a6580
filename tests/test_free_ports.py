"""The ports tests use: none of Triton's defaults, and free_ports' stay free until the server that gets one binds it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from pytriton.triton import Triton, TritonConfig
from tests.server_process import ROOT, WAIT_S, namespaces

# Run in a network namespace of its own, whose ephemeral range is 12 ports: every port the kernel would pick
# for a bind to port 0 or an outgoing connection is taken, and none of them may be a reserved one.
CHECK = textwrap.dedent(
    """
    import socket
    from tests.fleet import free_ports

    with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as range_file:
        range_file.write("40000 40011")
    reserved = set(free_ports(3))
    for reuse in (0, 1):
        taken = []
        try:
            while True:
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, reuse)
                sock.bind(("127.0.0.1", 0))
                taken.append(sock)
        except OSError:
            pass
        print("bind", reuse, sorted(reserved & {sock.getsockname()[1] for sock in taken}), len(taken))
        for sock in taken:
            sock.close()
    server = socket.create_server(("127.0.0.2", 5000))
    clients = []
    try:
        while True:
            clients.append(socket.create_connection(("127.0.0.2", 5000)))
    except OSError:
        pass
    print("connect", sorted(reserved & {client.getsockname()[1] for client in clients}), len(clients))
    for port in sorted(reserved):
        for host in ("127.0.0.1", "0.0.0.0"):
            with socket.socket() as sock:  # as pytriton's, HAProxy's and tritonserver's listeners are
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                sock.listen()
    print("servers bind them")
    """
)


def test_no_bind_to_port_0_and_no_connection_gets_a_reserved_port() -> None:
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    assert unshare and ip, "this test needs unshare (util-linux) and ip (iproute2): apt-get install util-linux iproute2"
    result = subprocess.run(
        [*namespaces(unshare, "--net"), "sh", "-c", f'{ip} link set lo up && exec "$0" -c "$1"', sys.executable, CHECK],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.stdout.splitlines() == [
        "bind 0 [] 9",
        "bind 1 [] 9",
        "connect [] 9",
        "servers bind them",
    ], result.stdout + result.stderr


def test_a_server_a_test_starts_on_a_default_port_fails_on_any_machine() -> None:
    # Where nothing served on 8000 such a test passed; where a pytriton demo did, it failed.
    triton = Triton(config=TritonConfig(allow_grpc=False, allow_metrics=False))
    try:
        with pytest.raises(OSError, match="port 8000, one of Triton's default ports"):
            triton.run()
    finally:
        triton.stop()
