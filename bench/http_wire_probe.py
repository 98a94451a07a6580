"""Send the same raw HTTP/1.1 bytes to two servers and print where their answers differ.

    BENCH_ACCESS_TOKEN=bench-token python bench/model_server.py --http-port 24817 ...          # this project's
    BENCH_ACCESS_TOKEN=bench-token /tmp/nvidia-pytriton/run python bench/model_server.py ...  # NVIDIA's
    python bench/http_wire_probe.py --ours 127.0.0.1:24817 --theirs 127.0.0.1:25817 [--group G] [--only WORD]

Both serve the bench models with the token `bench-token`. Each case is one connection: its bytes are sent, then
every response is read until the server closes or is quiet for --quiet seconds. Compared: status, content-type,
content-length, transfer-encoding, content-encoding, connection, the body (JSON as documents), and whether the
connection was left open. The `repository` group unloads `identity` (NVIDIA's cannot load it again): run it last.
tests/test_http_wire.py keeps what this found.
"""

from __future__ import annotations

import argparse
import gzip
import json
import socket
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Tuple

if sys.path and sys.path[0].endswith("bench"):
    sys.path.pop(0)

HEADERS = ("content-type", "content-length", "transfer-encoding", "content-encoding", "connection")
INFER_JSON = b'{"inputs":[{"name":"INPUT_1","datatype":"FP32","shape":[1,2],"data":[1,2]}]}'


@dataclass
class Answer:
    """What one connection got back."""

    responses: List[Tuple[int, Dict[str, str], Any]] = field(default_factory=list)
    ending: str = "open"  # "open", "closed", "reset", or "garbage: ..."

    def summary(self) -> str:
        """One line per response, then the ending."""
        lines = [f"{status} {headers} {body!r:.300}" for status, headers, body in self.responses]
        return " | ".join([*lines, self.ending])


def _read_line(stream: Any) -> bytes:
    line = stream.readline(70000)
    if not line:
        raise EOFError
    return bytes(line)


def _read_response(stream: Any, head_request: bool) -> Tuple[int, Dict[str, str], Any]:
    status_line = _read_line(stream)
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ValueError(f"garbage: {status_line[:80]!r}")
    status = int(parts[1])
    headers: Dict[str, str] = {}
    while True:
        line = _read_line(stream).rstrip(b"\r\n")
        if not line:
            break
        name, _, value = line.decode("latin-1").partition(":")
        key = name.strip().lower()
        headers[key] = (headers[key] + "," if key in headers else "") + value.strip()
    body = b""
    if head_request or status in (100, 204, 304):
        pass
    elif "chunked" in headers.get("transfer-encoding", ""):
        while True:
            size = int(_read_line(stream).split(b";")[0], 16)
            if size == 0:
                while _read_line(stream).strip():
                    pass
                break
            body += stream.read(size)
            stream.read(2)
    elif "content-length" in headers:
        body = stream.read(int(headers["content-length"].split(",")[0]))
    else:
        body = stream.read()
    return status, {k: v for k, v in headers.items() if k in HEADERS}, _decoded(body, headers)


def _decoded(body: bytes, headers: Dict[str, str]) -> Any:
    coding = headers.get("content-encoding", "")
    try:
        if coding == "gzip":
            body = gzip.decompress(body)
        elif coding == "deflate":
            body = zlib.decompress(body)
    except Exception as error:  # noqa: BLE001 - a probe reports what it sees
        return f"<undecodable {coding}: {error}>"
    try:
        return json.loads(body)
    except ValueError:
        return body[:300]


def exchange(address: Tuple[str, int], raw: bytes, quiet: float, head_request: bool = False) -> Answer:
    """Send `raw` on a fresh connection and read every response that comes back."""
    answer = Answer()
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(raw)
        sock.settimeout(quiet)
        stream = sock.makefile("rb")
        while True:
            try:
                response = _read_response(stream, head_request)
            except EOFError:
                answer.ending = "closed"
                break
            except (socket.timeout, TimeoutError):
                answer.ending = "open"
                break
            except ConnectionResetError:
                answer.ending = "reset"
                break
            except ValueError as error:
                answer.ending = str(error)
                break
            answer.responses.append(response)
            if response[0] == 100:
                continue
    return answer


TOKEN = "triton-access-token: bench-token\r\n"  # bench/model_server.py with BENCH_ACCESS_TOKEN=bench-token


def _request(method: str, target: str, body: bytes = b"", headers: str = "", version: str = "HTTP/1.1") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body or method in ("POST", "PUT", "PATCH") else ""
    return f"{method} {target} {version}\r\nHost: x\r\n{TOKEN}{headers}{length}\r\n".encode() + body


def method_cases() -> Iterator[Tuple[str, bytes, bool]]:
    """Every method on every fixed route."""
    paths = [
        "/v2",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/identity",
        "/v2/models/identity/ready",
        "/v2/models/identity/config",
        "/v2/models/identity/stats",
        "/v2/models/identity/infer",
        "/v2/models/stats",
        "/v2/repository/index",
        "/v2/repository/models/identity/load",
        "/v2/repository/models/identity/unload",
        "/v2/trace/setting",
        "/v2/models/identity/trace/setting",
        "/v2/logging",
        "/v2/systemsharedmemory/status",
        "/v2/systemsharedmemory/region/x/status",
        "/v2/systemsharedmemory/region/x/register",
        "/v2/systemsharedmemory/region/x/unregister",
        "/v2/systemsharedmemory/unregister",
        "/v2/cudasharedmemory/status",
        "/v2/cudasharedmemory/region/x/status",
        "/v2/cudasharedmemory/region/x/register",
        "/v2/cudasharedmemory/region/x/unregister",
        "/v2/cudasharedmemory/unregister",
    ]
    for path in paths:
        for method in ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"):
            if method == "POST" and path.endswith("load"):
                continue  # a load or unload of `identity` would disturb the servers' other users
            body = b"{}" if method in ("POST", "PUT", "PATCH") else b""
            yield f"{method} {path}", _request(method, path, body), method == "HEAD"


def path_cases() -> Iterator[Tuple[str, bytes, bool]]:
    """Unknown, odd and encoded paths."""
    gets = [
        "/",
        "/v2/",
        "/v2/nothing",
        "/v3",
        "/v2/health/live/",
        "/v2//health/live",
        "//v2/health/live",
        "/v2/health//live",
        "/v2/models/identity/",
        "/v2/models//identity",
        "/v2/models/identity/versions/1",
        "/v2/models/identity/versions/2",
        "/v2/models/identity/versions/abc",
        "/v2/models/identity/versions/",
        "/v2/models/identity/versions/1/ready",
        "/v2/models/identity/versions/2/ready",
        "/v2/models/identity/versions/01/ready",
        "/v2/models/identity/versions/0/ready",
        "/v2/models/identity/versions/9223372036854775807/ready",
        "/v2/models/identity/versions/9223372036854775808/config",
        "/v2/models/identity/versions/-1/ready",
        "/v2/models/identity/versions/99999999999999999999/ready",
        "/v2/models/identity/versions/1/config",
        "/v2/models/identity/versions/2/config",
        "/v2/models/identity/versions/1/stats",
        "/v2/models/identity/versions/2/stats",
        "/v2/models/nothing",
        "/v2/models/nothing/ready",
        "/v2/models/nothing/config",
        "/v2/models/nothing/stats",
        "/v2/health/live?x=1",
        "/v2/health/live?",
        "/v2/models/identity/ready?a=b&c",
        "/v2/models/identity?x",
        "http://x/v2/health/live",
        "http://other:1/v2/health/live",
        "/v2/models/%69dentity/ready",
        "/v2/models/identity%2Fready",
        "/v2/%68ealth/live",
        "/v2/models/iden tity/ready",
        "/v2/models/" + "a" * 8000 + "/ready",
        "/v2/models/" + "a" * 70000 + "/ready",
        "*",
        "v2/health/live",
        "/v2/health/live#frag",
        "/V2/health/live",
        "/v2/health/LIVE",
        "/v2/models/identity/ready/",
        "/v2/models/identity/versions/1/",
        "/v2/repository/index/",
        "/v2/models/stats?model_name=identity",
        "/v2/models/identity/stats?x",
    ]
    for path in gets:
        yield f"GET {path[:60]}", _request("GET", path), False
    post = INFER_JSON
    for path in [
        "/v2/models/identity/versions/1/infer",
        "/v2/models/identity/versions/2/infer",
        "/v2/models/identity/versions/abc/infer",
        "/v2/models/identity/infer/",
        "/v2/models/identity/infer?x=1",
        "/v2/models/identity//infer",
        "/v2/repository/models/nothing/load",
        "/v2/repository/models/nothing/unload",
        "/v2/repository/index?ready=true",
    ]:
        yield f"POST {path}", _request("POST", path, post), False
    yield "POST index ready", _request("POST", "/v2/repository/index", b'{"ready":true}'), False
    yield "POST index ready str", _request("POST", "/v2/repository/index", b'{"ready":"yes"}'), False
    yield "POST index not json", _request("POST", "/v2/repository/index", b"nope"), False
    yield "GET stats no token", b"GET /v2/models/stats HTTP/1.1\r\nHost: x\r\n\r\n", False
    yield "GET stats bad token", b"GET /v2/models/stats HTTP/1.1\r\nHost: x\r\ntriton-access-token: no\r\n\r\n", False


def framing_cases() -> Iterator[Tuple[str, bytes, bool]]:
    """Heads and bodies framed in odd ways."""
    live = "/v2/health/live"
    infer = "/v2/models/identity/infer"
    body = INFER_JSON
    n = len(body)
    head = f"POST {infer} HTTP/1.1\r\nHost: x\r\n"
    chunked = f"{n:x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    cases = {
        "no host 1.1": b"GET /v2/health/live HTTP/1.1\r\n\r\n",
        "no host 1.0": b"GET /v2/health/live HTTP/1.0\r\n\r\n",
        "empty host": b"GET /v2/health/live HTTP/1.1\r\nHost:\r\n\r\n",
        "two hosts": b"GET /v2/health/live HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        "CL and TE": f"POST {infer} HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n"
        f"Transfer-Encoding: chunked\r\n\r\n".encode()
        + chunked,
        "CL not a number": (head + "Content-Length: abc\r\n\r\n").encode() + body,
        "CL negative": (head + "Content-Length: -1\r\n\r\n").encode() + body,
        "CL plus": (head + f"Content-Length: +{n}\r\n\r\n").encode() + body,
        "CL two same": (head + f"Content-Length: {n}\r\nContent-Length: {n}\r\n\r\n").encode() + body,
        "CL two differ": (head + f"Content-Length: {n}\r\nContent-Length: 5\r\n\r\n").encode() + body,
        "CL list same": (head + f"Content-Length: {n}, {n}\r\n\r\n").encode() + body,
        "CL huge": (head + "Content-Length: 99999999999999999999\r\n\r\n").encode(),
        "CL short": (head + f"Content-Length: {n - 5}\r\n\r\n").encode() + body,
        "no CL with body": (head + "\r\n").encode() + body,
        "chunked": (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunked,
        "chunked ext": (head + "Transfer-Encoding: chunked\r\n\r\n").encode()
        + f"{n:x};name=value\r\n".encode()
        + body
        + b"\r\n0;last\r\n\r\n",
        "chunked trailer": (head + "Transfer-Encoding: chunked\r\n\r\n").encode()
        + f"{n:x}\r\n".encode()
        + body
        + b"\r\n0\r\nX-Trailer: 1\r\n\r\n",
        "chunked split": (head + "Transfer-Encoding: chunked\r\n\r\n").encode()
        + b"".join(f"{1:x}\r\n".encode() + body[i : i + 1] + b"\r\n" for i in range(n))
        + b"0\r\n\r\n",
        "chunked bad size": (head + "Transfer-Encoding: chunked\r\n\r\n").encode()
        + b"zz\r\n"
        + body
        + b"\r\n0\r\n\r\n",
        "TE gzip": (head + "Transfer-Encoding: gzip\r\n\r\n").encode() + body,
        "TE gzip,chunked": (head + "Transfer-Encoding: gzip, chunked\r\n\r\n").encode()
        + f"{n:x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n",
        "TE chunked 1.0": f"POST {infer} HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + chunked,
        "expect 100": (head + f"Expect: 100-continue\r\nContent-Length: {n}\r\n\r\n").encode() + body,
        "expect other": (head + f"Expect: something\r\nContent-Length: {n}\r\n\r\n").encode() + body,
        "expect 100 GET": f"GET {live} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n".encode(),
        "expect other GET": f"GET {live} HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\n\r\n".encode(),
        "1.0 keep-alive x2": f"GET {live} HTTP/1.0\r\nConnection: keep-alive\r\n\r\n".encode() * 2,
        "1.0 plain x2": f"GET {live} HTTP/1.0\r\n\r\n".encode() * 2,
        "1.1 close x2": f"GET {live} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode() * 2,
        "1.1 x2": f"GET {live} HTTP/1.1\r\nHost: x\r\n\r\n".encode() * 2,
        "HTTP/2.0 line": f"GET {live} HTTP/2.0\r\nHost: x\r\n\r\n".encode(),
        "HTTP/1.2": f"GET {live} HTTP/1.2\r\nHost: x\r\n\r\n".encode(),
        "HTTP/0.9": f"GET {live}\r\n\r\n".encode(),
        "no colon": f"GET {live} HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n".encode(),
        "obs-fold": f"GET {live} HTTP/1.1\r\nHost: x\r\nX-A: one\r\n two\r\n\r\n".encode(),
        "LF only": f"GET {live} HTTP/1.1\nHost: x\n\n".encode(),
        "LF only post": f"POST {infer} HTTP/1.1\nHost: x\nContent-Length: {n}\n\n".encode() + body,
        "NUL in value": f"GET {live} HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n".encode(),
        "NUL in name": f"GET {live} HTTP/1.1\r\nHost: x\r\nX\x00A: ab\r\n\r\n".encode(),
        "space before colon": f"GET {live} HTTP/1.1\r\nHost: x\r\nX-A : b\r\n\r\n".encode(),
        "extra spaces": f"GET  {live}  HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "trailing space": f"GET {live} HTTP/1.1 \r\nHost: x\r\n\r\n".encode(),
        "tab separator": f"GET\t{live}\tHTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "lower method": f"get {live} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "odd method": f"FOO {live} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "CONNECT": b"CONNECT x:1 HTTP/1.1\r\nHost: x\r\n\r\n",
        "TRACE": f"TRACE {live} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "leading CRLF": f"\r\nGET {live} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        "upgrade h2c": f"GET {live} HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n".encode(),
        "big header": f"GET {live} HTTP/1.1\r\nHost: x\r\nX-A: {'a' * 100000}\r\n\r\n".encode(),
        "many headers": f"GET {live} HTTP/1.1\r\nHost: x\r\n".encode()
        + b"".join(f"X-{i}: a\r\n".encode() for i in range(500))
        + b"\r\n",
        "GET with body": f"GET {live} HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc".encode(),
        "close mixed case": f"GET {live} HTTP/1.1\r\nHost: x\r\nConnection: ClOsE\r\n\r\n".encode(),
        "connection list": f"GET {live} HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, close\r\n\r\n".encode(),
    }
    for name, raw in cases.items():
        yield name, raw, False


def compression_cases() -> Iterator[Tuple[str, bytes, bool]]:
    """Compressed requests and the answers' codings."""
    infer = "/v2/models/identity/infer"
    body = INFER_JSON
    bodies = {
        "gzip": gzip.compress(body),
        "deflate": zlib.compress(body),
        "deflate raw": zlib.compress(body)[2:-4],
        "identity": body,
        "br": body,
        "unknown": body,
        "gzip corrupt": gzip.compress(body)[:-6] + b"xxxxxx",
        "gzip truncated": gzip.compress(body)[:-8],
        "gzip of garbage": gzip.compress(b"not json"),
        "GZIP": gzip.compress(body),
        "gzip, identity": gzip.compress(body),
        "x-gzip": gzip.compress(body),
        "": body,
    }
    for coding, payload in bodies.items():
        name = coding.split(" ")[0] if coding in ("deflate raw", "gzip corrupt", "gzip truncated") else coding
        yield (
            f"CE {coding!r}",
            _request(
                "POST",
                infer,
                payload,
                f"Content-Encoding: {name}\r\n" if coding != "gzip of garbage" else "Content-Encoding: gzip\r\n",
            ),
            False,
        )
    for accept in (
        "gzip",
        "deflate",
        "gzip;q=0",
        "*",
        "unknown",
        "br",
        "identity",
        "deflate, gzip",
        "gzip;q=0.5, deflate",
        "GZIP",
        "*;q=0",
        "identity;q=0",
        "x-gzip",
        "gzip, deflate;q=0",
        "",
    ):
        yield f"AE {accept!r}", _request("POST", infer, body, f"Accept-Encoding: {accept}\r\n"), False
        yield (
            f"AE GET {accept!r}",
            _request("GET", "/v2/models/identity", b"", f"Accept-Encoding: {accept}\r\n"),
            False,
        )


def header_length_cases() -> Iterator[Tuple[str, bytes, bool]]:
    """Inference-Header-Content-Length edges."""
    infer = "/v2/models/identity/infer"
    body = INFER_JSON
    for value in (
        str(len(body) + 10),
        "-1",
        "abc",
        "0",
        "",
        " 5",
        str(len(body)),
        "1e3",
        "0x10",
        "99999999999999999999",
        f"{len(body)},{len(body)}",
    ):
        yield f"IHCL {value!r}", _request("POST", infer, body, f"Inference-Header-Content-Length: {value}\r\n"), False
    yield (
        "IHCL twice",
        _request(
            "POST",
            infer,
            body,
            f"Inference-Header-Content-Length: {len(body)}\r\nInference-Header-Content-Length: 3\r\n",
        ),
        False,
    )
    yield "IHCL 0 empty", _request("POST", infer, b"", "Inference-Header-Content-Length: 0\r\n"), False
    yield (
        "IHCL on config",
        _request("GET", "/v2/models/identity/config", b"", "Inference-Header-Content-Length: 5\r\n"),
        False,
    )


def repository_cases() -> Iterator[Tuple[str, bytes, bool]]:
    """Unload and load `identity` with odd bodies (NVIDIA's PyTriton cannot load it again: run this group last)."""
    for body in (b"", b"{}", b'{"parameters":{}}', b'{"parameters":{"unload_dependents":true}}', b"nope", b"[]"):
        yield f"unload {body!r}", _request("POST", "/v2/repository/models/identity/unload", body), False
        yield "ready after unload", _request("GET", "/v2/models/identity/ready"), False
        yield "infer after unload", _request("POST", "/v2/models/identity/infer", INFER_JSON), False
        yield f"load {body!r}", _request("POST", "/v2/repository/models/identity/load", body), False
        yield "ready after load", _request("GET", "/v2/models/identity/ready"), False


GROUPS: Dict[str, Callable[[], Iterator[Tuple[str, bytes, bool]]]] = {
    "methods": method_cases,
    "paths": path_cases,
    "framing": framing_cases,
    "compression": compression_cases,
    "header-length": header_length_cases,
    "repository": repository_cases,
}


def _address(text: str) -> Tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _normalised(answer: Answer) -> str:
    """What is compared: headers names case-folded already; content-length left out when bodies are JSON."""
    return json.dumps(
        [[s, h, b if not isinstance(b, bytes) else b.decode("latin-1")] for s, h, b in answer.responses]
        + [answer.ending],
        sort_keys=True,
    )


def main() -> int:
    """Run the cases and print the differences (or every answer with --all)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ours", required=True)
    parser.add_argument("--theirs", required=True)
    parser.add_argument("--group", choices=sorted(GROUPS), action="append")
    parser.add_argument("--only", help="cases whose name holds this text")
    parser.add_argument("--all", action="store_true", help="print agreeing cases too")
    parser.add_argument("--quiet", type=float, default=0.4, help="seconds of silence that end a read")
    args = parser.parse_args()
    ours, theirs = _address(args.ours), _address(args.theirs)
    differences = 0
    for group in args.group or [name for name in GROUPS if name != "repository"]:
        for name, raw, head in GROUPS[group]():
            if args.only and args.only not in name:
                continue
            mine, triton = exchange(ours, raw, args.quiet, head), exchange(theirs, raw, args.quiet, head)
            same = _normalised(mine) == _normalised(triton)
            differences += not same
            if args.all or not same:
                print(f"{'==' if same else '!='} [{group}] {name}")
                print(f"   ours:   {mine.summary()}")
                if not same:
                    print(f"   triton: {triton.summary()}")
    print(f"{differences} differences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
