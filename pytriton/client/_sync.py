"""ModelClient: blocking inference over tritonclient.http or tritonclient.grpc."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from pytriton.client._errors import TRANSLATED_ERRORS, client_error
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
from pytriton.client._sync_base import SyncModelClientBase
from pytriton.client.exceptions import PyTritonClientInferenceServerError


class ModelClient(SyncModelClientBase):
    """Synchronous client for a model served over HTTP or gRPC.

    Examples:
        with ModelClient("localhost", "MyModel") as client:
            result_dict = client.infer_sample(input1_sample, input2_sample)
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
        """Create a client for `model_name` on the server at `url`.

        Args:
            url: server url, e.g. `grpc://localhost:8001`; no scheme means http, no port the scheme's default
                (8000 for http, 8001 for grpc).
            model_name: name of the model.
            model_version: version of the model; None means the latest.
            lazy_init: wait for the model and read its config at the first request instead of now.
            init_timeout_s: how long to wait for the server and the model to be ready (default 300 s).
            inference_timeout_s: how long one inference may take (default 60 s).

        Raises:
            PyTritonClientInvalidUrlError: if the url is invalid.
            PyTritonClientTimeoutError: if lazy_init is False and the model is not ready within init_timeout_s.
            PyTritonClientModelUnavailableError: if lazy_init is False and the model config cannot be obtained.
        """
        super().__init__(
            url,
            model_name,
            model_version,
            lazy_init=lazy_init,
            init_timeout_s=init_timeout_s,
            inference_timeout_s=inference_timeout_s,
        )
        self._infer_client = self.create_client_from_url(url, network_timeout_s=self._inference_timeout_s)
        self._initialize()

    def _close_connections(self) -> None:
        """Close both tritonclient clients."""
        try:
            super()._close_connections()
        finally:
            self._infer_client.close()

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
        return self._infer(inputs, named_inputs, parameters, headers, sample=True)

    def infer_batch(
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
        return self._infer(inputs, named_inputs, parameters, headers, sample=False)

    def _infer(
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
        config = self.model_config
        if config.decoupled:
            raise PyTritonClientInferenceServerError("Model config is decoupled. Use DecoupledModelClient instead.")
        arrays = batch_inputs(config, name_inputs(config, inputs, named_inputs), sample)
        lib = self.get_lib()
        timeout_kwargs = {"client_timeout": self._inference_timeout_s} if self._is_grpc else {}
        try:
            result = self._infer_client.infer(
                model_name=self._model_name,
                model_version=self._model_version or "",
                inputs=infer_inputs(lib, arrays),
                outputs=requested_outputs(lib, config),
                request_id=self._next_request_id(),
                parameters=parameters,
                headers=header_values(headers, lowercase=self._is_grpc),
                **timeout_kwargs,
            )
        except TRANSLATED_ERRORS as error:
            raise client_error(error, self._inference_timeout_s) from error
        return unbatch_outputs(config, result_arrays(result), sample)
