"""Server limits: request sizes, timeouts and connection caps, with safe defaults.

They are kept apart from TritonConfig, which holds NVIDIA's options only. Pass them as
`Triton(limits=ServerLimits(...))`; without that argument every field comes from its
`PYTRITON_LIMIT_<NAME>` environment variable when set, else from its default.

Where each limit is enforced, and how a refusal looks:

| limit | where | refusal |
|---|---|---|
| max_body_bytes | HTTP app, while reading (and decompressing) a body | 413 |
| max_json_bytes | HTTP app: a request's JSON (inference, generate; other API bodies: 413) | 400 |
| max_inflated_bytes | both transports: decompressed requests alive at once, together | 503 / RESOURCE_EXHAUSTED |
| max_received_bytes | both transports: bodies and messages of 1 MiB or more, received or held, together | they wait |
| max_header_bytes | HTTP connection, while the request line and headers arrive | 431, connection closed |
| header_timeout_s | HTTP connection: request line and headers must arrive within it | 408, connection closed |
| body_timeout_s | HTTP connection: longest pause between two parts of a body | 408, connection closed |
| keep_alive_timeout_s | HTTP connection: idle between requests (before the first: header_timeout_s if less) | closed |
| send_timeout_s | HTTP and gRPC connection: a full send buffer left unread (gRPC: no window opened) so long | closed |
| max_connections | HTTP connection: a request on a connection over the cap (all served busy) | 503, connection closed |
| grpc_max_message_bytes | gRPC channel (received and sent messages) | RESOURCE_EXHAUSTED |
| grpc_max_concurrent_rpcs | gRPC service, before a call runs: RPCs in progress at once | RESOURCE_EXHAUSTED |
| grpc_max_concurrent_streams | gRPC connection: calls open at once (SETTINGS_MAX_CONCURRENT_STREAMS) | REFUSED_STREAM |
| grpc_max_stream_requests | ModelStreamInfer: requests of one stream in progress at once | the stream waits |
| grpc_max_connections | gRPC connection over the cap (all served busy), at its first call | UNAVAILABLE, then GOAWAY |
| grpc_max_buffered_bytes | gRPC connection: bytes of request messages still arriving | all but the oldest wait |
| grpc_idle_timeout_s | gRPC connection: time without a call in progress | GOAWAY, connection closed |
| grpc_handshake_timeout_s | gRPC connection: TLS handshake, then the HTTP/2 preface and SETTINGS | connection closed |
| grpc_handshake_timeout_s | gRPC connection: after its SETTINGS, its first call (at most so long) | GOAWAY, closed |
| max_tensor_elements | both codecs, from the declared shape, before any tensor is built | 400 / INVALID_ARGUMENT |
| max_response_bytes | engine, per request, when its outputs come back from the callable | 500 / INTERNAL |
| hung_call_warning_s | engine: a callable running longer is logged once per call (not a refusal) | warning |
| lame_duck_s | stop: readiness is false but requests are still served this long before the drain | (none) |

At max_connections (grpc_max_connections, the metrics port's METRICS_MAX_CONNECTIONS), a new connection takes the
place of the served one that has waited on its client longest (idle, a request head unfinished, no gRPC call), which
is closed (`transport/connection_cap.py`): connections that send nothing cannot hold a cap. Only while every
connection served is busy is a new one over the cap.

A ModelStreamInfer stream at grpc_max_stream_requests is not refused: the server reads no further
request of it until one ends, and HTTP/2 flow control holds the client meanwhile.

gRPC keepalive enforcement (ping strikes, minimum ping interval) is set by TritonConfig's
`grpc_http2_*` options, as in Triton. Beyond these limits the gRPC server always enforces its HTTP/2
rules: inbound flow-control windows of 4 MiB a stream and 16 MiB a connection, reopened as calls read
(FLOW_CONTROL_ERROR for a client that sends past them), header blocks within twice max_header_bytes
(a header list over max_header_bytes fails its call alone, RESOURCE_EXHAUSTED) and a few CONTINUATION
frames, and flood counters (RST_STREAM, PING, SETTINGS, frames carrying nothing) that end a connection
with GOAWAY ENHANCE_YOUR_CALM (`pytriton/transport/grpc/floods.py`).

The HTTP limits are enforced by the HTTP server's connections (`pytriton/transport/http/connection.py`),
which answer every refusal with a JSON error body.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import math
import os
from typing import Any, Dict, Mapping, Optional

from pytriton.exceptions import PyTritonValidationError

LOGGER = logging.getLogger("pytriton")
ENV_PREFIX = "PYTRITON_LIMIT_"
# grpcio's largest message (Triton sets this on its server too).
GRPC_MAX_MESSAGE_BYTES = 2**31 - 1
# tritonserver 2.51 reads an HTTP body of any size; binary tensors get as much room as a gRPC message.
DEFAULT_MAX_BODY_BYTES = GRPC_MAX_MESSAGE_BYTES
# tritonserver 2.59+'s --http-max-input-size default, which bounds the JSON only: binary tensors pass it.
DEFAULT_MAX_JSON_BYTES = 64 * 1024 * 1024
# One message of the largest size still inflates when it is alone.
DEFAULT_MAX_INFLATED_BYTES = GRPC_MAX_MESSAGE_BYTES


# An idle HTTP connection outlives the clients' pools (aiohttp, under tritonclient.http.aio, keeps one 15 s; httpx
# 5 s) and load balancers' idle timeouts (AWS ALB 60 s), so the client, not the server, ends it: a request sent on
# a pooled connection just as the server closes it fails in the client (aiohttp raises ServerDisconnectedError or a
# reset for a POST, which it does not retry). tritonserver never closes an idle connection.
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 75.0
# Connections over max_connections (or grpc_max_connections) a server holds to answer them 503 (UNAVAILABLE);
# one more is closed as it comes. Each waits for its first request (or call) until a timeout (30 s, 10 s), so a
# client opening connections faster than that took every descriptor of the process, past any cap.
OVER_CAP_HELD = 256
# The metrics port's cap: a scraper or two use it (its connections are counted in the open-file limit).
METRICS_MAX_CONNECTIONS = 64


@functools.cache
def default_max_received_bytes() -> int:
    """Half of the memory this process may use: physical memory, or its cgroup's memory.max when lower.

    Read once (at the first server's start) and kept: a process's memory does not change under it.
    """
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cgroup = _cgroup_memory_max()
    if cgroup is not None:
        memory = min(memory, cgroup)
    return max(memory // 2, 1)


def _cgroup_memory_max(root: str = "/sys/fs/cgroup") -> Optional[int]:
    """The memory limit of this process's cgroup (v2 memory.max, else v1 memory.limit_in_bytes); None if none."""
    paths = []
    try:
        with open("/proc/self/cgroup") as lines:
            for line in lines:
                _, controllers, path = line.strip().split(":", 2)
                if not controllers:  # cgroup v2: "0::/the/group"
                    paths.append(os.path.join(root, path.lstrip("/"), "memory.max"))
                elif "memory" in controllers.split(","):  # cgroup v1: "4:memory:/the/group"
                    paths.append(os.path.join(root, "memory", path.lstrip("/"), "memory.limit_in_bytes"))
    except (OSError, ValueError):
        pass
    paths += [os.path.join(root, "memory.max"), os.path.join(root, "memory", "memory.limit_in_bytes")]
    for path in paths:
        try:
            with open(path) as file:
                value = file.read().strip()
        except OSError:
            continue
        if value.isdigit():
            return int(value)  # v1's "no limit" is a huge number: physical memory is then lower
        return None  # "max": no limit
    return None


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """Limits that protect the server from oversized, slow or too many requests; 0 disables a timeout.

    Args:
        max_body_bytes: largest HTTP request body, after decompression (413 above it): binary tensors included.
        max_json_bytes: largest JSON document of an HTTP request, as tritonserver 2.59+'s --http-max-input-size:
            an inference's JSON (its whole body, or its Inference-Header-Content-Length part) and a generate
            body are refused with 400 above it; the other API bodies (repository, logging, shared memory) and
            the OpenAI API's with 413.
        max_inflated_bytes: what the decompressed requests (HTTP Content-Encoding, gRPC grpc-encoding) alive at
            once may hold together, server-wide, from the first inflated byte until the request's last view of
            them is gone; one that would pass it is refused (HTTP 503, gRPC RESOURCE_EXHAUSTED). Each request is
            bounded by its own limit, but a client sends a compressed request for a thousandth of what it costs
            the server.
        max_received_bytes: what large request bodies (HTTP) and messages (gRPC) of 1 MiB or more may hold at once,
            server-wide, from before their first byte is read until the last view of them is gone or their request
            is answered (`transport/receive_budget.py`). One that finds no room is not refused: its connection
            reads none of it (HTTP: the socket; gRPC: its stream's window) until the ones before it are done, in
            arrival order; one larger than the whole budget goes alone. A value given is each process's own with
            frontend processes (each frontend, and the server's process when it serves ports of its own). Not
            given (None): half of the memory the process may use (physical memory, or the cgroup's memory.max
            when lower), decided once at start and divided between those processes (`received_bytes`), so
            that the server as a whole holds at most half: each connection's own bound (max_body_bytes, 2 GiB)
            lets a dozen clients fill 24 GiB, and the kernel's OOM killer would then end the server and every
            other client's requests with it; half leaves room for what the models, their outputs and the
            responses on their way hold.
        max_header_bytes: largest HTTP request line plus headers (431 above it).
        header_timeout_s: seconds for an HTTP request's line and headers to arrive (408 after it).
        body_timeout_s: longest pause, in seconds, while an HTTP request body arrives (408 after it).
        keep_alive_timeout_s: seconds an HTTP connection may stay idle between two requests, or before its first
            one unless header_timeout_s is shorter.
        send_timeout_s: seconds an HTTP or gRPC connection's send buffer may stay full while its client reads
            nothing of it (a client that never reads its responses holds their memory); 0: no limit. While it is
            full, the next pipelined HTTP request waits and a gRPC connection reads no more requests. A gRPC client
            that opens no HTTP/2 window (WINDOW_UPDATE, SETTINGS) this long while answers wait for one is let go
            too: its shut windows held its calls' answers without ever filling the buffer.
        max_connections: HTTP connections served at once. At the cap a new connection takes the place of the one
            that has waited on its client longest (idle, or a request head unfinished: closed, the head answered 503);
            while every one served is busy, a request on one more gets 503 (past OVER_CAP_HELD more, a new
            connection is closed as it comes).
        grpc_max_message_bytes: largest gRPC message received or sent (RESOURCE_EXHAUSTED above it).
        grpc_max_concurrent_rpcs: gRPC calls in progress at once (RESOURCE_EXHAUSTED above it).
        grpc_max_concurrent_streams: calls open at once on one gRPC connection, advertised to clients
            (SETTINGS_MAX_CONCURRENT_STREAMS); a stream beyond it is refused (REFUSED_STREAM).
        grpc_max_stream_requests: requests of one ModelStreamInfer stream in progress at once; the server
            reads the next one when one ends.
        grpc_max_connections: gRPC connections served at once. At the cap a new connection takes the place of the
            one without a call for the longest (GOAWAY NO_ERROR saying why); while every one served has a call in
            progress, one more answers its first call UNAVAILABLE, then
            says GOAWAY (at the first call's deadline if it opens none); past OVER_CAP_HELD more, a new connection
            is closed as it comes.
        grpc_max_buffered_bytes: bytes of request messages still arriving (sent in part) that one gRPC connection
            buffers; past it, only the oldest such message's flow-control window reopens, and the others' clients wait
            until it is whole. Nothing is refused: a single message may be larger (up to grpc_max_message_bytes).
        grpc_idle_timeout_s: seconds a gRPC connection may stay without a call before the server closes it.
        grpc_handshake_timeout_s: seconds for a gRPC connection's TLS handshake, then its HTTP/2 preface and
            SETTINGS, to arrive; then as long again for its first call (GOAWAY after it), or grpc_idle_timeout_s
            if that is shorter. A connection that opens no call is held no longer for sending the preface.
        max_tensor_elements: most elements a request may declare for one input, and the largest dimension.
        max_response_bytes: largest total of one response's output tensors (the request fails above it).
        hung_call_warning_s: log a warning naming the model and instance when one call runs longer.
        lame_duck_s: on stop (SIGTERM), seconds during which readiness is false but requests are still served,
            HTTP/1.1 responses say `Connection: close` and gRPC clients get a graceful GOAWAY, so that a load
            balancer's health checks take the replica out before it refuses anything; set it above the
            balancer's detection time (a readiness probe's period times its failure threshold). 0: drain at once.
    """

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES
    max_received_bytes: Optional[int] = None
    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 30.0
    body_timeout_s: float = 30.0
    keep_alive_timeout_s: float = DEFAULT_KEEP_ALIVE_TIMEOUT_S
    send_timeout_s: float = 30.0
    max_connections: int = 4096
    grpc_max_message_bytes: int = GRPC_MAX_MESSAGE_BYTES
    grpc_max_concurrent_rpcs: int = 4096
    grpc_max_concurrent_streams: int = 100
    grpc_max_stream_requests: int = 128
    grpc_max_connections: int = 4096
    grpc_max_buffered_bytes: int = 256 * 2**20
    grpc_idle_timeout_s: float = 300.0
    grpc_handshake_timeout_s: float = 10.0
    max_tensor_elements: int = 1 << 28
    max_response_bytes: int = GRPC_MAX_MESSAGE_BYTES
    hung_call_warning_s: float = 60.0
    lame_duck_s: float = 0.0

    def __post_init__(self) -> None:
        """Refuse values that would disable a protection by accident."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.name == "max_received_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise PyTritonValidationError(f"ServerLimits.{field.name} must be a number, got {value!r}")
            if field.name.endswith("_s"):
                if not 0 <= value < math.inf:  # NaN too: it compares false, and no timer can be set from it
                    raise PyTritonValidationError(
                        f"ServerLimits.{field.name} must be a finite number >= 0, got {value}"
                    )
            elif not isinstance(value, int) or value <= 0:
                raise PyTritonValidationError(f"ServerLimits.{field.name} must be a positive integer, got {value!r}")
        if self.grpc_max_concurrent_streams > GRPC_MAX_MESSAGE_BYTES:
            raise PyTritonValidationError(
                f"ServerLimits.grpc_max_concurrent_streams must be <= 2^31-1, got {self.grpc_max_concurrent_streams}"
            )
        if self.grpc_max_message_bytes > GRPC_MAX_MESSAGE_BYTES:
            raise PyTritonValidationError(
                f"ServerLimits.grpc_max_message_bytes must be <= {GRPC_MAX_MESSAGE_BYTES}, got "
                f"{self.grpc_max_message_bytes}"
            )

    def received_bytes(self, processes: int = 1) -> int:
        """Each process's receive budget: max_received_bytes, else half the memory divided between `processes`."""
        if self.max_received_bytes is not None:
            return self.max_received_bytes
        return max(default_max_received_bytes() // processes, 1)

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> ServerLimits:
        """Limits from PYTRITON_LIMIT_<NAME> variables (e.g. PYTRITON_LIMIT_MAX_BODY_BYTES=1048576), else defaults."""
        environ = os.environ if environ is None else environ
        names = [ENV_PREFIX + field.name.upper() for field in dataclasses.fields(cls)]
        for name in sorted(set(environ) - set(names)):
            if name.startswith(ENV_PREFIX):  # a misspelt limit would silently keep its default
                nearest = difflib.get_close_matches(name, names, n=1)
                hint = f" (did you mean {nearest[0]}?)" if nearest else ""
                LOGGER.warning("%s is not a server limit, ignored%s", name, hint)
        values: Dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = environ.get(ENV_PREFIX + field.name.upper())
            if raw is None or not raw.strip():
                continue
            try:
                values[field.name] = float(raw) if field.name.endswith("_s") else int(raw)
            except ValueError:
                kind = "a number" if field.name.endswith("_s") else "an integer"
                raise PyTritonValidationError(f"{ENV_PREFIX}{field.name.upper()} must be {kind}, got {raw!r}") from None
        return cls(**values)


def resolve_limits(explicit: Optional[ServerLimits]) -> ServerLimits:
    """The limits to run with: the ones given, else the environment's over the defaults."""
    return explicit if explicit is not None else ServerLimits.from_env()
