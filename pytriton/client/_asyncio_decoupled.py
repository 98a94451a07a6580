"""AsyncioDecoupledModelClient: asyncio streaming inference (gRPC only) for decoupled models."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncGenerator, Dict, Optional, Tuple

import grpc
import numpy as np
from tritonclient.grpc import service_pb2_grpc

from pytriton.client._asyncio_base import AsyncioModelClientBase
from pytriton.client._errors import client_error
from pytriton.client._request import Arrays, Parameters, batch_inputs, check_call, name_inputs, unbatch_outputs
from pytriton.client._stream import CHANNEL_OPTIONS, stream_metadata, stream_outputs, stream_request
from pytriton.client._url import TritonUrl
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)


class AsyncioDecoupledModelClient(AsyncioModelClientBase):
    """Asyncio client for a decoupled model over gRPC: each call is an async iterator over the responses.

    Examples:
        async with AsyncioDecoupledModelClient("grpc://localhost", "MyModel") as client:
            async for result_dict in client.infer_sample(input1_sample):
                print(result_dict)
    """

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: Optional[str] = None,
        *,
        lazy_init: bool = True,
        init_timeout_s: Optional[float] = None,
        inference_timeout_s: Optional[float] = None,
    ) -> None:
        """Create a client for the decoupled model `model_name` on the gRPC server at `url`.

        Args:
            url: server url with the grpc scheme, e.g. `grpc://localhost:8001` (default port 8001).
            model_name: name of the model.
            model_version: version of the model; None means the latest.
            lazy_init: wait for the model and read its config at the first request instead of in `__aenter__`.
            init_timeout_s: how long to wait for the server and the model to be ready (default 300 s).
            inference_timeout_s: how long to wait for each response (default 60 s).

        Raises:
            PyTritonClientValueError: if the url's scheme is not grpc.
            PyTritonClientInvalidUrlError: if the url is invalid.
        """
        if TritonUrl.from_url(url).scheme != "grpc":
            raise PyTritonClientValueError("AsyncioDecoupledModelClient is only supported for grpc protocol")
        super().__init__(
            url,
            model_name,
            model_version,
            lazy_init=lazy_init,
            init_timeout_s=init_timeout_s,
            inference_timeout_s=inference_timeout_s,
        )
        self._channel: Any = None

    async def _close_connections(self) -> None:
        """Close the health/config client and the streaming channel (ending streams in progress)."""
        try:
            await super()._close_connections()
        finally:
            if self._channel is not None:
                await self._channel.close()

    def infer_sample(
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> AsyncGenerator[Dict[str, np.ndarray], None]:
        """Stream the responses to one sample (batch axis removed for batching models); sent at first iteration.

        Args:
            *inputs: inputs in the model's input order.
            parameters: request parameters handed to the model.
            headers: request headers, sent as gRPC metadata.
            **named_inputs: inputs by name (not together with positional ones).

        Returns:
            An async generator of the responses' outputs by name (aclose() cancels the stream). Iterating
            raises PyTritonClientValueError for invalid arguments, PyTritonClientTimeoutError when the model is
            not ready within init_timeout_s or a response takes longer than inference_timeout_s,
            PyTritonClientInferenceServerError when the model fails or is not decoupled, and
            PyTritonClientClosedError when the client is closed.
        """
        return self._stream(inputs, named_inputs, parameters, headers, sample=True)

    def infer_batch(
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> AsyncGenerator[Dict[str, np.ndarray], None]:
        """Stream the responses to one batch; sent at first iteration.

        Args:
            *inputs: inputs in the model's input order.
            parameters: request parameters handed to the model.
            headers: request headers, sent as gRPC metadata.
            **named_inputs: inputs by name (not together with positional ones).

        Returns:
            An async generator of the responses' outputs by name (aclose() cancels the stream). Iterating raises
            PyTritonClientModelDoesntSupportBatchingError when the model does not batch, and otherwise the
            errors listed for `infer_sample`.
        """
        return self._stream(inputs, named_inputs, parameters, headers, sample=False)

    def _stub(self) -> Any:
        """The streaming stub, on a channel opened at first use."""
        self._check_open()
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self._triton_url.without_scheme, options=CHANNEL_OPTIONS)
        return service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def _stream(
        self,
        inputs: Tuple[Any, ...],
        named_inputs: Dict[str, Any],
        parameters: Optional[Parameters],
        headers: Optional[Parameters],
        sample: bool,
    ) -> AsyncGenerator[Arrays, None]:
        """Send the request, then yield each response's outputs until the final one."""
        check_call(inputs, named_inputs, parameters, headers)
        self._check_open()
        config = await self.model_config
        if not config.decoupled:
            raise PyTritonClientInferenceServerError("Model config is coupled. Use AsyncioModelClient instead.")
        arrays = batch_inputs(config, name_inputs(config, inputs, named_inputs), sample)
        request = stream_request(
            self._model_name, self._model_version, self._next_request_id(), arrays, config, parameters
        )
        call = self._stub().ModelStreamInfer(iter([request]), metadata=stream_metadata(headers))
        try:
            while True:
                try:
                    reply = await asyncio.wait_for(call.read(), self._inference_timeout_s)
                except asyncio.TimeoutError:
                    raise PyTritonClientTimeoutError(
                        f"Timeout occurred during inference request. Timeout: {self._inference_timeout_s} s"
                    ) from None
                except grpc.RpcError as error:
                    if self._closed:
                        raise PyTritonClientClosedError(
                            "AsyncioDecoupledModelClient was closed while streaming"
                        ) from error
                    raise client_error(error, self._inference_timeout_s) from error
                if reply is grpc.aio.EOF:
                    return
                outputs = stream_outputs(reply, self._inference_timeout_s)
                if outputs is None:
                    return
                yield unbatch_outputs(config, outputs, sample)
        finally:
            call.cancel()
