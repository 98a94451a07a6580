"""Restricted APIs: Triton's http_restricted_api and grpc_restricted_protocol rules, shared by both transports."""

from __future__ import annotations

import enum
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from pytriton.exceptions import PyTritonValidationError

# The header (HTTP) and metadata key (gRPC, after GRPC_HEADER_PREFIX) an access token travels in, as in
# nvidia-pytriton 0.7.
ACCESS_TOKEN_HEADER = "triton-access-token"
HTTP_DENIED = "This API is restricted, expecting header '{}'"
GRPC_DENIED = "This protocol is restricted, expecting header '{}'"
# A gRPC restriction's key is looked up in the call metadata under this prefix (Triton's rule).
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


class Category(enum.Enum):
    """The API groups a restriction names, as Triton spells them."""

    HEALTH = "health"
    METADATA = "metadata"
    INFERENCE = "inference"
    SHARED_MEMORY = "shared-memory"
    MODEL_CONFIG = "model-config"
    MODEL_REPOSITORY = "model-repository"
    STATISTICS = "statistics"
    TRACE = "trace"
    LOGGING = "logging"
    CUSTOM = "custom"  # pytriton's own: the user's routes and mounted apps on the HTTP port (options/routes.py)


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
# HTTP routes outside /v2/models/{m}, by their path below /v2.
_HTTP_ROUTES: Dict[str, Category] = {
    "": Category.METADATA,
    "health/live": Category.HEALTH,
    "health/ready": Category.HEALTH,
    "models/stats": Category.STATISTICS,
    "logging": Category.LOGGING,
    "trace/setting": Category.TRACE,
}
_HTTP_PREFIXES: Dict[str, Category] = {
    "repository": Category.MODEL_REPOSITORY,
    "systemsharedmemory": Category.SHARED_MEMORY,
    "cudasharedmemory": Category.SHARED_MEMORY,
}
# Actions under /v2/models/{m}[/versions/{v}].
_HTTP_MODEL_ACTIONS: Dict[str, Category] = {
    "": Category.METADATA,
    "ready": Category.HEALTH,
    "config": Category.MODEL_CONFIG,
    "stats": Category.STATISTICS,
    "infer": Category.INFERENCE,
    "generate": Category.INFERENCE,
    "generate_stream": Category.INFERENCE,
    "trace/setting": Category.TRACE,
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

    def http_denial(self, path: str, headers: Mapping[str, str]) -> Optional[str]:
        """The error message for an HTTP request lacking its category's header, or None when it may pass."""
        category = http_category(path)
        restriction = self.rules.get(category) if category is not None else None
        if restriction is None or headers.get(restriction.header.lower()) == restriction.value:
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
        key = restriction.header.lower()
        if any(name == key and value == restriction.value for name, value in metadata):
            return None
        return GRPC_DENIED.format(restriction.header)


def http_category(path: str) -> Optional[Category]:
    """The category of an HTTP path; one outside /v1 and /v2 is a custom route's (options/routes.py)."""
    parts: List[str] = path.strip("/").split("/")
    if parts[0] == "v1":  # the OpenAI API (transport/openai): its listing is metadata, the rest inference
        return Category.METADATA if parts[1:2] == ["models"] else Category.INFERENCE
    if parts[0] != "v2":
        return Category.CUSTOM
    rest = parts[1:]
    if len(rest) >= 2 and rest[0] == "models" and rest[1] != "stats":
        action = rest[2:]
        if len(action) >= 2 and action[0] == "versions":
            action = action[2:]
        return _HTTP_MODEL_ACTIONS.get("/".join(action))
    route = "/".join(rest)
    if route in _HTTP_ROUTES:
        return _HTTP_ROUTES[route]
    return _HTTP_PREFIXES.get(rest[0])


def token_rules(categories: Iterable[str], token: Optional[str], *, header_prefix: str = "") -> AccessRules:
    """Rules that restrict `categories` (Triton's names) to calls carrying `token` in ACCESS_TOKEN_HEADER.

    No token restricts nothing (an empty list of categories generates none, as in nvidia-pytriton 0.7).
    """
    if not token:
        return AccessRules()
    restriction = Restriction(header_prefix + ACCESS_TOKEN_HEADER, token)
    return AccessRules({Category(name): restriction for name in categories})


def parse_rules(text: Optional[str], *, option: str, header_prefix: str = "", kind: str = "api") -> AccessRules:
    """Parse `<api>,<api>,...:<key>=<value>` groups separated by ';' (Triton repeats the option instead).

    Args:
        text: the option's value; None or empty restricts nothing.
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
                category = Category(name.strip())
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


def _groups(text: Optional[str]) -> List[str]:
    """The non-empty ';'-separated groups of an option value."""
    return [group.strip() for group in (text or "").split(";") if group.strip()]


def _split_group(group: str, option: str) -> Tuple[Sequence[str], str, str]:
    """`<apis>:<key>=<value>` -> (apis, key, value); the first ':' and the first '=' after it split."""
    names, colon, setting = group.partition(":")
    key, equals, value = setting.partition("=")
    if not (colon and equals and names and key and value):
        raise PyTritonValidationError(
            f"TritonConfig.{option} format is '<apis>:<key>=<value>' (groups separated by ';'), got '{group}'"
        )
    return names.split(","), key, value
