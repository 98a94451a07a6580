"""What the asyncio clients share: the health/config client, readiness, model config, async context manager."""

from __future__ import annotations

import asyncio
import logging
from types import ModuleType
from typing import Any, Dict, Optional, Tuple, Type, TypeVar, cast

import aiohttp
import tritonclient.grpc.aio
import tritonclient.http.aio

from pytriton.client._base import BaseModelClient
from pytriton.client._errors import TRANSLATED_ERRORS
from pytriton.client.asyncio_utils import asyncio_get_model_config, asyncio_wait_for_model_ready
from pytriton.client.exceptions import PyTritonClientClosedError
from pytriton.model_config.triton_model_config import TritonModelConfig

_LOGGER = logging.getLogger(__name__)
_Client = TypeVar("_Client", bound="AsyncioModelClientBase")

# What an asyncio inference call may raise that `client_error` translates.
ASYNCIO_TRANSLATED_ERRORS: Tuple[Type[BaseException], ...] = (*TRANSLATED_ERRORS, aiohttp.ClientError)


class AsyncioModelClientBase(BaseModelClient):
    """Base of the asyncio clients; tritonclient's asyncio clients are created at first use, inside the loop."""

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
        """Keep the settings; see BaseModelClient for the arguments."""
        super().__init__(
            url,
            model_name,
            model_version,
            lazy_init=lazy_init,
            init_timeout_s=init_timeout_s,
            inference_timeout_s=inference_timeout_s,
        )
        self._model_config: Optional[TritonModelConfig] = None
        self._config_lock: Optional[asyncio.Lock] = None
        self._general_client: Any = None
        self._closed = False

    def get_lib(self) -> ModuleType:
        """tritonclient.grpc.aio or tritonclient.http.aio, after the url's scheme."""
        return cast(ModuleType, tritonclient.grpc.aio if self._is_grpc else tritonclient.http.aio)

    def _client_kwargs(self, scheme: str, network_timeout_s: Optional[float]) -> Dict[str, Any]:
        """tritonclient.http.aio takes one timeout (connection and request) at construction."""
        if scheme != "http" or network_timeout_s is None:
            return {}
        return {"conn_timeout": network_timeout_s}

    async def __aenter__(self: _Client) -> _Client:
        """Use the client as an async context manager; without lazy_init, wait for the model and its config."""
        if not self._lazy_init:
            try:
                await self.model_config
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
        """Close the tritonclient clients and channels created so far."""
        if self._general_client is not None:
            await self._general_client.close()

    def _check_open(self) -> None:
        """Refuse use after close.

        Raises:
            PyTritonClientClosedError: if the client is closed.
        """
        if self._closed:
            raise PyTritonClientClosedError(f"{type(self).__name__} is closed")

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
        await asyncio_wait_for_model_ready(self._general(), self._model_name, self._model_version, timeout_s=timeout_s)

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
                    self._model_config = await asyncio_get_model_config(
                        self._general(), self._model_name, self._model_version, timeout_s=self._init_timeout_s
                    )
        return self._model_config
