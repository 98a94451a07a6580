"""grpc.aio server settings derived from ServerOptions: channel arguments, TLS credentials, bind address."""

from __future__ import annotations

import pathlib
from typing import Any, List, Tuple

import grpc

from pytriton.exceptions import PyTritonValidationError
from pytriton.runtime.options import GrpcTls, ServerOptions

# grpc_infer_response_compression_level -> grpc_compression_level (none, low, medium, high).
_COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}


def channel_options(options: ServerOptions) -> List[Tuple[str, Any]]:
    """Channel arguments of the server: message limits, keepalive, compression, exclusive port."""
    keepalive = options.grpc_keepalive
    arguments: List[Tuple[str, Any]] = [
        ("grpc.max_send_message_length", options.limits.grpc_max_message_bytes),
        ("grpc.max_receive_message_length", options.limits.grpc_max_message_bytes),
        ("grpc.keepalive_time_ms", keepalive.time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(keepalive.permit_without_calls)),
        ("grpc.http2.max_pings_without_data", keepalive.max_pings_without_data),
        ("grpc.http2.min_ping_interval_without_data_ms", keepalive.min_recv_ping_interval_without_data_ms),
        ("grpc.http2.max_ping_strikes", keepalive.max_ping_strikes),
        # A port already in use must fail to bind rather than be shared with another server.
        ("grpc.so_reuseport", 0),
    ]
    level = _COMPRESSION_LEVELS[options.grpc_compression_level]
    if level:
        # The level picks gzip or deflate among what each client accepts, as in Triton.
        arguments.append(("grpc.default_compression_level", level))
    return arguments


def bind_address(address: str, port: int) -> str:
    """host:port as grpc wants it (IPv6 hosts in brackets)."""
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"
    return f"{address}:{port}"


def server_credentials(tls: GrpcTls) -> Any:
    """Server TLS credentials; mutual TLS requires and verifies client certificates."""
    root = _read(tls.root_cert, "grpc_root_cert") if tls.root_cert is not None else None
    key_pair = (_read(tls.server_key, "grpc_server_key"), _read(tls.server_cert, "grpc_server_cert"))
    return grpc.ssl_server_credentials([key_pair], root_certificates=root, require_client_auth=tls.mutual)


def _read(path: pathlib.Path, option: str) -> bytes:
    """The content of a PEM file named by an option."""
    try:
        return path.read_bytes()
    except OSError as error:
        raise PyTritonValidationError(f"TritonConfig.{option}: cannot read {path}: {error.strerror}") from None
