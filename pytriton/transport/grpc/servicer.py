"""The inference.GRPCInferenceService servicer: translate the message, call the engine, translate the reply."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Dict, List, Optional

from tritonclient.grpc import service_pb2

from pytriton.core.errors import InferenceError
from pytriton.core.request_spans import NO_STAMPS, FixedStamps, TracedResponse, mark_arrival
from pytriton.core.serving import ServingEngine
from pytriton.core.shared_memory.off_loop import read_off_loop, write_off_loop
from pytriton.core.shared_memory.system import Read, WriteRun
from pytriton.options.header_forwarding import forward_pattern
from pytriton.options.log_trace import ServerSettings
from pytriton.protocol import (
    config_override,
    cuda_memory_codec,
    grpc_codec,
    grpc_health,
    settings_codec,
    system_memory_codec,
)
from pytriton.protocol.codec_place import ON_LOOP, OffLoop
from pytriton.protocol.grpc_codec import EncodedResponse, Message
from pytriton.transport import codec_threads
from pytriton.transport.grpc import coding
from pytriton.transport.grpc.errors import unary
from pytriton.transport.grpc.streaming import DEFAULT_STREAM_REQUESTS, StreamSession
from pytriton.transport.grpc.wire import InferRequestFrame


class InferenceServicer:
    """Serves every RPC of GRPCInferenceService over an engine."""

    def __init__(
        self,
        engine: ServingEngine,
        *,
        server_version: str,
        header_forward_pattern: Optional[str] = None,
        settings: Optional[ServerSettings] = None,
        max_stream_requests: int = DEFAULT_STREAM_REQUESTS,
        trace_stamps: Optional[FixedStamps] = None,
    ) -> None:
        """Create the servicer; metadata keys matching `header_forward_pattern` reach callables as parameters.

        Without `settings`, LogSettings and TraceSetting answer UNIMPLEMENTED. A ModelStreamInfer stream has
        at most `max_stream_requests` requests in progress at once. `trace_stamps`: whether requests are timed for
        trace files, for a servicer without `settings` (a frontend process's).
        """
        self._engine = engine
        self._max_stream_requests = max_stream_requests
        self._server_version = server_version
        self._forward = (
            forward_pattern(header_forward_pattern, "grpc_header_forward_pattern") if header_forward_pattern else None
        )
        self._settings = settings
        # Whether trace files' records get this transport's timestamps (`stamps`): only then are they taken.
        self._trace = settings.trace if settings is not None else trace_stamps or NO_STAMPS

    def _forwarded_headers(self, context: Any) -> Optional[Dict[str, str]]:
        """Text metadata whose key matches grpc_header_forward_pattern."""
        pattern = self._forward
        if pattern is None:
            return None
        return {
            key: value
            for key, value in (context.invocation_metadata() or ())
            if isinstance(value, str) and pattern.search(key)
        }

    @unary
    async def ServerLive(self, request: Message, context: Any) -> Message:
        """Whether the server is live."""
        return service_pb2.ServerLiveResponse(live=self._engine.live)

    @unary
    async def ServerReady(self, request: Message, context: Any) -> Message:
        """Whether the server is ready."""
        return service_pb2.ServerReadyResponse(ready=self._engine.ready)

    @unary
    async def Check(self, request: Message, context: Any) -> Message:
        """grpc.health.v1.Health/Check: SERVING while the server is ready, whatever service it names (as Triton)."""
        return grpc_health.check_response(self._engine.ready)

    @unary
    async def ModelReady(self, request: Message, context: Any) -> Message:
        """Whether a model version is ready (false for an unknown model)."""
        return service_pb2.ModelReadyResponse(ready=self._engine.model_ready(request.name, request.version))

    @unary
    async def ServerMetadata(self, request: Message, context: Any) -> Message:
        """Server name, version and extensions."""
        return grpc_codec.server_metadata(self._engine.server_name, self._server_version)

    @unary
    async def ModelMetadata(self, request: Message, context: Any) -> Message:
        """A model's inputs and outputs."""
        return grpc_codec.model_metadata(self._engine.model(request.name, request.version).spec)

    @unary
    async def ModelConfig(self, request: Message, context: Any) -> Message:
        """A model's configuration."""
        model = self._engine.model(request.name, request.version)
        return grpc_codec.model_config(model.spec)

    @unary
    async def ModelStatistics(self, request: Message, context: Any) -> Message:
        """Statistics of every model, of every version of one model, or of one version."""
        return grpc_codec.model_statistics(self._engine.statistics_of(request.name, request.version))

    @unary
    async def RepositoryIndex(self, request: Message, context: Any) -> Message:
        """Every model version and its state."""
        if request.repository_name:  # Triton's answer
            raise InferenceError.unimplemented("'repository_name' specification is not supported")
        return grpc_codec.repository_index(self._engine.repository(), request.ready)

    @unary
    async def RepositoryModelLoad(self, request: Message, context: Any) -> Message:
        """Serve a model again, as bound or with a config override (protocol/config_override.py)."""
        if request.repository_name:  # Triton's answer
            raise InferenceError.unimplemented("'repository_name' specification is not supported")
        parameters = {
            key: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
            for key, value in request.parameters.items()
        }
        grpc_codec.check_load_parameters(request.parameters)
        name = request.model_name
        change = config_override.spec_change(name, parameters, self._engine.has_cache)
        await self._engine.load(name, change)
        return service_pb2.RepositoryModelLoadResponse()

    @unary
    async def RepositoryModelUnload(self, request: Message, context: Any) -> Message:
        """Stop serving a model after its queued requests (Triton reads no parameter but `unload_dependents`)."""
        if request.repository_name:  # Triton's answer
            raise InferenceError.unimplemented("'repository_name' specification is not supported")
        grpc_codec.check_unload_parameters(request.parameters)
        await self._engine.unload(request.model_name)
        return service_pb2.RepositoryModelUnloadResponse()

    @unary
    async def ModelInfer(self, frame: InferRequestFrame, context: Any) -> EncodedResponse:
        """Run one inference request (not for decoupled models).

        A traced request's record (a trace file's) gets GRPC_WAITREAD_START and _END when the request was read,
        GRPC_SEND_START and _END around encoding its response, which the HTTP/2 connection then sends.
        """
        received_ns = time.monotonic_ns() if self._trace.stamps else 0
        request = frame.message
        model = self._engine.model(request.model_name, request.model_version)
        spec = model.spec
        if spec.decoupled:
            raise InferenceError.unimplemented(
                "ModelInfer RPC doesn't support models with decoupled transaction policy"
            )
        memory = self._engine.system_memory
        forwarded = self._forwarded_headers(context)
        deferred: List[Read] = []
        long = False  # decoded or encoded off the loop: it may hold long object arrays, freed off the loop too
        try:
            decoded = grpc_codec.decode_infer_request(
                spec, request, frame.raw_inputs, forwarded, memory, frame.data, deferred, ON_LOOP
            )
        except OffLoop:  # many strings: read in a worker thread, the other clients served meanwhile
            long = True
            decoded = await coding.decoded(spec, request, frame.raw_inputs, forwarded, memory, frame.data, deferred)
        if received_ns:
            mark_arrival(decoded.request, received_ns, grpc=True)
        held = decoded.regions and [where.region for where in decoded.regions.values()]
        if held:  # its output regions stay registered until they are written, as Triton keeps them
            memory.hold(held)
        try:
            if deferred:  # inputs too large to copy on the loop
                await read_off_loop(deferred)
            response = await model.infer(decoded.request)
            writes: List[WriteRun] = []
            if received_ns and type(response) is TracedResponse and response.trace.claim():
                send_ns = time.monotonic_ns()
                try:
                    try:
                        encoded = grpc_codec.encode_infer_response(
                            spec, decoded.request.id, response, None, decoded, memory, writes, ON_LOOP
                        )
                    except OffLoop:  # many strings: written in a worker thread
                        encoded = await coding.encoded(
                            spec, decoded.request.id, response, None, decoded, memory, writes
                        )
                    if writes:  # outputs too large to copy on the loop
                        await write_off_loop(writes)
                    return encoded
                finally:
                    response.trace.sent("GRPC", (received_ns, received_ns, send_ns, time.monotonic_ns()))
            try:
                encoded = grpc_codec.encode_infer_response(
                    spec, decoded.request.id, response, None, decoded, memory, writes, ON_LOOP
                )
            except OffLoop:  # many strings: written in a worker thread
                long = True
                encoded = await coding.encoded(spec, decoded.request.id, response, None, decoded, memory, writes)
            if writes:
                await write_off_loop(writes)
            if long:  # the last references to its long object arrays are these: freed in a codec thread
                freed = codec_threads.long_object_arrays(decoded.request, response)
                del decoded, response
                codec_threads.let_go(freed)
            return encoded
        finally:
            if held:
                memory.release(held)

    async def ModelStreamInfer(self, requests: AsyncIterator[InferRequestFrame], context: Any) -> None:
        """Run the requests of a stream concurrently and stream back their responses."""
        session = StreamSession(self._engine, self._forwarded_headers(context), self._max_stream_requests)
        await session.serve(requests, context)

    @unary
    async def LogSettings(self, request: Message, context: Any) -> Message:
        """Read, and change when settings are given, the log settings."""
        settings = self._runtime_settings("log settings")
        if "log_file" in request.settings:
            raise InferenceError.unimplemented("log file location can not be updated through network protocol")
        settings.log.update(settings_codec.log_changes(request))
        return settings_codec.log_response(settings.log.document())

    @unary
    async def TraceSetting(self, request: Message, context: Any) -> Message:
        """Read, and change when settings are given, the server's or a model's trace settings."""
        settings = self._runtime_settings("trace settings")
        model = request.model_name
        if model and not self._engine.model_ready(model):
            raise InferenceError.invalid(f"Request for unknown model : {model}")
        if request.settings:
            settings.trace.update(settings_codec.trace_changes(request), model, grpc_words=True)
        return settings_codec.trace_response(settings.trace.grpc_document(model))

    def _runtime_settings(self, what: str) -> ServerSettings:
        """The server's settings, or UNIMPLEMENTED when this servicer has none."""
        if self._settings is None:
            raise InferenceError.unimplemented(f"{what} is not supported by this server")
        return self._settings

    @unary
    async def SystemSharedMemoryStatus(self, request: Message, context: Any) -> Message:
        """Every registered system shared-memory region, or the one named."""
        return system_memory_codec.status_message(self._engine.system_memory.status(request.name))

    @unary
    async def SystemSharedMemoryRegister(self, request: Message, context: Any) -> Message:
        """Register part of a client's POSIX shared-memory segment, by key."""
        self._engine.system_memory.register(request.name, request.key, request.offset, request.byte_size)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    @unary
    async def SystemSharedMemoryUnregister(self, request: Message, context: Any) -> Message:
        """Unregister a system shared-memory region, or all of them."""
        self._engine.system_memory.unregister(request.name)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    @unary
    async def CudaSharedMemoryStatus(self, request: Message, context: Any) -> Message:
        """Every registered CUDA shared-memory region, or the one named."""
        return cuda_memory_codec.status_message(self._engine.cuda_memory.status(request.name))

    @unary
    async def CudaSharedMemoryRegister(self, request: Message, context: Any) -> Message:
        """Register a client's device allocation by its CUDA IPC handle (INVALID_ARGUMENT without CUDA)."""
        register = self._engine.cuda_memory.register
        args = (request.name, request.raw_handle, request.device_id, request.byte_size)
        await asyncio.get_running_loop().run_in_executor(None, register, *args)
        return service_pb2.CudaSharedMemoryRegisterResponse()

    @unary
    async def CudaSharedMemoryUnregister(self, request: Message, context: Any) -> Message:
        """Unregister a CUDA shared-memory region, or all of them."""
        await asyncio.get_running_loop().run_in_executor(None, self._engine.cuda_memory.unregister, request.name)
        return service_pb2.CudaSharedMemoryUnregisterResponse()
