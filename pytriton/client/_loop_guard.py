"""A blocking client call made on the event loop of a server of this process, to that server: refused at once.

An `async def` callable or route handler runs on its server's event loop. A call that blocks there waiting for that
same server's answer waits for the loop it blocks: every client of the server would stand still until it gave up.
"""

from __future__ import annotations

import ipaddress
import socket

from pytriton.client._url import TritonUrl
from pytriton.client.exceptions import PyTritonClientError
from pytriton.core.served_loops import ports_served_here


def refuse_a_wait_for_this_loop(what: str, url: TritonUrl) -> None:
    """Raise if this thread runs the event loop of the server at `url`: `what` (the client's call) would never end.

    Raises:
        PyTritonClientError: if so; it says what to use instead.
    """
    if would_wait_for_this_loop(url):
        raise PyTritonClientError(
            f"{what} called on the event loop of the server at {url.hostname}:{url.port}, which runs in this "
            "process (an async def callable or route handler): that server cannot answer while this call blocks "
            "its loop. Await an AsyncioModelClient or pytriton.compose.call_model_async instead, or bind a plain "
            "def callable (it runs in a thread of its own)."
        )


def would_wait_for_this_loop(url: TritonUrl) -> bool:
    """Whether this thread runs the event loop of the server at `url` (a wait for its answer here never ends)."""
    return url.port in ports_served_here() and _is_this_host(url.hostname)


def _is_this_host(hostname: str) -> bool:
    """Whether `hostname` names this host without a lookup: localhost, its name, a loopback or wildcard address."""
    if hostname in ("localhost", socket.gethostname()):
        return True
    try:
        address = ipaddress.ip_address(hostname.strip("[]"))
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified
