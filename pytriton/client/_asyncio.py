"""AsyncioModelClient: asyncio inference over tritonclient.http.aio or tritonclient.grpc.aio."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Optional, Tuple

import numpy as np

from pytriton.client._asyncio_base import ASYNCIO_TRANSLATED_ERRORS, AsyncioModelClientBase
from pytriton.client._errors import client_error
from pytriton.client._request import (
    Parameters,
    batch_inputs,
    check_call,
    header_values,
    infer_inputs,
    name_inputs,
    requested_outputs,
    result_arrays,
    unbatch_outputs,
)
from pytriton.client.exceptions import PyTritonClientInferenceServerError


class AsyncioModelClient(AsyncioModelClientBase):
    """Asyncio client for a model served over HTTP or gRPC.

    Examples:
        async with AsyncioModelClient("localhost", "MyModel") as client:
            result_dict = await client.infer_sample(input1_sample, input2_sample)
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
        """Create a client for `model_name` on the server at `url`; connections open at first use.

        Args:
            url: server url, e.g. `grpc://localhost:8001`; no scheme means http, no port the scheme's default
                (8000 for http, 8001 for grpc).
            model_name: name of the model.
            model_version: version of the model; None means the latest.
            lazy_init: wait for the model and read its config at the first request instead of in `__aenter__`.
            init_timeout_s: how long to wait for the server and the model to be ready (default 300 s).
            inference_timeout_s: how long one inference may take (default 60 s).

        Raises:
            PyTritonClientInvalidUrlError: if the url is invalid.
        """
        super().__init__(
            url,
            model_name,
            model_version,
            lazy_init=lazy_init,
            init_timeout_s=init_timeout_s,
            inference_timeout_s=inference_timeout_s,
        )
        self._infer_client: Any = None

    async def _close_connections(self) -> None:
        """Close both tritonclient clients."""
        try:
            await super()._close_connections()
        finally:
            if self._infer_client is not None:
                await self._infer_client.close()

    async def infer_sample(
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> Dict[str, np.ndarray]:
        """Run inference on one sample (a batch axis is added and removed for batching models).

        Args:
            *inputs: inputs in the model's input order.
            parameters: request parameters handed to the model.
            headers: request headers (HTTP headers or gRPC metadata).
            **named_inputs: inputs by name (not together with positional ones).

        Returns:
            The outputs by name.

        Raises:
            PyTritonClientValueError: if the inputs, parameters or headers are invalid.
            PyTritonClientTimeoutError: if the model is not ready within init_timeout_s
                or the inference takes longer than inference_timeout_s.
            PyTritonClientModelUnavailableError: if the model config cannot be obtained.
            PyTritonClientInferenceServerError: if the model or the server fails the request.
            PyTritonClientQueueFullError: if the model's queue is full.
            PyTritonClientClosedError: if the client is closed.
        """
        return await self._infer(inputs, named_inputs, parameters, headers, sample=True)

    async def infer_batch(
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> Dict[str, np.ndarray]:
        """Run inference on a batch (the first axis of every input).

        Args:
            *inputs: inputs in the model's input order.
            parameters: request parameters handed to the model.
            headers: request headers (HTTP headers or gRPC metadata).
            **named_inputs: inputs by name (not together with positional ones).

        Returns:
            The outputs by name.

        Raises:
            PyTritonClientModelDoesntSupportBatchingError: if the model does not batch.
            PyTritonClientValueError: if the inputs, parameters or headers are invalid.
            PyTritonClientTimeoutError: if the model is not ready within init_timeout_s
                or the inference takes longer than inference_timeout_s.
            PyTritonClientModelUnavailableError: if the model config cannot be obtained.
            PyTritonClientInferenceServerError: if the model or the server fails the request.
            PyTritonClientQueueFullError: if the model's queue is full.
            PyTritonClientClosedError: if the client is closed.
        """
        return await self._infer(inputs, named_inputs, parameters, headers, sample=False)

    def _inference_client(self) -> Any:
        """The client for inference requests, created at first use."""
        self._check_open()
        if self._infer_client is None:
            self._infer_client = self.create_client_from_url(self._url, network_timeout_s=self._inference_timeout_s)
        return self._infer_client

    async def _infer(
        self,
        inputs: Tuple[Any, ...],
        named_inputs: Dict[str, Any],
        parameters: Optional[Parameters],
        headers: Optional[Parameters],
        sample: bool,
    ) -> Dict[str, np.ndarray]:
        """Send one request and return its outputs."""
        check_call(inputs, named_inputs, parameters, headers)
        self._check_open()
        config = await self.model_config
        if config.decoupled:
            raise PyTritonClientInferenceServerError(
                "Model config is decoupled. Use AsyncioDecoupledModelClient instead."
            )
        arrays = batch_inputs(config, name_inputs(config, inputs, named_inputs), sample)
        lib = self.get_lib()
        timeout_kwargs = {"client_timeout": self._inference_timeout_s} if self._is_grpc else {}
        request = self._inference_client().infer(
            model_name=self._model_name,
            model_version=self._model_version or "",
            inputs=infer_inputs(lib, arrays),
            outputs=requested_outputs(lib, config),
            request_id=self._next_request_id(),
            parameters=parameters,
            headers=header_values(headers, lowercase=self._is_grpc),
            **timeout_kwargs,
        )
        try:
            result = await asyncio.wait_for(request, self._inference_timeout_s)
        except ASYNCIO_TRANSLATED_ERRORS as error:
            raise client_error(error, self._inference_timeout_s) from error
        return unbatch_outputs(config, result_arrays(result), sample)
