"""AsyncioModelClient: asyncio inference over tritonclient.http.aio or tritonclient.grpc.aio."""

from __future__ import annotations

import asyncio
import logging
from types import ModuleType
from typing import Any, Dict, Optional, Tuple, Type, cast

import aiohttp
import numpy as np
import tritonclient.grpc.aio
import tritonclient.http.aio

from pytriton.client._asyncio_readiness import fetch_model_config, wait_for_model
from pytriton.client._base import BaseModelClient
from pytriton.client._errors import TRANSLATED_ERRORS, asyncio_client_error
from pytriton.client._request import InferCall, Parameters, result_arrays, unbatch_outputs
from pytriton.client.exceptions import PyTritonClientTimeoutError
from pytriton.model_config.triton_model_config import TritonModelConfig

_LOGGER = logging.getLogger(__name__)
# What an asyncio inference call may raise that `client_error` translates.
ASYNCIO_TRANSLATED_ERRORS: Tuple[Type[BaseException], ...] = (*TRANSLATED_ERRORS, aiohttp.ClientError)


class AsyncioModelClient(BaseModelClient):
    """Asyncio client for a model served over HTTP or gRPC; tritonclient's clients are made at first use.

    Examples:
        async with AsyncioModelClient("localhost", "MyModel") as client:
            result_dict = await client.infer_sample(input1_sample, input2_sample)
    """

    _other_kind = "AsyncioDecoupledModelClient"

    def _open(self) -> None:
        """Nothing yet: tritonclient's asyncio clients are created inside the event loop, at first use."""
        self._general_client: Any = None
        self._infer_client: Any = None
        self._config_lock: Optional[asyncio.Lock] = None

    def get_lib(self) -> ModuleType:
        """tritonclient.grpc.aio or tritonclient.http.aio, after the url's scheme."""
        return cast(ModuleType, tritonclient.grpc.aio if self._is_grpc else tritonclient.http.aio)

    def _client_kwargs(self, scheme: str, network_timeout_s: Optional[float]) -> Dict[str, Any]:
        """tritonclient.http.aio takes one timeout (connection and request) at construction."""
        if scheme != "http" or network_timeout_s is None:
            return {}
        return {"conn_timeout": network_timeout_s}

    async def __aenter__(self) -> AsyncioModelClient:
        """Use the client as an async context manager; without lazy_init, wait for the model and its config."""
        if not self._lazy_init:
            try:
                await self._ready_config()
            except PyTritonClientTimeoutError as error:
                await self.close()
                # 0.7 words this wait (lazy_init=False) apart from the one at the first request
                raise PyTritonClientTimeoutError(
                    f"Timeout exceeded while waiting for model {self._model_name} to be ready"
                ) from error
            except BaseException:
                await self.close()
                raise
        return self

    async def __aexit__(self, *_: object) -> None:
        """Close the client when leaving the context."""
        await self.close()

    async def close(self) -> None:
        """Close the connections to the server; the client cannot be used afterwards."""
        if self._closed:
            return
        _LOGGER.debug("Closing %s", type(self).__name__)
        self._closed = True
        await self._close_connections()

    async def _close_connections(self) -> None:
        """Close the tritonclient clients created so far."""
        try:
            if self._general_client is not None:
                await self._general_client.close()
        finally:
            if self._infer_client is not None:
                await self._infer_client.close()

    def _general(self) -> Any:
        """The client for health and config requests, created at first use."""
        self._check_open()
        if self._general_client is None:
            self._general_client = self.create_client_from_url(self._url, network_timeout_s=self._network_timeout_s)
        return self._general_client

    async def wait_for_model(self, timeout_s: float) -> None:
        """Wait for the server and the model to be ready.

        Raises:
            PyTritonClientTimeoutError: if they are not ready within `timeout_s`.
            PyTritonClientClosedError: if the client is closed.
        """
        try:
            await wait_for_model(self._general(), self._model_ref, timeout_s)
        except PyTritonClientTimeoutError as error:
            raise self._not_ready_in_time(timeout_s) from error

    @property
    async def model_config(self) -> TritonModelConfig:
        """The model's config, read once (after waiting up to init_timeout_s for the server and the model).

        Raises:
            PyTritonClientTimeoutError: if the server or the model is not ready in time.
            PyTritonClientModelUnavailableError: if the config cannot be obtained.
            PyTritonClientClosedError: if the client is closed before the config was read.
        """
        if self._model_config is None:
            if self._config_lock is None:
                self._config_lock = asyncio.Lock()
            async with self._config_lock:
                if self._model_config is None:
                    try:
                        self._model_config = await fetch_model_config(
                            self._general(), self._model_ref, self._init_timeout_s
                        )
                    except PyTritonClientTimeoutError as error:
                        raise self._not_ready_in_time(self._init_timeout_s) from error
                    self._model_ready = True
        return self._model_config

    def _not_ready_in_time(self, timeout_s: Optional[float]) -> PyTritonClientTimeoutError:
        """The error for a server or model not ready in time, in 0.7's AsyncioModelClient's words.

        They differ from its ModelClient's ("Waiting for model m/<latest> to be ready timed out.").
        """
        return PyTritonClientTimeoutError(
            f"Timeout while waiting for model {self._model_name} to be ready for {timeout_s}s"
        )

    async def infer_sample(
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> Dict[str, np.ndarray]:
        """Run inference on one sample; the arguments, result and errors are ModelClient.infer_sample's."""
        return await self._infer(InferCall(inputs, named_inputs, parameters, headers, sample=True))

    async def infer_batch(
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> Dict[str, np.ndarray]:
        """Run inference on a batch; the arguments, result and errors are ModelClient.infer_batch's."""
        return await self._infer(InferCall(inputs, named_inputs, parameters, headers, sample=False))

    async def _ready_config(self) -> TritonModelConfig:
        """The model config once the model is ready (read, or waited for once when it was handed over)."""
        config = await self.model_config
        if not self._model_ready:
            await self.wait_for_model(self._init_timeout_s)
            self._model_ready = True
        return config

    async def _infer(self, call: InferCall) -> Dict[str, np.ndarray]:
        """Send one request and return its outputs."""
        self._check_call(call)
        config = await self._ready_config()
        arrays = self._request_arrays(config, call)
        if self._infer_client is None:
            self._infer_client = self.create_client_from_url(self._url, network_timeout_s=self._inference_timeout_s)
        request = self._infer_client.infer(**self._infer_arguments(config, arrays, call))
        try:
            result = await asyncio.wait_for(request, self._inference_timeout_s)
        except ASYNCIO_TRANSLATED_ERRORS as error:
            raise asyncio_client_error(error, self._model_name, self._inference_timeout_s, self._is_grpc) from error
        return unbatch_outputs(config, result_arrays(result), call.sample)
