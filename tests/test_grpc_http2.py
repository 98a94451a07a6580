"""The gRPC frontend's HTTP/2, spoken by hand: a raw client on a TCP socket against a real running server.

Request header blocks are encoded and response header blocks decoded with hpack; frames are packed with
struct. Every test asserts what a client sees on the wire: frames, header fields, messages, GOAWAY codes
and the connection closing.
"""

from __future__ import annotations

import dataclasses
import gzip
import socket
import struct
import threading
import time
import zlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import hpack
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from pytriton.model_config import ModelConfig, Tensor
from pytriton.options.limits import ServerLimits
from pytriton.triton import Triton, TritonConfig

# Generous: the tests must hold on a loaded 2-core machine. None of them waits this long when it passes.
READ_S = 5.0
# How long the gate model holds a call unless released (far longer than any test's expectations).
GATE_HOLD_S = 20.0
# Long enough to tell "nothing more is coming" from "it is on its way" on the loopback interface.
QUIET_S = 0.5
MESSAGE_LIMIT = 1 << 20

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x5, 0x6
REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x8, 0x9, 0xB
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5
DEFAULT_MAX_FRAME = 16_384
DEFAULT_WINDOW = 65_535
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"

FP32 = [Tensor(dtype=np.float32, shape=(-1,))]


# ---------------------------------------------------------------- wire helpers


@dataclasses.dataclass
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes
    headers: Optional[Dict[str, str]] = None  # a HEADERS frame's decoded block

    def has(self, flag: int) -> bool:
        return bool(self.flags & flag)


@dataclasses.dataclass
class Response:
    """The frames of one stream, from the server's first HEADERS to its END_STREAM (or RST_STREAM)."""

    frames: List[Frame]

    @property
    def blocks(self) -> List[Dict[str, str]]:
        return [frame.headers for frame in self.frames if frame.headers is not None]

    @property
    def headers(self) -> Dict[str, str]:
        return self.blocks[0]

    @property
    def trailers(self) -> Dict[str, str]:
        return self.blocks[-1]

    @property
    def trailers_only(self) -> bool:
        return len(self.blocks) == 1 and not self.data_frames

    @property
    def data_frames(self) -> List[Frame]:
        return [frame for frame in self.frames if frame.kind == DATA]

    @property
    def data(self) -> bytes:
        return b"".join(frame.payload for frame in self.data_frames)

    @property
    def grpc_status(self) -> Optional[str]:
        return self.trailers.get("grpc-status")

    def messages(self) -> List[Tuple[int, bytes]]:
        """The length-prefixed messages of the DATA, as (compression flag, payload); the DATA must hold whole ones."""
        data, found = self.data, []
        while data:
            assert len(data) >= 5, f"a partial message prefix: {data!r}"
            flag, length = struct.unpack(">BI", data[:5])
            assert len(data) >= 5 + length, "a partial message"
            found.append((flag, data[5 : 5 + length]))
            data = data[5 + length :]
        return found

    def infer_response(self) -> Any:
        messages = self.messages()
        assert len(messages) == 1 and messages[0][0] == 0, messages
        return service_pb2.ModelInferResponse.FromString(messages[0][1])

    def output(self) -> List[float]:
        return np.frombuffer(self.infer_response().raw_output_contents[0], np.float32).tolist()  # type: ignore[no-any-return]


def pack_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


def settings_payload(settings: Dict[int, int]) -> bytes:
    return b"".join(struct.pack(">HI", key, value) for key, value in settings.items())


def grpc_message(payload: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(payload)) + payload


def infer_request(values: Sequence[float], model: str = "identity") -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model, id="raw")
    request.inputs.add(name="INPUT_1", datatype="FP32", shape=[1, len(values)])
    request.raw_input_contents.append(np.asarray(values, np.float32).tobytes())
    return request.SerializeToString()  # type: ignore[no-any-return]


def request_headers(
    path: str = MODEL_INFER, method: str = "POST", content_type: Optional[str] = "application/grpc", **extra: str
) -> List[Tuple[str, str]]:
    headers = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "127.0.0.1")]
    if content_type is not None:
        headers.append(("content-type", content_type))
    headers.append(("te", "trailers"))
    headers += [(name.replace("_", "-"), value) for name, value in extra.items()]
    return headers


def goaway_fields(frame: Frame) -> Tuple[int, int, bytes]:
    """(last stream id, error code, debug data) of a GOAWAY frame."""
    assert frame.kind == GOAWAY and frame.stream == 0
    last, code = struct.unpack(">II", frame.payload[:8])
    return last & 0x7FFFFFFF, code, frame.payload[8:]


class ServerClosed(AssertionError):
    """The server closed the connection while the test still expected a frame."""


class H2Client:
    """A minimal HTTP/2 client: sends frames as told, reads frames with a timeout, answers the server's SETTINGS."""

    def __init__(self, port: int, settings: Optional[Dict[int, int]] = None, preface: bytes = PREFACE) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=READ_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self._buffer = bytearray()
        self._continuation: Optional[Tuple[Frame, bytearray]] = None
        self.log: List[Frame] = []  # every frame read, in order
        self._unclaimed: List[Frame] = []  # frames read that no wait_for has returned yet
        self.server_settings: Dict[int, int] = {}
        self.settings_acked = False
        self.eof = False
        self.next_stream = 1
        self.sock.sendall(preface + pack_frame(SETTINGS, 0, 0, settings_payload(settings or {})))

    def close(self) -> None:
        self.sock.close()

    # -- sending ---------------------------------------------------------------------------------

    def send(self, kind: int, flags: int, stream: int, payload: bytes = b"") -> None:
        self.sock.sendall(pack_frame(kind, flags, stream, payload))

    def new_stream(self) -> int:
        stream, self.next_stream = self.next_stream, self.next_stream + 2
        return stream

    def send_headers(
        self,
        stream: int,
        headers: Sequence[Tuple[str, str]],
        end_stream: bool = False,
        pad: Optional[int] = None,
        priority: bool = False,
        pieces: int = 1,
    ) -> None:
        """A header block in a HEADERS frame (padded, with priority fields) and `pieces - 1` CONTINUATION frames."""
        if stream >= self.next_stream:
            self.next_stream = stream + 2 if stream % 2 else stream + 1
        block = self.encoder.encode(headers)
        size = -(-len(block) // pieces)
        chunks = [block[start : start + size] for start in range(0, len(block), size)]
        assert len(chunks) == pieces, "the header block is too short to split that often"
        flags = END_STREAM if end_stream else 0
        first = chunks[0]
        if priority:
            flags |= PRIORITY_FLAG
            first = struct.pack(">IB", 0, 15) + first  # depends on stream 0, weight 16
        if pad is not None:
            flags |= PADDED
            first = bytes([pad]) + first + b"\0" * pad
        frames = [pack_frame(HEADERS, flags | (END_HEADERS if pieces == 1 else 0), stream, first)]
        for index, chunk in enumerate(chunks[1:], start=2):
            frames.append(pack_frame(CONTINUATION, END_HEADERS if index == pieces else 0, stream, chunk))
        self.sock.sendall(b"".join(frames))

    def send_data(
        self,
        stream: int,
        data: bytes,
        end_stream: bool = True,
        size: int = DEFAULT_MAX_FRAME,
        pad: Optional[int] = None,
    ) -> None:
        """`data` in DATA frames of at most `size` bytes of data, the last one ending the stream when asked."""
        chunks = [data[start : start + size] for start in range(0, len(data), size)] or [b""]
        frames = []
        for index, chunk in enumerate(chunks):
            flags = END_STREAM if end_stream and index == len(chunks) - 1 else 0
            if pad is not None:
                flags |= PADDED
                chunk = bytes([pad]) + chunk + b"\0" * pad
            frames.append(pack_frame(DATA, flags, stream, chunk))
        self.sock.sendall(b"".join(frames))

    def ping(self, payload: bytes, ack: bool = False) -> None:
        self.send(PING, ACK if ack else 0, 0, payload)

    def rst_stream(self, stream: int, code: int) -> None:
        self.send(RST_STREAM, 0, stream, struct.pack(">I", code))

    def window_update(self, stream: int, increment: int) -> None:
        self.send(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))

    def settings(self, settings: Dict[int, int]) -> None:
        self.send(SETTINGS, 0, 0, settings_payload(settings))

    def start_call(self, message: bytes, stream: Optional[int] = None, **headers: str) -> int:
        """HEADERS and DATA (ending the stream) of a call carrying one uncompressed message."""
        stream = self.new_stream() if stream is None else stream
        self.send_headers(stream, request_headers(**headers))
        self.send_data(stream, grpc_message(message))
        return stream

    def infer(self, values: Sequence[float], model: str = "identity") -> Response:
        return self.response(self.start_call(infer_request(values, model)))

    # -- reading ---------------------------------------------------------------------------------

    def read_frame(self, timeout: float = READ_S) -> Optional[Frame]:
        """The next frame off the socket; None once the server closed the connection; socket.timeout if none came."""
        deadline = time.monotonic() + timeout
        while True:
            buffer = self._buffer
            if len(buffer) >= 9:
                length = int.from_bytes(buffer[:3], "big")
                if len(buffer) >= 9 + length:
                    kind, flags, stream = buffer[3], buffer[4], int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
                    frame = Frame(kind, flags, stream, bytes(buffer[9 : 9 + length]))
                    del buffer[: 9 + length]
                    self._received(frame)
                    self.log.append(frame)
                    return frame
            if self.eof:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("no frame in time")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.eof = True
                continue
            buffer += chunk

    def _received(self, frame: Frame) -> None:
        """Keep the connection's state: answer SETTINGS, decode header blocks (every one, in order, as HPACK asks)."""
        if frame.kind == SETTINGS:
            if frame.has(ACK):
                self.settings_acked = True
            else:
                for offset in range(0, len(frame.payload), 6):
                    key, value = struct.unpack_from(">HI", frame.payload, offset)
                    self.server_settings[key] = value
                self.send(SETTINGS, ACK, 0)
        elif frame.kind == HEADERS:
            if frame.has(END_HEADERS):
                frame.headers = dict(self.decoder.decode(frame.payload))
            else:
                self._continuation = (frame, bytearray(frame.payload))
        elif frame.kind == CONTINUATION:
            assert self._continuation is not None, "CONTINUATION from the server without its HEADERS"
            self._continuation[1].extend(frame.payload)
            if frame.has(END_HEADERS):
                started, block = self._continuation
                started.headers = dict(self.decoder.decode(bytes(block)))
                self._continuation = None
        if not (frame.kind in (SETTINGS, CONTINUATION) or (frame.kind == WINDOW_UPDATE and frame.stream == 0)):
            self._unclaimed.append(frame)  # connection housekeeping is only logged

    def _claim(self, matches: Callable[[Frame], bool]) -> Optional[Frame]:
        for index, frame in enumerate(self._unclaimed):
            if matches(frame):
                del self._unclaimed[index]
                return frame
        return None

    def wait_for(self, matches: Callable[[Frame], bool], timeout: float = READ_S) -> Frame:
        """The first frame not yet claimed that matches, reading more as needed.

        Frames that do not match stay unclaimed for later calls (SETTINGS, CONTINUATION and connection
        WINDOW_UPDATE frames are never returned: they are handled as they arrive, and kept in `log`).
        """
        deadline = time.monotonic() + timeout
        while True:
            frame = self._claim(matches)
            if frame is not None:
                return frame
            if self.read_frame(max(0.0, deadline - time.monotonic())) is None:
                raise ServerClosed(f"the server closed the connection; frames read: {self.log}")

    def next_frame(self, timeout: float = READ_S) -> Optional[Frame]:
        """The next frame not yet claimed (housekeeping aside); None once the server closed the connection."""
        try:
            return self.wait_for(lambda frame: True, timeout)
        except ServerClosed:
            return None

    def wait_goaway(self, timeout: float = READ_S) -> Frame:
        return self.wait_for(lambda frame: frame.kind == GOAWAY, timeout)

    def response(self, stream: int, timeout: float = READ_S) -> Response:
        """The server's frames on `stream` until it ends the stream (END_STREAM, or RST_STREAM)."""
        deadline = time.monotonic() + timeout
        frames: List[Frame] = []
        while True:
            frame = self.wait_for(lambda frame: frame.stream == stream, max(0.0, deadline - time.monotonic()))
            frames.append(frame)
            if frame.kind == RST_STREAM or (frame.kind in (HEADERS, DATA) and frame.has(END_STREAM)):
                return Response(frames)

    def wait_closed(self, timeout: float = READ_S) -> List[Frame]:
        """Read until the server closes the connection; the frames not yet claimed (housekeeping aside)."""
        deadline = time.monotonic() + timeout
        while self.read_frame(max(0.0, deadline - time.monotonic())) is not None:
            pass
        frames, self._unclaimed = self._unclaimed, []
        return frames

    def assert_quiet(self, stream: int, seconds: float = QUIET_S) -> None:
        """Nothing arrives on `stream` for a while (frames on other streams and housekeeping may)."""
        deadline = time.monotonic() + seconds
        while True:
            assert not [frame for frame in self._unclaimed if frame.stream == stream], self._unclaimed
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                frame = self.read_frame(remaining)
            except socket.timeout:
                return
            assert frame is not None, "the server closed the connection"


@pytest.fixture
def connect() -> Iterator[Callable[..., H2Client]]:
    """Open raw HTTP/2 connections; all are closed at the end of the test."""
    clients: List[H2Client] = []

    def open_client(triton: Triton, **kwargs: Any) -> H2Client:
        client = H2Client(triton.grpc_port, **kwargs)  # type: ignore[arg-type]
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        client.close()


# ---------------------------------------------------------------- servers


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


class Gate:
    """A model that holds each call until released; counts calls in its callable."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.active = 0

    def __call__(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        with self._lock:
            self.active += 1
        try:
            self.entered.set()
            self.release.wait(GATE_HOLD_S)
            return _identity(requests)
        finally:
            with self._lock:
                self.active -= 1

    def reset(self) -> None:
        """Release whatever is held, wait until the callable is idle, then close the gate again."""
        self.release.set()
        deadline = time.monotonic() + READ_S
        while self.active and time.monotonic() < deadline:
            time.sleep(0.005)
        assert self.active == 0, "the gate model is still busy"
        self.release.clear()
        self.entered.clear()


def serve(gate: Optional[Gate] = None, limits: Optional[ServerLimits] = None, **config: Any) -> Triton:
    """A running Triton (gRPC only) with the identity model, and the gate model when given one."""
    options: Dict[str, Any] = {"http_port": 0, "grpc_port": 0, "allow_http": False, "allow_metrics": False}
    options.update(config)
    triton = Triton(config=TritonConfig(**options), limits=limits)
    try:
        triton.bind("identity", _identity, inputs=FP32, outputs=FP32, config=ModelConfig(max_batch_size=8))
        if gate is not None:
            triton.bind("gate", gate, inputs=FP32, outputs=FP32, config=ModelConfig(max_batch_size=8))
        triton.run()
    except BaseException:
        triton.stop()
        raise
    return triton


@pytest.fixture(scope="module")
def module_gate() -> Iterator[Gate]:
    gate = Gate()
    yield gate
    gate.release.set()


@pytest.fixture
def gate(module_gate: Gate) -> Iterator[Gate]:
    """The shared server's gate model, closed at the start of the test and idle again after it."""
    module_gate.reset()
    try:
        yield module_gate
    finally:
        module_gate.reset()


@pytest.fixture(scope="module")
def server(module_gate: Gate) -> Iterator[Triton]:
    triton = serve(module_gate, ServerLimits(grpc_max_message_bytes=MESSAGE_LIMIT))
    yield triton
    module_gate.release.set()
    triton.stop()


@pytest.fixture(scope="module")
def keepalive_server() -> Iterator[Triton]:
    triton = serve(grpc_keepalive_time=200, grpc_keepalive_timeout=300, grpc_keepalive_permit_without_calls=True)
    yield triton
    triton.stop()


def assert_served(triton: Triton, connect: Callable[..., H2Client], values: Sequence[float] = (3.0, 4.0)) -> None:
    """A fresh connection gets a call answered."""
    response = connect(triton).infer(values)
    assert response.grpc_status == "0" and response.output() == list(values)


# ---------------------------------------------------------------- 1. a call


def test_model_infer_over_raw_http2(server, connect):
    client = connect(server)
    stream = client.start_call(infer_request([1.0, 2.5, -3.0]))
    response = client.response(stream)

    assert client.log[0].kind == SETTINGS and not client.log[0].has(ACK)  # the server's preface
    assert [(frame.kind, frame.flags & END_STREAM) for frame in response.frames] == [
        (HEADERS, 0),
        (DATA, 0),
        (HEADERS, END_STREAM),
    ]
    assert all(frame.has(END_HEADERS) for frame in response.frames if frame.kind == HEADERS)
    assert response.headers[":status"] == "200"
    assert response.headers["content-type"] == "application/grpc"
    assert "grpc-encoding" not in response.headers
    message = response.infer_response()
    assert message.model_name == "identity" and message.id == "raw"
    assert [(out.name, out.datatype, list(out.shape)) for out in message.outputs] == [("OUTPUT_1", "FP32", [1, 3])]
    assert response.output() == [1.0, 2.5, -3.0]
    assert response.trailers == {"grpc-status": "0"}
    assert client.settings_acked  # our SETTINGS, acknowledged before the response
    assert client.server_settings[SETTINGS_INITIAL_WINDOW_SIZE] > DEFAULT_WINDOW  # it reads ahead of the default


def test_calls_on_one_connection_follow_each_other(server, connect):
    client = connect(server)
    for index in range(5):
        response = client.infer([float(index)] * (index + 1))
        assert response.grpc_status == "0" and response.output() == [float(index)] * (index + 1)


# ---------------------------------------------------------------- 2. framing of requests


def test_request_in_seven_byte_data_frames_with_its_prefix_split(server, connect):
    client = connect(server)
    values = [float(value) for value in range(50)]
    message = grpc_message(infer_request(values))
    client.send_headers(1, request_headers())
    client.send_data(1, message[:3], end_stream=False)  # 3 bytes of the 5-byte prefix
    client.send_data(1, message[3:], size=7)  # then 7-byte frames, the last ending the stream
    response = client.response(1)
    assert response.grpc_status == "0" and response.output() == values


def test_request_ended_by_an_empty_data_frame(server, connect):
    client = connect(server)
    client.send_headers(1, request_headers())
    client.send_data(1, grpc_message(infer_request([9.0])), end_stream=False)
    client.send_data(1, b"")
    response = client.response(1)
    assert response.grpc_status == "0" and response.output() == [9.0]


def test_header_block_in_headers_and_continuation_frames(server, connect):
    client = connect(server)
    headers = request_headers(x_trace_note="a" * 40, x_other="b" * 40)
    client.send_headers(1, headers, pieces=4)  # HEADERS + 3 CONTINUATION, END_HEADERS on the last
    client.send_data(1, grpc_message(infer_request([5.0, 6.0])))
    response = client.response(1)
    assert response.grpc_status == "0" and response.output() == [5.0, 6.0]


def test_padded_headers_and_data_frames(server, connect):
    client = connect(server)
    message = grpc_message(infer_request([7.0, 8.0, 9.0]))
    client.send_headers(1, request_headers(), pad=10)
    client.send_data(1, message, size=20, pad=17)
    first = client.response(1)
    client.send_headers(3, request_headers(), pad=0, priority=True)  # PADDED (pad length 0) and PRIORITY fields
    client.send_data(3, message, pad=255)
    second = client.response(3)
    assert first.grpc_status == second.grpc_status == "0"
    assert first.output() == second.output() == [7.0, 8.0, 9.0]


def test_interleaved_streams_are_reassembled_apart(server, connect):
    client = connect(server)
    one, three = grpc_message(infer_request([1.0] * 20)), grpc_message(infer_request([3.0] * 30))
    client.send_headers(1, request_headers())
    client.send_headers(3, request_headers())
    for start in range(0, max(len(one), len(three)), 11):
        if start < len(one):
            client.send_data(1, one[start : start + 11], end_stream=start + 11 >= len(one))
        if start < len(three):
            client.send_data(3, three[start : start + 11], end_stream=start + 11 >= len(three))
    assert client.response(3).output() == [3.0] * 30
    assert client.response(1).output() == [1.0] * 20


# ---------------------------------------------------------------- 3. requests that start no call


def test_unknown_method_is_unimplemented_trailers_only(server, connect):
    client = connect(server)
    client.send_headers(1, request_headers(path="/inference.GRPCInferenceService/NoSuchMethod"))
    client.send_data(1, grpc_message(infer_request([1.0])))
    response = client.response(1)
    assert response.trailers_only and response.frames[0].has(END_STREAM)
    assert response.headers[":status"] == "200"
    assert response.headers["content-type"] == "application/grpc"
    assert response.grpc_status == "12"  # UNIMPLEMENTED
    assert response.headers["grpc-message"] == "Method not found!"
    assert client.infer([2.0]).output() == [2.0]  # the connection serves on


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", None])
def test_a_content_type_other_than_grpc_is_415(server, connect, content_type):
    client = connect(server)
    client.send_headers(1, request_headers(content_type=content_type))
    client.send_data(1, grpc_message(infer_request([1.0])))
    response = client.response(1)
    assert response.frames[0].kind == HEADERS and response.frames[0].has(END_STREAM)
    assert response.headers[":status"] == "415"
    assert "grpc-status" not in response.headers
    assert client.infer([2.0]).output() == [2.0]


def test_a_grpc_content_type_with_a_suffix_is_served(server, connect):
    client = connect(server)
    response = client.response(client.start_call(infer_request([4.0]), content_type="application/grpc+proto"))
    assert response.grpc_status == "0" and response.output() == [4.0]


def test_get_is_405(server, connect):
    client = connect(server)
    client.send_headers(1, request_headers(method="GET"), end_stream=True)
    response = client.response(1)
    assert len(response.frames) == 1 and response.frames[0].has(END_STREAM)
    assert response.headers[":status"] == "405"
    assert client.infer([2.0]).output() == [2.0]


# ---------------------------------------------------------------- 4. flow control of responses


def _data_on(client: H2Client, stream: int, until_bytes: int) -> List[Frame]:
    """DATA frames of `stream` until `until_bytes` of DATA arrived."""
    frames: List[Frame] = []
    while sum(len(frame.payload) for frame in frames) < until_bytes:
        frame = client.wait_for(lambda frame: frame.stream == stream)
        if frame.kind == HEADERS and not frame.has(END_STREAM):
            continue  # the response headers
        assert frame.kind == DATA, f"expected DATA, got {frame}"
        frames.append(frame)
    return frames


def test_response_waits_for_the_stream_and_connection_windows(server, connect):
    client = connect(server, settings={SETTINGS_INITIAL_WINDOW_SIZE: 1000})
    values = [float(value) for value in range(32768)]  # a 128 KiB response: over the 65,535-byte connection window
    client.start_call(infer_request(values))

    head = client.wait_for(lambda frame: frame.stream == 1)
    assert head.kind == HEADERS and head.headers is not None and head.headers[":status"] == "200"
    first = _data_on(client, 1, 1000)
    assert sum(len(frame.payload) for frame in first) == 1000  # exactly the stream window
    client.assert_quiet(1)

    client.window_update(1, 1 << 20)  # the stream window opens; the connection window (65,535) is what is left
    second = _data_on(client, 1, DEFAULT_WINDOW - 1000)
    assert sum(len(frame.payload) for frame in first + second) == DEFAULT_WINDOW
    client.assert_quiet(1)

    client.window_update(0, 1 << 20)
    rest = client.response(1)
    assert rest.trailers == {"grpc-status": "0"} and rest.frames[-1].kind == HEADERS
    data_frames = first + second + rest.data_frames
    assert all(len(frame.payload) <= DEFAULT_MAX_FRAME for frame in data_frames)
    assert all(frame.flags == 0 for frame in data_frames)  # END_STREAM comes with the trailers
    whole = Response([head, *data_frames, rest.frames[-1]])
    assert whole.output() == values


def test_window_update_before_the_response_is_ready_is_kept(server, connect):
    """A window raised by WINDOW_UPDATE (not SETTINGS) while the call runs lets the whole response through."""
    client = connect(server, settings={SETTINGS_INITIAL_WINDOW_SIZE: 10})
    values = [float(value) for value in range(2000)]
    stream = client.start_call(infer_request(values))
    client.window_update(stream, 20_000)
    response = client.response(stream)
    assert response.grpc_status == "0" and response.output() == values


def test_settings_raise_the_window_of_a_blocked_response(server, connect):
    client = connect(server, settings={SETTINGS_INITIAL_WINDOW_SIZE: 100})
    values = [float(value) for value in range(1000)]
    client.start_call(infer_request(values))
    first = _data_on(client, 1, 100)
    client.assert_quiet(1)
    client.settings({SETTINGS_INITIAL_WINDOW_SIZE: DEFAULT_WINDOW})  # RFC 9113 6.9.2: applies to open streams
    rest = client.response(1)
    assert Response([*first, *rest.frames]).output() == values


@pytest.mark.parametrize("max_frame", [None, 32_768])
def test_data_frames_respect_the_client_max_frame_size(server, connect, max_frame):
    settings = {} if max_frame is None else {SETTINGS_MAX_FRAME_SIZE: max_frame}
    client = connect(server, settings=settings)
    values = [float(value) for value in range(15_000)]  # a 60 KB message: fits the default 65,535-byte windows
    response = client.infer(values)
    sizes = [len(frame.payload) for frame in response.data_frames]
    limit = max_frame or DEFAULT_MAX_FRAME
    assert max(sizes) <= limit and sum(sizes) > 2 * DEFAULT_MAX_FRAME
    if max_frame is not None:
        assert max(sizes) > DEFAULT_MAX_FRAME  # the larger frames the client allows are used
    assert response.grpc_status == "0" and response.output() == values


# ---------------------------------------------------------------- 5. pings


def test_ping_is_acknowledged_with_its_payload(server, connect):
    client = connect(server)
    client.ping(b"\x00\x01\x02\x03\xfc\xfd\xfe\xff")
    ack = client.next_frame()
    assert ack is not None
    assert (ack.kind, ack.flags, ack.stream, ack.payload) == (PING, ACK, 0, b"\x00\x01\x02\x03\xfc\xfd\xfe\xff")


def _pings_answered(client: H2Client, count: int) -> List[Frame]:
    payloads = [b"ping-%03d" % index for index in range(count)]
    for payload in payloads:
        client.ping(payload)
    frames = [client.next_frame() for _ in payloads]
    return [frame for frame in frames if frame is not None]


def test_too_many_pings_without_data_get_goaway_enhance_your_calm(server, connect):
    # Triton's defaults: pings closer than 300 s (2 hours without a call in progress), 2 strikes allowed.
    # The first ping sets the clock, the next two are strikes 1 and 2, the fourth is one strike too many.
    client = connect(server)
    for index in range(4):
        client.ping(b"ping-%03d" % index)
    frames = client.wait_closed()
    kinds = [frame.kind for frame in frames if frame.kind in (PING, GOAWAY)]
    assert kinds == [PING, PING, PING, GOAWAY]
    assert [frame.payload for frame in frames if frame.kind == PING] == [b"ping-000", b"ping-001", b"ping-002"]
    goaway = next(frame for frame in frames if frame.kind == GOAWAY)
    assert goaway_fields(goaway) == (0, ENHANCE_YOUR_CALM, b"too_many_pings")
    assert_served(server, connect)


def test_sending_data_restarts_the_ping_strikes(server, connect):
    client = connect(server)
    assert [frame.kind for frame in _pings_answered(client, 3)] == [PING] * 3  # two strikes
    assert client.infer([1.0]).output() == [1.0]  # response headers and data go out: the strikes restart
    assert [frame.kind for frame in _pings_answered(client, 3)] == [PING] * 3  # two strikes again, no GOAWAY
    assert client.infer([2.0]).output() == [2.0]
    client.ping(b"ping-end")  # one strike is not enough
    frame = client.next_frame()
    assert frame is not None and frame.kind == PING and frame.payload == b"ping-end"


def test_too_many_pings_during_a_call_end_it_unavailable_then_goaway(server, connect, gate):
    client = connect(server)
    stream = client.start_call(infer_request([1.0], model="gate"))
    assert gate.entered.wait(READ_S)
    for index in range(4):
        client.ping(b"ping-%03d" % index)
    response = client.response(stream)
    assert response.trailers_only and response.grpc_status == "14"  # UNAVAILABLE
    assert response.trailers["grpc-message"] == "Too many pings"
    assert goaway_fields(client.wait_goaway()) == (stream, ENHANCE_YOUR_CALM, b"too_many_pings")
    client.wait_closed()


# ---------------------------------------------------------------- 6. server keepalive


def test_keepalive_closes_a_client_that_does_not_acknowledge_pings(keepalive_server, connect):
    client = connect(keepalive_server)
    ping = client.wait_for(lambda frame: frame.kind == PING)
    pinged = time.monotonic()
    assert ping.flags == 0 and ping.stream == 0 and len(ping.payload) == 8
    frames = client.wait_closed()  # never acknowledged: the server closes after the 300 ms keepalive timeout
    closed_after = time.monotonic() - pinged
    assert closed_after < 3.0, f"closed {closed_after:.2f} s after the ping"
    assert not [frame for frame in frames if frame.kind == PING]  # no second ping before closing


def test_keepalive_keeps_a_client_that_acknowledges_pings(keepalive_server, connect):
    client = connect(keepalive_server)
    pings = []
    deadline = time.monotonic() + 1.5  # several keepalive timeouts
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            frame = client.read_frame(remaining)
        except socket.timeout:
            break
        assert frame is not None, f"closed although every ping was acknowledged: {client.log}"
        if frame.kind == PING and not frame.has(ACK):
            pings.append(frame.payload)
            client.ping(frame.payload, ack=True)
    # Triton's default grpc_http2_max_pings_without_data (2): no more pings until data goes out.
    assert len(pings) == 2 and len(set(pings)) == 2
    response = client.infer([6.0, 7.0])
    assert response.grpc_status == "0" and response.output() == [6.0, 7.0]


# ---------------------------------------------------------------- 7. protocol errors


def _request_block() -> bytes:
    return hpack.Encoder().encode(request_headers())


PROTOCOL_ERRORS = {
    "frame over max frame size": (pack_frame(PING, 0, 0, b"x" * (DEFAULT_MAX_FRAME + 1)), FRAME_SIZE_ERROR),
    "data frame over max frame size": (pack_frame(DATA, 0, 1, b"x" * (DEFAULT_MAX_FRAME + 1)), FRAME_SIZE_ERROR),
    "data on an idle stream": (pack_frame(DATA, END_STREAM, 1, grpc_message(b"")), PROTOCOL_ERROR),
    "headers on an even stream": (lambda: pack_frame(HEADERS, END_HEADERS, 2, _request_block()), PROTOCOL_ERROR),
    "headers on stream 0": (lambda: pack_frame(HEADERS, END_HEADERS, 0, _request_block()), PROTOCOL_ERROR),
    "continuation without headers": (
        lambda: pack_frame(CONTINUATION, END_HEADERS, 1, _request_block()),
        PROTOCOL_ERROR,
    ),
    "header block interrupted": (
        lambda: pack_frame(HEADERS, 0, 1, _request_block()) + pack_frame(PING, 0, 0, b"12345678"),
        PROTOCOL_ERROR,
    ),
    "invalid hpack": (pack_frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\x0f"), COMPRESSION_ERROR),
    "push promise": (pack_frame(PUSH_PROMISE, END_HEADERS, 1, b"\0\0\0\x02\x82"), PROTOCOL_ERROR),
    "settings on a stream": (pack_frame(SETTINGS, 0, 1), PROTOCOL_ERROR),
    "max frame size below 16384": (pack_frame(SETTINGS, 0, 0, settings_payload({5: 1000})), PROTOCOL_ERROR),
    "window over 2^31-1": (pack_frame(SETTINGS, 0, 0, settings_payload({4: 2**31})), FLOW_CONTROL_ERROR),
    "ping of 7 bytes": (pack_frame(PING, 0, 0, b"1234567"), FRAME_SIZE_ERROR),
    "connection window_update of 0": (pack_frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), PROTOCOL_ERROR),
    # 1-byte CONTINUATIONs past the 64 KiB header limit: refused as they come, in linear time
    "header block over the limit in tiny continuations": (
        lambda: pack_frame(HEADERS, 0, 1, _request_block()) + pack_frame(CONTINUATION, 0, 1, b"\x82") * 70_000,
        ENHANCE_YOUR_CALM,
    ),
}


@pytest.mark.parametrize("case", list(PROTOCOL_ERRORS))
def test_protocol_error_gets_goaway_then_close_and_the_server_serves_on(server, connect, case):
    frames, code = PROTOCOL_ERRORS[case]
    client = connect(server)
    client.sock.sendall(frames() if callable(frames) else frames)
    goaway = client.wait_goaway()
    last, received_code, debug = goaway_fields(goaway)
    assert (last, received_code) == (0, code), debug
    client.wait_closed()
    assert_served(server, connect)


@pytest.mark.parametrize(
    "preface",
    [
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",  # HTTP/1.1
        b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n",  # almost the preface
        b"hello",  # shorter than the preface
    ],
)
def test_garbage_instead_of_the_preface_is_closed(server, connect, preface):
    client = connect(server, preface=preface)
    frames = client.wait_closed()
    assert {frame.kind for frame in frames} <= {SETTINGS, WINDOW_UPDATE, GOAWAY}
    goaways = [goaway_fields(frame) for frame in frames if frame.kind == GOAWAY]
    assert all(code == PROTOCOL_ERROR for _, code, _ in goaways)
    assert_served(server, connect)


# ---------------------------------------------------------------- 8. RST_STREAM


def test_rst_stream_cancels_a_call_in_progress_and_the_connection_serves_on(server, connect, gate):
    client = connect(server)
    cancelled = client.start_call(infer_request([1.0], model="gate"))
    assert gate.entered.wait(READ_S)
    client.rst_stream(cancelled, CANCEL)
    response = client.infer([2.0])  # while the cancelled call's model still runs
    assert response.grpc_status == "0" and response.output() == [2.0]
    gate.release.set()
    response = client.infer([3.0], model="gate")  # the model is free again
    assert response.grpc_status == "0" and response.output() == [3.0]
    client.assert_quiet(cancelled)
    assert not [frame for frame in client.log if frame.stream == cancelled]  # nothing was sent for the reset call


def test_rst_stream_before_the_request_ends(server, connect):
    client = connect(server)
    client.send_headers(1, request_headers())
    client.send_data(1, grpc_message(infer_request([1.0]))[:8], end_stream=False)
    client.rst_stream(1, CANCEL)
    client.send_data(1, b"late data", end_stream=True)  # after its own reset: RFC 9113 5.1, a stream error
    response = client.infer([4.0])
    assert response.grpc_status == "0" and response.output() == [4.0]
    assert [(frame.kind, frame.payload) for frame in client.log if frame.stream == 1] == [
        (RST_STREAM, struct.pack(">I", STREAM_CLOSED))
    ]


# ---------------------------------------------------------------- 9. deadlines


def test_grpc_timeout_ends_a_blocked_call_deadline_exceeded(server, connect, gate):
    client = connect(server)
    started = time.monotonic()
    stream = client.start_call(infer_request([1.0], model="gate"), grpc_timeout="100m")
    response = client.response(stream)
    elapsed = time.monotonic() - started
    assert response.trailers_only and response.headers[":status"] == "200"
    assert response.grpc_status == "4"  # DEADLINE_EXCEEDED
    assert response.trailers["grpc-message"] == "Deadline Exceeded"
    assert elapsed < GATE_HOLD_S / 4, f"answered after {elapsed:.2f} s"
    assert client.infer([2.0]).output() == [2.0]


# ---------------------------------------------------------------- 10. message size limit


@pytest.mark.parametrize("prefix_split", [5, 2])
def test_message_over_the_limit_is_refused_from_its_prefix(server, connect, prefix_split):
    client = connect(server)
    client.send_headers(1, request_headers())
    prefix = struct.pack(">BI", 0, 2 * MESSAGE_LIMIT)  # declares 2 MiB, never sends it
    client.send_data(1, prefix[:prefix_split], end_stream=False)
    client.send_data(1, prefix[prefix_split:] + b"\0" * 100, end_stream=False)
    response = client.response(1)
    assert response.trailers_only and response.grpc_status == "8"  # RESOURCE_EXHAUSTED
    assert (
        response.trailers["grpc-message"]
        == f"Received message larger than max ({2 * MESSAGE_LIMIT} vs. {MESSAGE_LIMIT})"
    )
    reset = client.wait_for(lambda frame: frame.stream == 1)  # the client had not ended its side
    assert reset.kind == RST_STREAM and struct.unpack(">I", reset.payload)[0] == NO_ERROR
    assert client.infer([5.0]).output() == [5.0]


# ---------------------------------------------------------------- 11. compression


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", gzip.compress), ("deflate", zlib.compress)],
)
def test_compressed_request_is_served(server, connect, encoding, compress):
    client = connect(server)
    values = [float(value) for value in range(100)]
    client.send_headers(1, request_headers(grpc_encoding=encoding))
    client.send_data(1, grpc_message(compress(infer_request(values)), flag=1))
    response = client.response(1)
    assert response.grpc_status == "0" and response.output() == values
    assert "grpc-encoding" not in response.headers  # responses are not compressed by default


def test_unsupported_request_encoding_is_unimplemented(server, connect):
    client = connect(server)
    client.send_headers(1, request_headers(grpc_encoding="snappy"))
    client.send_data(1, grpc_message(b"not really snappy", flag=1))
    response = client.response(1)
    assert response.trailers_only and response.grpc_status == "12"
    assert response.trailers["grpc-message"] == "Compression algorithm 'snappy' is not supported"
    assert client.infer([1.0]).output() == [1.0]


def test_compressed_message_without_an_encoding_is_internal(server, connect):
    client = connect(server)
    client.send_headers(1, request_headers())
    client.send_data(1, grpc_message(gzip.compress(infer_request([1.0])), flag=1))
    response = client.response(1)
    assert response.trailers_only and response.grpc_status == "13"  # INTERNAL


# ---------------------------------------------------------------- 12. GOAWAY on stop


def _stopping(triton: Triton) -> threading.Thread:
    stopper = threading.Thread(target=triton.stop, daemon=True)
    stopper.start()
    return stopper


def test_stop_finishes_a_model_call_in_progress_and_sends_goaway(connect):
    gate = Gate()
    triton = serve(gate)
    try:
        client = connect(triton)
        held = client.start_call(infer_request([8.0], model="gate"))
        assert gate.entered.wait(READ_S)
        stopper = _stopping(triton)
        # The engine drains first (as Triton does): meanwhile new calls get UNAVAILABLE on the open connection.
        for _ in range(50):
            refused = client.infer([9.0])
            if refused.grpc_status != "0":
                break
        assert refused.trailers_only and refused.grpc_status == "14", refused.trailers
        last_opened = client.next_stream - 2
        gate.release.set()
        # The frontends stop (GOAWAY) once the engine has drained, so the order of these two is not asserted.
        response = client.response(held)
        assert response.grpc_status == "0" and response.output() == [8.0]
        assert goaway_fields(client.wait_goaway())[:2] == (last_opened, NO_ERROR)
        client.wait_closed()
        stopper.join(READ_S)
        assert not stopper.is_alive()
    finally:
        gate.release.set()
        triton.stop()


def test_stop_sends_goaway_and_a_call_held_by_flow_control_finishes_in_the_grace(connect):
    triton = serve()
    try:
        client = connect(triton, settings={SETTINGS_INITIAL_WINDOW_SIZE: 1000})
        values = [float(value) for value in range(4096)]
        held = client.start_call(infer_request(values))
        head = client.wait_for(lambda frame: frame.stream == held)
        first = _data_on(client, held, 1000)
        stopper = _stopping(triton)
        goaway = client.wait_goaway()
        assert goaway_fields(goaway) == (held, NO_ERROR, b"")
        client.send_headers(3, request_headers())  # after GOAWAY: refused
        client.send_data(3, grpc_message(infer_request([1.0])))
        refused = client.response(3)
        assert [frame.kind for frame in refused.frames] == [RST_STREAM]
        assert struct.unpack(">I", refused.frames[0].payload)[0] == REFUSED_STREAM
        client.window_update(held, 1 << 20)
        client.window_update(0, 1 << 20)
        rest = client.response(held)
        assert rest.trailers == {"grpc-status": "0"}
        assert Response([head, *first, *rest.frames]).output() == values
        client.wait_closed()  # the last call is done: the connection closes
        stopper.join(READ_S)
        assert not stopper.is_alive()
    finally:
        triton.stop()


def test_stop_closes_a_connection_whose_call_outlasts_the_grace(connect):
    triton = serve()
    try:
        client = connect(triton, settings={SETTINGS_INITIAL_WINDOW_SIZE: 1000})
        held = client.start_call(infer_request([float(value) for value in range(4096)]))
        _data_on(client, held, 1000)
        stopper = _stopping(triton)
        client.wait_goaway()
        frames = client.wait_closed()  # the window never opens: closed at the end of the grace (1 s)
        assert not [frame for frame in frames if frame.stream == held and frame.has(END_STREAM)]
        stopper.join(READ_S)
        assert not stopper.is_alive()
    finally:
        triton.stop()
