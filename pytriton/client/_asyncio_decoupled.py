"""AsyncioDecoupledModelClient: asyncio streaming inference (gRPC only) for decoupled models."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncGenerator, Dict, Optional

import grpc
import numpy as np
from tritonclient.grpc import service_pb2_grpc

from pytriton.client._asyncio import AsyncioModelClient
from pytriton.client._errors import asyncio_client_error, client_error
from pytriton.client._request import Arrays, InferCall, Parameters, unbatch_outputs
from pytriton.client._stream import CHANNEL_OPTIONS, stream_metadata, stream_outputs, stream_request
from pytriton.client.exceptions import PyTritonClientClosedError, PyTritonClientError, PyTritonClientTimeoutError


class AsyncioDecoupledModelClient(AsyncioModelClient):
    """Asyncio client for a decoupled model over gRPC: each call is an async iterator over the responses.

    Examples:
        async with AsyncioDecoupledModelClient("grpc://localhost", "MyModel") as client:
            async for result_dict in client.infer_sample(input1_sample):
                print(result_dict)
    """

    _decoupled = True
    _other_kind = "AsyncioModelClient"

    def _open(self) -> None:
        """Nothing yet but the check of the protocol: the channel is opened at first use, in the loop."""
        self._require_grpc()
        super()._open()
        self._channel: Any = None

    async def _close_connections(self) -> None:
        """Close the health/config client and the streaming channel (ending streams in progress)."""
        try:
            await super()._close_connections()
        finally:
            if self._channel is not None:
                await self._channel.close()

    async def infer_sample(  # type: ignore[override]
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> AsyncGenerator[Dict[str, np.ndarray], None]:
        """Stream the responses to one sample (batch axis removed for batching models); sent at first iteration.

        The arguments are ModelClient.infer_sample's. Leaving the loop early (or aclose()) cancels the stream;
        iterating raises PyTritonClientTimeoutError when a response takes longer than inference_timeout_s and
        PyTritonClientInferenceServerError when the model fails.
        """
        async for response in self._stream(InferCall(inputs, named_inputs, parameters, headers, sample=True)):
            yield response

    async def infer_batch(  # type: ignore[override]
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> AsyncGenerator[Dict[str, np.ndarray], None]:
        """Stream the responses to one batch; sent at first iteration (see `infer_sample`)."""
        async for response in self._stream(InferCall(inputs, named_inputs, parameters, headers, sample=False)):
            yield response

    def _stub(self) -> Any:
        """The streaming stub, on a channel opened at first use."""
        self._check_open()
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self._triton_url.without_scheme, options=CHANNEL_OPTIONS)
        return service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    def _stream_error(self, error: BaseException, timeout_s: float) -> PyTritonClientError:
        """An error a streamed response carries, in 0.7's AsyncioDecoupledModelClient's words for it."""
        return asyncio_client_error(error, self._model_name, timeout_s, grpc=True)

    async def _stream(self, call: InferCall) -> AsyncGenerator[Arrays, None]:
        """Send the request, then yield each response's outputs until the final one."""
        self._check_call(call)
        config = await self._ready_config()
        arrays = self._request_arrays(config, call)
        request = stream_request(
            self._model_name, self._model_version, self._next_request_id(), arrays, config, call.parameters
        )
        stream = self._stub().ModelStreamInfer(
            iter([request]), metadata=stream_metadata(self._call_headers(call.headers))
        )
        try:
            while True:
                try:
                    reply = await asyncio.wait_for(stream.read(), self._inference_timeout_s)
                except asyncio.TimeoutError:
                    raise PyTritonClientTimeoutError(  # 0.7's words
                        f"Timeout while waiting for model {self._model_name} to return next response "
                        f"{self._inference_timeout_s}s"
                    ) from None
                except grpc.RpcError as error:
                    if self._closed:
                        raise PyTritonClientClosedError(
                            "AsyncioDecoupledModelClient was closed while streaming"
                        ) from error
                    raise client_error(error, self._inference_timeout_s) from error
                if reply is grpc.aio.EOF:
                    return
                outputs = stream_outputs(reply, self._inference_timeout_s, self._stream_error)
                if outputs is None:
                    return
                yield unbatch_outputs(config, outputs, call.sample)
        finally:
            stream.cancel()
