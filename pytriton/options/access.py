"""Restricted APIs: Triton's http_restricted_api and grpc_restricted_protocol rules, shared by both transports."""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from pytriton.exceptions import PyTritonValidationError
from pytriton.options.categories import Category
from pytriton.options.http_routes import http_category

__all__ = [  # Category and http_category are imported from here too
    "ACCESS_TOKEN_HEADER",
    "GRPC_METHOD_CATEGORIES",
    "AccessRules",
    "Category",
    "Restriction",
    "http_category",
    "parse_rules",
    "token_rules",
]

# The header (HTTP) and metadata key (gRPC, after GRPC_HEADER_PREFIX) an access token travels in, as in
# nvidia-pytriton 0.7.
ACCESS_TOKEN_HEADER = "triton-access-token"
HTTP_DENIED = "This API is restricted, expecting header '{}'"
GRPC_DENIED = "This protocol is restricted, expecting header '{}'"
# A gRPC restriction's key is looked up in the call metadata under this prefix (Triton's rule).
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


class Restriction(NamedTuple):
    """The header a restricted call must carry, and its value."""

    header: str
    value: str


# gRPC method -> the category restricting it.
GRPC_METHOD_CATEGORIES: Dict[str, Category] = {
    "ServerLive": Category.HEALTH,
    "ServerReady": Category.HEALTH,
    "Check": Category.HEALTH,  # grpc.health.v1.Health's, as Triton restricts it
    "ModelReady": Category.HEALTH,
    "ServerMetadata": Category.METADATA,
    "ModelMetadata": Category.METADATA,
    "ModelInfer": Category.INFERENCE,
    "ModelStreamInfer": Category.INFERENCE,
    "ModelConfig": Category.MODEL_CONFIG,
    "ModelStatistics": Category.STATISTICS,
    "RepositoryIndex": Category.MODEL_REPOSITORY,
    "RepositoryModelLoad": Category.MODEL_REPOSITORY,
    "RepositoryModelUnload": Category.MODEL_REPOSITORY,
    "SystemSharedMemoryStatus": Category.SHARED_MEMORY,
    "SystemSharedMemoryRegister": Category.SHARED_MEMORY,
    "SystemSharedMemoryUnregister": Category.SHARED_MEMORY,
    "CudaSharedMemoryStatus": Category.SHARED_MEMORY,
    "CudaSharedMemoryRegister": Category.SHARED_MEMORY,
    "CudaSharedMemoryUnregister": Category.SHARED_MEMORY,
    "TraceSetting": Category.TRACE,
    "LogSettings": Category.LOGGING,
}


class AccessRules:
    """Which API categories need which header; an empty set of rules restricts nothing."""

    def __init__(self, rules: Optional[Mapping[Category, Restriction]] = None) -> None:
        """Create rules from a category -> restriction map."""
        self.rules: Dict[Category, Restriction] = dict(rules or {})

    def __bool__(self) -> bool:
        """Whether anything is restricted."""
        return bool(self.rules)

    def over(self, defaults: AccessRules) -> AccessRules:
        """These rules, and `defaults` for the categories these do not name."""
        return AccessRules({**defaults.rules, **self.rules})

    def http_denial(self, category: Optional[Category], headers: Iterable[Tuple[bytes, bytes]]) -> Optional[str]:
        """The error message for an HTTP request lacking its category's header, or None when it may pass.

        `category` is that of the route the request's path found (options/http_routes.py), None for none;
        `headers` the request's, as ASGI gives them. A header sent twice is read at its first value, as Triton's
        (libevhtp) reads it. A value that is not ASCII must be the configured one in UTF-8.
        """
        restriction = self.rules.get(category) if category is not None else None
        if restriction is None:
            return None
        name = restriction.header.lower().encode("latin-1")
        sent = next((value for key, value in headers if key.lower() == name), None)
        if sent == restriction.value.encode("utf-8"):  # byte for byte, as Triton compares its argv's UTF-8
            return None
        return HTTP_DENIED.format(restriction.header)

    def restricts_grpc(self, method: str) -> bool:
        """Whether calls of a gRPC method need a header."""
        category = GRPC_METHOD_CATEGORIES.get(method)
        return category is not None and category in self.rules

    def grpc_denial(self, method: str, metadata: Iterable[Tuple[str, object]]) -> Optional[str]:
        """The error message for a gRPC call lacking its category's metadata, or None when it may pass."""
        category = GRPC_METHOD_CATEGORIES.get(method)
        restriction = self.rules.get(category) if category is not None else None
        if restriction is None:
            return None
        key = restriction.header.lower()  # Triton compares its key as given: one with capitals never matches
        sent = next((value for name, value in metadata if name == key), None)  # the first, as Triton's multimap
        expected = restriction.value.encode("utf-8") if isinstance(sent, bytes) else restriction.value
        if sent == expected:  # bytes: a `-bin` key's value, base64-decoded, compared as Triton compares it
            return None
        return GRPC_DENIED.format(restriction.header)


def token_rules(categories: Iterable[str], token: Optional[str], *, header_prefix: str = "") -> AccessRules:
    """Rules that restrict `categories` (Triton's names) to calls carrying `token` in ACCESS_TOKEN_HEADER.

    No token restricts nothing (an empty list of categories generates none, as in nvidia-pytriton 0.7).
    """
    if not token:
        return AccessRules()
    restriction = Restriction(header_prefix + ACCESS_TOKEN_HEADER, token)
    return AccessRules({Category(name): restriction for name in categories})


def parse_rules(
    text: Union[str, Sequence[str], None], *, option: str, header_prefix: str = "", kind: str = "api"
) -> AccessRules:
    """Parse `<api>,<api>,...:<key>=<value>` groups separated by ';' (Triton repeats the option instead).

    Args:
        text: the option's value; None or empty restricts nothing. A list or tuple holds one value per
            item, as nvidia-pytriton 0.7 passes each item to tritonserver as an option of its own.
        option: the option name, for error messages.
        header_prefix: prepended to each key (gRPC metadata keys are `triton-grpc-protocol-<key>`).
        kind: "api" (HTTP) or "protocol" (gRPC), for error messages.

    Raises:
        PyTritonValidationError: a group is malformed, names an unknown API, or repeats an API.
    """
    rules: Dict[Category, Restriction] = {}
    for group in _groups(text):
        names, key, value = _split_group(group, option)
        for name in names:
            try:
                category = Category(name)  # as written: tritonserver refuses " metadata" in "health, metadata"
            except ValueError:
                known = ", ".join(member.value for member in Category)
                raise PyTritonValidationError(
                    f"TritonConfig.{option}: unknown restricted {kind} '{name}'; known: {known}"
                ) from None
            if category in rules:
                raise PyTritonValidationError(
                    f"TritonConfig.{option}: restricted {kind} '{name}' can not be specified in multiple config groups"
                )
            rules[category] = Restriction(header_prefix + key, value)
    return AccessRules(rules)


def _groups(text: Union[str, Sequence[str], None]) -> List[str]:
    """The non-empty ';'-separated groups of an option value, or of each of its items."""
    values = [text] if text is None or isinstance(text, str) else list(text)
    return [group.strip() for value in values for group in (value or "").split(";") if group.strip()]


def _split_group(group: str, option: str) -> Tuple[Sequence[str], str, str]:
    """`<apis>:<key>=<value>` -> (apis, key, value); the first ':' and the first '=' after it split."""
    names, colon, setting = group.partition(":")
    key, equals, value = setting.partition("=")
    if not (colon and equals and names and key and value):
        raise PyTritonValidationError(
            f"TritonConfig.{option} format is '<apis>:<key>=<value>' (groups separated by ';'), got '{group}'"
        )
    return names.split(","), key, value
