"""Access tokens in requests: the header (HTTP) or metadata key (gRPC) a server's restricted APIs expect.

A server with the default TritonSecurityConfig guards its model-repository, statistics, trace, logging and
shared-memory APIs with a token (`Triton.get_access_token()`): HTTP requests carry it in the
`triton-access-token` header, gRPC calls in the `triton-grpc-protocol-triton-access-token` metadata key.
"""

from __future__ import annotations

from typing import Dict, Optional

from pytriton.options.access import ACCESS_TOKEN_HEADER, GRPC_HEADER_PREFIX

_GRPC_ACCESS_HEADER = GRPC_HEADER_PREFIX + ACCESS_TOKEN_HEADER


def create_auth_headers(access_token: Optional[str], protocol: str) -> Dict[str, str]:
    """The headers carrying `access_token` for a protocol ("http" or "grpc").

    Examples:
        create_auth_headers("my-token", "http") == {"triton-access-token": "my-token"}
        create_auth_headers("my-token", "grpc") == {"triton-grpc-protocol-triton-access-token": "my-token"}

    Raises:
        ValueError: the token is empty, or the protocol is neither http nor grpc.
    """
    if not access_token:
        raise ValueError("access_token cannot be None or empty")
    protocol = protocol.lower()
    if protocol not in ("http", "grpc"):
        raise ValueError(f"Invalid protocol '{protocol}'. Must be 'http' or 'grpc'")
    return {ACCESS_TOKEN_HEADER if protocol == "http" else _GRPC_ACCESS_HEADER: access_token}


def extract_access_token_from_headers(headers: Optional[Dict[str, str]]) -> Optional[str]:
    """The access token in headers of either form, None when there is none.

    Raises:
        ValueError: both forms are present with different tokens.
    """
    if not headers:
        return None
    http_token = headers.get(ACCESS_TOKEN_HEADER)
    grpc_token = headers.get(_GRPC_ACCESS_HEADER)
    if http_token is not None and grpc_token is not None and http_token != grpc_token:
        raise ValueError(
            f"Conflicting authentication headers found: '{ACCESS_TOKEN_HEADER}' and '{_GRPC_ACCESS_HEADER}' contain "
            "different tokens. Please use consistent tokens."
        )
    return http_token or grpc_token
