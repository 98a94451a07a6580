"""Listening sockets bound by the server itself, so port 0 works and the real port is known."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl as ssl_module
from typing import Callable, Optional

LOGGER = logging.getLogger(__name__)

# Connections the kernel completes and queues until the server accepts them. asyncio's create_server
# listens again with its own default (100) unless given this: pass it there too.
BACKLOG = 2048


def bind_socket(address: str, port: int, dual_stack: bool = False) -> socket.socket:
    """Bind and listen on address:port (IPv4 or IPv6); port 0 picks a free port.

    With `dual_stack`, the IPv4 wildcard 0.0.0.0 is bound as IPv6's [::] taking IPv4 too, as grpc's C-core (and so
    Triton's gRPC port) binds it, where the machine has IPv6: clients of either family reach it.
    """
    if dual_stack and address == "0.0.0.0" and socket.has_ipv6:
        try:
            return _bound(socket.AF_INET6, "::", port, dual_stack=True)
        except OSError as error:
            if error.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT):
                raise
            # no IPv6 on this machine (disabled, or a container without it): IPv4's wildcard alone
    return _bound(socket.AF_INET6 if ":" in address else socket.AF_INET, address, port)


def _bound(family: int, address: str, port: int, dual_stack: bool = False) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if dual_stack:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((address, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def bound_port(sock: socket.socket) -> int:
    """The port a socket is bound to."""
    return int(sock.getsockname()[1])


async def adopt_connection(
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    factory: Callable[[], asyncio.BaseProtocol],
    ssl: Optional[ssl_module.SSLContext] = None,
    ssl_handshake_timeout: Optional[float] = None,
    failed: Optional[Callable[[], None]] = None,
) -> None:
    """Serve a connection accepted elsewhere (the hub's) with a protocol from `factory`; closed if that fails.

    With TLS this waits for the handshake, as a server's accept does. `failed` is called when the connection
    is closed without being served: where it was accepted it was counted open, against the caps.
    """
    try:
        await loop.connect_accepted_socket(factory, sock, ssl=ssl, ssl_handshake_timeout=ssl_handshake_timeout)
    except Exception as error:  # noqa: BLE001 - the client went away, or its handshake failed: its loss alone
        LOGGER.debug("a connection handed over could not be served: %r", error)
        sock.close()
        if failed is not None:
            failed()
