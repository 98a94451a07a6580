"""A minimal HTTP/2 client for tests: frames packed by hand, header blocks by hpack, read back frame by frame.

It sends exactly what a test tells it (valid or not) and reads what the server answers, so tests can
assert what a client sees on the wire: frames, header fields, messages, GOAWAY codes, the connection
closing.
"""

from __future__ import annotations

import dataclasses
import socket
import struct
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import hpack
import numpy as np
from tritonclient.grpc import service_pb2

# Generous: the tests must hold on a loaded 2-core machine. None of them waits this long when it passes.
READ_S = 5.0
# Long enough to tell "nothing more is coming" from "it is on its way" on the loopback interface.
QUIET_S = 0.5

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x5, 0x6
INTERNAL_ERROR = 0x2
REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x8, 0x9, 0xB
SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x3, 0x4, 0x5
DEFAULT_MAX_FRAME = 16_384
DEFAULT_WINDOW = 65_535
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


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

    def handshake(self, timeout: float = READ_S) -> None:
        """Read until the server's SETTINGS and its acknowledgement of ours have arrived."""
        deadline = time.monotonic() + timeout
        while not (self.server_settings and self.settings_acked):
            if self.read_frame(max(0.0, deadline - time.monotonic())) is None:
                raise ServerClosed(f"the server closed the connection; frames read: {self.log}")

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
