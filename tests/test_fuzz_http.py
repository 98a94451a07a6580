"""Property-based fuzzing of HTTP infer: JSON bodies, the binary extension, headers and raw bytes.

Every generated request goes over one persistent connection (a new one only after the server closed
it). Whatever the request, the server answers it with a 2xx or 4xx (never a 5xx, never silence), errors
are Triton's JSON `{"error": ...}`, and the server serves correctly afterwards. The three tests send
more than 10,000 requests together.
"""

from __future__ import annotations

import gzip
import json
import random
import socket
import zlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytriton.options.limits import ServerLimits
from pytriton.triton import Triton
from tests.conftest import running_triton
from tests.fuzz_models import DATATYPES, FUZZ_SETTINGS, bind_fuzz_models, examples, mutate_bytes

# Generated examples per test; each is sent with its mutants (5, 4 and 3 requests): 11,250 requests in all.
JSON_EXAMPLES = examples(900)
BINARY_EXAMPLES = examples(900)
HEADER_EXAMPLES = examples(1050)
PATHS = [
    "/v2/models/identity/infer",
    "/v2/models/mixed/infer",
    "/v2/models/identity/versions/1/infer",
    "/v2/models/identity/versions/7/infer",
    "/v2/models/identity/versions/x/infer",
    "/v2/models/missing/infer",
    "/v2/models/stream/infer",
    "/v2/models/mixed/generate",
]


# The connection stays open across examples: on a loaded machine the pause between two of them may pass the
# default keep-alive timeout (5 s), and the server's close of the idle connection meets the next request.
IDLE_S = 600.0


@pytest.fixture(scope="module")
def server() -> Iterator[Triton]:
    limits = ServerLimits(keep_alive_timeout_s=IDLE_S)
    with running_triton(bind_fuzz_models, allow_grpc=False, allow_metrics=False, limits=limits) as triton:
        yield triton


class Connection:
    """One keep-alive HTTP/1.1 connection that sends raw request bytes and reads whole responses."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: Optional[socket.socket] = None
        self.sent = 0

    def exchange(self, method: str, raw: bytes) -> Tuple[int, Dict[str, str], bytes]:
        """Send one request; return status, headers and body (status 0: closed without an answer)."""
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        self.sock.sendall(raw)
        self.sent += 1
        status, headers, body = self._read(method)
        if status == 0 or headers.get("connection") == "close":
            self.close()
        return status, headers, body

    def _read(self, method: str) -> Tuple[int, Dict[str, str], bytes]:
        assert self.sock is not None
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                return 0, {}, data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {name.strip().lower(): value.strip() for name, _, value in (ln.partition(":") for ln in lines[1:])}
        length = 0 if method == "HEAD" else int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return int(lines[0].split()[1]), headers, body

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


@pytest.fixture
def connection(server: Triton) -> Iterator[Connection]:
    assert server.http_port is not None
    conn = Connection(server.http_port)
    yield conn
    conn.close()


def _raw_request(method: str, path: str, headers: List[Tuple[str, str]], body: bytes) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: fuzz"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def check_answer(status: int, headers: Dict[str, str], body: bytes, method: str = "POST") -> None:
    """A client error is a 4xx with a JSON error; nothing is a 5xx or goes unanswered.

    The 5xx allowed are Triton's 501s for what the server or a model does not support (a body coding other than
    gzip or deflate, HTTP infer on a decoupled model). The error is JSON, sent as Triton types it: `text/plain`
    where its handler has set no content type yet (tests/test_http_wire.py).
    """
    assert status != 0, "the server closed the connection without answering"
    unsupported = status == 501 and (b"decoupled transaction policy" in body or b"Unsupported compression" in body)
    assert status < 500 or unsupported, (status, body[:300])
    if status == 200 or method == "HEAD" or not body:
        return
    assert headers.get("content-type") in ("application/json", "text/plain"), (status, headers, body[:300])
    assert isinstance(json.loads(body)["error"], str)


def still_serving(connection: Connection) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT_1", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]})
    raw = _raw_request("POST", "/v2/models/identity/infer", [], body.encode())
    status, _, answer = connection.exchange("POST", raw)
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [1.0, 2.0, 3.0]
    status, _, _ = connection.exchange("GET", _raw_request("GET", "/v2/health/ready", [], b""))
    assert status == 200


# ---------------------------------------------------------------- strategies

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
names = st.sampled_from(["INPUT_1", "a", "b", "c", "OUTPUT_1", "a_out", "x", ""]) | st.text(max_size=4)
datatypes = st.sampled_from([*DATATYPES, "FP128", "fp32", ""]) | st.text(max_size=4)
dims = st.one_of(
    st.integers(-2, 4),
    st.sampled_from([0, 1, 2, 2**31, 2**62, 2**63 - 1, -(2**63)]),
    st.integers(-(2**63), 2**63 - 1),
)
shapes = st.lists(dims, max_size=4) | json_values
numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.booleans(), st.text(max_size=3))
data = st.lists(numbers, max_size=6) | st.lists(st.lists(numbers, max_size=3), max_size=3) | json_values
parameter_keys = st.sampled_from(
    [
        "binary_data_size",
        "binary_data",
        "binary_data_output",
        "priority",
        "timeout",
        "sequence_id",
        "sequence_start",
        "headers",
        "triton_enable_empty_final_response",
        "triton_x",
        "classification",
        "shared_memory_region",
        "kind",
    ]
) | st.text(max_size=4)
parameters = st.dictionaries(parameter_keys, json_values, max_size=3)
input_entries = st.fixed_dictionaries(
    {"name": names, "datatype": datatypes, "shape": shapes},
    optional={"data": data, "parameters": parameters | json_values},
)
output_entries = st.fixed_dictionaries({"name": names}, optional={"parameters": parameters | json_values})
documents = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "inputs": st.lists(input_entries | json_values, max_size=3) | json_values,
        "outputs": st.lists(output_entries | json_values, max_size=3) | json_values,
        "parameters": parameters | json_values,
        "text_input": json_values,
    },
)


@st.composite
def near_valid_documents(draw: st.DrawFn) -> Dict[str, Any]:
    """A valid request for `identity` or `mixed` with one part replaced by something generated."""
    if draw(st.booleans()):
        rows = draw(st.integers(0, 3))
        values = draw(st.lists(st.floats(width=32, allow_nan=False), min_size=rows, max_size=rows))
        inputs: List[Any] = [{"name": "INPUT_1", "datatype": "FP32", "shape": [1, rows], "data": values}]
    else:
        inputs = [
            {"name": "a", "datatype": "INT32", "shape": [2], "data": [1, 2]},
            {"name": "b", "datatype": "BYTES", "shape": [1], "data": ["x"]},
            {"name": "c", "datatype": "BOOL", "shape": [2], "data": [True, False]},
        ]
    document: Dict[str, Any] = {"inputs": inputs}
    target = draw(st.sampled_from(["name", "datatype", "shape", "data", "parameters", "outputs", "top", "extra"]))
    replacement = draw(json_values | shapes | data | parameters)
    entry = inputs[draw(st.integers(0, len(inputs) - 1))]
    if target == "outputs":
        document["outputs"] = draw(st.lists(output_entries, max_size=3))
    elif target == "top":
        document[draw(st.sampled_from(["id", "parameters", "inputs"]))] = replacement
    elif target == "extra":
        inputs.append(draw(input_entries))
    else:
        entry[target] = replacement
    return document


@st.composite
def binary_requests(draw: st.DrawFn) -> Tuple[str, List[Tuple[str, str]], bytes]:
    """A JSON header with binary_data_size parameters, a binary tail and an Inference-Header-Content-Length."""
    path = draw(st.sampled_from(PATHS[:3]))
    count = draw(st.integers(0, 3))
    entries = []
    for _ in range(count):
        size = draw(st.integers(0, 24) | st.sampled_from([-1, 2**40, 2**63]) | st.booleans() | st.text(max_size=2))
        entry: Dict[str, Any] = {
            "name": draw(st.sampled_from(["INPUT_1", "a", "b", "c"]) | names),
            "datatype": draw(st.sampled_from(["FP32", "INT32", "BYTES", "BOOL", "FP16", "BF16"]) | datatypes),
            "shape": draw(st.lists(st.integers(0, 6), min_size=1, max_size=3) | shapes),
            "parameters": {"binary_data_size": size},
        }
        if draw(st.booleans()):
            entry["data"] = draw(data)
        entries.append(entry)
    document: Dict[str, Any] = {"inputs": entries}
    if draw(st.booleans()):
        document["outputs"] = [{"name": draw(names), "parameters": {"binary_data": draw(json_values)}}]
    if draw(st.booleans()):
        document["parameters"] = {"binary_data_output": draw(json_values)}
    header = json.dumps(document).encode()
    tail = draw(st.binary(max_size=64))
    length = str(len(header))
    if draw(st.integers(0, 3)) == 0:
        length = draw(
            st.sampled_from(["0", "-1", "", "abc", "1e3", " 7", "0x10", "99999999999999999999"])
            | st.integers(-5, len(header) + 80).map(str)
        )
    headers = [("Inference-Header-Content-Length", length)]
    if draw(st.booleans()):
        headers.append(("Accept-Encoding", draw(st.sampled_from(["gzip", "deflate", "br", "gzip;q=0", "*"]))))
    return path, headers, header + tail


token_chars = st.characters(codec="ascii", categories=["L", "N"], include_characters="-_!#$%&'*+.^`|~")
header_names = st.sampled_from(
    ["Content-Encoding", "Accept-Encoding", "Content-Type", "Inference-Header-Content-Length", "Connection"]
) | st.text(token_chars, min_size=1, max_size=12)
header_values = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=24) | st.text(
    st.characters(codec="latin-1", exclude_characters="\r\n"), max_size=8
)
bad_header_lines = st.sampled_from(
    ["X-Bad Name: 1", "X-Ctl: a\x00b", ": no-name", "NoColon", "X-Fold: a\r\n b", "Content-Length: 5", " X: leading"]
)


@st.composite
def raw_requests(draw: st.DrawFn) -> Tuple[str, bytes, bytes]:
    """Method, request line and headers (some not HTTP at all), and a body: bytes, compressed or mangled."""
    method = draw(st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]))
    path = draw(
        st.sampled_from([*PATHS, "/v2", "/v2/health/live", "/v2/repository/index", "/v2/models/stats", "/", "/v3"])
        | st.text(st.characters(codec="ascii", categories=["L", "N"], include_characters="/._-%~"), max_size=20).map(
            lambda text: "/" + text
        )
    )
    valid = json.dumps({"inputs": [{"name": "INPUT_1", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})
    kind = draw(st.sampled_from(["bytes", "mangled", "gzip", "deflate", "json"]))
    if kind == "bytes":
        body = draw(st.binary(max_size=80))
    elif kind == "mangled":
        raw = bytearray(valid.encode())
        for _ in range(draw(st.integers(1, 4))):
            position = draw(st.integers(0, len(raw)))
            action = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
            if action == "flip" and position < len(raw):
                raw[position] ^= 1 << draw(st.integers(0, 7))
            elif action == "insert":
                raw[position:position] = draw(st.binary(min_size=1, max_size=4))
            elif action == "delete":
                del raw[position : position + draw(st.integers(1, 4))]
            else:
                del raw[position:]
        body = bytes(raw)
    elif kind == "json":
        body = json.dumps(draw(documents)).encode()
    else:
        payload = draw(st.sampled_from([valid.encode(), b"{", b""]) | st.binary(max_size=40))
        body = gzip.compress(payload) if kind == "gzip" else zlib.compress(payload)
        if draw(st.booleans()):
            body = body[: draw(st.integers(0, len(body)))]
    headers = draw(st.lists(st.tuples(header_names, header_values), max_size=4))
    if kind in ("gzip", "deflate"):
        headers.append(("Content-Encoding", draw(st.sampled_from([kind, kind, "identity", "br", "gzip, deflate"]))))
    lines = [f"{name}: {value}" for name, value in headers if name.lower() != "content-length"]
    if draw(st.integers(0, 9)) == 0:
        lines.append(draw(bad_header_lines))
    head = [f"{method} {path} HTTP/1.1", "Host: fuzz", *lines]
    return method, "\r\n".join(head).encode("latin-1"), body


# ---------------------------------------------------------------- mutations
# Hypothesis draws each request's structure; a random generator it also draws derives a few cheap
# mutants from it (generating an example costs milliseconds here, a mutant microseconds).

_SCALARS: List[Any] = [None, True, 0, -1, 2**63, 1e308, "", "x", [], {}, [[1], [2, 3]], "\u0000"]


def mutate_document(rng: random.Random, document: Any) -> Any:
    """A copy of a JSON document with one value replaced or one key dropped, somewhere inside."""
    document = json.loads(json.dumps(document))
    holder, key = document, None
    for _ in range(rng.randint(0, 4)):
        children = list(holder.items()) if isinstance(holder, dict) else list(enumerate(holder))
        if not isinstance(holder, (dict, list)) or not children:
            break
        key, child = rng.choice(children)
        if not isinstance(child, (dict, list)) or not child:
            break
        holder = child
    if not isinstance(holder, (dict, list)) or not holder:
        return rng.choice(_SCALARS)
    if key is None or key not in (holder if isinstance(holder, dict) else range(len(holder))):
        key = rng.choice(list(holder) if isinstance(holder, dict) else range(len(holder)))
    if isinstance(holder, dict) and rng.random() < 0.3:
        del holder[key]
    else:
        holder[key] = rng.choice(_SCALARS)
    return document


# ---------------------------------------------------------------- tests


def test_fuzz_infer_json_bodies(server: Triton, connection: Connection) -> None:
    @settings(FUZZ_SETTINGS, max_examples=JSON_EXAMPLES)
    @given(path=st.sampled_from(PATHS[:2] * 3 + PATHS), document=documents | near_valid_documents(), rng=st.randoms())
    def run(path: str, document: Dict[str, Any], rng: random.Random) -> None:
        body = json.dumps(document).encode()
        bodies = [body, *(json.dumps(mutate_document(rng, document)).encode() for _ in range(2))]
        bodies += [mutate_bytes(rng, body) for _ in range(2)]
        for variant in bodies:
            status, headers, answer = connection.exchange("POST", _raw_request("POST", path, [], variant))
            check_answer(status, headers, answer)

    run()
    assert connection.sent >= JSON_EXAMPLES * 5
    still_serving(connection)


def test_fuzz_binary_extension(server: Triton, connection: Connection) -> None:
    @settings(FUZZ_SETTINGS, max_examples=BINARY_EXAMPLES)
    @given(request=binary_requests(), rng=st.randoms())
    def run(request: Tuple[str, List[Tuple[str, str]], bytes], rng: random.Random) -> None:
        path, headers, body = request
        header_length = int(headers[0][1]) if headers[0][1].isdigit() else len(body)
        head, tail = body[:header_length], body[header_length:]
        variants = [
            (headers, body),
            (headers, head + mutate_bytes(rng, tail)),  # the binary part only
            (headers, mutate_bytes(rng, head) + tail),  # the JSON header only
            ([("Inference-Header-Content-Length", str(rng.randint(-2, len(body) + 2))), *headers[1:]], body),
        ]
        for variant_headers, variant_body in variants:
            raw = _raw_request("POST", path, variant_headers, variant_body)
            status, answer_headers, answer = connection.exchange("POST", raw)
            check_answer(status, answer_headers, answer)

    run()
    assert connection.sent >= BINARY_EXAMPLES * 4
    still_serving(connection)


def test_fuzz_headers_methods_and_raw_bodies(server: Triton, connection: Connection) -> None:
    @settings(FUZZ_SETTINGS, max_examples=HEADER_EXAMPLES)
    @given(request=raw_requests(), rng=st.randoms())
    def run(request: Tuple[str, bytes, bytes], rng: random.Random) -> None:
        method, head, body = request
        variants = [(head, body), (mutate_bytes(rng, head, line_safe=True), body), (head, mutate_bytes(rng, body))]
        for variant_head, variant_body in variants:
            raw = variant_head + b"\r\nContent-Length: %d\r\n\r\n" % len(variant_body) + variant_body
            status, headers, answer = connection.exchange(method, raw)
            check_answer(status, headers, answer, method)

    run()
    assert connection.sent >= HEADER_EXAMPLES * 3
    still_serving(connection)
