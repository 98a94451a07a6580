"""Bare gRPC KServe echoes: what serving ModelInfer costs on each gRPC stack, with no engine behind it.

Each answers inference.GRPCInferenceService/ModelInfer by echoing every input's raw contents as the
output of the same position (OUTPUT_1 for INPUT_1): the protobuf parse and serialization every server
does, and no tensor conversion, batching or model call. ServerLive answers live. The stacks:

    .venv/bin/python bench/grpc_echo.py --grpc-port 31001 --http-port 31000 --server aio
    --server aio        grpc.aio: grpcio's C-core under asyncio (what the gRPC frontend ran on before)
    --server h2         python-hyper's h2 state machine driven by an asyncio protocol
    --server grpclib    grpclib (h2 underneath, its own gRPC layer)
    --server pytriton   this project's HTTP/2 server (pytriton.transport.grpc), as the frontend runs it

The HTTP port answers 200 to any request: the bench's readiness check.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import struct
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

from tritonclient.grpc import service_pb2

SERVICE = "inference.GRPCInferenceService"
INFER = f"/{SERVICE}/ModelInfer"
LIVE = f"/{SERVICE}/ServerLive"
_PREFIX = struct.Struct(">BI")


def echo(request: Any) -> Any:
    """The ModelInferResponse echoing a ModelInferRequest's inputs."""
    response = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
    for tensor in request.inputs:
        output = response.outputs.add()
        output.name = tensor.name.replace("INPUT", "OUTPUT", 1)
        output.datatype = tensor.datatype
        output.shape.extend(tensor.shape)
    response.raw_output_contents.extend(request.raw_input_contents)
    return response


def answer(path: str, message: bytes) -> bytes:
    """The serialized reply to a request message on `path` (ModelInfer or ServerLive)."""
    if path == LIVE:
        return service_pb2.ServerLiveResponse(live=True).SerializeToString()  # type: ignore[no-any-return]
    return echo(service_pb2.ModelInferRequest.FromString(message)).SerializeToString()  # type: ignore[no-any-return]


# ---------------------------------------------------------------- grpc.aio


async def serve_aio(port: int) -> Callable[[], Any]:
    import grpc

    async def model_infer(request: Any, context: Any) -> Any:
        return echo(request)

    async def server_live(request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    handlers = {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            model_infer, service_pb2.ModelInferRequest.FromString, service_pb2.ModelInferResponse.SerializeToString
        ),
        "ServerLive": grpc.unary_unary_rpc_method_handler(
            server_live, service_pb2.ServerLiveRequest.FromString, service_pb2.ServerLiveResponse.SerializeToString
        ),
    }
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 2**31 - 1)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return lambda: server.stop(0)


# ---------------------------------------------------------------- grpclib


async def serve_grpclib(port: int) -> Callable[[], Any]:
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server

    class Echo:
        async def model_infer(self, stream: Any) -> None:
            await stream.send_message(echo(await stream.recv_message()))

        async def server_live(self, stream: Any) -> None:
            await stream.recv_message()
            await stream.send_message(service_pb2.ServerLiveResponse(live=True))

        def __mapping__(self) -> Dict[str, Any]:
            return {
                INFER: Handler(
                    self.model_infer,
                    Cardinality.UNARY_UNARY,
                    service_pb2.ModelInferRequest,
                    service_pb2.ModelInferResponse,
                ),
                LIVE: Handler(
                    self.server_live,
                    Cardinality.UNARY_UNARY,
                    service_pb2.ServerLiveRequest,
                    service_pb2.ServerLiveResponse,
                ),
            }

    server = Server([Echo()])
    await server.start("127.0.0.1", port)

    async def stop() -> None:
        server.close()
        await server.wait_closed()

    return stop


# ---------------------------------------------------------------- h2


class H2EchoProtocol(asyncio.Protocol):
    """gRPC over python-hyper's h2: requests gathered per stream, answered at END_STREAM under flow control."""

    def __init__(self) -> None:
        import h2.config
        import h2.connection

        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.transport: Optional[asyncio.Transport] = None
        self.requests: Dict[int, Tuple[str, bytearray]] = {}
        self.pending: Dict[int, Tuple[memoryview, List[Tuple[bytes, bytes]]]] = {}  # data and trailers held back

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(2**24)
        self._flush()

    def data_received(self, data: bytes) -> None:
        import h2.events
        import h2.exceptions

        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._flush()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                path = dict(event.headers).get(b":path", b"").decode()
                self.requests[event.stream_id] = (path, bytearray())
            elif isinstance(event, h2.events.DataReceived):
                self.requests[event.stream_id][1].extend(event.data)
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self._respond(event.stream_id)
            elif isinstance(event, h2.events.WindowUpdated):
                self._send_pending()
            elif isinstance(event, h2.events.StreamReset):
                self.requests.pop(event.stream_id, None)
                self.pending.pop(event.stream_id, None)
        self._flush()

    def _respond(self, stream_id: int) -> None:
        path, body = self.requests.pop(stream_id)
        reply = answer(path, bytes(body[_PREFIX.size :]))
        self.h2.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        trailers = [(b"grpc-status", b"0")]
        self.pending[stream_id] = (memoryview(_PREFIX.pack(0, len(reply)) + reply), trailers)
        self._send_pending()

    def _send_pending(self) -> None:
        for stream_id in list(self.pending):
            data, trailers = self.pending[stream_id]
            while data:
                room = min(self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size)
                if room <= 0:
                    break
                self.h2.send_data(stream_id, data[:room].tobytes())
                data = data[room:]
            if data:
                self.pending[stream_id] = (data, trailers)
            else:
                del self.pending[stream_id]
                self.h2.send_headers(stream_id, trailers, end_stream=True)

    def _flush(self) -> None:
        out = self.h2.data_to_send()
        if out and self.transport is not None:
            self.transport.write(out)


async def serve_h2(port: int) -> Callable[[], Any]:
    server = await asyncio.get_running_loop().create_server(H2EchoProtocol, "127.0.0.1", port)
    return server.close


# ---------------------------------------------------------------- this project's HTTP/2 server


async def serve_pytriton(port: int) -> Callable[[], Any]:
    from pytriton.options.limits import ServerLimits
    from pytriton.options.server import GrpcKeepalive
    from pytriton.transport.grpc.connection import GrpcConnection
    from pytriton.transport.grpc.handlers import Method
    from pytriton.transport.grpc.server import GrpcServerState
    from pytriton.transport.sockets import BACKLOG, bind_socket

    def serialize(message: Any) -> Tuple[List[bytes], int]:
        data = message.SerializeToString()
        return [data], len(data)

    async def model_infer(request: Any, context: Any) -> Any:
        return echo(request)

    async def server_live(request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    methods = {
        INFER.encode(): Method("ModelInfer", False, service_pb2.ModelInferRequest.FromString, serialize, model_infer),
        LIVE.encode(): Method("ServerLive", False, service_pb2.ServerLiveRequest.FromString, serialize, server_live),
    }
    state = GrpcServerState(methods, ServerLimits(), keepalive=GrpcKeepalive(), compression_level=0)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: GrpcConnection(state, loop), sock=bind_socket("127.0.0.1", port), backlog=BACKLOG
    )
    return server.close


# ---------------------------------------------------------------- readiness and main

STACKS = {"aio": serve_aio, "grpclib": serve_grpclib, "h2": serve_h2, "pytriton": serve_pytriton}


class ReadyProtocol(asyncio.Protocol):
    """Answers 200 to every HTTP request and closes."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if b"\r\n\r\n" in data:
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            self.transport.close()


async def main(stack: str, grpc_port: int, http_port: int) -> None:
    """Serve until SIGTERM/SIGINT."""
    loop = asyncio.get_running_loop()
    stop_grpc = await STACKS[stack](grpc_port)
    ready = await loop.create_server(ReadyProtocol, "127.0.0.1", http_port)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    ready.close()
    result = stop_grpc()
    if asyncio.iscoroutine(result):
        await result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, default=0, help="ignored")
    parser.add_argument("--server", choices=sorted(STACKS), default=os.environ.get("BENCH_GRPC_SERVER", "aio"))
    args = parser.parse_args()
    import uvloop

    uvloop.run(main(args.server, args.grpc_port, args.http_port))
