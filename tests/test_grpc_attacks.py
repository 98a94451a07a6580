"""One client attacking the gRPC server's HTTP/2, attack by attack, against a server in a process of its own.

Each attack is bounded and runs over loopback, in two parts: a first part the server accepts, then a
tritonclient call (it must be served while the attacker's connection is open), then the rest of the
attack, which the server must cut off with the code RFC 9113 (or nghttp2, where the RFC leaves the
choice) gives. After it another tritonclient call must be served, and the server's RSS must not have
grown by more than RSS_GROWTH_MIB: the attacks would take it far past that if the server kept what
they send.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import pathlib
import resource
import select
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.options.limits import OVER_CAP_HELD, ServerLimits
from pytriton.transport.grpc.responses import UNSENT_BOUND_BYTES
from pytriton.triton import Triton
from tests.conftest import running_triton
from tests.frontend_processes import frontend_pids, serving_pid
from tests.h2_wire import (
    ACK,
    CANCEL,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    GOAWAY,
    HEADERS,
    NO_ERROR,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    READ_S,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    Frame,
    H2Client,
    goaway_fields,
    grpc_message,
    infer_request,
    pack_frame,
    request_headers,
)
from tests.waiting import wait_until

REPO = pathlib.Path(__file__).resolve().parent.parent
RSS_GROWTH_MIB = 24
# Long enough for a flood to be read through on a loaded machine.
FLOOD_S = 60.0
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


class ServedProcess:
    """tests/served_process.py running with some ServerLimits; its ports, RSS, and a well-behaved client."""

    def __init__(self, limits: Dict[str, Any], open_files: Optional[int] = None) -> None:
        """`open_files`: the soft open-file limit the process starts with (its parent's by default).

        The child lowers its own limit first thing: a `preexec_fn` would fork this process, whose gRPC threads
        may hold locks the child then waits on (a CI run's child never printed READY)."""
        argv = [sys.executable, "-m", "tests.served_process", json.dumps(limits)]
        if open_files is not None:
            argv.append(str(open_files))
        self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as selector:  # not select(): this process may hold 1,024 descriptors
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            ready = selector.select(120)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("READY"):
            self.stop()
            raise RuntimeError(f"the served process did not start: {line!r}")
        self.grpc_port, self.http_port = (int(part) for part in line.split()[1:])

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def rss_mib(self) -> float:
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def infer(self, values: Sequence[float], model: str = "identity") -> np.ndarray:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc_port}")
        try:
            tensor = grpcclient.InferInput("INPUT_1", [1, len(values)], "FP32")
            tensor.set_data_from_numpy(np.asarray([values], np.float32))
            result = client.infer(model, [tensor], client_timeout=2 * READ_S)
            return result.as_numpy("OUTPUT_1")  # type: ignore[no-any-return]
        finally:
            client.close()

    def assert_served(self) -> None:
        """A tritonclient call on a connection of its own is answered."""
        assert self.infer([3.0, 4.0]).tolist() == [[3.0, 4.0]]

    def slow_rows(self) -> int:
        """The rows the `slow` model has computed so far."""
        return int(self.infer([0.0], model="rows")[0][0])

    def h2(self, **kwargs: Any) -> H2Client:
        """A raw HTTP/2 connection whose handshake is done."""
        client = H2Client(self.grpc_port, **kwargs)
        client.handshake()
        return client


@pytest.fixture(scope="module")
def served() -> Iterator[ServedProcess]:
    server = ServedProcess({})
    yield server
    server.stop()


@pytest.fixture
def clients() -> Iterator[List[H2Client]]:
    """Raw connections a test opens (append them), closed at its end."""
    opened: List[H2Client] = []
    yield opened
    for client in opened:
        client.close()


class Flood:
    """Sends chunks of bytes from a thread while the test reads (the server may close: that ends it quietly).

    It sends on a duplicate of the socket, whose timeout is its own.
    """

    def __init__(self, sock: socket.socket, chunks: Iterable[bytes]) -> None:
        self._sock = sock.dup()
        self._sock.settimeout(FLOOD_S)
        self._chunks = chunks
        self._thread = threading.Thread(target=self._send, daemon=True)
        self._thread.start()

    def _send(self) -> None:
        try:
            for chunk in self._chunks:
                self._sock.sendall(chunk)
        except OSError:
            pass
        finally:
            self._sock.close()

    def join(self) -> None:
        self._thread.join(FLOOD_S)
        assert not self._thread.is_alive(), "the flood is still being sent"


@contextlib.contextmanager
def attacker(served: ServedProcess, clients: List[H2Client], **kwargs: Any) -> Iterator[H2Client]:
    """An attacker's connection; after the attack a well-behaved call is served and the RSS grew little."""
    client = served.h2(**kwargs)
    clients.append(client)
    before = served.rss_mib()
    yield client
    served.assert_served()
    assert served.rss_mib() - before < RSS_GROWTH_MIB


def flood_until_closed(client: H2Client, chunks: Iterable[bytes]) -> List[Frame]:
    """Send `chunks` while reading what the server answers until it closes the connection."""
    flood = Flood(client.sock, chunks)
    frames = client.wait_closed(FLOOD_S)
    flood.join()
    return frames


def goaway_of(frames: List[Frame]) -> Tuple[int, int, bytes]:
    goaways = [goaway_fields(frame) for frame in frames if frame.kind == GOAWAY]
    assert len(goaways) == 1, frames[-10:]
    return goaways[0]


def resets_of(frames: List[Frame]) -> Dict[int, int]:
    return {frame.stream: struct.unpack(">I", frame.payload)[0] for frame in frames if frame.kind == RST_STREAM}


def repeated(frame: bytes, count: int, per_chunk: int = 1000) -> Iterator[bytes]:
    while count > 0:
        yield frame * min(count, per_chunk)
        count -= per_chunk


def header_blocks(client: H2Client, headers: List[Tuple[str, str]]) -> Tuple[bytes, bytes]:
    """The first block of `headers` (it fills the HPACK table) and the one that repeats after it (all indexed)."""
    return client.encoder.encode(headers), client.encoder.encode(headers)


# ---------------------------------------------------------------- thousands of half-open streams


def test_half_open_streams_beyond_the_advertised_limit_are_refused(served, clients):
    with attacker(served, clients) as client:
        assert client.server_settings[SETTINGS_MAX_CONCURRENT_STREAMS] == 100
        first, again = header_blocks(client, request_headers())
        opens = [pack_frame(HEADERS, END_HEADERS, 1, first)]
        opens += [pack_frame(HEADERS, END_HEADERS, stream, again) for stream in range(3, 40_001, 2)]
        client.sock.sendall(b"".join(opens[:100]))  # the limit: 100 calls waiting for their message
        served.assert_served()
        frames = flood_until_closed(client, (b"".join(opens[at : at + 1000]) for at in range(100, len(opens), 1000)))
    resets = resets_of(frames)
    assert not [stream for stream in resets if stream <= 199], "a stream within the limit was reset"
    assert resets[201] == REFUSED_STREAM and set(resets.values()) == {REFUSED_STREAM}
    assert goaway_of(frames)[1:] == (ENHANCE_YOUR_CALM, b"too many frames that carry nothing")


# ---------------------------------------------------------------- data nobody reads on a unary call


def test_data_flood_on_a_unary_call_ends_the_call_and_is_never_buffered(served, clients):
    with attacker(served, clients) as client:
        stream = client.new_stream()
        client.send_headers(stream, request_headers())
        client.send_data(stream, grpc_message(infer_request([1.0], model="slow")), end_stream=False)
        zeros = pack_frame(DATA, 0, stream, b"\0" * 16_384)
        client.sock.sendall(zeros * 64)  # 1 MiB of messages after the request's: a second message ends the call
        response = client.response(stream)
        assert response.grpc_status == "12"  # UNIMPLEMENTED: a unary call got more than one request message
        reset = client.wait_for(lambda frame: frame.stream == stream and frame.kind == RST_STREAM)
        assert struct.unpack(">I", reset.payload)[0] == NO_ERROR
        served.assert_served()
        flood = Flood(client.sock, repeated(zeros, 63 * 64, per_chunk=64))  # 63 MiB more on the ended stream
        flood.join()
        assert client.infer([5.0]).output() == [5.0]  # dropped unread: the connection serves on


# ---------------------------------------------------------------- messages that never end, on many streams


@pytest.fixture(scope="module")
def buffer_bound() -> Iterator[ServedProcess]:
    server = ServedProcess({"grpc_max_buffered_bytes": 2**20})
    yield server
    server.stop()


def test_the_buffered_bytes_bound_is_256_mib_unless_set():
    assert ServerLimits().grpc_max_buffered_bytes == 256 * 2**20
    limits = ServerLimits.from_env({"PYTRITON_LIMIT_GRPC_MAX_BUFFERED_BYTES": "1048576"})
    assert limits.grpc_max_buffered_bytes == 2**20
    with pytest.raises(PyTritonValidationError, match="grpc_max_buffered_bytes must be a positive integer"):
        ServerLimits(grpc_max_buffered_bytes=0)


def _window_update(client: H2Client, stream: int) -> int:
    frame = client.wait_for(lambda frame: frame.kind == WINDOW_UPDATE and frame.stream == stream)
    return int(struct.unpack(">I", frame.payload)[0])


def test_messages_arriving_past_the_connection_bound_wait_for_the_oldest_one(buffer_bound, clients):
    mib = 2**20
    message = grpc_message(infer_request([0.0] * (6 * mib // 4), model="absent"))  # 6 MiB, NOT_FOUND once whole
    with attacker(buffer_bound, clients) as client:
        first, second = client.new_stream(), client.new_stream()
        client.send_headers(first, request_headers())
        client.send_data(first, message[:mib], end_stream=False)  # within the 1 MiB bound
        client.send_headers(second, request_headers())
        client.send_data(second, message[: 3 * mib], end_stream=False)  # past it: the second's window waits
        client.send_data(first, message[mib : 4 * mib], end_stream=False)  # the oldest's window comes back
        assert _window_update(client, first) >= 2 * mib
        client.assert_quiet(second)
        served = buffer_bound.infer([1.0])  # a call on a connection of its own is served meanwhile
        assert served.tolist() == [[1.0]]
        client.send_data(first, message[4 * mib :])  # whole: the second is the oldest now
        assert client.response(first).grpc_status == "5"
        assert _window_update(client, second) == 3 * mib
        client.send_data(second, message[3 * mib :])
        assert client.response(second).grpc_status == "5"


def test_a_stream_past_the_bound_that_sends_past_its_window_is_reset(buffer_bound, clients):
    mib = 2**20
    message = grpc_message(infer_request([0.0] * (8 * mib // 4), model="absent"))
    with attacker(buffer_bound, clients) as client:
        streams = [client.new_stream() for _ in range(4)]  # 4 messages declaring 8 MiB each
        for stream in streams:
            client.send_headers(stream, request_headers())
            client.send_data(stream, message[: 4 * mib], end_stream=False)  # each stream's whole window
        assert _window_update(client, streams[0]) >= 2 * mib  # the oldest goes on
        for stream in streams[1:]:
            client.assert_quiet(stream, 0.1)
        client.send_data(streams[1], message[4 * mib : 5 * mib], end_stream=False)
        reset = client.wait_for(lambda frame: frame.stream == streams[1])
        assert reset.kind == RST_STREAM and struct.unpack(">I", reset.payload)[0] == FLOW_CONTROL_ERROR
        assert client.infer([5.0]).output() == [5.0]  # the connection serves on


# ---------------------------------------------------------------- rapid reset (CVE-2023-44487)


def test_rapid_reset_gets_goaway_and_the_reset_requests_never_run(served, clients):
    rows_before = served.slow_rows()
    with attacker(served, clients) as client:
        resets = _opened_and_reset(client)
        client.sock.sendall(resets(range(1, 1001, 2)))  # 500 calls opened and reset: within nghttp2's burst of 1000
        served.assert_served()
        frames = flood_until_closed(
            client, (resets(range(start, start + 1000, 2)) for start in range(1001, 10_001, 1000))
        )
    assert goaway_of(frames)[1:] == (ENHANCE_YOUR_CALM, b"too many stream resets")
    # The first request may have found the model idle and run at once; the others left its queue when reset.
    assert served.slow_rows() - rows_before <= 2


def test_rapid_reset_past_the_limit_still_answers_the_call_in_progress(served, clients):
    """As nghttp2: the GOAWAY takes no new call, but a call in progress (another client's, when a process shares
    the connection) is answered; the connection closes then."""
    rows_before = served.slow_rows()
    with attacker(served, clients) as client:
        client.send_headers(1, request_headers())  # a call whose message has not come yet
        again = client.encoder.encode(request_headers())
        message = grpc_message(infer_request([1.0], model="slow"))
        cancel = struct.pack(">I", CANCEL)
        client.sock.sendall(
            b"".join(
                pack_frame(HEADERS, END_HEADERS, stream, again)
                + pack_frame(DATA, END_STREAM, stream, message)
                + pack_frame(RST_STREAM, 0, stream, cancel)
                for stream in range(3, 3003, 2)  # 1500 calls opened and reset: past the burst of 1000
            )
        )
        assert goaway_fields(client.wait_goaway(FLOOD_S))[1:] == (ENHANCE_YOUR_CALM, b"too many stream resets")
        client.send_data(1, grpc_message(infer_request([5.0])))
        assert client.response(1, FLOOD_S).output() == [5.0]
        client.wait_closed(FLOOD_S)
    assert served.slow_rows() - rows_before <= 1  # the first may have found the model idle and run at once


def _opened_and_reset(client: H2Client) -> Callable[[Iterable[int]], bytes]:
    """HEADERS, DATA and RST_STREAM (CANCEL) of a call to the slow model, on each of the streams given."""
    first, again = header_blocks(client, request_headers())
    message = grpc_message(infer_request([1.0], model="slow"))
    cancel = struct.pack(">I", CANCEL)

    def resets(streams: Iterable[int]) -> bytes:
        return b"".join(
            pack_frame(HEADERS, END_HEADERS, stream, first if stream == 1 else again)
            + pack_frame(DATA, END_STREAM, stream, message)
            + pack_frame(RST_STREAM, 0, stream, cancel)
            for stream in streams
        )

    return resets


# ---------------------------------------------------------------- CONTINUATION flood


def test_300000_empty_continuations_end_the_connection_after_a_few(served, clients):
    with attacker(served, clients) as client:
        client.sock.sendall(
            pack_frame(HEADERS, 0, 1, client.encoder.encode(request_headers())) + pack_frame(CONTINUATION, 0, 1) * 5
        )
        served.assert_served()
        frames = flood_until_closed(client, repeated(pack_frame(CONTINUATION, 0, 1), 300_000, per_chunk=10_000))
    assert goaway_of(frames)[1:] == (ENHANCE_YOUR_CALM, b"too many CONTINUATION frames in a header block")


# ---------------------------------------------------------------- HEADERS on a stream the client ended


def test_headers_again_on_an_ended_stream_reset_it_and_never_run_a_handler_again(served, clients):
    rows_before = served.slow_rows()
    with attacker(served, clients) as client:
        first, again = header_blocks(client, request_headers())
        client.sock.sendall(
            pack_frame(HEADERS, END_HEADERS, 1, first)
            + pack_frame(DATA, END_STREAM, 1, grpc_message(infer_request([1.0], model="slow")))
            + pack_frame(HEADERS, END_HEADERS | END_STREAM, 1, again)  # the call is running: half-closed (remote)
        )
        reset = client.wait_for(lambda frame: frame.stream == 1)
        assert reset.kind == RST_STREAM and struct.unpack(">I", reset.payload)[0] == STREAM_CLOSED  # RFC 9113 5.1
        served.assert_served()
        frames = flood_until_closed(client, repeated(pack_frame(HEADERS, END_HEADERS | END_STREAM, 1, again), 12_000))
    assert 1 not in resets_of(frames)  # after its reset, the stream's frames are dropped (and counted)
    assert goaway_of(frames)[1:] == (ENHANCE_YOUR_CALM, b"too many frames that carry nothing")
    assert served.slow_rows() - rows_before <= 1  # the handler ran once at most (the reset cancelled it)


# ---------------------------------------------------------------- floods of frames that cost the server


FLOODS = {
    "PING": (pack_frame(PING, 0, 0, b"pingpong"), b"too many PING frames"),
    "SETTINGS": (pack_frame(SETTINGS, 0, 0), b"too many SETTINGS frames"),
    "empty DATA": (pack_frame(DATA, 0, 1), b"too many frames that carry nothing"),
    "unknown frame type": (pack_frame(0x21, 0, 1, b"x"), b"too many frames that carry nothing"),
    "PRIORITY": (pack_frame(0x2, 0, 3, struct.pack(">IB", 0, 15)), b"too many frames that carry nothing"),
    # Stream errors, each answered RST_STREAM (an idle stream stays idle, and is reset again and again).
    "PRIORITY making an idle stream depend on itself": (
        pack_frame(0x2, 0, 3, struct.pack(">IB", 3, 15)),
        b"too many frames that carry nothing",
    ),
    "PRIORITY making the open stream depend on itself": (
        pack_frame(0x2, 0, 1, struct.pack(">IB", 1, 15)),
        b"too many frames that carry nothing",
    ),
    "PRIORITY of 4 bytes": (pack_frame(0x2, 0, 3, bytes(4)), b"too many frames that carry nothing"),
    # Windows opened again byte by byte with nothing sent: each took the server ~1 us, and was never cut off.
    "WINDOW_UPDATE of 1 on the connection": (
        pack_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)),
        b"too many frames that carry nothing",
    ),
    "WINDOW_UPDATE of 1 on the open stream": (
        pack_frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1)),
        b"too many frames that carry nothing",
    ),
}


@pytest.mark.parametrize("kind", list(FLOODS))
def test_floods_of_frames_that_cost_the_server_get_enhance_your_calm(served, clients, kind):
    frame, debug = FLOODS[kind]
    with attacker(served, clients) as client:
        client.send_headers(1, request_headers())  # a call waiting for its message: empty DATA goes to it
        client.sock.sendall(frame * 100)
        served.assert_served()
        frames = flood_until_closed(client, repeated(frame, 30_000))
    assert goaway_of(frames)[1:] == (ENHANCE_YOUR_CALM, debug)


@pytest.mark.parametrize("kind", ["depending on themselves", "with a field name in uppercase"])
def test_a_flood_of_new_streams_that_are_stream_errors_gets_enhance_your_calm(served, clients, kind):
    # Each one is a stream error (RFC 9113 5.3.1, 8.2.1): reset, its id used, and counted as a stream the server reset.
    with attacker(served, clients) as client:
        headers = request_headers() + ([("X-Test", "1")] if kind == "with a field name in uppercase" else [])
        first, again = header_blocks(client, headers)

        def opening(stream: int, block: bytes = again) -> bytes:
            if kind == "depending on themselves":
                return pack_frame(HEADERS, END_HEADERS | PRIORITY_FLAG, stream, struct.pack(">IB", stream, 15) + block)
            return pack_frame(HEADERS, END_HEADERS, stream, block)

        client.sock.sendall(opening(1, first) + b"".join(opening(stream) for stream in range(3, 201, 2)))
        served.assert_served()
        streams = range(201, 60_001, 2)
        chunks = (
            b"".join(opening(stream) for stream in streams[at : at + 1000]) for at in range(0, len(streams), 1000)
        )
        frames = flood_until_closed(client, chunks)
    resets = resets_of(frames)
    assert resets and set(resets.values()) == {PROTOCOL_ERROR}
    assert goaway_of(frames)[1:] == (ENHANCE_YOUR_CALM, b"too many frames that carry nothing")


def test_a_flood_of_window_updates_on_a_closed_stream_gets_enhance_your_calm(served, clients):
    with attacker(served, clients) as client:
        stream = client.start_call(infer_request([1.0]))
        assert client.response(stream).output() == [1.0]
        frame = pack_frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", 1))  # dropped, as RFC 9113 lets it be
        client.sock.sendall(frame * 100)
        served.assert_served()
        frames = flood_until_closed(client, repeated(frame, 30_000))
    assert goaway_of(frames)[1:] == (ENHANCE_YOUR_CALM, b"too many frames that carry nothing")


def test_a_client_that_opens_its_window_a_byte_at_a_time_gets_enhance_your_calm(served, clients):
    # "Data dribble" (CVE-2019-9511): each WINDOW_UPDATE of 1 had the server send a DATA frame of 1 byte.
    with attacker(served, clients, settings={SETTINGS_INITIAL_WINDOW_SIZE: 1}) as client:
        stream = client.start_call(infer_request([1.0] * 100_000))
        frame = pack_frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", 1))
        frames = flood_until_closed(client, repeated(frame, 30_000))
    assert goaway_of(frames)[1:] == (ENHANCE_YOUR_CALM, b"too many frames that carry nothing")


def test_a_flood_of_one_byte_data_frames_on_an_open_call_gets_enhance_your_calm(served, clients):
    # Each frame is a byte of a message that stays under way: legal one by one, but 20 M of them took a core of
    # the server for as long as the client went on, and were never cut off.
    frame = pack_frame(DATA, 0, 1, b"\0")
    with attacker(served, clients) as client:
        client.send_headers(1, request_headers(path="/inference.GRPCInferenceService/ModelStreamInfer"))
        client.sock.sendall(pack_frame(DATA, 0, 1, struct.pack(">BI", 0, 2**20)) + frame * 100)
        served.assert_served()
        frames = flood_until_closed(client, repeated(frame, 30_000))
    assert goaway_of(frames)[1:] == (ENHANCE_YOUR_CALM, b"too many frames that carry nothing")


# ---------------------------------------------------------------- a burst of connections (listen backlog)


def _tcp_retransmits(sock: socket.socket) -> int:
    """tcpi_total_retrans of a socket's TCP_INFO (SYN retransmissions included)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int(struct.unpack_from("I", info, 100)[0])


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_burst_of_connections_is_accepted_without_syn_retransmits(served, protocol):
    port = served.grpc_port if protocol == "grpc" else served.http_port
    sockets: List[socket.socket] = []
    try:
        for _ in range(1500):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sockets.append(sock)
            if sock.connect_ex(("127.0.0.1", port)) not in (0, 115):  # 115: EINPROGRESS
                raise AssertionError("connect failed")
        poll = select.poll()
        for sock in sockets:
            poll.register(sock, select.POLLOUT)
        pending, deadline = len(sockets), time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            for fd, _ in poll.poll(100):
                poll.unregister(fd)
                pending -= 1
        assert not pending, f"{pending} connections not established"
        retransmitted = [sock for sock in sockets if _tcp_retransmits(sock)]
        # A listen backlog of 100 (asyncio's default) drops SYNs in such a burst: they come back a second later.
        assert len(retransmitted) == 0, f"{len(retransmitted)} of {len(sockets)} connections needed a SYN retransmit"
    finally:
        for sock in sockets:
            sock.close()
    served.assert_served()


def _soft_open_files(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-file limit")


def test_a_thousand_idle_connections_leave_descriptors_for_other_clients_under_a_soft_limit_of_1024():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the hard open-file limit here ({hard}) leaves the server nothing to raise its soft limit to")
    server = ServedProcess({}, open_files=1024)
    sockets: List[socket.socket] = []
    try:
        assert _soft_open_files(server.proc.pid) >= 4096
        for port in (server.http_port, server.grpc_port) * 750:
            sockets.append(socket.create_connection(("127.0.0.1", port), timeout=READ_S))
        server.assert_served()  # a connection of its own, past the 1024 descriptors of the start
        status, _ = _http_get(server.http_port, "/v2/health/ready")
        assert status == 200
    finally:
        for sock in sockets:
            sock.close()
        server.stop()


def test_a_hard_open_file_limit_below_the_caps_is_warned_of():
    script = (
        "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)); "
        "import logging; logging.basicConfig(); "
        "from pytriton.options.limits import ServerLimits; "
        "from pytriton.runtime.open_files import raise_open_files_limit; "
        "print(raise_open_files_limit(ServerLimits(max_connections=100, grpc_max_connections=100)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "(1024, 1024)"), done.stderr
    assert "the open-file limit is 1024, below the 3080 the server may need" in done.stderr


def _http_get(port: int, path: str) -> Tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=READ_S)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


# ---------------------------------------------------------------- connection cap, idle connections, no preface


@pytest.fixture(scope="module")
def capped() -> Iterator[ServedProcess]:
    # A connection waits for its first call as long as for its SETTINGS: 2 s, so that the 8 that fill the cap
    # are still there when the test's call comes, on a loaded machine too.
    server = ServedProcess({"grpc_max_connections": 8, "grpc_idle_timeout_s": 2.0, "grpc_handshake_timeout_s": 2.0})
    yield server
    server.stop()


def test_an_idle_connection_makes_room_for_a_new_one_at_the_cap(capped, clients):
    # The 8 that fill the cap held it until their idle timeout, and every new client got UNAVAILABLE meanwhile: the
    # one without a call for the longest now gives its place (GOAWAY saying why), as nginx reclaims idle ones.
    before = capped.rss_mib()
    for _ in range(8):
        clients.append(capped.h2())  # the cap: 8 connections without a call
    capped.assert_served()
    assert goaway_of(clients[0].wait_closed(READ_S)) == (
        0,
        NO_ERROR,
        b"the server serves at most 8 gRPC connections at once: one without a call for the longest makes room for "
        b"a new one",
    )
    for client in clients[1:]:  # idle for grpc_idle_timeout_s: GOAWAY, then closed
        frames = client.wait_closed(READ_S)
        assert goaway_of(frames) == (0, NO_ERROR, b"")
    assert capped.rss_mib() - before < RSS_GROWTH_MIB


def busy_h2(served: ServedProcess) -> H2Client:
    """A raw HTTP/2 connection with a call in progress (its request not ended), read by the server: not reclaimed."""
    client = served.h2()
    client.send_headers(client.new_stream(), request_headers())
    client.ping(b"callopen")  # answered once the server has read the HEADERS before it
    client.wait_for(lambda frame: frame.kind == PING and frame.has(ACK))
    return client


def busy_http(port: int) -> socket.socket:
    """An HTTP connection whose request body the server waits for: not reclaimed."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=READ_S)
    sock.sendall(
        b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n"
    )
    assert sock.recv(65536).startswith(b"HTTP/1.1 100 ")  # the app reads its body: the head was read whole
    return sock


@pytest.fixture(scope="module")
def four_connections() -> Iterator[ServedProcess]:
    server = ServedProcess({"max_connections": 4, "grpc_max_connections": 4})
    yield server
    server.stop()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_connections_past_those_held_over_the_cap_are_closed_as_they_come(four_connections, protocol, clients):
    # Each connection over the cap waited for its first request (30 s) or call (10 s) to be answered 503 or
    # UNAVAILABLE: a client opening them faster than that held every descriptor of the process, past any cap.
    # Over the cap means every connection served is busy: an idle one would make room (connection_cap.py).
    served = four_connections
    port = served.http_port if protocol == "http" else served.grpc_port
    sockets: List[socket.socket] = []
    try:
        for _ in range(4):
            if protocol == "http":
                sockets.append(busy_http(port))
            else:
                clients.append(busy_h2(served))
        over: List[socket.socket] = []
        for _ in range(OVER_CAP_HELD + 3):  # accepted in this order: the last 3 are past those held
            over.append(socket.create_connection(("127.0.0.1", port), timeout=READ_S))
        sockets += over
        for sock in over[-3:]:
            assert sock.recv(65536) == b""  # closed at once: no answer (nor gRPC's SETTINGS) is owed
        held = over[-4]
        if protocol == "http":
            held.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            assert held.recv(65536).startswith(b"HTTP/1.1 503 ")
        else:
            assert held.recv(65536)  # the server's SETTINGS: it waits for the first call, to answer UNAVAILABLE
    finally:
        for sock in sockets:
            sock.close()
        for client in clients:
            client.close()
    # The busy connections count until the server has read their ends; then a new one of each port is served.
    wait_until(lambda: _http_get(served.http_port, "/v2/health/ready")[0] == 200, "the busy connections are gone")
    wait_until(lambda: _grpc_served(served), "the busy connections are gone")


def _grpc_served(served: ServedProcess) -> bool:
    """Whether a tritonclient call on a connection of its own is answered (not UNAVAILABLE over the cap)."""
    try:
        served.assert_served()
    except InferenceServerException as error:
        assert "UNAVAILABLE" in str(error.status()), error
        return False
    return True


@pytest.fixture(scope="module")
def two_connections() -> Iterator[ServedProcess]:
    server = ServedProcess({"grpc_max_connections": 2})  # an idle connection is held 10 s for its first call
    yield server
    server.stop()


def test_idle_connections_over_the_cap_get_goaway_saying_why_at_their_first_calls_deadline(clients):
    # A server of its own: a connection a test before closed may still count while the server has yet to read
    # its end. The two that fill the cap have a call in progress (idle ones would make room for the next four).
    server = ServedProcess({"grpc_max_connections": 2, "grpc_handshake_timeout_s": 2.0})
    try:
        for _ in range(2):
            clients.append(busy_h2(server))
        for _ in range(4):
            clients.append(server.h2())
        for client in clients[2:]:
            assert goaway_of(client.wait_closed(READ_S)) == (
                0,
                NO_ERROR,
                b"the server serves at most 2 gRPC connections at once",
            )
    finally:
        server.stop()


def test_a_call_sent_once_the_settings_are_acknowledged_over_the_cap_gets_unavailable_then_goaway(
    two_connections, clients
):
    # As grpc's clients do: they send their first call only once the server's SETTINGS have come. A GOAWAY
    # said as soon as the client's SETTINGS were read refused it, and tritonclient opened connection after
    # connection until its deadline (DEADLINE_EXCEEDED) whenever the server read the SETTINGS apart from it.
    for _ in range(2):
        clients.append(busy_h2(two_connections))
    over = two_connections.h2()
    clients.append(over)
    response = over.infer([1.0])
    assert response.trailers_only and response.grpc_status == "14"  # UNAVAILABLE
    assert response.headers["grpc-message"] == "the server serves at most 2 gRPC connections at once"
    assert goaway_of(over.wait_closed(READ_S))[:2] == (1, NO_ERROR)


def test_a_call_sent_with_the_preface_over_the_cap_gets_unavailable_then_goaway(two_connections, clients):
    for _ in range(2):
        clients.append(busy_h2(two_connections))
    call = pack_frame(HEADERS, END_HEADERS, 1, hpack.Encoder().encode(request_headers()))
    call += pack_frame(DATA, END_STREAM, 1, grpc_message(infer_request([1.0])))
    client = H2Client(two_connections.grpc_port, preface=PREFACE + pack_frame(SETTINGS, 0, 0) + call)
    clients.append(client)
    response = client.response(1)
    assert response.trailers_only and response.grpc_status == "14"  # UNAVAILABLE
    assert response.headers["grpc-message"] == "the server serves at most 2 gRPC connections at once"
    assert goaway_of(client.wait_closed(READ_S))[:2] == (1, NO_ERROR)


@pytest.mark.parametrize("sent", [b"", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"], ids=["nothing", "the magic alone"])
def test_connections_without_preface_and_settings_are_closed(capped, sent):
    silent = []
    for _ in range(20):  # more than the cap
        sock = socket.create_connection(("127.0.0.1", capped.grpc_port), timeout=READ_S)
        sock.sendall(sent)
        silent.append(sock)
    started = time.monotonic()
    try:
        for sock in silent:
            while sock.recv(65536):  # this server's SETTINGS, then the close
                pass
    except ConnectionResetError:
        pass
    finally:
        for sock in silent:
            sock.close()
    assert time.monotonic() - started < READ_S
    capped.assert_served()


def test_a_connection_with_a_call_in_progress_is_not_idle(capped, clients):
    client = capped.h2()
    clients.append(client)
    stream = client.new_stream()
    client.send_headers(stream, request_headers(path=STREAM_INFER))  # a stream open for longer than 2 s idle
    client.assert_quiet(0, 3.0)
    assert not [frame for frame in client.log if frame.kind == GOAWAY]
    client.send_data(stream, grpc_message(infer_request([2.0])))
    response = client.response(stream)
    assert response.grpc_status == "0" and len(response.messages()) == 1
    frames = client.wait_closed(READ_S)  # idle after its call: GOAWAY naming it
    assert goaway_of(frames)[:2] == (stream, NO_ERROR)


@pytest.fixture(scope="module")
def first_call_due() -> Iterator[ServedProcess]:
    server = ServedProcess({"grpc_handshake_timeout_s": 1.0})  # the idle timeout between calls stays 300 s
    yield server
    server.stop()


def test_connections_that_send_only_the_preface_get_goaway_after_the_handshake_timeout(first_call_due, clients):
    # The preface and SETTINGS, then nothing: such connections were held for the idle timeout (300 s), where
    # one that sent nothing is closed after the handshake timeout; now they wait for their first call that long.
    for _ in range(50):
        clients.append(first_call_due.h2())
    for client in clients:
        assert goaway_of(client.wait_closed(READ_S)) == (0, NO_ERROR, b"")
    first_call_due.assert_served()


def test_a_connection_with_a_call_keeps_the_idle_timeout(first_call_due, clients):
    client = first_call_due.h2()
    clients.append(client)
    stream = client.new_stream()
    client.send_headers(stream, request_headers(path=STREAM_INFER))  # open past the 1 s for a first call
    client.assert_quiet(0, 2.0)
    client.send_data(stream, grpc_message(infer_request([2.0])), end_stream=True)
    response = client.response(stream)
    assert response.grpc_status == "0" and len(response.messages()) == 1
    client.assert_quiet(0, 2.0)  # between calls: the idle timeout (300 s), not the first call's
    assert not client.eof and not [frame for frame in client.log if frame.kind == GOAWAY]


# ---------------------------------------------------------------- ModelStreamInfer: in-flight bound, windows


@pytest.fixture(scope="module")
def stream_limited() -> Iterator[ServedProcess]:
    server = ServedProcess({"grpc_max_stream_requests": 2})
    yield server
    server.stop()


def test_a_stream_runs_at_most_its_bound_of_requests_at_once(stream_limited):
    responses: List[Any] = []
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{stream_limited.grpc_port}")
    try:
        client.start_stream(callback=lambda result, error: responses.append(error or result))
        for index in range(12):
            tensor = grpcclient.InferInput("INPUT_1", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[float(index)]], np.float32))
            client.async_stream_infer("slow", [tensor], request_id=str(index))
        deadline = time.monotonic() + 30
        while len(responses) < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        client.stop_stream()
    finally:
        client.close()
    assert sorted(float(result.as_numpy("OUTPUT_1")[0][0]) for result in responses) == [float(i) for i in range(12)]
    largest_batch = int(stream_limited.infer([0.0], model="rows")[0][1])
    assert largest_batch <= 2  # without the bound, 12 queued requests make batches of 8


def _stream_messages(count: int, size: int) -> bytes:
    values = [1.0] * (size // 4)
    return grpc_message(infer_request(values, model="slow")) * count


def test_unread_stream_messages_hold_the_window_until_the_handler_reads_them(stream_limited, clients):
    big = 2**30
    client = stream_limited.h2(settings={SETTINGS_INITIAL_WINDOW_SIZE: big})
    clients.append(client)
    client.window_update(0, big)
    stream = client.new_stream()
    client.send_headers(stream, request_headers(path=STREAM_INFER))
    client.send_data(stream, _stream_messages(12, 256 * 1024), end_stream=False)  # 3 MiB; 2 run, 10 wait
    with pytest.raises(socket.timeout):  # unread: no WINDOW_UPDATE gives the stream room back yet
        client.wait_for(lambda frame: frame.kind == WINDOW_UPDATE and frame.stream == stream, 0.3)
    update = client.wait_for(lambda frame: frame.kind == WINDOW_UPDATE and frame.stream == stream, 30)
    assert struct.unpack(">I", update.payload)[0] >= 2 * 2**20  # read by the handler: half a window back
    client.send_data(stream, b"", end_stream=True)
    responses = 0
    while True:
        frame = client.wait_for(lambda frame: frame.stream == stream and frame.kind in (DATA, HEADERS), 30)
        if frame.kind == HEADERS and frame.has(END_STREAM):
            break
        responses += frame.kind == DATA
    assert responses >= 12


def test_a_client_sending_past_the_connection_window_gets_flow_control_error(clients):
    server = ServedProcess({"grpc_max_stream_requests": 1})
    try:
        client = server.h2()
        clients.append(client)
        message = _stream_messages(1, 60 * 1024)
        chunks = []
        for stream in range(1, 11, 2):  # 5 streams x 3.5 MiB: each within its 4 MiB, 17.5 MiB over the 16 MiB
            chunks.append(
                pack_frame(HEADERS, END_HEADERS, stream, client.encoder.encode(request_headers(path=STREAM_INFER)))
            )
            data = message * 60
            chunks += [pack_frame(DATA, 0, stream, data[at : at + 16_384]) for at in range(0, len(data), 16_384)]
        frames = flood_until_closed(client, chunks)
        assert goaway_of(frames)[1] == FLOW_CONTROL_ERROR
        assert not resets_of(frames)  # no stream went past its own window
        server.assert_served()
    finally:
        server.stop()


# ---------------------------------------------------------------- what a declared size costs a frontend process


def _memfd_bytes(pids: List[int]) -> Dict[Tuple[int, int], Tuple[int, int]]:
    """Each shared-memory file the processes hold: (pid, inode) -> (its size, the bytes of memory it took).

    By inode, not descriptor: a frontend holds a new buffer's file under two descriptors for a while (its own
    and the duplicate it sends the hub).
    """
    found: Dict[Tuple[int, int], Tuple[int, int]] = {}
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                    continue
                stat = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            found[(pid, stat.st_ino)] = (stat.st_size, stat.st_blocks * 512)
    return found


@pytest.fixture(scope="module")
def behind_frontends() -> Iterator[Triton]:
    def bind(triton: Triton) -> None:
        fp32 = [Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))]
        out = [Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))]
        triton.bind("identity", _identity, inputs=fp32, outputs=out, config=ModelConfig(max_batch_size=8))

    with running_triton(bind, frontends=3) as triton:
        yield triton


@pytest.fixture
def sockets() -> Iterator[List[socket.socket]]:
    """Plain connections a test opens (append them), closed at its end."""
    opened: List[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


def _answered_by(pid: int, frontends: List[int], port: int, sockets: List[socket.socket]) -> None:
    """A request answered by frontend `pid` (on a connection of its own): its loop is past what came before."""
    for _ in range(50):
        sock = socket.create_connection(("127.0.0.1", port), timeout=READ_S)
        sockets.append(sock)
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        if serving_pid(sock, frontends) == pid:
            return
    raise AssertionError(f"no connection reached frontend {pid}")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_declared_size_costs_a_frontend_process_only_the_bytes_that_arrive(
    behind_frontends, clients, sockets, protocol
):
    declared = (1 << 30) + 4096 if protocol == "grpc" else (60 << 20) + 4096
    client = None
    if protocol == "grpc":
        client = H2Client(behind_frontends.grpc_port)
        clients.append(client)
        client.handshake()
        client.send_headers(1, request_headers())
        client.send_data(1, struct.pack(">BI", 0, declared) + b"x" * 100_000, end_stream=False)
    else:
        sock = socket.create_connection(("127.0.0.1", behind_frontends.http_port), timeout=READ_S)
        sockets.append(sock)
        sock.sendall(
            b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % declared
            + b"x" * 100_000
        )
    frontends = frontend_pids()
    made: Dict[Tuple[int, int], Tuple[int, int]] = {}

    def buffer_made() -> bool:
        made.update((key, sizes) for key, sizes in _memfd_bytes(frontends).items() if sizes[0] == declared)
        return bool(made)

    wait_until(buffer_made, "the frontend made the declared message's buffer")
    ((pid, inode),) = made
    if client is not None:  # the frontend's loop answers the PING once it is past the message's first bytes
        client.ping(b"12345678")
        client.wait_for(lambda frame: frame.kind == PING and frame.has(ACK))
    else:
        _answered_by(pid, frontends, behind_frontends.http_port, sockets)
    ((size, taken),) = (sizes for key, sizes in _memfd_bytes([pid]).items() if key == (pid, inode))
    assert taken < 16 << 20, f"a buffer of {size} bytes took {taken} bytes for the 100 KB that came"


def test_unparsable_stream_messages_whose_errors_go_unread_are_held_by_flow_control(served, clients):
    before = served.rss_mib()
    client = served.h2()  # its window for the server's answers stays at 64 KiB: it reads none of them
    clients.append(client)
    client.send_headers(1, request_headers(path=STREAM_INFER))
    client.send_data(1, grpc_message(b"\xff\xff\xff") * 200_000, end_stream=False)  # in the 4 MiB stream window
    # Each costs the server an error answer of 10 times its size. Without a hold the server reads them all
    # within this while, and its RSS grows by 170 MiB; with one it reads a few dozen and no more.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        assert served.rss_mib() - before < RSS_GROWTH_MIB
        try:
            assert client.read_frame(0.1) is not None, "the server closed the connection"
        except (socket.timeout, TimeoutError):
            pass
    served.assert_served()


# ---------------------------------------------------------------- answers held for a client that opens no window

ANSWER_BYTES = 8 * 2**20
ANSWER_VALUES = float(ANSWER_BYTES // 4)  # `large` answers that many FP32 zeros


def test_a_client_that_opens_no_window_gets_no_new_calls_past_the_unsent_bound(served, clients):
    """Its calls' answers all waited for a window it never opened, until the send timeout: 100 calls of 8 MiB held
    760 MB on one connection. Past UNSENT_BOUND_BYTES waiting, its new calls wait unanswered, and run once it reads."""
    calls = 24  # 192 MiB of answers, six times the bound
    client = served.h2(settings={SETTINGS_INITIAL_WINDOW_SIZE: 0})
    clients.append(client)
    before = served.rss_mib()
    streams: List[int] = []
    answered = 0
    for _ in range(calls):  # one at a time: each call once the last one's answer waits (its headers came)
        stream = client.start_call(infer_request([ANSWER_VALUES], model="large"))
        streams.append(stream)
        try:
            client.wait_for(lambda frame, stream=stream: frame.kind == HEADERS and frame.stream == stream)
        except socket.timeout:  # held back: its handler waits for the answers to go
            break
        answered += 1
    assert answered <= UNSENT_BOUND_BYTES // ANSWER_BYTES + 2, "every answer waited for the window"
    served.assert_served()  # another connection's calls go on meanwhile
    assert served.rss_mib() - before < UNSENT_BOUND_BYTES / 2**20 + 3 * ANSWER_BYTES / 2**20
    for stream in [0, *streams]:  # once the client reads, the calls held back run
        client.window_update(stream, 2**31 - 1 - 65535 * (stream == 0))
    for stream in streams:
        response = client.response(stream, timeout=60)
        assert response.grpc_status == "0"
        assert response.infer_response().raw_output_contents[0] == bytes(ANSWER_BYTES)


def test_grpc_clients_with_many_large_answers_in_flight_get_them_all(served):
    """grpc's own client opens its windows as it reads: past the unsent bound its calls wait a moment, none fails."""
    calls = 24
    results: List[Any] = []
    done = threading.Event()

    def on_result(result: Any, error: Any) -> None:
        results.append(error or result)
        if len(results) == calls:
            done.set()

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    try:
        for index in range(calls):
            tensor = grpcclient.InferInput("INPUT_1", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[ANSWER_VALUES + index]], np.float32))
            client.async_infer("large", [tensor], on_result, request_id=str(index))
        assert done.wait(120)
    finally:
        client.close()
    sizes = sorted(result.as_numpy("OUTPUT_1").size for result in results)
    assert sizes == [int(ANSWER_VALUES) + index for index in range(calls)]


def test_calls_held_back_past_the_unsent_bound_run_once_the_waiting_answers_are_cancelled(served, clients):
    """The answers of calls the client resets no longer wait: their bytes leave the bound, the held calls run."""
    client = served.h2(settings={SETTINGS_INITIAL_WINDOW_SIZE: 0})
    clients.append(client)
    waiting: List[int] = []
    held = None
    for _ in range(UNSENT_BOUND_BYTES // ANSWER_BYTES + 3):
        stream = client.start_call(infer_request([ANSWER_VALUES], model="large"))
        try:
            client.wait_for(lambda frame, stream=stream: frame.kind == HEADERS and frame.stream == stream)
        except socket.timeout:
            held = stream
            break
        waiting.append(stream)
    assert held is not None, "no call was held back"
    for stream in waiting:
        client.rst_stream(stream, CANCEL)
    client.wait_for(lambda frame: frame.kind == HEADERS and frame.stream == held, 30)  # its answer waits now
    client.window_update(0, 2**31 - 1 - 65535)
    client.window_update(held, 2**31 - 1)
    response = client.response(held, timeout=60)
    assert response.grpc_status == "0"
    assert response.infer_response().raw_output_contents[0] == bytes(ANSWER_BYTES)
