"""TritonSecurityConfig: the access token that guards Triton's administrative APIs, as in nvidia-pytriton 0.7.

By default a server restricts the shared-memory, model-repository, statistics, trace and logging APIs to
calls carrying a token generated for it: the HTTP header `triton-access-token`, or the gRPC metadata key
`triton-grpc-protocol-triton-access-token`. `Triton.get_access_token()` returns it.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from typing import List, Optional

from pytriton.exceptions import PyTritonValidationError
from pytriton.options.access import ACCESS_TOKEN_HEADER, Category

# The API names a restriction may list (Triton's).
VALID_TRITON_ENDPOINTS = {category.value for category in Category if category is not Category.CUSTOM}
# pytriton's own besides: "custom", the routes and apps added with Triton.add_route and Triton.mount.
_VALID_ENDPOINTS = VALID_TRITON_ENDPOINTS | {Category.CUSTOM.value}
# The APIs a default server restricts to its access token.
DEFAULT_PROTECTED_ENDPOINTS = ["shared-memory", "model-repository", "statistics", "trace", "logging"]
TRITON_ACCESS_HEADER = ACCESS_TOKEN_HEADER
# The variable an OpenAI API key is read from when TritonSecurityConfig names none.
OPENAI_API_KEY_VARIABLE = "PYTRITON_OPENAI_API_KEY"


@dataclasses.dataclass
class TritonSecurityConfig:
    """Which APIs need an access token, and the token.

    Args:
        access_token: the token; None generates one (when any endpoint is restricted).
        restricted_endpoints: the APIs that need it; None means DEFAULT_PROTECTED_ENDPOINTS, [] none at all.
        openai_api_key: the key the OpenAI API (/v1, docs/openai.md) asks of clients as `Authorization: Bearer
            <key>` (401 without it); None reads PYTRITON_OPENAI_API_KEY, and without it asks no key.

    Raises:
        PyTritonValidationError: an endpoint name is not one of VALID_TRITON_ENDPOINTS.
    """

    access_token: Optional[str] = None
    restricted_endpoints: Optional[List[str]] = None
    openai_api_key: Optional[str] = None

    def __post_init__(self) -> None:
        """Apply the defaults and check the endpoint names."""
        if self.restricted_endpoints is None:
            self.restricted_endpoints = list(DEFAULT_PROTECTED_ENDPOINTS)
        invalid = set(self.restricted_endpoints) - _VALID_ENDPOINTS
        if invalid:
            raise PyTritonValidationError(
                f"Invalid endpoint names: {', '.join(sorted(invalid))}. "
                f"Valid endpoints are: {', '.join(sorted(_VALID_ENDPOINTS))}"
            )
        if self.openai_api_key is None:
            self.openai_api_key = os.environ.get(OPENAI_API_KEY_VARIABLE) or None
        if self.access_token is None and self.restricted_endpoints:
            self.access_token = secrets.token_urlsafe(32)
