"""DecoupledModelClient: blocking streaming inference (gRPC only) for decoupled models."""

from __future__ import annotations

import queue
import threading
from typing import Any, Dict, Generator, Optional, Union

import grpc
import numpy as np
from tritonclient.grpc import service_pb2_grpc

from pytriton.client._errors import client_error
from pytriton.client._request import Arrays, InferCall, Parameters, unbatch_outputs
from pytriton.client._stream import CHANNEL_OPTIONS, stream_metadata, stream_outputs, stream_request
from pytriton.client._sync import ModelClient
from pytriton.client.exceptions import PyTritonClientClosedError, PyTritonClientTimeoutError
from pytriton.model_config.triton_model_config import TritonModelConfig

_Reply = Union[Any, grpc.RpcError, None]  # a ModelStreamInferResponse, the error that ended the call, or the end


class DecoupledModelClient(ModelClient):
    """Synchronous client for a decoupled model over gRPC: each call yields the responses as they come.

    Examples:
        with DecoupledModelClient("grpc://localhost", "MyModel") as client:
            for result_dict in client.infer_sample(input1_sample):
                print(result_dict)
    """

    _decoupled = True
    _other_kind = "ModelClient"

    def _open(self) -> None:
        """A gRPC channel for the streams, beside the client for health and config requests."""
        self._require_grpc()
        super()._open()
        self._channel = grpc.insecure_channel(self._triton_url.without_scheme, options=CHANNEL_OPTIONS)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    def _close_connections(self) -> None:
        """Close the health/config client and the streaming channel (ending streams in progress)."""
        try:
            super()._close_connections()
        finally:
            self._channel.close()

    def infer_sample(  # type: ignore[override]
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> Generator[Dict[str, np.ndarray], None, None]:
        """Send one sample now; a generator of the model's responses (batch axis removed for batching models).

        The arguments are ModelClient.infer_sample's. Closing the generator cancels the stream; iterating it
        raises PyTritonClientTimeoutError when a response takes longer than inference_timeout_s and
        PyTritonClientInferenceServerError when the model fails.
        """
        return self._stream(InferCall(inputs, named_inputs, parameters, headers, sample=True))

    def infer_batch(  # type: ignore[override]
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> Generator[Dict[str, np.ndarray], None, None]:
        """Send one batch now; a generator of the model's responses (see `infer_sample`)."""
        return self._stream(InferCall(inputs, named_inputs, parameters, headers, sample=False))

    def _stream(self, call: InferCall) -> Generator[Arrays, None, None]:
        """Start the call and a thread reading its replies; return the iterator over the responses."""
        self._check_call(call)
        config = self._ready_config()
        arrays = self._request_arrays(config, call)
        request = stream_request(
            self._model_name, self._model_version, self._next_request_id(), arrays, config, call.parameters
        )
        stream = self._stub.ModelStreamInfer(
            iter([request]), metadata=stream_metadata(self._call_headers(call.headers))
        )
        replies: queue.SimpleQueue[_Reply] = queue.SimpleQueue()
        reader = threading.Thread(
            target=_read_replies, args=(stream, replies), name="pytriton-client-stream", daemon=True
        )
        reader.start()
        return self._responses(stream, reader, replies, config, call.sample)

    def _responses(
        self,
        stream: Any,
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
            stream.cancel()
            reader.join()


def _read_replies(call: Any, replies: queue.SimpleQueue[_Reply]) -> None:
    """Move a call's replies into a queue, then the error that ended it or None."""
    try:
        for reply in call:
            replies.put(reply)
    except grpc.RpcError as error:
        # The error is the call itself, and its traceback's frames (this one's) hold the call: a cycle that only the
        # collector frees, at the latest at exit, where the call's __del__ then waited forever for a lock a daemon
        # thread of grpc's died holding (grpcio 1.67, Python 3.9: the process hung after its last response).
        error.__traceback__ = None
        replies.put(error)
    else:
        replies.put(None)
