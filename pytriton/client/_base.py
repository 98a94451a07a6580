"""The core every model client shares: settings, access token, readiness state and building a request."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from types import ModuleType
from typing import Any, Dict, Optional, Type, TypeVar

from pytriton.client._request import (
    Arrays,
    InferCall,
    Parameters,
    batch_inputs,
    check_call,
    header_values,
    infer_inputs,
    name_inputs,
    requested_outputs,
)
from pytriton.client._state import ModelRef
from pytriton.client._url import TritonUrl
from pytriton.client.auth import create_auth_headers, extract_access_token_from_headers
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientValueError,
)
from pytriton.model_config.triton_model_config import TritonModelConfig

_LOGGER = logging.getLogger(__name__)
_Client = TypeVar("_Client", bound="BaseModelClient")

DEFAULT_INFERENCE_TIMEOUT_S = 60.0
DEFAULT_INIT_TIMEOUT_S = 300.0
DEFAULT_NETWORK_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class ClientSettings:
    """What a model client is created with, to create another one alike (from_existing_client, futures threads)."""

    url: str
    model_name: str
    model_version: Optional[str]
    init_timeout_s: Optional[float]
    inference_timeout_s: Optional[float]
    access_token: Optional[str]

    def create(self, cls: Type[_Client], **options: Any) -> _Client:
        """A `cls` client with these settings and `options` (`model_config`, `ensure_model_is_ready`, ...)."""
        return cls(
            self.url,
            self.model_name,
            self.model_version,
            init_timeout_s=self.init_timeout_s,
            inference_timeout_s=self.inference_timeout_s,
            access_token=self.access_token,
            **options,
        )


class BaseModelClient:
    """Base client for a model served over the Triton (KServe v2) protocols."""

    # Whether the client serves decoupled models, and the client to use for the other kind.
    _decoupled = False
    _other_kind = "DecoupledModelClient"

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: Optional[str] = None,
        *,
        lazy_init: bool = True,
        init_timeout_s: Optional[float] = None,
        inference_timeout_s: Optional[float] = None,
        model_config: Optional[TritonModelConfig] = None,
        ensure_model_is_ready: bool = True,
        access_token: Optional[str] = None,
    ) -> None:
        """Create a client for `model_name` on the server at `url`.

        Args:
            url: server url, e.g. `grpc://localhost:8001`; no scheme means http, no port the scheme's default
                (8000 for http, 8001 for grpc).
            model_name: name of the model.
            model_version: version of the model; None means the latest.
            lazy_init: wait for the model and read its config at the first request instead of at creation
                (asyncio clients: in `__aenter__`).
            init_timeout_s: how long to wait for the server and the model to be ready (default 300 s).
            inference_timeout_s: how long one inference may take (default 60 s).
            model_config: the model's config, so that it is not read from the server.
            ensure_model_is_ready: with a `model_config`, still wait for the model to be ready before the
                first request (False: send at once).
            access_token: the server's access token (`Triton.get_access_token()`), sent with every call.

        Raises:
            PyTritonClientInvalidUrlError: if the url is invalid.
            PyTritonClientValueError: if the client does not speak the url's protocol.
            PyTritonClientTimeoutError: if lazy_init is False and the model is not ready within init_timeout_s.
            PyTritonClientModelUnavailableError: if lazy_init is False and the model config cannot be obtained.
        """
        self._url = url
        self._triton_url = TritonUrl.from_url(url)
        self._model_name = model_name
        self._model_version = None if model_version is None else str(model_version)
        self._lazy_init = lazy_init
        self._init_timeout_s = DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else init_timeout_s
        self._inference_timeout_s = DEFAULT_INFERENCE_TIMEOUT_S if inference_timeout_s is None else inference_timeout_s
        self._network_timeout_s = min(DEFAULT_NETWORK_TIMEOUT_S, self._init_timeout_s)
        self._request_ids = itertools.count()
        self._model_config = model_config
        # Whether requests may go without waiting for the model: a config was handed over and no wait asked.
        self._model_ready = model_config is not None and not ensure_model_is_ready
        self._headers = create_auth_headers(access_token, self._triton_url.scheme) if access_token else None
        self._closed = False
        self._open()
        self._initialize()

    @classmethod
    def from_existing_client(cls: Type[_Client], existing_client: BaseModelClient) -> _Client:
        """A new client of this class with another client's settings, model config and access token.

        The new client does not read the config or wait for the model again.
        """
        settings = ClientSettings(
            existing_client._url,
            existing_client._model_name,
            existing_client._model_version,
            existing_client._init_timeout_s,
            existing_client._inference_timeout_s,
            extract_access_token_from_headers(existing_client._headers),
        )
        return settings.create(cls, model_config=existing_client._model_config, ensure_model_is_ready=False)

    def get_lib(self) -> ModuleType:
        """The tritonclient module this client uses for its url's scheme."""
        raise NotImplementedError

    def create_client_from_url(self, url: str, network_timeout_s: Optional[float] = None) -> Any:
        """Create a tritonclient client (of `get_lib()`) for `url`, with `network_timeout_s` where it applies.

        Raises:
            PyTritonClientInvalidUrlError: if the url is invalid.
        """
        triton_url = TritonUrl.from_url(url)
        kwargs = self._client_kwargs(triton_url.scheme, network_timeout_s)
        _LOGGER.debug("Creating InferenceServerClient for %s with %s", triton_url.with_scheme, kwargs)
        return self.get_lib().InferenceServerClient(triton_url.without_scheme, **kwargs)

    def _open(self) -> None:
        """Create what the client needs to talk to the server (called at the end of `__init__`)."""

    def _initialize(self) -> None:
        """Without lazy_init, get ready for requests now (called after `_open`)."""

    def _client_kwargs(self, scheme: str, network_timeout_s: Optional[float]) -> Dict[str, Any]:
        """Constructor arguments carrying the network timeout (tritonclient's gRPC clients take it per call)."""
        return {}

    @property
    def _model_ref(self) -> ModelRef:
        """The model and the access token's headers, for the readiness and config helpers."""
        return ModelRef(self._model_name, self._model_version, self._headers)

    def _next_request_id(self) -> str:
        """A fresh request id."""
        return str(next(self._request_ids))

    @property
    def _is_grpc(self) -> bool:
        """Whether this client speaks gRPC."""
        return self._triton_url.scheme == "grpc"

    def _check_open(self) -> None:
        """Refuse use after close.

        Raises:
            PyTritonClientClosedError: if the client is closed.
        """
        if self._closed:
            raise PyTritonClientClosedError(f"{self._closed_name} is closed")

    @property
    def _closed_name(self) -> str:
        """The name a closed client calls itself: 0.7's DecoupledModelClient is a ModelClient that says so."""
        return type(self).__name__

    def _require_grpc(self) -> None:
        """Refuse a url of another protocol (the decoupled clients stream over gRPC only).

        Raises:
            PyTritonClientValueError: if the url's scheme is not grpc.
        """
        if not self._is_grpc:
            raise PyTritonClientValueError(f"{type(self).__name__} is only supported for grpc protocol")

    def _check_call(self, call: InferCall) -> None:
        """Check an infer call's arguments, and that the client is open (see `check_call`)."""
        check_call(call.inputs, call.named_inputs, call.parameters, call.headers)
        self._check_open()

    def _call_headers(self, headers: Optional[Parameters] = None) -> Optional[Dict[str, str]]:
        """The access token's headers and a call's own, as strings (gRPC metadata keys lowercase)."""
        merged: Dict[str, Any] = {**(self._headers or {}), **(headers or {})}
        return header_values(merged, lowercase=self._is_grpc)

    def _request_arrays(self, config: TritonModelConfig, call: InferCall) -> Arrays:
        """The arrays a request sends (named, a batch axis added to a sample), for a model of this client's kind.

        Raises:
            PyTritonClientInferenceServerError: if the model is (not) decoupled unlike this client.
            PyTritonClientValueError: if an input is not a supported array or there are too many.
            PyTritonClientModelDoesntSupportBatchingError: if a batch is given to a model without batching.
        """
        if config.decoupled != self._decoupled:
            kind = "decoupled" if config.decoupled else "coupled"
            raise PyTritonClientInferenceServerError(f"Model config is {kind}. Use {self._other_kind} instead.")
        return batch_inputs(config, name_inputs(config, call.inputs, call.named_inputs), call.sample)

    def _infer_arguments(self, config: TritonModelConfig, arrays: Arrays, call: InferCall) -> Dict[str, Any]:
        """The arguments of tritonclient's `infer` for one request (gRPC takes the inference timeout per call)."""
        lib = self.get_lib()
        arguments: Dict[str, Any] = {
            "model_name": self._model_name,
            "model_version": self._model_version or "",
            "inputs": infer_inputs(lib, arrays),
            "outputs": requested_outputs(lib, config),
            "request_id": self._next_request_id(),
            "parameters": call.parameters,
            "headers": self._call_headers(call.headers),
        }
        if self._is_grpc:
            arguments["client_timeout"] = self._inference_timeout_s
        return arguments
