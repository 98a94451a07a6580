"""State and settings shared by the model clients: url, model, timeouts, request ids."""

from __future__ import annotations

import itertools
import logging
from types import ModuleType
from typing import Any, Dict, Optional

from pytriton.client._url import TritonUrl

_LOGGER = logging.getLogger(__name__)

DEFAULT_INFERENCE_TIMEOUT_S = 60.0
DEFAULT_INIT_TIMEOUT_S = 300.0
DEFAULT_NETWORK_TIMEOUT_S = 60.0


class BaseModelClient:
    """Base client for a model served over the Triton (KServe v2) protocols."""

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
        """Keep the settings of a client for `model_name` (its latest version when `model_version` is None).

        Args:
            url: server url, e.g. `grpc://localhost:8001`; no scheme means http, no port the scheme's default
                (8000 for http, 8001 for grpc).
            model_name: name of the model.
            model_version: version of the model; None means the latest.
            lazy_init: wait for the model and read its config at the first request instead of at creation.
            init_timeout_s: how long to wait for the server and the model to be ready (default 300 s).
            inference_timeout_s: how long one inference may take (default 60 s).

        Raises:
            PyTritonClientInvalidUrlError: if the url is invalid.
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

    def _client_kwargs(self, scheme: str, network_timeout_s: Optional[float]) -> Dict[str, Any]:
        """Constructor arguments carrying the network timeout (tritonclient's gRPC clients take it per call)."""
        return {}

    def _next_request_id(self) -> str:
        """A fresh request id."""
        return str(next(self._request_ids))

    @property
    def _is_grpc(self) -> bool:
        """Whether this client speaks gRPC."""
        return self._triton_url.scheme == "grpc"
