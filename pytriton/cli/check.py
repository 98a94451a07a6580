"""`pytriton check`: versions, and for each port whether the server could listen on it, or what serves it now.

A port that is taken is asked what it is, in its own protocol and within PROBE_TIMEOUT_S: HTTP `GET /v2`
(Triton's server metadata), gRPC `ServerMetadata`, `GET /metrics`. A pytriton server of this user on this
host also gives its pid (through the local socket RemoteTriton attaches to).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import http.client
import importlib.metadata
import json
import platform
import socket
from typing import List, Optional, Sequence, Tuple

from pytriton import __version__
from pytriton.cli.errors import StartupError
from pytriton.exceptions import PyTritonError
from pytriton.options.openai import resolve_openai_port
from pytriton.runtime.options import resolve_options
from pytriton.transport.sockets import bind_socket
from pytriton.triton_config import TritonConfig

EXIT_FREE = 0
EXIT_TAKEN = 1
# How long one probe of a taken port may take (connecting, then the answer).
PROBE_TIMEOUT_S = 1.0
# The most of an answer read: a metadata document or the start of a metrics page.
_MAX_ANSWER_BYTES = 64 * 1024
_PACKAGES = ("numpy", "orjson", "httptools", "uvloop", "grpcio", "protobuf", "tritonclient", "wrapt")
# What each port is for.
HTTP, GRPC, METRICS = "HTTP/REST", "gRPC", "metrics"
# Ports of their own that answer HTTP, served when the options or the environment ask for them.
SAGEMAKER, VERTEX_AI, OPENAI = "SageMaker", "Vertex AI", "OpenAI"


def check(config: TritonConfig) -> int:
    """Print versions and what each port would serve, and whether it is free (or what serves it); the exit status."""
    print(f"pytriton {__version__} on Python {platform.python_version()} ({platform.platform()})")
    for package in _PACKAGES:
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        print(f"  {package:<13} {version}")
    try:
        options = resolve_options(config)
        openai_port = resolve_openai_port(None)
    except PyTritonError as error:
        raise StartupError(str(error)) from None
    # What it is for, whether it is served, its address and port, and the protocol it is asked in when taken.
    rows: List[Tuple[str, bool, str, int, Optional[str]]] = [
        (HTTP, options.http_enabled, options.http_address, options.http_port, HTTP),
        (GRPC, options.grpc_enabled, options.grpc_address, options.grpc_port, GRPC),
        (METRICS, options.metrics_enabled, options.metrics_address, options.metrics_port, METRICS),
    ]
    # The server listens on these too (on the HTTP address) and cannot start when one is taken; they serve no Triton
    # API to ask what answers there.
    extra: List[Tuple[str, Optional[int]]] = [
        (OPENAI, openai_port),
        (SAGEMAKER, options.sagemaker.port if options.sagemaker else None),
        (VERTEX_AI, options.vertex_ai.port if options.vertex_ai else None),
    ]
    rows += [(name, True, options.http_address, port, None) for name, port in extra if port is not None]
    taken = 0
    for name, enabled, address, port, protocol in rows:
        if not enabled:
            print(f"  {name:<10} disabled")
            continue
        state = port_state(address, port, protocol)
        taken += state.startswith("not free")
        print(f"  {name:<10} {address}:{port}  {state}", flush=True)
    return EXIT_TAKEN if taken else EXIT_FREE


def port_state(address: str, port: int, protocol: Optional[str]) -> str:
    """'free', 'any free port', or 'not free: <what serves there, or why>'.

    `protocol` is what the port is for (HTTP, GRPC or METRICS), which a taken port is asked in; None: not asked.
    """
    if port == 0:
        return "any free port"
    try:
        bind_socket(address, port).close()
    except OSError as error:
        reason = error.strerror or str(error)
        if error.errno != errno.EADDRINUSE or protocol is None:
            return f"not free: {reason}"
        answer = _identify(_loopback(address), port, protocol)
        if answer.text is None:
            waited = f"nothing answers there within {PROBE_TIMEOUT_S:g} s" if answer.silent else "not a Triton server"
            return f"not free: {reason} ({waited})"
        pid = _pytriton_pid(port) if answer.triton else None
        details = [detail for detail in (answer.detail, f"pytriton pid {pid}" if pid else None) if detail]
        return f"not free: {answer.text}" + (f" ({'; '.join(details)})" if details else "")
    return "free"


@dataclasses.dataclass(frozen=True)
class _Answer:
    """What a probe found: its words (None: nothing it recognises), whether it is Triton's, and how it ended."""

    text: Optional[str] = None
    detail: Optional[str] = None  # the server's name and version
    triton: bool = False
    silent: bool = False  # no answer within PROBE_TIMEOUT_S: another protocol would wait as long for nothing
    http: bool = False  # an HTTP server answered


def _identify(host: str, port: int, protocol: str) -> _Answer:
    """Ask the port in its own protocol first; a port that answers in no way that protocol expects, in the other."""
    if protocol == GRPC:
        answer = _probe_grpc(host, port)
        if answer.triton or answer.silent:
            return answer
        over_http = _probe_http(host, port, ("/v2", "/metrics"))
        return over_http if over_http.http else answer
    answer = _probe_http(host, port, ("/v2", "/metrics") if protocol == HTTP else ("/metrics", "/v2"))
    if answer.triton or answer.silent or answer.http:
        return answer
    return _probe_grpc(host, port)  # e.g. a gRPC port given as the HTTP one


def _loopback(address: str) -> str:
    """The address to reach a server listening on `address` from this host."""
    if address in ("", "0.0.0.0"):
        return "127.0.0.1"
    if address == "::":
        return "::1"
    return address


def _probe_http(host: str, port: int, paths: Sequence[str]) -> _Answer:
    """`GET` each path until one shows a Triton server (metadata on /v2, nv_ metrics on /metrics)."""
    first: Optional[_Answer] = None
    for path in paths:
        try:
            status, body = _get(host, port, path)
        except socket.timeout:
            return first or _Answer(silent=True)
        except (OSError, http.client.HTTPException):
            return first or _Answer()  # not HTTP
        answer = _what_answers(path, status, body)
        if answer.triton:
            return answer
        first = first or answer
    return first or _Answer()


def _get(host: str, port: int, path: str) -> Tuple[int, bytes]:
    """`GET path` over HTTP/1.1: the status and the start of the body."""
    connection = http.client.HTTPConnection(host, port, timeout=PROBE_TIMEOUT_S)
    try:
        connection.request("GET", path, headers={"Connection": "close"})
        response = connection.getresponse()
        return response.status, response.read(_MAX_ANSWER_BYTES)
    finally:
        connection.close()


def _what_answers(path: str, status: int, body: bytes) -> _Answer:
    """What an HTTP answer to `GET path` shows."""
    if path == "/v2":
        metadata = _metadata(body) if status == 200 else None
        if metadata is not None:
            return _Answer("Triton HTTP/REST answers there", metadata, triton=True, http=True)
    elif status == 200 and (body.startswith(b"nv_") or b"\nnv_" in body or b"# HELP nv_" in body):
        return _Answer("Triton metrics answer there (GET /metrics)", triton=True, http=True)
    return _Answer(f"an HTTP server that is not Triton answers there (GET {path}: {status})", http=True)


def _probe_grpc(host: str, port: int) -> _Answer:
    """What answers a gRPC ServerMetadata call: Triton gRPC, with the server's name and version."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    channel = grpc.insecure_channel(target, options=[("grpc.enable_http_proxy", 0)])  # the port itself, not a proxy
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        reply = stub.ServerMetadata(service_pb2.ServerMetadataRequest(), timeout=PROBE_TIMEOUT_S)
    except grpc.RpcError as error:
        code = error.code() if isinstance(error, grpc.Call) else None
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return _Answer(silent=True)
        if code is grpc.StatusCode.UNAVAILABLE or code is None:
            return _Answer()  # nothing that speaks gRPC in cleartext
        return _Answer(f"a gRPC server that is not Triton answers there (ServerMetadata: {code.name})")
    finally:
        channel.close()
    return _Answer("Triton gRPC answers there", f"server {reply.name}, version {reply.version}", triton=True)


def _metadata(body: bytes) -> Optional[str]:
    """'server triton, version 0.1.0' from Triton's server metadata document; None from any other body."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict) or not {"name", "version", "extensions"} <= document.keys():
        return None
    return f"server {document['name']}, version {document['version']}"


def _pytriton_pid(port: int) -> Optional[int]:
    """The pid of this user's pytriton server whose HTTP or gRPC port is `port`, when it is on this host."""
    from pytriton.runtime.attach import attach_address, peer_is_trusted, peer_pid

    with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as sock:
        sock.settimeout(PROBE_TIMEOUT_S)
        try:
            sock.connect(attach_address(port))
            if not peer_is_trusted(sock):
                return None
            return peer_pid(sock) or None
        except OSError:
            return None
