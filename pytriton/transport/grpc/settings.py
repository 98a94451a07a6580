"""gRPC server settings derived from ServerOptions: TLS context, compression level, bind address."""

from __future__ import annotations

import pathlib
import ssl

from pytriton.exceptions import PyTritonValidationError
from pytriton.options.server import GrpcTls

# grpc_infer_response_compression_level -> grpc's compression level (none, low, medium, high).
COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}


def bind_address(address: str, port: int) -> str:
    """host:port as gRPC names it (IPv6 hosts in brackets)."""
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"
    return f"{address}:{port}"


def tls_context(tls: GrpcTls) -> ssl.SSLContext:
    """The server's TLS context (ALPN h2, TLS 1.2 or later); mutual TLS requires and verifies client certificates."""
    for path, option in (
        (tls.server_cert, "grpc_server_cert"),
        (tls.server_key, "grpc_server_key"),
        (tls.root_cert, "grpc_root_cert"),
    ):
        if path is not None:
            _check_readable(path, option)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    try:
        context.load_cert_chain(tls.server_cert, tls.server_key)
        if tls.root_cert is not None:
            context.load_verify_locations(tls.root_cert)
    except ssl.SSLError as error:
        raise PyTritonValidationError(f"gRPC TLS: cannot use the certificates or key: {error}") from None
    if tls.mutual:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _check_readable(path: pathlib.Path, option: str) -> None:
    """Fail with the option's name when a PEM file cannot be read."""
    try:
        path.read_bytes()
    except OSError as error:
        raise PyTritonValidationError(f"TritonConfig.{option}: cannot read {path}: {error.strerror}") from None
