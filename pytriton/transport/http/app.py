"""The HTTP/REST frontend: a plain ASGI app that translates KServe v2 requests to and from the engine."""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple, Union
from urllib.parse import unquote

import orjson

from pytriton.core.errors import InferenceError, exception_text
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.request_spans import NO_STAMPS, FixedStamps, FrontendTrace, TracedResponse, mark_arrival
from pytriton.core.serving import ServingEngine
from pytriton.core.shared_memory.off_loop import read_off_loop, write_off_loop
from pytriton.core.shared_memory.system import Read, SystemSharedMemory, WriteRun
from pytriton.core.spec import ModelSpec
from pytriton.core.tensors.raw_tensors import unchanging
from pytriton.options.access import AccessRules
from pytriton.options.header_forwarding import forward_pattern
from pytriton.options.http_routes import ROUTES, find_route, http_category
from pytriton.options.limits import DEFAULT_MAX_INFLATED_BYTES
from pytriton.options.log_trace import ServerSettings, trace_changes_from_json
from pytriton.options.routes import CustomRoutes
from pytriton.protocol import config_override, documents, json_text, openai_codec
from pytriton.protocol.codec_place import ON_LOOP, OffLoop
from pytriton.protocol.generate_codec import decode_generate_request, encode_generate_response
from pytriton.protocol.http_codec import (
    Body,
    OutputFormat,
    decode_infer_request,
    encode_infer_response,
    parse_json_members,
)
from pytriton.transport import codec_threads
from pytriton.transport.codec_threads import OFF_LOOP_JOIN_BYTES
from pytriton.transport.deflate import compressed
from pytriton.transport.http import cuda_memory, system_memory
from pytriton.transport.http.custom import serve_custom
from pytriton.transport.http.cycle import BODY_PARTS, HEADER_NAMES
from pytriton.transport.http.responses import (
    JSON_TYPE,
    OCTET_TYPE,
    PLAIN_TYPE,
    Message,
    Receive,
    Scope,
    Send,
    send_empty,
    send_error,
    send_json,
    until_disconnect,
)
from pytriton.transport.inflate import Failure, InflateError, InflationBudget, inflate

LOGGER = logging.getLogger(__name__)

# Responses at least this large leave as views of their outputs (writev); smaller ones cost less joined.
_SCATTER_BYTES = 64 * 1024
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


_JSON = (JSON_TYPE,)
_PLAIN = (PLAIN_TYPE,)
_UNDONE = (JSON_TYPE, (b"accept-encoding", b"gzip, deflate"))  # the codings a request body may come in


class HttpError(Exception):
    """A transport-level failure with its HTTP status, and the headers of its answer (its content type)."""

    def __init__(self, status: int, message: str, headers: Sequence[Any] = _JSON) -> None:
        """Create an error with a status and a message."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def _plain(status: int, message: str) -> HttpError:
    """An error Triton answers before its handler has set a content type: libevhtp's text/plain goes out."""
    return HttpError(status, message, _PLAIN)


def _untyped(error: Exception) -> Exception:
    """`error` (an HttpError or InferenceError) answered as Triton answers it before its handler set a content type."""
    if isinstance(error, InferenceError):
        return _plain(error.status.http_status, error.message)
    if isinstance(error, HttpError):
        return HttpError(error.status, error.message, [_PLAIN[0], *error.headers[1:]])
    return error


class HttpFrontend:
    """ASGI application serving Triton's HTTP API over an engine."""

    def __init__(
        self,
        engine: ServingEngine,
        *,
        server_version: str,
        header_forward_pattern: Optional[str] = None,
        max_body_bytes: int = 2**31 - 1,
        max_json_bytes: int = 2**31 - 1,
        access: Optional[AccessRules] = None,
        settings: Optional[ServerSettings] = None,
        inflation_budget: Optional[InflationBudget] = None,
        openai: Optional[Any] = None,
        routes: Optional[CustomRoutes] = None,
        trace_stamps: Optional[FixedStamps] = None,
    ) -> None:
        """Create the app; `header_forward_pattern` selects headers handed to callables as parameters.

        `access` restricts API categories to requests carrying a header (http_restricted_api); `settings`
        serves the logging and trace extensions (without it those routes are not found); `inflation_budget`
        bounds what decompressed bodies hold at once (the server's, shared with its other frontends; by
        default the app's own, of ServerLimits' default); `openai` serves the paths under /v1 (the OpenAI API,
        transport/openai/), which Triton's routes leave free; `routes` the user's own routes and mounted apps
        (options/routes.py), outside /v1 and /v2. `trace_stamps`: whether requests are timed for trace files,
        for an app without `settings` (a frontend process's).
        """
        self._engine = engine
        self._server_version = server_version
        self._forward = (
            forward_pattern(header_forward_pattern, "http_header_forward_pattern") if header_forward_pattern else None
        )
        self._max_body_bytes = max_body_bytes
        self._max_json_bytes = max_json_bytes
        self._inflation_budget = inflation_budget or InflationBudget(DEFAULT_MAX_INFLATED_BYTES)
        self._access = access or None
        self._settings = settings
        # Whether trace files' records get this transport's timestamps (`stamps`): only then are they taken.
        self._trace = settings.trace if settings is not None else trace_stamps or NO_STAMPS
        self._openai = openai
        self._routes = routes
        # Each route's handler (options/http_routes.ROUTES names them), bound once.
        self._handlers: Dict[str, Callable[..., Awaitable[None]]] = {
            route.handler: getattr(self, "_" + route.handler) for _, route in ROUTES
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request."""
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        v2 = path.startswith("/v2")  # Triton's routes: the usual case, checked once
        if not v2 and self._openai is not None and path.startswith(openai_codec.PATH_PREFIX):
            await self._openai(scope, receive, send)
            return
        try:
            if not v2 and self._routes:
                match = self._routes.match(path, scope["method"])
                if match is not None:
                    await self._custom(scope, receive, send, match)
                    return
            await self._route(scope, receive, send)
        except InferenceError as error:
            await send_error(send, error.status.http_status, error.message)
        except HttpError as error:
            await send_error(send, error.status, error.message, error.headers)
        except Exception as error:
            LOGGER.exception("unexpected error serving %s %s", scope["method"], scope["path"])
            # Its type when it says nothing: a MemoryError (no room to encode a response) said "internal server error: "
            await send_error(send, 500, f"internal server error: {exception_text(error) or type(error).__name__}")

    async def _custom(self, scope: Scope, receive: Receive, send: Send, match: Any) -> None:
        """A custom route or mounted app (transport/http/custom.py), under the access rules of its category."""
        assert self._routes is not None
        if self._access is not None:
            denial = self._access.http_denial(http_category(scope["path"]), scope["headers"])
            if denial is not None:
                self._routes.count(_label(match, scope["path"]), scope["method"], 403)
                raise HttpError(403, denial)
        await serve_custom(
            self._routes,
            match,
            self._engine,
            scope,
            receive,
            send,
            lambda: read_body(receive, self._max_body_bytes),
        )

    def _route(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """The handler of a request, by its path's route (options/http_routes.py); routing itself awaits nothing."""
        parts = path_segments(scope)
        found = find_route(parts)
        if self._access is not None:  # the category of the route found, or of a path outside /v2
            category = found[0].category if found is not None else http_category(parts)
            denial = self._access.http_denial(category, scope["headers"])
            if denial is not None:
                raise _plain(403, denial)  # Triton refuses before its handler sets a content type
        if found is None:
            raise _plain(404, "Not Found")
        route, parameters = found
        return self._handlers[route.handler](scope, receive, send, **parameters)

    # The handlers ROUTES names (options/http_routes.py), called with the route's parameters by name.

    def _server_metadata(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """GET /v2."""
        _allow(scope["method"], "GET")
        return send_json(send, 200, documents.server_metadata(self._engine.server_name, self._server_version))

    def _server_live(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """GET /v2/health/live (no content type, as Triton's)."""
        _allow(scope["method"], "GET", _PLAIN)
        return send_empty(send, 200 if self._engine.live else 400, _PLAIN)

    def _server_ready(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """GET /v2/health/ready (no content type, as Triton's)."""
        _allow(scope["method"], "GET", _PLAIN)
        return send_empty(send, 200 if self._engine.ready else 400, _PLAIN)

    def _server_statistics(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """GET /v2/models/stats: every model's."""
        _allow(scope["method"], "GET")
        return send_json(send, 200, documents.model_statistics(self._engine.statistics_of()))

    def _logging(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """GET or POST /v2/logging; not found without settings."""
        return self._settings_route(scope, receive, send, "logging", "")

    def _trace_setting(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """GET or POST /v2/trace/setting; not found without settings."""
        return self._settings_route(scope, receive, send, "trace/setting", "")

    def _model_trace_setting(self, scope: Scope, receive: Receive, send: Send, model: str) -> Awaitable[None]:
        """GET or POST /v2/models/{model}/trace/setting; not found without settings."""
        return self._settings_route(scope, receive, send, "trace/setting", model)

    def _model_metadata(
        self, scope: Scope, receive: Receive, send: Send, model: str, version: str = ""
    ) -> Awaitable[None]:
        """GET /v2/models/{model}[/versions/{version}]."""
        _allow(scope["method"], "GET")
        return send_json(send, 200, documents.model_metadata(self._engine.model(model, version).spec))

    def _model_ready(
        self, scope: Scope, receive: Receive, send: Send, model: str, version: str = ""
    ) -> Awaitable[None]:
        """GET .../ready: Triton's readiness sets no content type."""
        _allow(scope["method"], "GET", _PLAIN)
        try:
            ready = self._engine.model_ready(model, version)
        except InferenceError as error:
            raise _untyped(error) from None
        if ready:
            return send_empty(send, 200, _PLAIN)
        raise _plain(400, "Model version not ready")

    def _model_config(
        self, scope: Scope, receive: Receive, send: Send, model: str, version: str = ""
    ) -> Awaitable[None]:
        """GET .../config."""
        _allow(scope["method"], "GET")
        return send_json(send, 200, documents.model_config(self._engine.model(model, version).spec))

    def _model_statistics(
        self, scope: Scope, receive: Receive, send: Send, model: str, version: str = ""
    ) -> Awaitable[None]:
        """GET .../stats."""
        _allow(scope["method"], "GET")
        return send_json(send, 200, documents.model_statistics(self._engine.statistics_of(model, version)))

    def _repository_index(self, scope: Scope, receive: Receive, send: Send, repository: str = "") -> Awaitable[None]:
        """POST /v2/repository[/{repository}]/index: Triton ignores the repository's name."""
        _whole(repository)
        _allow(scope["method"], "POST")
        return self._index(receive, send)

    def _repository_load(self, scope: Scope, receive: Receive, send: Send, name: str, action: str) -> Awaitable[None]:
        """POST /v2/repository/models/{name}/load or unload."""
        _whole(name)
        _allow(scope["method"], "POST")
        return self._load(receive, send, name, action == "load")

    def _repository_named(self, scope: Scope, receive: Receive, send: Send, repository: str, name: str) -> Any:
        """POST /v2/repository/{repository}/models/{name}/load or unload: Triton's 501."""
        _whole(repository, name)
        _allow(scope["method"], "POST")
        raise InferenceError.unimplemented("'repository_name' specification is not supported")

    def _system_shared_memory(
        self, scope: Scope, receive: Receive, send: Send, action: str, region: str = ""
    ) -> Awaitable[None]:
        """/v2/systemsharedmemory/[region/{region}/]{status,register,unregister}."""
        _whole(region)
        _allow(scope["method"], system_memory.method_of(action))
        return self._system_memory(receive, send, action, region)

    def _cuda_shared_memory(
        self, scope: Scope, receive: Receive, send: Send, action: str, region: str = ""
    ) -> Awaitable[None]:
        """/v2/cudasharedmemory/[region/{region}/]{status,register,unregister}."""
        _whole(region)
        _allow(scope["method"], cuda_memory.method_of(action))
        return self._cuda_memory(receive, send, action, region)

    async def _index(self, receive: Receive, send: Send) -> None:
        """The repository's index, of the ready models only when the body says `"ready": true`."""
        body = await read_body(receive, self._max_json_bytes)
        ready_only = False
        if bytes(body).strip():
            try:
                document = json_text.loads(body)
            except json_text.JsonError as error:  # 400, as every unreadable body here (Triton's index: 500)
                raise InferenceError.invalid(f"failed to parse the request JSON buffer: {error}") from None
            ready = document.get("ready", False) if isinstance(document, dict) else False  # Triton: `[]` is no error
            if not isinstance(ready, bool):
                raise InferenceError.invalid("attempt to access JSON non-boolean as boolean")  # Triton's words, 400
            ready_only = ready
        entries = [entry for entry in self._engine.repository() if entry.ready or not ready_only]
        await send_json(send, 200, documents.repository_index(entries))

    async def _load(self, receive: Receive, send: Send, name: str, load: bool) -> None:
        """Load a model (a body may hold a config override) or unload it."""
        body = await read_body(receive, self._max_json_bytes)
        if load:
            parameters = _load_parameters(body) if len(body) else {}  # whitespace alone fails, as in Triton
            change = config_override.spec_change(name, parameters, self._engine.has_cache)
            await self._engine.load(name, change)
        else:
            await self._engine.unload(name)
        await send_empty(send, 200, _JSON)

    async def _cuda_memory(self, receive: Receive, send: Send, action: str, region: str) -> None:
        """Carry out a CUDA shared-memory action (transport/http/cuda_memory.py)."""
        body = await read_body(receive, self._max_json_bytes)
        document = await cuda_memory.answer(self._engine.cuda_memory, action, region, body)
        await (send_empty(send, 200, _JSON) if document is None else send_json(send, 200, document))

    async def _system_memory(self, receive: Receive, send: Send, action: str, region: str) -> None:
        """Carry out a system shared-memory action (transport/http/system_memory.py)."""
        body = await read_body(receive, self._max_json_bytes)
        document = system_memory.answer(self._engine.system_memory, action, region, body)
        await (send_empty(send, 200, _JSON) if document is None else send_json(send, 200, document))

    async def _infer(self, scope: Scope, receive: Receive, send: Send, model: str, version: str = "") -> None:
        """POST .../infer."""
        _allow(scope["method"], "POST", _PLAIN)
        received_ns = time.monotonic_ns() if self._trace.stamps else 0
        encoding = accept = raw_length = None
        for header, value in scope["headers"]:  # the three headers read here, the first of each as Triton reads them
            if header == b"inference-header-content-length":
                raw_length = value if raw_length is None else raw_length
            elif header == b"content-encoding":
                encoding = value if encoding is None else encoding
            elif header == b"accept-encoding":
                accept = value if accept is None else accept
        try:  # what Triton refuses before it reads the JSON, with no content type set yet
            served = self._engine.model(model, version)
            if served.spec.decoupled:
                raise InferenceError.unimplemented(
                    "HTTP end point doesn't support models with decoupled transaction policy"
                )
            body = await read_body(receive, self._max_body_bytes)
            if encoding:
                body = await _decompress(body, encoding.decode("latin-1"), self._max_body_bytes, self._inflation_budget)
            header_length = None if raw_length is None else _header_length(raw_length, len(body))
            if header_length != 0:  # 0: the body is one raw tensor, no JSON
                _json_within(len(body) if header_length is None else header_length, self._max_json_bytes)
            if served.out_of_date:
                # Found again once the body is in, where Triton first looks the model up: one unloaded while the
                # body came answers in Triton's words (not a stale binding's "not ready"), one loaded again serves it.
                served = self._engine.model(model, version)
        except (InferenceError, HttpError) as error:
            raise _untyped(error) from None
        spec = served.spec
        if header_length is not None and isinstance(body, bytes):
            body = bytearray(body)  # binary inputs become writable zero-copy views of this buffer
        forwarded = self._forwarded_headers(scope) if self._forward is not None else None
        memory = self._engine.system_memory
        long = False  # decoded or encoded off the loop: it may hold long object arrays, freed off the loop too
        try:
            deferred: List[Read] = []
            try:
                request, output_format = decode_infer_request(
                    spec, body, header_length, forwarded, memory, deferred, ON_LOOP
                )
            except OffLoop:  # long to decode: in a worker thread, the other clients served meanwhile
                long = True
                request, output_format = await _decoded_off_loop(spec, body, header_length, forwarded, memory, deferred)
            decoded_ns = 0
            if received_ns:
                decoded_ns = time.monotonic_ns()
                mark_arrival(request, received_ns, grpc=False)
            held = output_format.regions and [where.region for where in output_format.regions.values()]
            if held:  # its output regions stay registered until they are written, as Triton keeps them
                memory.hold(held)
            try:
                if deferred:  # inputs too large to copy on the loop (the output regions held meanwhile)
                    await read_off_loop(deferred)
                response = await served.infer(request, gone=lambda: until_disconnect(receive))
                writes: List[WriteRun] = []
                try:
                    json_part, binary_parts, json_length = encode_infer_response(
                        spec, request.id, response, output_format, memory, None, writes, ON_LOOP
                    )
                except OffLoop:
                    long = True
                    json_part, binary_parts, json_length = await _encoded_off_loop(
                        spec, request.id, response, output_format, memory, writes
                    )
                if writes:  # outputs too large to copy on the loop, written while their regions are held
                    await write_off_loop(writes)
            finally:
                if held:
                    memory.release(held)
        except InferenceError as error:
            # Triton's response callback sets no content type: the model's errors, and those Triton finds in its
            # answer (a class count of an output without order) or its Python backend in the inputs (a cut string).
            if error.in_response:
                raise _untyped(error) from None
            raise
        if received_ns and type(response) is TracedResponse and response.trace.claim():
            send = _timed_send(send, response.trace, received_ns, decoded_ns)
        if long:  # the last references to its long object arrays are these: freed in a codec thread
            freed = codec_threads.long_object_arrays(request, response)
            del request, response
            codec_threads.let_go(freed)
        if binary_parts:
            out_headers = [OCTET_TYPE, (b"inference-header-content-length", b"%d" % json_length)]
            size = json_length + sum(map(len, binary_parts))  # byte-format views: len is the size
            out: Union[bytes, bytearray, memoryview]
            if size < _SCATTER_BYTES:  # a small answer's path: as few steps as may be (OFF_LOOP_JOIN_BYTES is more)
                out = b"".join([json_part, *binary_parts])
            elif not accept and BODY_PARTS in scope.get("extensions", ()) and _request_owned(binary_parts, body):
                out_headers.append((b"content-length", b"%d" % size))
                await send({"type": "http.response.start", "status": 200, "headers": out_headers})
                await send({"type": "http.response.body", "body": json_part, BODY_PARTS: binary_parts})
                return
            elif size >= OFF_LOOP_JOIN_BYTES:
                out = await codec_threads.joined([json_part, *binary_parts], size)
            else:
                out = b"".join([json_part, *binary_parts])
        else:
            out = json_part
            out_headers = [JSON_TYPE]
        if accept:
            out = await _compress(out, accept.decode("latin-1"), out_headers)
        out_headers.append((b"content-length", b"%d" % len(out)))
        await send({"type": "http.response.start", "status": 200, "headers": out_headers})
        await send({"type": "http.response.body", "body": out})

    async def _generate(self, scope: Scope, receive: Receive, send: Send, model: str, version: str = "") -> None:
        """POST .../generate: one flat JSON response."""
        _allow(scope["method"], "POST")
        served = self._engine.model(model, version)  # an unknown model is refused before its body is read
        _identity_encoded(scope)
        body = await read_body(receive, self._max_body_bytes)
        _json_within(len(body), self._max_json_bytes)
        if served.out_of_date:  # once the body is in, as _infer finds it again
            served = self._engine.model(model, version)
        request, _ = decode_generate_request(served.spec, body, self._forwarded_headers(scope))
        if served.spec.decoupled:
            responses = await _first_responses(served.stream(request), receive, send)
            if responses is None:
                return  # the client went away; closing the stream stopped the model's work for it
            if len(responses) != 1:
                raise InferenceError.invalid(  # Triton's words
                    "generate expects model to produce exactly 1 response, use generate stream for model that "
                    "generates various number of responses"
                )
            response = responses[0]
        else:
            response = await served.infer(request, gone=lambda: until_disconnect(receive))
        await send_json(send, 200, encode_generate_response(served.spec, request.id, response))

    async def _generate_stream(self, scope: Scope, receive: Receive, send: Send, model: str, version: str = "") -> None:
        """POST .../generate_stream: one server-sent event per response; the client leaving stops the model.

        As in tritonserver 2.51, a request refused before it runs gets a JSON error; once it runs, the stream starts
        with its first response, and a failure, its first included, is an event `data: {"error": ...}` (the
        status line the first response's: that error's status when it failed).
        """
        _allow(scope["method"], "POST")
        served = self._engine.model(model, version)  # an unknown model is refused before its body is read
        _identity_encoded(scope)
        body = await read_body(receive, self._max_body_bytes)
        _json_within(len(body), self._max_json_bytes)
        if served.out_of_date:  # once the body is in, as _infer finds it again
            served = self._engine.model(model, version)
        request, _ = decode_generate_request(served.spec, body, self._forwarded_headers(scope))
        responses = served.stream(request)
        handler = asyncio.current_task()
        assert handler is not None
        started = [False]  # the watcher's view of it
        watcher = asyncio.get_running_loop().create_task(_cancel_on_disconnect(receive, send, handler, started))
        try:
            async for response in responses:
                event = json_text.dumps(encode_generate_response(served.spec, request.id, response))
                if not started[0]:
                    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                    started[0] = True
                await send({"type": "http.response.body", "body": b"data: " + event + b"\n\n", "more_body": True})
        except InferenceError as error:
            if not started[0]:
                status = error.status.http_status
                await send({"type": "http.response.start", "status": status, "headers": _SSE_HEADERS})
                started[0] = True
            event = orjson.dumps({"error": error.message})
            await send({"type": "http.response.body", "body": b"data: " + event + b"\n\n", "more_body": True})
        except asyncio.CancelledError:
            return  # the client went away; closing `responses` stopped the model's work for it
        finally:
            watcher.cancel()
            await responses.aclose()  # type: ignore[attr-defined]
        if not started[0]:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        await send({"type": "http.response.body", "body": b""})

    def _settings_route(self, scope: Scope, receive: Receive, send: Send, route: str, model: str) -> Awaitable[None]:
        """GET or POST /v2/logging, /v2/trace/setting and /v2/models/{name}/trace/setting; 404 without settings."""
        if self._settings is None:
            raise _plain(404, "Not Found")
        return self._settings_answer(receive, send, scope["method"], route, model)

    async def _settings_answer(self, receive: Receive, send: Send, method: str, route: str, model: str) -> None:
        """Answer a settings route."""
        if method not in ("GET", "POST"):
            raise HttpError(405, "Method Not Allowed")
        settings = self._settings
        assert settings is not None
        if model and not self._engine.model_ready(model):
            raise InferenceError.invalid(f"Request for unknown model : {model}")
        body = bytes(await read_body(receive, self._max_json_bytes)) if method == "POST" else b""
        changes = parse_json_members(body) if body.strip() else {}
        if route == "logging":
            settings.log.update(changes, http=True)
            await send_json(send, 200, settings.log.document())
            return
        if changes:
            settings.trace.update(trace_changes_from_json(changes), model)
        await send_json(send, 200, settings.trace.document(model))

    def _forwarded_headers(self, scope: Scope) -> Optional[Dict[str, str]]:
        """Headers matching http_header_forward_pattern, handed to the callable as parameters.

        Named as the client wrote them, as Triton hands them on, where the server kept the names (HEADER_NAMES);
        the last of a header sent twice wins.
        """
        pattern = self._forward
        if pattern is None:
            return None
        headers = scope["headers"]
        names = scope.get(HEADER_NAMES) or [name for name, _ in headers]
        forwarded = ((name.decode("latin-1"), value) for name, (_, value) in zip(names, headers))
        return {name: value.decode("latin-1") for name, value in forwarded if pattern.search(name)}


# The codec's calls off the loop, out of `_infer`: a lambda there would make its variables closure cells, a
# cost of every request (1 % of a small JSON request's instructions).


def _decoded_off_loop(
    spec: ModelSpec,
    body: Body,
    header_length: Optional[int],
    forwarded: Optional[Dict[str, str]],
    memory: Optional[SystemSharedMemory],
    deferred: List[Read],
) -> Awaitable[Tuple[InferenceRequest, OutputFormat]]:
    """`decode_infer_request` of a request it refused to decode on the loop (OffLoop), in a worker thread."""
    return codec_threads.off_loop(
        lambda registry, place: decode_infer_request(spec, body, header_length, forwarded, registry, deferred, place),
        memory,
    )


def _encoded_off_loop(
    spec: ModelSpec,
    request_id: str,
    response: InferenceResponse,
    output_format: OutputFormat,
    memory: Optional[SystemSharedMemory],
    writes: List[WriteRun],
) -> Awaitable[Tuple[Union[bytes, bytearray, memoryview], Sequence[Any], int]]:
    """`encode_infer_response` of an answer it refused to encode on the loop (OffLoop), in a worker thread."""
    return codec_threads.off_loop(
        lambda registry, place: encode_infer_response(
            spec, request_id, response, output_format, registry, None, writes, place
        ),
        memory,
    )


def _label(match: Any, path: str) -> str:
    """How a custom route's metrics name it: its path template, or its mount's prefix."""
    if match.route is not None:
        return str(match.route.path)
    if match.mount is not None:
        return str(match.mount.prefix)
    return path


def _identity_encoded(scope: Scope) -> None:
    """Refuse a generate body with a Content-Encoding other than identity, as tritonserver 2.51 does (in its words).

    Its generate routes read no compressed body; an empty Content-Encoding is refused too (measured).
    """
    for header, value in scope["headers"]:
        if header == b"content-encoding" and value != b"identity":
            raise InferenceError.invalid("Unsupported content-encoding, only 'identity' is supported.")


def _json_within(length: int, limit: int) -> None:
    """Refuse a request JSON longer than ServerLimits.max_json_bytes, as tritonserver 2.59+ words it (400)."""
    if length > limit:
        raise InferenceError.invalid(
            f"request JSON size of {length} bytes exceeds the maximum allowed input size of {limit} bytes. Use "
            "ServerLimits(max_json_bytes=...) or PYTRITON_LIMIT_MAX_JSON_BYTES to increase the limit."
        )


async def _first_responses(
    responses: AsyncIterator[InferenceResponse], receive: Receive, send: Send
) -> Optional[List[InferenceResponse]]:
    """A decoupled model's first responses to a request, two at most (`{}` yielded is one too); None if it left.

    A second one is enough to refuse the request: the stream is closed then, which stops the model's generator at
    its next step (gathering them all held every response of a long generation, without bound, and ran it to its
    end for an answer that was an error already). A client that leaves cancels the request, as a stream's does.
    """
    handler = asyncio.current_task()
    assert handler is not None
    watcher = asyncio.get_running_loop().create_task(_cancel_on_disconnect(receive, send, handler, [False]))
    gathered: List[InferenceResponse] = []
    try:
        async for response in responses:
            gathered.append(response)
            if len(gathered) > 1:
                break
        return gathered
    except asyncio.CancelledError:
        return None
    finally:
        watcher.cancel()
        await responses.aclose()  # type: ignore[attr-defined]


async def _cancel_on_disconnect(receive: Receive, send: Send, handler: asyncio.Task[Any], started: List[bool]) -> None:
    """Cancel a streaming handler when its client disconnects.

    A client that only stopped sending may still read (`shutdown(SHUT_WR)`, `nc -N`), as tritonserver's do, and
    one that closed looks the same: the stream goes on until the connection is lost. One that closed answers
    the next bytes sent with a reset, so a stream already under way sends an SSE comment, which readers skip, at
    once rather than waiting for the model's next response.
    """

    async def probe() -> None:
        if started[0]:
            await send({"type": "http.response.body", "body": b":\n\n", "more_body": True})

    await until_disconnect(receive, probe)
    handler.cancel()


def _request_owned(parts: Sequence[Any], body: Body) -> bool:
    """Whether every output lies in the request's own body, which nothing else writes: sent as views, not joined.

    Other outputs are copied into one buffer first: a callable may fill the array it returned again
    on its next call while a slow client still reads this response.
    """
    return unchanging(parts, body.obj if isinstance(body, memoryview) else body)


def path_segments(scope: Scope) -> List[str]:
    """The request path's segments, each percent-decoded on its own.

    The scope's path is decoded whole (ASGI), so an encoded slash in it ("identity%2Finfer") would split a
    segment in two and route the request elsewhere. Triton does not decode paths at all; tritonclient
    percent-encodes model names, so segments are decoded, one at a time. A segment whose bytes are no UTF-8 once
    decoded stays as sent: a name of U+FFFD in the 404 would not be the one the client sent, which Triton quotes.
    """
    raw_path: Optional[bytes] = scope.get("raw_path")
    if raw_path is None or b"%" not in raw_path:
        return str(scope["path"]).split("/")
    return [_decoded(segment) for segment in raw_path.decode("latin-1").split("/")]


def _decoded(segment: str) -> str:
    """A path segment percent-decoded, or as sent if its bytes are no UTF-8."""
    try:
        return unquote(segment, errors="strict")
    except UnicodeDecodeError:
        return segment


def _allow(method: str, allowed: str, headers: Sequence[Any] = _JSON) -> None:
    """Refuse other methods with 405 (with `headers`: Triton checks the method after some handlers set JSON)."""
    if method != allowed:
        raise HttpError(405, "Method Not Allowed", headers)


def _whole(*names: str) -> None:
    """404 for a region's, repository's or repository model's name holding an encoded "/" (a model's may hold one).

    Triton does not decode paths, so its routes match such a name, and its category is checked before this.
    """
    if any("/" in name for name in names):
        raise _plain(404, "Not Found")


async def read_body(receive: Receive, limit: int) -> Body:
    """Read the whole request body, refusing more than `limit` bytes."""
    message = await receive()
    body: Body = message.get("body", b"")
    if len(body) > limit:  # the first part too: a chunked body may come as one part of 4 MiB (BODY_HIGH_WATER)
        raise HttpError(413, f"request body larger than {limit} bytes")
    if not message.get("more_body", False):
        return body
    buffer = bytearray(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InferenceError.invalid("client disconnected while sending the request")
        buffer += message.get("body", b"")
        if len(buffer) > limit:
            raise HttpError(413, f"request body larger than {limit} bytes")
        if not message.get("more_body", False):
            return buffer


def _load_parameters(body: Body) -> Dict[str, Any]:
    """A load's parameters, read as Triton's HTTP server reads them (every failure an INTERNAL error, 500).

    A body that is no object has none; `parameters` must be an object whose values are strings, under the keys
    Triton's HTTP API turns into load parameters: `config` and `file:...`.
    """
    try:
        document = json_text.loads(body)
    except json_text.JsonError as error:
        raise InferenceError.internal(f"failed to parse the request JSON buffer: {error}") from None
    if not isinstance(document, dict) or "parameters" not in document:
        return {}
    parameters = document["parameters"]
    if not isinstance(parameters, dict):
        raise InferenceError.internal("attempt to get members for non-object")
    for key, value in parameters.items():
        if not isinstance(value, str):
            raise InferenceError.internal("attempt to access JSON non-string as string")
        if key != "config" and not key.startswith("file:"):
            raise InferenceError.internal("unexpected error on creating Triton parameter")
    return parameters


def _header_length(raw: bytes, size: int) -> int:
    """The Inference-Header-Content-Length of a body of `size` bytes, checked as Triton checks it."""
    try:
        length = int(raw)
    except ValueError:
        raise HttpError(400, f"invalid Inference-Header-Content-Length: '{raw.decode('latin-1')}'") from None
    if length < 0 or length > size:
        raise HttpError(400, f"inference header size should be in range (0, {size}), got: {length}")  # Triton's words
    return length


async def _decompress(body: Body, encoding: str, limit: int, budget: InflationBudget) -> Body:
    """Undo a gzip or deflate (zlib) Content-Encoding, a step at a time (transport/inflate.py), up to `limit` bytes.

    The header is a list of codings (RFC 9110 8.4): `identity` ones change nothing, `x-gzip` is gzip, and one
    coding at most is undone. As Triton's (zlib's `15 | 32`), either coding's body may come with a gzip or a zlib
    header. The inflated body holds its size of `budget` while it lives (503 past it).
    """
    codings = [coding for coding in encoding.lower().replace(" ", "").split(",") if coding not in ("", "identity")]
    if not codings:
        return bytearray(body)
    if len(codings) > 1:
        raise HttpError(501, f"Unsupported compression type: one coding at most is undone, got '{encoding}'", _UNDONE)
    encoding = "gzip" if codings[0] == "x-gzip" else codings[0]
    if encoding not in ("gzip", "deflate"):
        raise HttpError(501, "Unsupported compression type", _UNDONE)  # Triton's answer, and its Accept-Encoding
    if not len(body):
        raise HttpError(400, "nothing to be decompressed")  # Triton's words
    wbits = 32 + zlib.MAX_WBITS  # a gzip or a zlib header, whichever comes
    limit = min(limit, budget.capacity)  # a body larger than the whole budget could never inflate: 413
    try:
        inflated, end = await inflate(body, wbits, limit, members=encoding == "gzip", name=encoding, budget=budget)
    except InflateError as error:
        if error.failure is Failure.TOO_LARGE:
            raise HttpError(413, f"decompressed request body larger than {limit} bytes") from None
        if error.failure is Failure.OVER_BUDGET:
            raise HttpError(503, f"{error.detail}: try again later") from None
        raise HttpError(400, f"failed to decompress the request body: {error.detail}") from None
    if end < len(body):
        raise HttpError(400, f"failed to decompress the request body: bytes after the end of the {encoding} stream")
    return inflated


def _response_encoding(accept_encoding: str) -> str:
    """The encoding, gzip or deflate, that Accept-Encoding weighs most (the first listed of equal weights); "" for none.

    As Triton: a weight of 0 refuses an encoding, `*` chooses none, and `identity` is weighed with the others
    (`identity, gzip` and `gzip;q=0.5, identity` answer uncompressed; tritonserver 2.51, probed).
    """
    chosen, best = "", 0.0
    for token in accept_encoding.split(","):
        name, _, parameters = token.partition(";")
        name = name.strip().lower()
        if name not in ("gzip", "deflate", "identity"):
            continue
        weight = 1.0
        for parameter in parameters.split(";"):
            key, _, value = parameter.partition("=")
            if key.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        if weight > best:
            chosen, best = name, weight
    return "" if chosen == "identity" else chosen


async def _compress(
    body: Union[bytes, bytearray, memoryview], accept_encoding: str, headers: List[Any]
) -> Union[bytes, bytearray, memoryview]:
    """Compress an infer response per Accept-Encoding (gzip or deflate), adding Content-Encoding.

    A large body is compressed in a worker thread (transport/deflate.py): the other clients are served meanwhile.
    """
    chosen = _response_encoding(accept_encoding)
    if chosen == "gzip":
        wbits = 16 + zlib.MAX_WBITS
        headers.append((b"content-encoding", b"gzip"))
    elif chosen == "deflate":
        wbits = zlib.MAX_WBITS
        headers.append((b"content-encoding", b"deflate"))
    else:
        return body
    return await compressed(body, wbits)


def _timed_send(send: Send, trace: FrontendTrace, received_ns: int, decoded_ns: int) -> Send:
    """`send` for a traced request's response: its trace record gets HTTP_SEND_START and HTTP_SEND_END.

    The response's last message (its body) ends the send; the record then has all of this transport's timestamps.
    """
    started_ns = 0

    async def timed(message: Message) -> None:
        nonlocal started_ns
        if not started_ns:
            started_ns = time.monotonic_ns()
        try:
            await send(message)
        except BaseException:  # a client that left has its record too
            trace.sent("HTTP", (received_ns, decoded_ns, started_ns, time.monotonic_ns()))
            raise
        if message["type"] == "http.response.body" and not message.get("more_body"):
            trace.sent("HTTP", (received_ns, decoded_ns, started_ns, time.monotonic_ns()))

    return timed
