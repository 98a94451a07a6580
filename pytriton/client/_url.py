"""Server url parsing: scheme (http or grpc), host and port."""

from __future__ import annotations

import dataclasses
import urllib.parse

from pytriton.client.exceptions import PyTritonClientInvalidUrlError
from pytriton.constants import DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT

_DEFAULT_PORTS = {"http": DEFAULT_HTTP_PORT, "grpc": DEFAULT_GRPC_PORT}


@dataclasses.dataclass(frozen=True)
class TritonUrl:
    """A parsed server url.

    Examples:
        TritonUrl.from_url("localhost") == TritonUrl("http", "localhost", 8000)
        TritonUrl.from_url("grpc://localhost").without_scheme == "localhost:8001"
    """

    scheme: str
    hostname: str
    port: int

    @classmethod
    def from_url(cls, url: str) -> TritonUrl:
        """Parse a url; no scheme means http, no port means the scheme's default port (8000 http, 8001 grpc).

        Raises:
            PyTritonClientInvalidUrlError: if the url is not a string, its scheme is neither http nor grpc,
                or its host or port is invalid.
        """
        if not isinstance(url, str):
            raise PyTritonClientInvalidUrlError(f"Invalid url {url}. Url must be a string.")
        parsed = urllib.parse.urlparse(url)
        if (not parsed.scheme and "://" not in parsed.path) or (parsed.scheme and not parsed.netloc):
            # "host" and "host:port" parse as a path, or as a scheme with no netloc
            parsed = urllib.parse.urlparse(f"http://{url}")
        scheme = parsed.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise PyTritonClientInvalidUrlError(f"Invalid url {url}. Only grpc and http are supported.")
        try:
            port = parsed.port
        except ValueError as error:
            raise PyTritonClientInvalidUrlError(f"Invalid url {url}: {error}") from error
        if not parsed.hostname:
            raise PyTritonClientInvalidUrlError(f"Invalid url {url}: no host.")
        return cls(scheme, parsed.hostname, port or _DEFAULT_PORTS[scheme])

    @property
    def without_scheme(self) -> str:
        """host:port, as tritonclient takes it."""
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{host}:{self.port}"

    @property
    def with_scheme(self) -> str:
        """scheme://host:port."""
        return f"{self.scheme}://{self.without_scheme}"
