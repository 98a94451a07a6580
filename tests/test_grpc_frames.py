"""The gRPC server's HTTP/2, frame by frame: a raw client on a socket, a real server, no gRPC library between."""

from __future__ import annotations

import gzip
import socket
import struct
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import hpack
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from pytriton.model_config import ModelConfig, Tensor
from pytriton.runtime.limits import ServerLimits
from pytriton.triton import Triton, TritonConfig

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS, PADDED = 0x1, 0x4, 0x8
INFER_PATH = b"/inference.GRPCInferenceService/ModelInfer"
WAIT_S = 10.0

Frame = Tuple[int, int, int, bytes]  # type, flags, stream, payload


class RawH2:
    """A minimal HTTP/2 client: frames in and out, header blocks through hpack."""

    def __init__(self, port: int, settings: Optional[Dict[int, int]] = None, preface: bytes = PREFACE) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self._buffer = b""
        payload = b"".join(struct.pack(">HI", key, value) for key, value in (settings or {}).items())
        self.sock.sendall(preface + self.frame(SETTINGS, 0, 0, payload))

    def close(self) -> None:
        self.sock.close()

    @staticmethod
    def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
        length = len(payload)
        return struct.pack(">HBBBI", length >> 8, length & 0xFF, kind, flags, stream) + payload

    def send(self, kind: int, flags: int, stream: int, payload: bytes = b"") -> None:
        self.sock.sendall(self.frame(kind, flags, stream, payload))

    def send_message(self, stream: int, message: bytes) -> None:
        """DATA frames of at most 16 KiB carrying `message`, the last one ending the stream."""
        chunks = [message[start : start + 16384] for start in range(0, len(message), 16384)] or [b""]
        for index, chunk in enumerate(chunks):
            self.send(DATA, END_STREAM if index == len(chunks) - 1 else 0, stream, chunk)

    def block(self, path: bytes = INFER_PATH, **extra: str) -> bytes:
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path.decode()),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        headers += [(name.replace("_", "-"), value) for name, value in extra.items()]
        return self.encoder.encode(headers)

    def read(self) -> Optional[Frame]:
        """The next frame (answering SETTINGS), None once the server closed the connection."""
        while True:
            while len(self._buffer) < 9 or len(self._buffer) < 9 + int.from_bytes(self._buffer[:3], "big"):
                chunk = self.sock.recv(65536)
                if not chunk:
                    return None
                self._buffer += chunk
            length = int.from_bytes(self._buffer[:3], "big")
            kind, flags, stream = self._buffer[3], self._buffer[4], int.from_bytes(self._buffer[5:9], "big")
            payload, self._buffer = self._buffer[9 : 9 + length], self._buffer[9 + length :]
            if kind == SETTINGS and not flags & 1:
                self.send(SETTINGS, 1, 0)
                continue
            if kind == SETTINGS or (kind == WINDOW_UPDATE and stream == 0):
                continue
            return kind, flags, stream, payload

    def read_until(self, kind: int) -> List[Frame]:
        frames = []
        while True:
            frame = self.read()
            assert frame is not None, f"connection closed before a frame of type {kind}: {frames}"
            frames.append(frame)
            if frame[0] == kind:
                return frames

    def response(self, stream: int) -> Tuple[Dict[str, str], bytes, Dict[str, str]]:
        """Headers, DATA and trailers of one stream (a trailers-only answer has empty headers and DATA)."""
        blocks: List[Dict[str, str]] = []
        data = b""
        while True:
            frame = self.read()
            assert frame is not None, "connection closed before the stream ended"
            kind, flags, frame_stream, payload = frame
            if frame_stream != stream:
                continue
            if kind == HEADERS:
                blocks.append({k: v for k, v in self.decoder.decode(payload)})
            elif kind == DATA:
                data += payload
            if flags & END_STREAM and kind in (HEADERS, DATA):
                return (blocks[0] if len(blocks) > 1 else {}), data, blocks[-1]


def grpc_message(payload: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(payload)) + payload


def infer_request(values: List[float], model: str = "identity") -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT_1", datatype="FP32", shape=[1, len(values)])
    request.raw_input_contents.append(np.array(values, np.float32).tobytes())
    return request.SerializeToString()


def output_of(data: bytes) -> np.ndarray:
    flag, length = struct.unpack(">BI", data[:5])
    assert flag == 0 and length == len(data) - 5
    response = service_pb2.ModelInferResponse.FromString(data[5:])
    return np.frombuffer(response.raw_output_contents[0], np.float32)


class Gate:
    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        self.release.wait(WAIT_S)
        return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


def _bind(triton: Triton, gate: Gate) -> None:
    tensors = {
        "inputs": [Tensor(name="INPUT_1", dtype=np.float32, shape=(-1,))],
        "outputs": [Tensor(name="OUTPUT_1", dtype=np.float32, shape=(-1,))],
        "config": ModelConfig(max_batch_size=8),
    }
    triton.bind("identity", lambda requests: [{"OUTPUT_1": r["INPUT_1"]} for r in requests], **tensors)
    triton.bind("gate", gate, **tensors)


def _serve(gate: Gate, limits: Optional[ServerLimits] = None, **config: Any) -> Triton:
    options = {"http_port": 0, "grpc_port": 0, "allow_metrics": False, **config}
    triton = Triton(config=TritonConfig(**options), limits=limits)
    _bind(triton, gate)
    triton.run()
    return triton


@pytest.fixture(scope="module")
def gate() -> Iterator[Gate]:
    gate = Gate()
    yield gate
    gate.release.set()


@pytest.fixture(scope="module")
def triton(gate: Gate) -> Iterator[Triton]:
    server = _serve(gate, ServerLimits(grpc_max_message_bytes=1 << 20))
    yield server
    server.stop()


@pytest.fixture()
def client(triton: Triton) -> Iterator[RawH2]:
    raw = RawH2(triton.grpc_port)  # type: ignore[arg-type]
    yield raw
    raw.close()


def test_a_call_in_small_frames_with_continuation_and_padding(client: RawH2) -> None:
    block = client.block()
    client.send(HEADERS, PADDED, 1, bytes([3]) + block[:5] + b"\0\0\0")
    client.send(CONTINUATION, END_HEADERS, 1, block[5:])
    message = grpc_message(infer_request([1.0, 2.0, 3.0]))
    for start in range(0, len(message), 7):  # the 5-byte prefix split too
        client.send(DATA, 0, 1, message[start : start + 7])
    client.send(DATA, PADDED | END_STREAM, 1, bytes([4]) + b"\0" * 4)
    headers, data, trailers = client.response(1)
    assert headers[":status"] == "200" and headers["content-type"] == "application/grpc"
    assert output_of(data).tolist() == [1.0, 2.0, 3.0]
    assert trailers["grpc-status"] == "0"


@pytest.mark.parametrize(
    ("path", "extra", "method", "expected"),
    [
        (b"/inference.GRPCInferenceService/Nope", {}, "POST", {"grpc-status": "12"}),
        (INFER_PATH, {"content_type": "text/plain"}, "POST", {":status": "415"}),
        (INFER_PATH, {}, "GET", {":status": "405"}),
        (INFER_PATH, {"grpc_encoding": "snappy"}, "POST", {"grpc-status": "12"}),
    ],
)
def test_requests_that_start_no_call(client: RawH2, path: bytes, extra: Dict[str, str], method: str, expected) -> None:
    headers = [(":method", method), (":scheme", "http"), (":path", path.decode()), (":authority", "x")]
    headers += [("content-type", extra.pop("content_type", "application/grpc"))]
    headers += [(name.replace("_", "-"), value) for name, value in extra.items()]
    client.send(HEADERS, END_HEADERS, 1, client.encoder.encode(headers))
    client.send(DATA, END_STREAM, 1, grpc_message(infer_request([1.0])))
    _, _, answer = client.response(1)
    assert expected.items() <= answer.items()
    client.send(HEADERS, END_HEADERS, 3, client.block())  # the connection still serves
    client.send(DATA, END_STREAM, 3, grpc_message(infer_request([4.0])))
    assert output_of(client.response(3)[1]).tolist() == [4.0]


def test_gzip_compressed_request(client: RawH2) -> None:
    client.send(HEADERS, END_HEADERS, 1, client.block(grpc_encoding="gzip"))
    client.send(DATA, END_STREAM, 1, grpc_message(gzip.compress(infer_request([5.0, 6.0])), flag=1))
    _, data, trailers = client.response(1)
    assert trailers["grpc-status"] == "0" and output_of(data).tolist() == [5.0, 6.0]


def test_flow_control_holds_a_response_back_until_the_client_opens_its_window(triton: Triton) -> None:
    client = RawH2(triton.grpc_port, settings={0x4: 1000})  # type: ignore[arg-type]
    try:
        values = [float(value) for value in range(4096)]  # a 16 KiB response
        client.send(HEADERS, END_HEADERS, 1, client.block())
        client.send_message(1, grpc_message(infer_request(values)))
        frames = client.read_until(DATA)
        received = len(frames[-1][3])
        client.sock.settimeout(0.5)
        with pytest.raises(socket.timeout):  # nothing more until the window opens
            while True:
                frame = client.read()
                assert frame is not None and frame[0] == DATA
                received += len(frame[3])
        assert received == 1000
        client.sock.settimeout(WAIT_S)
        client.send(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 20))
        client.send(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20))
        _, rest, trailers = client.response(1)
        assert trailers["grpc-status"] == "0"
        data = frames[-1][3] + rest
        assert output_of(data).tolist() == values
    finally:
        client.close()


def test_ping_is_answered_and_too_many_pings_get_goaway(client: RawH2) -> None:
    client.send(PING, 0, 0, b"12345678")
    assert client.read() == (PING, 1, 0, b"12345678")
    for _ in range(3):  # no call in progress: Triton's defaults allow one ping per 2 hours, 2 strikes
        client.send(PING, 0, 0, b"abcdefgh")
    frames = client.read_until(GOAWAY)
    code, debug = struct.unpack(">I", frames[-1][3][4:8])[0], frames[-1][3][8:]
    assert (code, debug) == (0xB, b"too_many_pings")
    assert client.read() is None


def test_deadline_exceeded(client: RawH2, gate: Gate) -> None:
    started = time.monotonic()
    client.send(HEADERS, END_HEADERS, 1, client.block(grpc_timeout="100m"))
    client.send(DATA, END_STREAM, 1, grpc_message(infer_request([1.0], model="gate")))
    _, _, trailers = client.response(1)
    assert trailers["grpc-status"] == "4" and time.monotonic() - started < WAIT_S / 2


def test_reset_stream_cancels_the_call_and_the_connection_goes_on(client: RawH2) -> None:
    client.send(HEADERS, END_HEADERS, 1, client.block())
    client.send(DATA, END_STREAM, 1, grpc_message(infer_request([1.0], model="gate")))
    client.send(RST_STREAM, 0, 1, struct.pack(">I", 0x8))
    client.send(HEADERS, END_HEADERS, 3, client.block())
    client.send(DATA, END_STREAM, 3, grpc_message(infer_request([2.0])))
    assert output_of(client.response(3)[1]).tolist() == [2.0]


def test_message_over_the_limit_is_refused_from_its_prefix(client: RawH2) -> None:
    client.send(HEADERS, END_HEADERS, 1, client.block())
    client.send(DATA, 0, 1, struct.pack(">BI", 0, 2 << 20))  # declares 2 MiB, sends none of it
    _, _, trailers = client.response(1)
    assert trailers["grpc-status"] == "8" and "larger than max" in trailers["grpc-message"]


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([RawH2.frame(PING, 0, 0, b"x" * 16385)], 0x6),  # over SETTINGS_MAX_FRAME_SIZE
        ([RawH2.frame(DATA, 0, 5, b"data")], 0x1),  # DATA on a stream never opened
        ([RawH2.frame(HEADERS, END_HEADERS, 2, b"\x82")], 0x1),  # a client stream with an even id
    ],
)
def test_protocol_errors_close_only_their_connection(triton: Triton, frames: List[bytes], code: int) -> None:
    client = RawH2(triton.grpc_port)  # type: ignore[arg-type]
    try:
        client.sock.sendall(b"".join(frames))
        goaway = client.read_until(GOAWAY)[-1]
        assert struct.unpack(">I", goaway[3][4:8])[0] == code
        assert client.read() is None
    finally:
        client.close()
    healthy = RawH2(triton.grpc_port)  # type: ignore[arg-type]
    try:
        healthy.send(HEADERS, END_HEADERS, 1, healthy.block())
        healthy.send(DATA, END_STREAM, 1, grpc_message(infer_request([3.0])))
        assert output_of(healthy.response(1)[1]).tolist() == [3.0]
    finally:
        healthy.close()


def test_a_header_block_over_the_limit_in_many_continuations_is_refused(triton: Triton) -> None:
    client = RawH2(triton.grpc_port)  # type: ignore[arg-type]
    try:
        client.send(HEADERS, 0, 1, client.block())
        tiny = RawH2.frame(CONTINUATION, 0, 1, b"\x82")  # one byte each: the header limit is 64 KiB
        started = time.monotonic()
        client.sock.sendall(tiny * 70_000)
        goaway = client.read_until(GOAWAY)[-1]
        assert struct.unpack(">I", goaway[3][4:8])[0] == 0xB  # ENHANCE_YOUR_CALM
        assert time.monotonic() - started < WAIT_S
    finally:
        client.close()


def test_not_http2_is_closed(triton: Triton) -> None:
    client = RawH2(triton.grpc_port, preface=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # type: ignore[arg-type]
    try:
        frames = []
        while (frame := client.read()) is not None:
            frames.append(frame)
        assert [frame[0] for frame in frames] in ([], [GOAWAY])
    finally:
        client.close()


def test_keepalive_closes_a_client_that_does_not_answer_pings() -> None:
    triton = _serve(
        Gate(),
        grpc_keepalive_time=200,
        grpc_keepalive_timeout=300,
        grpc_keepalive_permit_without_calls=True,
        grpc_http2_max_pings_without_data=0,  # no cap: Triton's default (2) stops pinging an idle connection
    )
    silent = RawH2(triton.grpc_port)  # type: ignore[arg-type]
    answering = RawH2(triton.grpc_port)  # type: ignore[arg-type]
    answered: List[bytes] = []

    def answer_pings() -> None:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            ping = answering.read_until(PING)[-1]
            answering.send(PING, 1, 0, ping[3])
            answered.append(ping[3])

    try:
        thread = threading.Thread(target=answer_pings)
        thread.start()
        ping = silent.read_until(PING)[-1]
        assert ping[1] == 0 and len(ping[3]) == 8
        assert silent.read() is None  # closed: no acknowledgement within the keepalive timeout
        thread.join(WAIT_S)
        assert len(answered) >= 3  # one ping per keepalive time, each answered in time
        answering.send(HEADERS, END_HEADERS, 1, answering.block())
        answering.send(DATA, END_STREAM, 1, grpc_message(infer_request([7.0])))
        assert output_of(answering.response(1)[1]).tolist() == [7.0]
    finally:
        silent.close()
        answering.close()
        triton.stop()


def test_stop_finishes_calls_in_progress_then_sends_goaway() -> None:
    gate = Gate()
    triton = _serve(gate)
    client = RawH2(triton.grpc_port)  # type: ignore[arg-type]
    stopper = threading.Thread(target=triton.stop)
    try:
        client.send(HEADERS, END_HEADERS, 1, client.block())
        client.send(DATA, END_STREAM, 1, grpc_message(infer_request([8.0], model="gate")))
        time.sleep(0.3)  # the call reaches the model
        stopper.start()
        time.sleep(0.3)  # the engine drains: new calls are refused meanwhile
        client.send(HEADERS, END_HEADERS, 3, client.block())
        client.send(DATA, END_STREAM, 3, grpc_message(infer_request([9.0])))
        _, _, refused = client.response(3)
        assert refused["grpc-status"] == "14"  # UNAVAILABLE
        gate.release.set()
        _, data, trailers = client.response(1)
        assert trailers["grpc-status"] == "0" and output_of(data).tolist() == [8.0]
        goaway = client.read_until(GOAWAY)[-1]
        assert struct.unpack(">II", goaway[3][:8]) == (3, 0)  # the last stream it saw, NO_ERROR
        assert client.read() is None
        stopper.join(WAIT_S)
        assert not stopper.is_alive()
    finally:
        gate.release.set()
        client.close()
        if stopper.is_alive() or not stopper.ident:
            triton.stop()
