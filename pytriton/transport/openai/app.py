"""The OpenAI API as an ASGI app over the engine: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings.

It serves the models bound with `openai=...` (the option travels in their spec), through the same
`ServingEngine` as the KServe routes, so it runs unchanged in frontend processes. Every error has OpenAI's
shape, `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import time
import weakref
from typing import Any, Awaitable, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

import numpy as np
import orjson

from pytriton.core.errors import CONTROL_FLOW, CallableRaised, InferenceError
from pytriton.core.model import ModelState
from pytriton.core.serving import ServingEngine, ServingModel
from pytriton.core.waiters import Room
from pytriton.options.access import AccessRules
from pytriton.options.http_routes import http_category
from pytriton.options.openai import OpenAIChat, OpenAICompletions, OpenAIEmbeddings, TokenCounter, counted
from pytriton.protocol import openai_codec as codec
from pytriton.protocol.openai_codec import PATH_PREFIX, OpenAIError, Sampling, invalid
from pytriton.transport.http.responses import Receive, Scope, Send, until_disconnect
from pytriton.transport.openai.generation import EMBEDDING_OUTPUT, Generation, TextBudget, build_request
from pytriton.transport.openai.templates import TemplateError, render

LOGGER = logging.getLogger("pytriton.openai")

_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
T = TypeVar("T")
# Pieces of a streamed answer that wait for the client before its generations take no more from their models (whose
# generators then wait): a client that reads nothing holds them, not a growing queue of text.
STREAM_AHEAD = 64
# A request body this large is parsed, templated and counted in a thread: a tokenizer counting a prompt of megabytes
# on the event loop had held every other client of the server meanwhile.
OFF_LOOP_BYTES = 64 << 10
# Handlers cancelled because their client disconnected.
_LEFT: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
# The states of a model unloaded through the repository API: /v1/models lists it no more (its requests are 404).
_OUT_OF_SERVICE = (ModelState.UNLOADING, ModelState.UNAVAILABLE)


class _Job(NamedTuple):
    """What a chat or completions request asks to generate: one prompt a choice, and how to answer."""

    prompts: List[str]
    prompt_tokens: int
    messages: Optional[List[Dict[str, Any]]]  # a chat's messages (the model's `messages` input), else None
    echo: Optional[List[str]]  # the prompts to put before the texts (completions' `echo`), else None
    chat: bool
    started_ns: int
    echo_bytes: int = 0  # the UTF-8 bytes of the echoed prompts, all choices together


class OpenAIApp:
    """Serves the /v1 routes of the OpenAI API over `engine`.

    `api_key`: the key clients must send as `Authorization: Bearer <key>` (401 otherwise); None asks none.
    """

    def __init__(
        self,
        engine: ServingEngine,
        *,
        api_key: Optional[str] = None,
        max_body_bytes: int = 2**31 - 1,
        access: Optional[AccessRules] = None,
    ):
        """Serve `engine`'s models that have an OpenAI option.

        `access`: the server's restricted APIs (http_restricted_api, the access token's): a restriction of
        `inference` holds for the generation routes, of `metadata` for /v1/models.
        """
        self._engine = engine
        self._access = access or None
        self._api_key = api_key.encode() if api_key else None
        self._max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request under /v1."""
        try:
            await self._route(scope, receive, send)
        except asyncio.CancelledError:
            if asyncio.current_task() in _LEFT:  # its client went away: closing its work stopped the model's
                return
            raise
        except OpenAIError as error:
            await _send_json(send, error.status, error.document(), error.headers)
        except InferenceError as error:
            failure = codec.from_inference_error(error)
            await _send_json(send, failure.status, failure.document())
        except Exception as error:
            LOGGER.exception("unexpected error serving %s %s", scope.get("method"), scope.get("path"))
            await _send_json(
                send, 500, OpenAIError(500, f"internal server error: {error}", kind="server_error").document()
            )

    def _route(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """The handler of a request (the key and the access rules checked first), by path and method."""
        method: str = scope["method"]
        path: str = scope["path"]
        self._authorize(scope)
        if self._access is not None:
            denial = self._access.http_denial(http_category(path), scope["headers"])
            if denial is not None:
                raise OpenAIError(403, denial, code="restricted_api")
        route = path[len(PATH_PREFIX) :].rstrip("/")
        if route == "models" or route.startswith("models/"):
            _allow(method, "GET", path)
            return self._models(send, route[len("models/") :] if "/" in route else None)
        if route in ("chat/completions", "completions", "embeddings"):
            _allow(method, "POST", path)
            if route == "chat/completions":
                return self._chat(receive, send)
            if route == "completions":
                return self._completions(receive, send)
            return self._embeddings(receive, send)
        raise OpenAIError(404, f"Invalid URL ({method} {path})")

    def _authorize(self, scope: Scope) -> None:
        """401 unless the request carries the configured key as `Authorization: Bearer <key>`."""
        if self._api_key is None:
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":  # the first, as the restricted APIs read their header (and vLLM its key)
                given = value
                break
        scheme, _, key = given.partition(b" ")
        if not given:
            raise OpenAIError(
                401,
                "You didn't provide an API key. You need to provide your API key in an Authorization header using "
                "Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                code="invalid_api_key",
            )
        if scheme.lower() != b"bearer" or not hmac.compare_digest(key.strip(), self._api_key):
            raise OpenAIError(401, "Incorrect API key provided.", code="invalid_api_key")

    async def _models(self, send: Send, name: Optional[str]) -> None:
        """GET /v1/models, or /v1/models/{name}."""
        entries: Dict[str, Dict[str, Any]] = {}
        for model in self._engine.models():  # by name, then version: the latest version in service stands for its name
            option = model.spec.openai
            if option is not None and model.state not in _OUT_OF_SERVICE:  # an unloaded model is not found here
                entries[model.spec.name] = codec.model_entry(model.spec.name, option.created, option.owned_by)
        if name is None:
            await _send_json(send, 200, {"object": "list", "data": list(entries.values())})
            return
        if name not in entries:
            raise codec.model_not_found(name)
        await _send_json(send, 200, entries[name])

    def _model(self, name: str, kind: Tuple[type, ...], route: str) -> Tuple[ServingModel, Any]:
        """The model a request names and its OpenAI option (404 when it has none; 400 for a kind it is not)."""
        try:
            model = self._engine.model(name)
        except InferenceError:
            raise codec.model_not_found(name) from None
        option = model.spec.openai
        if option is None:
            raise codec.model_not_found(name)
        if not isinstance(option, kind):
            raise invalid(f"model '{name}' is not served at {route}", param="model", code="model_not_supported")
        return model, option

    async def _chat(self, receive: Receive, send: Send) -> None:
        """POST /v1/chat/completions."""
        started_ns = time.monotonic_ns()
        body = await self._body(receive)
        request = await _off_loop_if_large(len(body), codec.parse_chat, body)
        model, option = self._model(request.model, (OpenAIChat,), "/v1/chat/completions")
        prompt, prompt_tokens = await _off_loop_if_large(len(body), _chat_prompt, option, request)
        prompts = [prompt] * request.sampling.n
        job = _Job(prompts, prompt_tokens, request.messages, None, True, started_ns)
        await self._generate(receive, send, model, option, request.sampling, job)

    async def _completions(self, receive: Receive, send: Send) -> None:
        """POST /v1/completions."""
        started_ns = time.monotonic_ns()
        body = await self._body(receive)
        request = await _off_loop_if_large(len(body), codec.parse_completion, body)
        model, option = self._model(request.model, (OpenAIChat, OpenAICompletions), "/v1/completions")
        prompts = [prompt for prompt in request.prompts for _ in range(request.sampling.n)]
        prompt_tokens = await _off_loop_if_large(len(body), _tokens_of, option.token_counter, request.prompts)
        echoed = prompts if request.echo else None
        echo_bytes = sum(map(_utf8_size, request.prompts)) * request.sampling.n if request.echo else 0
        job = _Job(prompts, prompt_tokens, None, echoed, False, started_ns, echo_bytes)
        await self._generate(receive, send, model, option, request.sampling, job)

    async def _generate(
        self,
        receive: Receive,
        send: Send,
        model: ServingModel,
        option: Any,
        sampling: Sampling,
        job: _Job,
    ) -> None:
        """Run one generation a choice (concurrently: the model's batcher batches them) and answer."""
        spec = model.spec
        chat, echo, prompt_tokens = job.chat, job.echo, job.prompt_tokens
        budget = None
        if not sampling.stream:
            if job.echo_bytes > option.max_answer_bytes:
                raise invalid(
                    f"'echo' of these prompts ({job.echo_bytes} bytes with their choices) passes the "
                    f"{option.max_answer_bytes} bytes an answer of model '{spec.name}' may hold: stream it, or ask "
                    "fewer choices",
                    param="echo",
                )
            budget = TextBudget(option.max_answer_bytes - job.echo_bytes)
        generations = [
            Generation(
                model,
                build_request(spec, prompt, sampling.parameters, job.messages),
                stop=sampling.stop,
                max_tokens=sampling.max_tokens,
                counter=option.token_counter,
                started_ns=job.started_ns,
                budget=budget,
            )
            for prompt in job.prompts
        ]
        answer = _Answer(
            codec.new_id("chatcmpl" if chat else "cmpl"), int(time.time()), spec.name, chat, sampling.include_usage
        )
        if sampling.stream:
            await self._stream(receive, send, model, answer, generations, prompt_tokens, echo)
            return
        texts = await _until_disconnect(receive, [generation.whole() for generation in generations])
        if echo is not None:
            texts = [prompt + text for prompt, text in zip(echo, texts)]
        choices = [(text, generation.finish_reason) for text, generation in zip(texts, generations)]
        token_usage = codec.usage(prompt_tokens, sum(generation.tokens for generation in generations))
        build = codec.chat_completion if chat else codec.completion
        _record(model, generations, prompt_tokens)
        await _send_json(send, 200, build(answer.id, answer.created, spec.name, choices, token_usage))

    async def _stream(
        self,
        receive: Receive,
        send: Send,
        model: ServingModel,
        answer: _Answer,
        generations: List[Generation],
        prompt_tokens: int,
        echo: Optional[List[str]],
    ) -> None:
        """Server-sent events: the chunks of every choice as they come (each choice in order), then [DONE].

        A client that disconnects cancels this handler; closing the generations stops the model's generators.
        """
        handler = asyncio.current_task()
        assert handler is not None
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Tuple[int, Optional[str], Optional[BaseException]]] = asyncio.Queue()
        # The generations wait there while STREAM_AHEAD events wait for the handler to send them; woken at half.
        room = Room()

        def has_room() -> bool:
            return events.qsize() < STREAM_AHEAD

        async def run(index: int, generation: Generation) -> None:
            try:
                async for piece in generation.pieces():
                    if not has_room():
                        await room.until(has_room)
                    events.put_nowait((index, piece, None))
            except BaseException as error:  # noqa: BLE001 - handed to the handler, which answers it
                events.put_nowait((index, None, error))
                return
            events.put_nowait((index, None, None))

        # The first event is read before the head goes out: an error of the model before any text is a status.
        tasks = [loop.create_task(run(index, generation)) for index, generation in enumerate(generations)]
        watcher = loop.create_task(_cancel_on_disconnect(receive, handler))
        started = False
        recorded = False
        open_choices = len(generations)
        sent = 0
        try:
            while open_choices:
                index, piece, error = await events.get()
                if events.qsize() <= STREAM_AHEAD // 2:
                    room.wake()
                if error is not None:
                    if isinstance(error, asyncio.CancelledError):
                        raise error
                    failure = _as_openai_error(error)
                    if not started:
                        try:
                            raise failure
                        finally:
                            # Its traceback holds this frame: not the error too (a reference cycle that kept the
                            # request's body and prompt until a full collection).
                            del failure, error
                    await send(
                        {"type": "http.response.body", "body": codec.sse_event(failure.document()), "more_body": True}
                    )
                    await send({"type": "http.response.body", "body": b""})
                    return
                if not started:
                    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                    started = True
                    await self._send_openers(send, answer, len(generations), echo)
                if piece is None:
                    open_choices -= 1
                    await _send_event(send, answer.chunk(index, None, generations[index].finish_reason))
                    continue
                sent += 1
                await _send_event(send, answer.chunk(index, piece, None))
            if answer.include_usage:
                token_usage = codec.usage(prompt_tokens, sum(generation.tokens for generation in generations))
                await _send_event(send, answer.usage_chunk(token_usage))
            # Counted before the client sees the end, as an answer that is not streamed is: a scrape it makes next
            # finds it (on the hub, once a frontend's message about it arrived).
            _record(model, generations, prompt_tokens)
            recorded = True
            await send({"type": "http.response.body", "body": codec.SSE_DONE, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except asyncio.CancelledError:
            LOGGER.info(
                "client disconnected from stream %s of model '%s' after %d chunks: its generation is stopped",
                answer.id,
                model.spec.name,
                sent,
            )
            raise
        finally:
            watcher.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if not recorded:
                _record(model, generations, prompt_tokens)  # what was generated, also for a client that left

    async def _send_openers(self, send: Send, answer: _Answer, choices: int, echo: Optional[List[str]]) -> None:
        """What opens each choice: the assistant's role (chat), or the echoed prompt (completions)."""
        for index in range(choices):
            if answer.chat:
                await _send_event(send, answer.chunk(index, "", None, role=True))
            elif echo is not None:
                await _send_event(send, answer.chunk(index, echo[index], None))

    async def _embeddings(self, receive: Receive, send: Send) -> None:
        """POST /v1/embeddings: one request a text (the model's batcher batches them), a vector each."""
        body = await self._body(receive)
        request = await _off_loop_if_large(len(body), codec.parse_embeddings, body)
        model, option = self._model(request.model, (OpenAIEmbeddings,), "/v1/embeddings")
        spec = model.spec
        dimensions = request.dimensions
        parameters: Dict[str, Any] = {}
        if request.user is not None:
            parameters["user"] = request.user
        truncate = False
        if dimensions is not None:
            if "dimensions" in spec.input_by_name:
                parameters["dimensions"] = dimensions
            elif option.truncate_dimensions:
                truncate = True
            else:
                raise invalid(f"model '{spec.name}' does not support 'dimensions'", param="dimensions")
        requests = [build_request(spec, text, parameters) for text in request.inputs]
        responses = await _until_disconnect(receive, [model.infer(item) for item in requests])
        vectors = []
        for response in responses:
            vector = _embedding_of(response, spec.name)
            if truncate:
                assert dimensions is not None
                if dimensions > vector.size:
                    raise invalid(
                        f"'dimensions' must be at most {vector.size} for model '{spec.name}'", param="dimensions"
                    )
                vector = vector[:dimensions]
                norm = float(np.linalg.norm(vector))
                vector = vector / norm if norm else vector
            if request.encoding_format == "base64":
                vectors.append(base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii"))
            else:
                vectors.append(vector.tolist())
        prompt_tokens = await _off_loop_if_large(len(body), _tokens_of, option.token_counter, request.inputs)
        await _send_json(send, 200, codec.embeddings(spec.name, vectors, prompt_tokens))

    async def _body(self, receive: Receive) -> bytes:
        """The whole request body (413 past the server's limit)."""
        parts: List[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise invalid("client disconnected while sending the request")
            part = bytes(message.get("body", b""))
            size += len(part)
            if size > self._max_body_bytes:
                raise OpenAIError(413, f"request body larger than {self._max_body_bytes} bytes")
            parts.append(part)
            if not message.get("more_body", False):
                return b"".join(parts)


class _Answer:
    """The id, time and model every chunk of one answer repeats."""

    def __init__(self, answer_id: str, created: int, model: str, chat: bool, include_usage: bool) -> None:
        self.id = answer_id
        self.created = created
        self.model = model
        self.chat = chat
        self.include_usage = include_usage

    def chunk(
        self, index: int, text: Optional[str], finish_reason: Optional[str], role: bool = False
    ) -> Dict[str, Any]:
        """A chunk of one choice: text, or (text None) its end."""
        if self.chat:
            delta: Dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            return codec.chat_chunk(self.id, self.created, self.model, index, delta, finish_reason, self.include_usage)
        return codec.completion_chunk(
            self.id, self.created, self.model, index, text or "", finish_reason, self.include_usage
        )

    def usage_chunk(self, token_usage: Dict[str, int]) -> Dict[str, Any]:
        """The last chunk, with include_usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return codec.usage_chunk(self.id, self.created, self.model, obj, token_usage)


async def _off_loop_if_large(size: int, work: Callable[..., T], *args: Any) -> T:
    """`work(*args)`, in a thread of the loop's executor for a request body of OFF_LOOP_BYTES or more."""
    if size < OFF_LOOP_BYTES:
        return work(*args)
    return await asyncio.get_running_loop().run_in_executor(None, _carried, work, *args)


def _carried(work: Callable[..., T], *args: Any) -> T:
    """`work(*args)`, what it raises of CONTROL_FLOW carried: asyncio refuses a StopIteration on the awaited future."""
    try:
        return work(*args)
    except CONTROL_FLOW as error:
        raise CallableRaised(error) from None


def _chat_prompt(option: OpenAIChat, request: codec.ChatRequest) -> Tuple[str, int]:
    """A chat request's prompt, from the model's template, and its tokens."""
    try:
        prompt = render(option.chat_template, request.messages, option.template_variables, request.tools)
    except TemplateError as error:
        raise invalid(str(error), param="messages") from None
    return prompt, counted(option.token_counter, prompt)


def _utf8_size(text: str) -> int:
    """The UTF-8 bytes of `text` (without encoding an ASCII text)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _tokens_of(counter: TokenCounter, texts: List[str]) -> int:
    """The tokens of `texts` together."""
    return sum(counted(counter, text) for text in texts)


def _embedding_of(response: Any, name: str) -> np.ndarray:
    """A response's `embedding` output as a flat float32 vector."""
    for output in response.outputs:
        if output.name == EMBEDDING_OUTPUT:
            return np.asarray(output.array, dtype=np.float32).reshape(-1)
    raise OpenAIError(500, f"model '{name}' gave no '{EMBEDDING_OUTPUT}' output", kind="server_error")


def _record(model: ServingModel, generations: List[Generation], prompt_tokens: int) -> None:
    """Count a finished generation's tokens and their times in the model's metrics (on the main process)."""
    for generation in generations:
        if generation.first_token_ns is not None:
            model.record_tokens(generation.first_token_ns, generation.gaps_ns, generation.tokens, prompt_tokens)
            prompt_tokens = 0  # counted once a request


def _as_openai_error(error: BaseException) -> OpenAIError:
    if isinstance(error, OpenAIError):
        return error
    if isinstance(error, InferenceError):
        return codec.from_inference_error(error)
    LOGGER.error("a generation failed", exc_info=error)
    return OpenAIError(500, f"internal server error: {error}", kind="server_error")


def _allow(method: str, allowed: str, path: str) -> None:
    """405 for another method, with the `Allow` header RFC 9110 asks of it."""
    if method != allowed:
        raise OpenAIError(405, f"Invalid method for URL ({method} {path})", headers=((b"allow", allowed.encode()),))


async def _send_json(send: Send, status: int, document: Any, extra: Sequence[Tuple[bytes, bytes]] = ()) -> None:
    body = orjson.dumps(document)
    headers = [*_JSON_HEADERS, (b"content-length", b"%d" % len(body)), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_event(send: Send, document: Any) -> None:
    await send({"type": "http.response.body", "body": codec.sse_event(document), "more_body": True})


async def _until_disconnect(receive: Receive, work: List[Awaitable[T]]) -> List[T]:
    """Run `work` concurrently: its results; the first failure, or the client leaving, cancels the rest."""
    handler = asyncio.current_task()
    assert handler is not None
    loop = asyncio.get_running_loop()
    watcher = loop.create_task(_cancel_on_disconnect(receive, handler))
    tasks = [asyncio.ensure_future(item) for item in work]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        watcher.cancel()
        await _cancel_all(tasks)
        # A failed task holds its error, whose traceback holds this frame once it is raised here: without the
        # tasks here, that is no reference cycle, so the handler's frames (the request's body, its prompt) go with
        # the answer, not at the cycle collector's next full pass (six failed requests of 32 MiB held 192 MB).
        tasks.clear()


async def _cancel_all(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel `tasks` and wait for them to end (in a frame of its own: no loop variable outlives it)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _cancel_on_disconnect(receive: Receive, handler: asyncio.Task[Any]) -> None:
    """Cancel a handler when its client disconnects (the request body has been read already).

    A client that only stopped sending (it half-closed) still gets its answer: `until_disconnect` waits for it to
    be seen leaving.
    """
    await until_disconnect(receive)
    _LEFT.add(handler)
    handler.cancel()
