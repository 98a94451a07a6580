"""ModelClient: blocking inference over tritonclient.http or tritonclient.grpc."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, Dict, Optional, cast

import numpy as np
import tritonclient.grpc
import tritonclient.http

from pytriton.client._base import BaseModelClient
from pytriton.client._errors import TRANSLATED_ERRORS, client_error
from pytriton.client._loop_guard import refuse_a_wait_for_this_loop
from pytriton.client._readiness import fetch_model_config, wait_for_model, wait_for_server_ready
from pytriton.client._request import InferCall, Parameters, result_arrays, unbatch_outputs
from pytriton.client._thread_clients import ThreadClients
from pytriton.model_config.triton_model_config import TritonModelConfig

_LOGGER = logging.getLogger(__name__)


class ModelClient(BaseModelClient):
    """Synchronous client for a model served over HTTP or gRPC.

    Examples:
        with ModelClient("localhost", "MyModel") as client:
            result_dict = client.infer_sample(input1_sample, input2_sample)

        A client for another thread, without reading the config again:
            other = ModelClient.from_existing_client(client)
    """

    @property
    def _closed_name(self) -> str:
        """0.7's words for every ModelClient, its DecoupledModelClient too: "ModelClient is closed"."""
        return "ModelClient"

    def _open(self) -> None:
        """The clients for health, config and repository requests and for inference, made at first use.

        Over HTTP each thread gets its own (see `ThreadClients`), so that threads may share this client.
        """
        per_thread = not self._is_grpc
        self._general_clients = ThreadClients(
            lambda: self.create_client_from_url(self._url, network_timeout_s=self._network_timeout_s), per_thread
        )
        self._infer_clients = ThreadClients(
            lambda: self.create_client_from_url(self._url, network_timeout_s=self._inference_timeout_s), per_thread
        )

    def _check_open(self) -> None:
        """Refuse use after close, and a call that would wait for the event loop it blocks.

        Raises:
            PyTritonClientClosedError: if the client is closed.
            PyTritonClientError: if called on the event loop of a server of this process (an `async def` callable
                or route handler) to that server: it could not answer until the call gave up.
        """
        super()._check_open()
        refuse_a_wait_for_this_loop(type(self).__name__, self._triton_url)

    @property
    def _general_client(self) -> Any:
        """The calling thread's client for health, config and repository requests."""
        return self._general_clients.get()

    def _initialize(self) -> None:
        """Without lazy_init, wait for the model and read its config now; close the client if that fails."""
        if self._lazy_init:
            return
        try:
            self._ready_config()
        except BaseException:
            self.close()
            raise

    def get_lib(self) -> ModuleType:
        """tritonclient.grpc or tritonclient.http, after the url's scheme."""
        return cast(ModuleType, tritonclient.grpc if self._is_grpc else tritonclient.http)

    def _client_kwargs(self, scheme: str, network_timeout_s: Optional[float]) -> Dict[str, Any]:
        """tritonclient.http takes its connection and network timeouts at construction."""
        if scheme != "http" or network_timeout_s is None:
            return {}
        return {"connection_timeout": network_timeout_s, "network_timeout": network_timeout_s}

    def __enter__(self) -> ModelClient:
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
        try:
            self._general_clients.close()
        finally:
            self._infer_clients.close()

    def wait_for_model(self, timeout_s: float) -> None:
        """Wait for the server and the model to be ready.

        Raises:
            PyTritonClientTimeoutError: if they are not ready within `timeout_s`.
            PyTritonClientClosedError: if the client is closed.
        """
        self._check_open()
        wait_for_model(self._general_client, self._model_ref, timeout_s)

    def wait_for_server(self, timeout_s: float) -> None:
        """Wait for the server to be ready.

        Raises:
            PyTritonClientTimeoutError: if it is not ready within `timeout_s`.
            PyTritonClientClosedError: if the client is closed.
        """
        self._check_open()
        wait_for_server_ready(self._general_client, timeout_s=timeout_s, headers=self._headers)

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
            self._model_config = fetch_model_config(self._general_client, self._model_ref, self._init_timeout_s)
            self._model_ready = True
        return self._model_config

    @property
    def is_batching_supported(self) -> bool:
        """Whether the model batches (max_batch_size > 0); reads the model config first if needed."""
        return self.model_config.max_batch_size > 0

    def load_model(self, config: Optional[str] = None, files: Optional[Dict[str, bytes]] = None) -> None:
        """Ask the server to load the model (restricted: the client needs the server's access token).

        Args:
            config: a JSON model config to load the model with: this project's server lays its fields over the
                config the model was bound with (docs/binding_models.md#live-model-control-load-with-a-config-override).
            files: "file:<path>" -> content of files of the model directory (with `config`; refused by this
                project's server, which loads no model files).
        """
        self._check_open()
        self._general_client.load_model(self._model_name, config=config, files=files, headers=self._headers)

    def unload_model(self) -> None:
        """Ask the server to unload the model (restricted: the client needs the server's access token)."""
        self._check_open()
        self._general_client.unload_model(self._model_name, headers=self._headers)

    def infer_sample(
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
        return self._infer(InferCall(inputs, named_inputs, parameters, headers, sample=True))

    def infer_batch(
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> Dict[str, np.ndarray]:
        """Run inference on a batch (the first axis of every input).

        Args and errors are those of `infer_sample`; besides, PyTritonClientModelDoesntSupportBatchingError
        is raised if the model does not batch.
        """
        return self._infer(InferCall(inputs, named_inputs, parameters, headers, sample=False))

    def _ready_config(self) -> TritonModelConfig:
        """The model config once the model is ready (read, or waited for once when it was handed over)."""
        config = self.model_config
        if not self._model_ready:
            self.wait_for_model(self._init_timeout_s)
            self._model_ready = True
        return config

    def _infer(self, call: InferCall) -> Dict[str, np.ndarray]:
        """Send one request and return its outputs."""
        self._check_call(call)
        config = self._ready_config()
        arrays = self._request_arrays(config, call)
        try:
            result = self._infer_clients.get().infer(**self._infer_arguments(config, arrays, call))
        except TRANSLATED_ERRORS as error:
            raise client_error(error, self._inference_timeout_s) from error
        return unbatch_outputs(config, result_arrays(result), call.sample)
