"""What the blocking clients share: the tritonclient client for health and config, readiness, model config."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, Dict, Optional, TypeVar, cast

import tritonclient.grpc
import tritonclient.http

from pytriton.client._base import BaseModelClient
from pytriton.client._readiness import get_model_config, wait_for_model_ready, wait_for_server_ready
from pytriton.client.exceptions import PyTritonClientClosedError
from pytriton.model_config.triton_model_config import TritonModelConfig

_LOGGER = logging.getLogger(__name__)
_Client = TypeVar("_Client", bound="SyncModelClientBase")


class SyncModelClientBase(BaseModelClient):
    """Base of the blocking clients: readiness, model config, close and the context manager."""

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
        """Create the client used for health and config requests; see BaseModelClient for the arguments."""
        super().__init__(
            url,
            model_name,
            model_version,
            lazy_init=lazy_init,
            init_timeout_s=init_timeout_s,
            inference_timeout_s=inference_timeout_s,
        )
        self._model_config: Optional[TritonModelConfig] = None
        self._closed = False
        self._general_client = self.create_client_from_url(url, network_timeout_s=self._network_timeout_s)

    def get_lib(self) -> ModuleType:
        """tritonclient.grpc or tritonclient.http, after the url's scheme."""
        return cast(ModuleType, tritonclient.grpc if self._is_grpc else tritonclient.http)

    def _client_kwargs(self, scheme: str, network_timeout_s: Optional[float]) -> Dict[str, Any]:
        """tritonclient.http takes its connection and network timeouts at construction."""
        if scheme != "http" or network_timeout_s is None:
            return {}
        return {"connection_timeout": network_timeout_s, "network_timeout": network_timeout_s}

    def _initialize(self) -> None:
        """Without lazy_init, wait for the model and read its config now; close the client if that fails."""
        if self._lazy_init:
            return
        try:
            _ = self.model_config
        except BaseException:
            self.close()
            raise

    def __enter__(self: _Client) -> _Client:
        """Use the client as a context manager."""
        return self

    def __exit__(self, *_: object) -> None:
        """Close the client when leaving the context."""
        self.close()

    def close(self) -> None:
        """Close the connections to the server; the client cannot be used afterwards."""
        if self._closed:
            return
        _LOGGER.debug("Closing %s", type(self).__name__)
        self._closed = True
        self._close_connections()

    def _close_connections(self) -> None:
        """Close this client's tritonclient clients and channels."""
        self._general_client.close()

    def _check_open(self) -> None:
        """Refuse use after close.

        Raises:
            PyTritonClientClosedError: if the client is closed.
        """
        if self._closed:
            raise PyTritonClientClosedError(f"{type(self).__name__} is closed")

    def wait_for_model(self, timeout_s: float) -> None:
        """Wait for the server and the model to be ready.

        Raises:
            PyTritonClientTimeoutError: if they are not ready within `timeout_s`.
            PyTritonClientClosedError: if the client is closed.
        """
        self._check_open()
        wait_for_model_ready(self._general_client, self._model_name, self._model_version, timeout_s=timeout_s)

    def wait_for_server(self, timeout_s: float) -> None:
        """Wait for the server to be ready.

        Raises:
            PyTritonClientTimeoutError: if it is not ready within `timeout_s`.
            PyTritonClientClosedError: if the client is closed.
        """
        self._check_open()
        wait_for_server_ready(self._general_client, timeout_s=timeout_s)

    @property
    def model_config(self) -> TritonModelConfig:
        """The model's config, read once (after waiting up to init_timeout_s for the server and the model).

        Raises:
            PyTritonClientTimeoutError: if the server or the model is not ready in time.
            PyTritonClientModelUnavailableError: if the config cannot be obtained.
            PyTritonClientClosedError: if the client is closed before the config was read.
        """
        if self._model_config is None:
            self._check_open()
            self._model_config = get_model_config(
                self._general_client, self._model_name, self._model_version, timeout_s=self._init_timeout_s
            )
        return self._model_config

    @property
    def is_batching_supported(self) -> bool:
        """Whether the model batches (max_batch_size > 0); reads the model config first if needed."""
        return self.model_config.max_batch_size > 0
