"""The HTTP port's routes: which route a path is, the handler that serves it, and the category that restricts it.

One table (ROUTES) for both: the HTTP app routes each request by it (transport/http/app.py calls the handler a
route names) and the restricted-API rules read the category of the route found (options/access.py), so a route
cannot be added without its category. Paths outside /v2 belong to the OpenAI API (/v1) or to the user's routes.
"""

from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from pytriton.options.categories import Category


class HttpRoute(NamedTuple):
    """A route of Triton's HTTP API.

    `handler` names the HTTP app's method that serves it (HttpFrontend's `_<handler>`), called with the path's
    parameters by name, and `action` too where it is not empty (one handler serving several routes).
    """

    handler: str
    category: Category
    action: str = ""


_MR = Category.MODEL_REPOSITORY
_SM = Category.SHARED_MEMORY
# Triton's routes. `{name}`: a segment, handed to the handler as `name` (its kind: _PARAMETERS); `[...]`: a part
# that may be left out. Where two match a path, one that ends in a fixed segment wins, then the first listed.
ROUTES: Tuple[Tuple[str, HttpRoute], ...] = (
    ("/v2", HttpRoute("server_metadata", Category.METADATA)),
    ("/v2/health/live", HttpRoute("server_live", Category.HEALTH)),
    ("/v2/health/ready", HttpRoute("server_ready", Category.HEALTH)),
    ("/v2/models/stats", HttpRoute("server_statistics", Category.STATISTICS)),  # before a model named "stats"
    ("/v2/logging", HttpRoute("logging", Category.LOGGING)),
    ("/v2/trace/setting", HttpRoute("trace_setting", Category.TRACE)),
    ("/v2/models/{model}[/versions/{version}]", HttpRoute("model_metadata", Category.METADATA)),
    ("/v2/models/{model}[/versions/{version}]/ready", HttpRoute("model_ready", Category.HEALTH)),
    ("/v2/models/{model}[/versions/{version}]/config", HttpRoute("model_config", Category.MODEL_CONFIG)),
    ("/v2/models/{model}[/versions/{version}]/stats", HttpRoute("model_statistics", Category.STATISTICS)),
    ("/v2/models/{model}[/versions/{version}]/infer", HttpRoute("infer", Category.INFERENCE)),
    ("/v2/models/{model}[/versions/{version}]/generate", HttpRoute("generate", Category.INFERENCE)),
    ("/v2/models/{model}[/versions/{version}]/generate_stream", HttpRoute("generate_stream", Category.INFERENCE)),
    ("/v2/models/{model}/trace/setting", HttpRoute("model_trace_setting", Category.TRACE)),  # Triton's: no version
    ("/v2/repository[/{repository}]/index", HttpRoute("repository_index", _MR)),
    ("/v2/repository/models/{name}/load", HttpRoute("repository_load", _MR, "load")),
    ("/v2/repository/models/{name}/unload", HttpRoute("repository_load", _MR, "unload")),
    ("/v2/repository/{repository}/models/{name}/load", HttpRoute("repository_named", _MR)),
    ("/v2/repository/{repository}/models/{name}/unload", HttpRoute("repository_named", _MR)),
    ("/v2/systemsharedmemory[/region/{region}]/status", HttpRoute("system_shared_memory", _SM, "status")),
    ("/v2/systemsharedmemory[/region/{region}]/register", HttpRoute("system_shared_memory", _SM, "register")),
    ("/v2/systemsharedmemory[/region/{region}]/unregister", HttpRoute("system_shared_memory", _SM, "unregister")),
    ("/v2/cudasharedmemory[/region/{region}]/status", HttpRoute("cuda_shared_memory", _SM, "status")),
    ("/v2/cudasharedmemory[/region/{region}]/register", HttpRoute("cuda_shared_memory", _SM, "register")),
    ("/v2/cudasharedmemory[/region/{region}]/unregister", HttpRoute("cuda_shared_memory", _SM, "unregister")),
)
# What each parameter's segment may be. A model's name may hold an encoded "/" (tritonclient encodes names);
# the handlers of the others refuse one with a 404, after the route's category has been checked.
_PARAMETERS: Dict[str, Callable[[str], bool]] = {
    "model": bool,  # not empty
    "version": lambda segment: segment.isascii() and segment.isdigit(),
    "region": bool,
    "repository": bool,  # Triton ignores the name (index) or refuses it (501), but its routes want one
    "name": bool,  # a repository's model: tritonserver 2.51 answers 404 to an empty one, as to an empty region
}
# The OpenAI API's paths (transport/openai/app.py routes them): its listing is metadata, the rest inference.
_OPENAI_METADATA = "models"

Found = Tuple[HttpRoute, Dict[str, str]]


class _Pattern(NamedTuple):
    """A route's path as checked: each segment not in its index key, fixed (`check` None) or a parameter."""

    route: HttpRoute
    checks: Tuple[Tuple[int, str, Optional[Callable[[str], bool]]], ...]
    parameters: Tuple[Tuple[str, int], ...]


def _expand(template: str) -> List[str]:
    """A template's paths: with and without its optional part."""
    head, bracket, rest = template.partition("[")
    if not bracket:
        return [template]
    optional, _, tail = rest.partition("]")
    return [head + optional + tail, head + tail]


def _compile() -> Tuple[Dict[Tuple[int, str], List[_Pattern]], Dict[int, List[_Pattern]]]:
    """ROUTES indexed by segment count and last segment (those that end in a fixed one), or by count alone."""
    by_end: Dict[Tuple[int, str], List[_Pattern]] = {}
    by_count: Dict[int, List[_Pattern]] = {}
    for template, route in ROUTES:
        for path in _expand(template):
            segments = path.split("/")
            last = segments[-1]
            ends_fixed = not last.startswith("{")
            checks: List[Tuple[int, str, Optional[Callable[[str], bool]]]] = []
            parameters: List[Tuple[str, int]] = []
            for position, segment in enumerate(segments):
                if segment.startswith("{"):
                    name = segment[1:-1]
                    checks.append((position, name, _PARAMETERS[name]))
                    parameters.append((name, position))
                elif not (ends_fixed and position == len(segments) - 1):
                    checks.append((position, segment, None))
            pattern = _Pattern(route, tuple(checks), tuple(parameters))
            if ends_fixed:
                by_end.setdefault((len(segments), last), []).append(pattern)
            else:
                by_count.setdefault(len(segments), []).append(pattern)
    return by_end, by_count


_BY_END, _BY_COUNT = _compile()


def find_route(parts: Sequence[str]) -> Optional[Found]:
    """The route of a path's segments (transport/http/app.path_segments: "" first) and its parameters by name.

    None where Triton's routes find nothing (404): outside /v2, a version not of digits, a model's trace setting
    with a version, an unknown action, an empty model name or region, an empty segment or a trailing slash.
    """
    count = len(parts)
    for pattern in _BY_END.get((count, parts[-1]), ()):
        if _matches(pattern, parts):
            return _found(pattern, parts)
    for pattern in _BY_COUNT.get(count, ()):
        if _matches(pattern, parts):
            return _found(pattern, parts)
    return None


def _matches(pattern: _Pattern, parts: Sequence[str]) -> bool:
    """Whether the segments a pattern checks are its own."""
    for position, text, check in pattern.checks:
        segment = parts[position]
        if not (check(segment) if check is not None else segment == text):
            return False
    return True


def _found(pattern: _Pattern, parts: Sequence[str]) -> Found:
    """A matched pattern's route and its parameters (and action)."""
    parameters = {name: parts[position] for name, position in pattern.parameters}
    route = pattern.route
    if route.action:
        parameters["action"] = route.action
    return route, parameters


def http_category(path: Union[str, Sequence[str]]) -> Optional[Category]:
    """The category of an HTTP path, or of its segments (transport/http/app.path_segments: "" first).

    Under /v2, its route's (find_route), None where there is none (404); under /v1 the OpenAI API's;
    elsewhere a custom route's (options/routes.py).
    """
    parts: List[str] = path.split("/") if isinstance(path, str) else list(path)
    if parts[1:2] == ["v1"]:
        return Category.METADATA if parts[2:3] == [_OPENAI_METADATA] else Category.INFERENCE
    if parts[:2] != ["", "v2"]:
        return Category.CUSTOM
    found = find_route(parts)
    return found[0].category if found is not None else None
