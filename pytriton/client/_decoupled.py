"""DecoupledModelClient: blocking streaming inference (gRPC only) for decoupled models."""

from __future__ import annotations

import queue
import threading
from typing import Any, Dict, Generator, Optional, Tuple, Union

import grpc
import numpy as np
from tritonclient.grpc import service_pb2_grpc

from pytriton.client._errors import client_error
from pytriton.client._request import Arrays, Parameters, batch_inputs, check_call, name_inputs, unbatch_outputs
from pytriton.client._stream import CHANNEL_OPTIONS, stream_metadata, stream_outputs, stream_request
from pytriton.client._sync_base import SyncModelClientBase
from pytriton.client._url import TritonUrl
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.model_config.triton_model_config import TritonModelConfig

_Reply = Union[Any, grpc.RpcError, None]  # a ModelStreamInferResponse, the error that ended the call, or the end


class DecoupledModelClient(SyncModelClientBase):
    """Synchronous client for a decoupled model over gRPC: each call yields the responses as they come.

    Examples:
        with DecoupledModelClient("grpc://localhost", "MyModel") as client:
            for result_dict in client.infer_sample(input1_sample):
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
            lazy_init: wait for the model and read its config at the first request instead of now.
            init_timeout_s: how long to wait for the server and the model to be ready (default 300 s).
            inference_timeout_s: how long to wait for each response (default 60 s).

        Raises:
            PyTritonClientValueError: if the url's scheme is not grpc.
            PyTritonClientInvalidUrlError: if the url is invalid.
            PyTritonClientTimeoutError: if lazy_init is False and the model is not ready within init_timeout_s.
        """
        if TritonUrl.from_url(url).scheme != "grpc":
            raise PyTritonClientValueError("DecoupledModelClient is only supported for grpc protocol")
        super().__init__(
            url,
            model_name,
            model_version,
            lazy_init=lazy_init,
            init_timeout_s=init_timeout_s,
            inference_timeout_s=inference_timeout_s,
        )
        self._channel = grpc.insecure_channel(self._triton_url.without_scheme, options=CHANNEL_OPTIONS)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._initialize()

    def _close_connections(self) -> None:
        """Close the health/config client and the streaming channel (ending streams in progress)."""
        try:
            super()._close_connections()
        finally:
            self._channel.close()

    def infer_sample(
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> Generator[Dict[str, np.ndarray], None, None]:
        """Send one sample now; iterate over the model's responses (batch axis removed for batching models).

        Args:
            *inputs: inputs in the model's input order.
            parameters: request parameters handed to the model.
            headers: request headers, sent as gRPC metadata.
            **named_inputs: inputs by name (not together with positional ones).

        Returns:
            A generator of the responses' outputs by name (closing it cancels the stream); it raises
            PyTritonClientTimeoutError when a response takes longer than inference_timeout_s and
            PyTritonClientInferenceServerError when the model fails.

        Raises:
            PyTritonClientValueError: if the inputs, parameters or headers are invalid.
            PyTritonClientTimeoutError: if the model is not ready within init_timeout_s.
            PyTritonClientInferenceServerError: if the model is not decoupled.
            PyTritonClientClosedError: if the client is closed.
        """
        return self._stream(inputs, named_inputs, parameters, headers, sample=True)

    def infer_batch(
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> Generator[Dict[str, np.ndarray], None, None]:
        """Send one batch now; iterate over the model's responses.

        Args:
            *inputs: inputs in the model's input order.
            parameters: request parameters handed to the model.
            headers: request headers, sent as gRPC metadata.
            **named_inputs: inputs by name (not together with positional ones).

        Returns:
            A generator of the responses' outputs by name (closing it cancels the stream); it raises
            PyTritonClientTimeoutError when a response takes longer than inference_timeout_s and
            PyTritonClientInferenceServerError when the model fails.

        Raises:
            PyTritonClientModelDoesntSupportBatchingError: if the model does not batch.
            PyTritonClientValueError: if the inputs, parameters or headers are invalid.
            PyTritonClientTimeoutError: if the model is not ready within init_timeout_s.
            PyTritonClientInferenceServerError: if the model is not decoupled.
            PyTritonClientClosedError: if the client is closed.
        """
        return self._stream(inputs, named_inputs, parameters, headers, sample=False)

    def _stream(
        self,
        inputs: Tuple[Any, ...],
        named_inputs: Dict[str, Any],
        parameters: Optional[Parameters],
        headers: Optional[Parameters],
        sample: bool,
    ) -> Generator[Arrays, None, None]:
        """Start the call and a thread reading its replies; return the iterator over the responses."""
        check_call(inputs, named_inputs, parameters, headers)
        self._check_open()
        config = self.model_config
        if not config.decoupled:
            raise PyTritonClientInferenceServerError("Model config is coupled. Use ModelClient instead.")
        arrays = batch_inputs(config, name_inputs(config, inputs, named_inputs), sample)
        request = stream_request(
            self._model_name, self._model_version, self._next_request_id(), arrays, config, parameters
        )
        call = self._stub.ModelStreamInfer(iter([request]), metadata=stream_metadata(headers))
        replies: queue.SimpleQueue[_Reply] = queue.SimpleQueue()
        reader = threading.Thread(
            target=_read_replies, args=(call, replies), name="pytriton-client-stream", daemon=True
        )
        reader.start()
        return self._responses(call, reader, replies, config, sample)

    def _responses(
        self,
        call: Any,
        reader: threading.Thread,
        replies: queue.SimpleQueue[_Reply],
        config: TritonModelConfig,
        sample: bool,
    ) -> Generator[Arrays, None, None]:
        """Yield each response's outputs until the final one; cancel the call if stopped early."""
        try:
            while True:
                try:
                    reply = replies.get(timeout=self._inference_timeout_s)
                except queue.Empty:
                    raise PyTritonClientTimeoutError(
                        f"Timeout occurred during inference request. Timeout: {self._inference_timeout_s} s"
                    ) from None
                if reply is None:
                    return
                if isinstance(reply, grpc.RpcError):
                    if self._closed:
                        raise PyTritonClientClosedError("DecoupledModelClient was closed while streaming")
                    raise client_error(reply, self._inference_timeout_s) from reply
                outputs = stream_outputs(reply, self._inference_timeout_s)
                if outputs is None:
                    return
                yield unbatch_outputs(config, outputs, sample)
        finally:
            call.cancel()
            reader.join()


def _read_replies(call: Any, replies: queue.SimpleQueue[_Reply]) -> None:
    """Move a call's replies into a queue, then the error that ended it or None."""
    try:
        for reply in call:
            replies.put(reply)
    except grpc.RpcError as error:
        replies.put(error)
    else:
        replies.put(None)
