"""Raw HTTP calls for tests that must see exactly what goes over the wire."""

from __future__ import annotations

import http.client
import json
from typing import Any, Dict, Optional, Tuple, Union


def request(
    port: int,
    method: str,
    path: str,
    body: Union[bytes, str, None] = None,
    headers: Optional[Dict[str, str]] = None,
) -> Tuple[int, Dict[str, str], bytes]:
    """Send one request on a fresh connection; return status, lower-case headers and body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        payload = body.encode() if isinstance(body, str) else body
        connection.request(method, path, body=payload, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def post_json(port: int, path: str, document: Any, headers: Optional[Dict[str, str]] = None) -> Tuple[int, Any]:
    """POST a JSON document; return status and the decoded JSON answer (None when empty)."""
    status, _, body = request(port, "POST", path, json.dumps(document), headers)
    return status, json.loads(body) if body else None


def get_json(port: int, path: str, headers: Optional[Dict[str, str]] = None) -> Tuple[int, Any]:
    """GET a path; return status and decoded JSON (None when empty)."""
    status, _, body = request(port, "GET", path, headers=headers)
    return status, json.loads(body) if body else None
