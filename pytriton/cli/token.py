"""The access token of a server the command started: how the operator gets it, never written to the log.

A server started with no token of its own (no --access-token, no PYTRITON_ACCESS_TOKEN) guards its
administrative APIs with a generated one, as nvidia-pytriton 0.7 does. Logs are often shared, so the
token is not logged: once the server serves, one line says which APIs need it and how to get it:
`pytriton token --port <port>` reads it from the server itself, as RemoteTriton does (the server keeps it in
a memfd that only processes of its user, in its PID namespace, may open: `pytriton.runtime.attach`).
"""

from __future__ import annotations

import logging
import socket
import sys
from typing import Any, Optional, Sequence

from pytriton.exceptions import PyTritonError
from pytriton.options.access import ACCESS_TOKEN_HEADER, Category
from pytriton.runtime.attach import ask_token, attach_address, peer_is_trusted
from pytriton.triton import Triton
from pytriton.triton_config import TritonConfig, resolve_config

LOGGER = logging.getLogger("pytriton")
TOKEN_VARIABLE = "PYTRITON_ACCESS_TOKEN"
EXIT_FOUND = 0
EXIT_NOT_FOUND = 1
# How long the server may take to say where its token is.
_ANSWER_TIMEOUT_S = 5.0


class ServedTriton(Triton):
    """The command's Triton: after the startup line, a line on how to get the access token it generated."""

    def __init__(self, *, token_generated: bool, **kwargs: Any) -> None:
        """Create the server; `token_generated`: nobody gave it a token (TritonSecurityConfig made one)."""
        super().__init__(**kwargs)
        self._token_hint_due = token_generated

    def _serving(self) -> None:
        """Log the startup line, then (once) how the operator gets the generated token."""
        super()._serving()
        if not self._token_hint_due:
            return
        self._token_hint_due = False
        endpoints = self._security_config.restricted_endpoints or []
        token = self.get_access_token()
        if not endpoints or token is None:
            return
        port = self.http_port if self.http_port is not None else self.grpc_port
        rule = self._options.http_access.rules.get(Category.MODEL_REPOSITORY)
        readable = rule is not None and rule.value == token and sys.platform.startswith("linux")
        LOGGER.info("%s", token_hint(endpoints, port if readable else None))


def token_hint(endpoints: Sequence[str], port: Optional[int]) -> str:
    """Which APIs need the generated token, and how to get it (`pytriton token --port PORT`) or set one."""
    where = (
        f"`pytriton token --port {port}` prints it (to this user, on this host)"
        if port is not None
        else "it is not shown"
    )
    return (
        f"the restricted APIs ({', '.join(endpoints)}) need the access token generated for this run, in the "
        f"{ACCESS_TOKEN_HEADER} header: {where}; {TOKEN_VARIABLE} (or --access-token) sets one of your own"
    )


def default_port() -> int:
    """The port `pytriton token` asks by default: the configured HTTP port, else the gRPC one."""
    from pytriton.runtime.options import resolve_options

    options = resolve_options(resolve_config(TritonConfig()))
    return options.http_port if options.http_enabled else options.grpc_port


def print_token(port: Optional[int]) -> int:
    """Print the access token of this user's server whose HTTP or gRPC port is `port`; the exit status."""
    if port is None:
        try:
            port = default_port()
        except PyTritonError as error:
            return _not_found(str(error))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(attach_address(port))
    except OSError:
        sock.close()
        return _not_found(f"no pytriton server of this user on this host has port {port} (HTTP or gRPC)")
    if not peer_is_trusted(sock):
        sock.close()
        return _not_found(f"the server with port {port} runs as another user")
    token = ask_token(sock, _ANSWER_TIMEOUT_S)
    if token is None:
        return _not_found(
            f"the server with port {port} shows this process no token: it restricts no model-repository API "
            "with one, or it runs in another PID namespace (another container)"
        )
    print(token)
    return EXIT_FOUND


def _not_found(reason: str) -> int:
    """Say why no token was printed; the exit status."""
    print(f"pytriton token: error: {reason}", file=sys.stderr)
    return EXIT_NOT_FOUND
