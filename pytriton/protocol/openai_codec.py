"""OpenAI's JSON: requests read and checked, responses, stream chunks and errors written as OpenAI writes them.

Plain functions of documents; what runs a request on a model is `transport/openai/`.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any, Dict, List, Optional, Tuple

import orjson

from pytriton.core.errors import InferenceError, Status

# Sampling fields handed to the model as request parameters (and as inputs a model declares of these names).
SCALAR_PARAMETERS = (
    "temperature",
    "top_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "reasoning_effort",
    "verbosity",
    "safety_identifier",
    "prompt_cache_key",
)
# Fields handed to the model as JSON text (parameters are scalars).
JSON_PARAMETERS = ("tools", "tool_choice", "response_format", "logit_bias", "metadata", "functions", "function_call")
# Fields read and honoured by the server itself, beside the sampling ones.
_COMMON_FIELDS = frozenset(
    ("model", "n", "max_tokens", "stream", "stream_options", "stop", "logprobs", "top_logprobs", "parallel_tool_calls")
)
# Fields a client library may send that change nothing here.
_IGNORED_FIELDS = frozenset(("store", "service_tier", "modalities", "prediction"))
_GENERATION_FIELDS = (*_COMMON_FIELDS, *_IGNORED_FIELDS, *SCALAR_PARAMETERS, *JSON_PARAMETERS)
# Chat fields OpenAI defines that ask what this server cannot do: refused unless null.
UNSUPPORTED_CHAT_FIELDS = ("audio", "web_search_options", "moderation")
CHAT_FIELDS = frozenset(
    (
        *_GENERATION_FIELDS,
        *UNSUPPORTED_CHAT_FIELDS,
        "messages",
        "max_completion_tokens",
        "prompt_cache_retention",
        "prompt_cache_options",
    )
)
COMPLETION_FIELDS = frozenset((*_GENERATION_FIELDS, "prompt", "echo", "suffix", "best_of"))
EMBEDDING_FIELDS = frozenset(("model", "input", "encoding_format", "dimensions", "user"))
# The JSON types of the fields handed on or ignored (OpenAI refuses others, and the model could not read them).
_FIELD_TYPES: Dict[str, Tuple[type, ...]] = {
    **{key: (str,) for key in ("user", "reasoning_effort", "verbosity", "safety_identifier", "prompt_cache_key")},
    **{key: (dict,) for key in ("response_format", "logit_bias", "metadata", "prediction", "prompt_cache_options")},
    **{key: (str, dict) for key in ("tool_choice", "function_call")},
    **{key: (list,) for key in ("tools", "functions", "modalities")},
    **{key: (bool,) for key in ("parallel_tool_calls", "store")},
    **{key: (str,) for key in ("service_tier", "prompt_cache_retention")},
}
_TYPE_NAMES = {str: "a string", dict: "an object", list: "an array", bool: "a boolean"}
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
MESSAGE_ROLES = frozenset(("system", "developer", "user", "assistant", "tool", "function"))
MAX_N = 16
MAX_STOP_SEQUENCES = 4
LOGIT_BIAS = 100  # the most a token's logit_bias moves it, either way
# An object's fields OpenAI defines: (name, JSON type, whether it is required).
Fields = Tuple[Tuple[str, type, bool], ...]
_REQUIRED_NAME: Fields = (("name", str, True),)
FUNCTION_FIELDS: Fields = (*_REQUIRED_NAME, ("description", str, False), ("parameters", dict, False))
# A list of typed objects (an assistant message's tool calls, the request's tools): for each `type`, the object
# the item carries under the same key, and that object's fields.
TypedObjects = Dict[str, Tuple[str, Fields]]
TOOL_CALL_FIELDS: TypedObjects = {
    "function": ("function", (*_REQUIRED_NAME, ("arguments", str, True))),
    "custom": ("custom", (*_REQUIRED_NAME, ("input", str, True))),
}
TOOL_FIELDS: TypedObjects = {
    "function": ("function", (*FUNCTION_FIELDS, ("strict", bool, False))),
    "custom": ("custom", (*_REQUIRED_NAME, ("description", str, False), ("format", dict, False))),
}
# The tools allowed tools of mode `auto` name (`tool_choice.allowed_tools.tools`).
CHOSEN_TOOL_FIELDS: TypedObjects = {"function": ("function", _REQUIRED_NAME), "custom": ("custom", _REQUIRED_NAME)}
# The choices `tool_choice` and the older `function_call` may be as a string.
TOOL_CHOICES = {"tool_choice": ("none", "auto", "required"), "function_call": ("none", "auto")}
# A message's fields beside `role`, `content` and `tool_calls`, by role.
_OPTIONAL_NAME: Fields = (("name", str, False),)
MESSAGE_FIELDS: Dict[str, Fields] = {
    **{role: _OPTIONAL_NAME for role in ("system", "developer", "user")},
    "assistant": (*_OPTIONAL_NAME, ("refusal", str, False), ("function_call", dict, False), ("audio", dict, False)),
    "tool": (*_OPTIONAL_NAME, ("tool_call_id", str, True)),
    "function": _REQUIRED_NAME,
}
# The objects an assistant message carries beside its tool calls, and their fields.
ASSISTANT_OBJECTS: Dict[str, Fields] = {
    "function_call": (*_REQUIRED_NAME, ("arguments", str, True)),
    "audio": (("id", str, True),),
}
# How much of a refused value an error message repeats.
_SHOWN_CHARS = 100


# Where the OpenAI API is served, on the HTTP port or a port of its own.
PATH_PREFIX = "/v1/"


class OpenAIError(Exception):
    """A request refused, with OpenAI's status and error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: Optional[str] = None,
        code: Optional[str] = None,
        headers: Tuple[Tuple[bytes, bytes], ...] = (),
    ) -> None:
        """An error of HTTP `status`; `kind` is the error object's `type`; `headers` go with its response."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.headers = headers

    def document(self) -> Dict[str, Any]:
        """`{"error": {"message", "type", "param", "code"}}`."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def invalid(message: str, param: Optional[str] = None, code: Optional[str] = None) -> OpenAIError:
    """A 400 invalid_request_error."""
    return OpenAIError(400, message, param=param, code=code)


def model_not_found(name: str) -> OpenAIError:
    """The 404 of a model the server does not serve through the OpenAI API."""
    return OpenAIError(
        404,
        f"The model `{name}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def from_inference_error(error: InferenceError) -> OpenAIError:
    """The engine's error as OpenAI's: 400 for the request's fault, 503 while stopping, 500 for the model's."""
    status = error.status
    if status in (Status.INVALID_ARGUMENT, Status.ALREADY_EXISTS, Status.UNIMPLEMENTED):
        return OpenAIError(400, error.message)
    if status is Status.NOT_FOUND:
        return OpenAIError(404, error.message, code="model_not_found")
    if status is Status.UNAVAILABLE:
        return OpenAIError(503, error.message, kind="server_error", code="service_unavailable")
    if status is Status.CANCELLED:
        return OpenAIError(499, error.message, kind="server_error", code="cancelled")
    return OpenAIError(500, error.message, kind="server_error")


@dataclasses.dataclass
class Sampling:
    """What a generation request asks beside its prompt."""

    n: int = 1
    stream: bool = False
    include_usage: bool = False
    max_tokens: Optional[int] = None
    stop: Tuple[str, ...] = ()
    parameters: Dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ChatRequest:
    """A /v1/chat/completions request, checked."""

    model: str
    messages: List[Dict[str, Any]]
    sampling: Sampling
    tools: Optional[List[Any]] = None  # for the chat template, as Hugging Face's apply_chat_template takes them


@dataclasses.dataclass
class CompletionRequest:
    """A /v1/completions request, checked: one prompt or several (each its own choices)."""

    model: str
    prompts: List[str]
    echo: bool
    sampling: Sampling


@dataclasses.dataclass
class EmbeddingRequest:
    """A /v1/embeddings request, checked."""

    model: str
    inputs: List[str]
    encoding_format: str
    dimensions: Optional[int]
    user: Optional[str]


def parse_document(body: bytes) -> Dict[str, Any]:
    """The request body as a JSON object (400 otherwise)."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise invalid(f"We could not parse the JSON body of your request: {error}") from None
    if not isinstance(document, dict):
        raise invalid("The request body must be a JSON object.")
    return document


def _model_name(document: Dict[str, Any]) -> str:
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("you must provide a model parameter", param="model")
    return model


def shown(value: Any) -> str:
    """A request's value as JSON in an error message: its first characters; its type when too deep to write."""
    try:
        text = orjson.dumps(value).decode()
    except orjson.JSONEncodeError:  # orjson writes at most 254 levels; it reads 1024
        return f"a {type(value).__name__} nested too deeply"
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def json_text(value: Any, param: str) -> str:
    """A request's value as JSON text for the model (400 when it is nested too deeply to write)."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        raise invalid(f"'{param}' is nested too deeply", param=param) from None


def _refuse_unknown(document: Dict[str, Any], known: frozenset) -> None:  # type: ignore[type-arg]
    for key in document:
        if key not in known:
            raise invalid(f"Unrecognized request argument supplied: {key[:_SHOWN_CHARS]}", param=key[:_SHOWN_CHARS])


def _integer(document: Dict[str, Any], key: str, low: int, high: Optional[int] = None) -> Optional[int]:
    value = document.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{key}' must be an integer, got {shown(value)}", param=key)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise invalid(f"'{key}' must be {bound}, got {value}", param=key)
    return value


def _number(document: Dict[str, Any], key: str, low: float, high: float) -> Optional[float]:
    value = document.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"'{key}' must be a number, got {shown(value)}", param=key)
    if not low <= value <= high:
        raise invalid(f"'{key}' must be between {low} and {high}, got {value}", param=key)
    return float(value)


def _sampling(document: Dict[str, Any], max_tokens_keys: Tuple[str, ...]) -> Sampling:
    """The fields every generation request shares, checked; the model's parameters."""
    sampling = Sampling()
    sampling.n = _integer(document, "n", 1, MAX_N) or 1
    stream = document.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise invalid("'stream' must be a boolean", param="stream")
    sampling.stream = bool(stream)
    options = document.get("stream_options")
    if options is not None:
        if not sampling.stream:
            raise invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise invalid("'stream_options' must be an object with a boolean 'include_usage'", "stream_options")
        sampling.include_usage = bool(options.get("include_usage", False))
    for key in max_tokens_keys:
        value = _integer(document, key, 1)
        if value is not None:
            sampling.max_tokens = value
    stop = document.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(item, str) and item for item in stop):
            raise invalid("'stop' must be a string or a list of non-empty strings", param="stop")
        if len(stop) > MAX_STOP_SEQUENCES:
            raise invalid(f"'stop' takes at most {MAX_STOP_SEQUENCES} sequences", param="stop")
        sampling.stop = tuple(stop)
    if document.get("logprobs") not in (None, False, 0) or document.get("top_logprobs") not in (None, 0):
        raise invalid("logprobs are not supported by this server", param="logprobs")
    _number(document, "temperature", 0.0, 2.0)
    _number(document, "top_p", 0.0, 1.0)
    _number(document, "presence_penalty", -2.0, 2.0)
    _number(document, "frequency_penalty", -2.0, 2.0)
    _integer(document, "seed", -(2**63), 2**63 - 1)
    _check_types(document)
    _check_logit_bias(document.get("logit_bias"))
    parameters: Dict[str, Any] = {"stream": sampling.stream}
    if sampling.max_tokens is not None:
        parameters["max_tokens"] = sampling.max_tokens
    if sampling.stop:
        parameters["stop"] = orjson.dumps(list(sampling.stop)).decode()
    for key in SCALAR_PARAMETERS:
        if document.get(key) is not None:
            parameters[key] = document[key]
    for key in JSON_PARAMETERS:
        value = document.get(key)
        if value is not None:
            parameters[key] = value if isinstance(value, str) else json_text(value, key)
    _check_tools(document)
    sampling.parameters = parameters
    return sampling


def _check_types(document: Dict[str, Any]) -> None:
    """The fields handed on (or ignored) have OpenAI's JSON types; `response_format` one of its types."""
    for key, kinds in _FIELD_TYPES.items():
        value = document.get(key)
        if value is not None and not isinstance(value, kinds):
            expected = " or ".join(_TYPE_NAMES[kind] for kind in kinds)
            raise invalid(f"Invalid type for '{key}': expected {expected}, got {shown(value)}", param=key)
    response_format = document.get("response_format")
    if response_format is not None and response_format.get("type") not in RESPONSE_FORMATS:
        raise invalid(
            f"Invalid value for 'response_format.type': {shown(response_format.get('type'))}; supported: "
            + ", ".join(RESPONSE_FORMATS),
            param="response_format.type",
        )
    for key in UNSUPPORTED_CHAT_FIELDS:
        if document.get(key) is not None:
            raise invalid(f"'{key}' is not supported by this server", param=key)


def _check_logit_bias(bias: Optional[Dict[str, Any]]) -> None:
    """`logit_bias` (an object or None, as `_check_types` left it) maps token ids (strings of digits) to [-100, 100]."""
    for token, value in (bias or {}).items():
        if not (token.isascii() and token.isdigit()):
            raise invalid(
                f"Invalid key in 'logit_bias': {shown(token)}. You should only be submitting non-negative integers.",
                param="logit_bias",
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -LOGIT_BIAS <= value <= LOGIT_BIAS:
            raise invalid(
                f"Invalid value for 'logit_bias' of token {token}: expected a number between -{LOGIT_BIAS} and "
                f"{LOGIT_BIAS}, got {shown(value)}",
                param="logit_bias",
            )


def _check_tools(document: Dict[str, Any]) -> None:
    """Tools pass to the model as JSON, and to a chat template (`tool.function.name`): OpenAI's fields, checked.

    What only a tool call could answer is refused.
    """
    if document.get("tools") is not None:
        _check_typed_objects(document["tools"], "tools", TOOL_FIELDS)
    for number, function in enumerate(document.get("functions") or ()):
        _required(function, dict, f"functions[{number}]")
        _check_fields(function, FUNCTION_FIELDS, f"functions[{number}]")
    for key, choices in TOOL_CHOICES.items():
        choice = document.get(key)
        if isinstance(choice, str) and choice not in choices:
            raise invalid(f"Invalid value for '{key}': {shown(choice)}; supported: " + ", ".join(choices), param=key)
        if not _lets_the_model_answer_text(choice):
            raise invalid(
                f"{key} 'required' or a named tool is not supported: this server answers with text, never tool calls",
                param=key,
            )
    choice = document.get("tool_choice")
    if isinstance(choice, dict):  # allowed tools of mode auto, as `_lets_the_model_answer_text` took it
        where = "tool_choice.allowed_tools.tools"
        _check_typed_objects(choice["allowed_tools"].get("tools"), where, CHOSEN_TOOL_FIELDS)
    modalities = document.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise invalid("only the 'text' modality is supported", param="modalities")


def _lets_the_model_answer_text(choice: Any) -> bool:
    """Whether a `tool_choice` (or `function_call`) lets the model answer with a message.

    None, `"none"`, `"auto"`, or allowed tools of mode `auto` do; `"required"` and a named tool do not.
    """
    if choice is None or choice in ("none", "auto"):
        return True
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        allowed = choice.get("allowed_tools")
        return isinstance(allowed, dict) and allowed.get("mode") == "auto"
    return False


def _part_text(part: Any, role: str, where: str) -> Optional[str]:
    """The text of a content part (at `where`): a `text` part's, or an assistant's `refusal` part's; None for others.

    A text part without a string text is refused naming it.
    """
    if not isinstance(part, dict):
        return None
    kind = "refusal" if role == "assistant" and part.get("type") == "refusal" else "text"
    if part.get("type") != kind:
        return None
    _required(part.get(kind), str, f"{where}.{kind}")
    return str(part[kind])


def _content_text(content: Any, index: int, role: str) -> str:
    """A message's content as text: a string, or the text of its parts (other parts are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for number, part in enumerate(content):
            text = _part_text(part, role, f"messages[{index}].content[{number}]")
            if text is None:
                kind = shown(part.get("type")) if isinstance(part, dict) else f"a {type(part).__name__}"
                raise invalid(
                    f"messages[{index}].content: only text parts are supported, got {kind}",
                    param=f"messages.[{index}].content",
                )
            texts.append(text)
        return "".join(texts)
    raise invalid(f"messages[{index}].content must be a string or a list of parts", param=f"messages.[{index}].content")


def _check_message_fields(message: Dict[str, Any], role: str, index: int) -> None:
    """A message has content and OpenAI's fields of its role, of their JSON types.

    Content may be null in a function's message, and in an assistant's (absent too beside its tool or function call).
    """
    if message.get("content") is None:
        calls = role == "assistant" and (message.get("tool_calls") or message.get("function_call"))
        if role not in ("assistant", "function") or ("content" not in message and not calls):
            raise invalid(f"messages[{index}] has no 'content'", param=f"messages.[{index}].content")
    where = f"messages[{index}]"
    _check_fields(message, MESSAGE_FIELDS[role], where)
    if role != "assistant":
        return
    for key, fields in ASSISTANT_OBJECTS.items():
        if message.get(key) is not None:  # an object, as `_check_fields` left it
            _check_fields(message[key], fields, f"{where}.{key}")
    if message.get("tool_calls") is not None:
        # A chat template reads them (`call.function.name`); OpenAI refuses a call without any of these fields.
        _check_typed_objects(message["tool_calls"], f"{where}.tool_calls", TOOL_CALL_FIELDS, (("id", str, True),))


def _check_typed_objects(items: Any, where: str, kinds: TypedObjects, own: Fields = ()) -> None:
    """A list (at `where`) of objects, each with its `own` fields and a `type` of `kinds` with that type's object."""
    _required(items, list, where)
    for number, item in enumerate(items):
        at = f"{where}[{number}]"
        _required(item, dict, at)
        _check_fields(item, own, at)
        kind = item.get("type")
        _required(kind, str, f"{at}.type")
        if kind not in kinds:
            raise invalid(
                f"Invalid value for '{at}.type': {shown(kind)}; supported: " + ", ".join(kinds),
                param=_param(f"{at}.type"),
            )
        key, fields = kinds[kind]
        _required(item.get(key), dict, f"{at}.{key}")
        _check_fields(item[key], fields, f"{at}.{key}")


def _check_fields(value: Dict[str, Any], fields: Fields, where: str) -> None:
    """The `fields` of the object at `where`: each of its JSON type where not null; the required ones not null."""
    for field, kind, required in fields:
        item = value.get(field)
        if required or item is not None:
            _required(item, kind, f"{where}.{field}")


def _required(value: Any, kind: type, where: str) -> None:
    """A field OpenAI requires is there (not null) with its JSON type, or the 400 naming it."""
    if value is None:
        raise invalid(f"Missing required parameter: '{where}'.", param=_param(where))
    if not isinstance(value, kind):
        raise invalid(
            f"Invalid type for '{where}': expected {_TYPE_NAMES[kind]}, got {shown(value)}", param=_param(where)
        )


def _param(where: str) -> str:
    """An error's `param` as OpenAI writes it: `messages.[1].tool_calls.[0].id` for `messages[1].tool_calls[0].id`."""
    return where.replace("[", ".[")


def parse_chat(body: bytes) -> ChatRequest:
    """A chat completion request (400 for what OpenAI refuses, or what this server cannot honour)."""
    document = parse_document(body)
    model = _model_name(document)
    _refuse_unknown(document, CHAT_FIELDS)
    messages = document.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list", param="messages")
    checked: List[Dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages[{index}] must be an object", param=f"messages.[{index}]")
        role = message.get("role")
        if not isinstance(role, str) or role not in MESSAGE_ROLES:
            raise invalid(
                f"Invalid value for 'messages[{index}].role': {shown(role)}; supported: "
                + ", ".join(sorted(MESSAGE_ROLES)),
                param=f"messages.[{index}].role",
            )
        _check_message_fields(message, role, index)
        checked.append({**message, "content": _content_text(message.get("content"), index, role)})
    sampling = _sampling(document, ("max_tokens", "max_completion_tokens"))  # checks `tools` too: a list
    return ChatRequest(model, checked, sampling, document.get("tools"))


def parse_completion(body: bytes) -> CompletionRequest:
    """A (legacy) completion request: a prompt or a list of prompts, as text."""
    document = parse_document(body)
    model = _model_name(document)
    _refuse_unknown(document, COMPLETION_FIELDS)
    prompt = document.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(isinstance(item, str) for item in prompts):
        raise invalid(
            "'prompt' must be a string or a non-empty list of strings (token arrays are not supported)", "prompt"
        )
    if document.get("suffix") is not None:
        raise invalid("'suffix' is not supported by this server", param="suffix")
    best_of = document.get("best_of")
    if best_of not in (None, 1):
        raise invalid("'best_of' is not supported by this server", param="best_of")
    echo = document.get("echo")
    if echo is None:  # nullable in OpenAI's spec (the SDK's Optional[bool])
        echo = False
    if not isinstance(echo, bool):
        raise invalid("'echo' must be a boolean", param="echo")
    sampling = _sampling(document, ("max_tokens",))
    if len(prompts) * sampling.n > MAX_N * 8:
        raise invalid(f"at most {MAX_N * 8} choices a request (prompts times n)", param="n")
    return CompletionRequest(model, prompts, echo, sampling)


def parse_embeddings(body: bytes, max_inputs: int = 2048) -> EmbeddingRequest:
    """An embeddings request: a string or a list of strings, `encoding_format` float or base64."""
    document = parse_document(body)
    model = _model_name(document)
    _refuse_unknown(document, EMBEDDING_FIELDS)
    value = document.get("input")
    inputs = [value] if isinstance(value, str) else value
    if not isinstance(inputs, list) or not inputs or not all(isinstance(item, str) for item in inputs):
        raise invalid(
            "'input' must be a string or a non-empty list of strings (token arrays are not supported)", "input"
        )
    if len(inputs) > max_inputs:
        raise invalid(f"'input' takes at most {max_inputs} strings", param="input")
    if any(not item for item in inputs):
        raise invalid("'input' cannot contain an empty string", param="input")
    encoding = document.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise invalid("'encoding_format' must be 'float' or 'base64'", param="encoding_format")
    dimensions = _integer(document, "dimensions", 1)
    user = document.get("user")
    if user is not None and not isinstance(user, str):
        raise invalid("'user' must be a string", param="user")
    return EmbeddingRequest(model, inputs, encoding or "float", dimensions, user)


def new_id(prefix: str) -> str:
    """An id as OpenAI writes them: a prefix and random letters and digits."""
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(prompt_tokens: int, completion_tokens: int) -> Dict[str, int]:
    """A generation's usage object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_completion(
    completion_id: str, created: int, model: str, choices: List[Tuple[str, str]], token_usage: Dict[str, int]
) -> Dict[str, Any]:
    """A chat.completion object; `choices` are (text, finish reason)."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": reason,
            }
            for index, (text, reason) in enumerate(choices)
        ],
        "usage": token_usage,
        "system_fingerprint": None,
    }


def chat_chunk(
    completion_id: str,
    created: int,
    model: str,
    index: int,
    delta: Dict[str, Any],
    finish_reason: Optional[str],
    with_usage: bool,
) -> Dict[str, Any]:
    """A chat.completion.chunk of one choice (`usage` null while include_usage asks for a last chunk)."""
    chunk: Dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }
    if with_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(completion_id: str, created: int, model: str, obj: str, token_usage: Dict[str, int]) -> Dict[str, Any]:
    """The last chunk of a stream with include_usage: no choices, the usage."""
    chunk: Dict[str, Any] = {"id": completion_id, "object": obj, "created": created, "model": model, "choices": []}
    if obj == "chat.completion.chunk":
        chunk["system_fingerprint"] = None
    chunk["usage"] = token_usage
    return chunk


def completion(
    completion_id: str, created: int, model: str, choices: List[Tuple[str, str]], token_usage: Dict[str, int]
) -> Dict[str, Any]:
    """A text_completion object; `choices` are (text, finish reason)."""
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
            for index, (text, reason) in enumerate(choices)
        ],
        "usage": token_usage,
        "system_fingerprint": None,
    }


def completion_chunk(
    completion_id: str, created: int, model: str, index: int, text: str, finish_reason: Optional[str], with_usage: bool
) -> Dict[str, Any]:
    """One streamed piece of a text completion."""
    chunk: Dict[str, Any] = {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }
    if with_usage:
        chunk["usage"] = None
    return chunk


def embeddings(model: str, vectors: List[Any], prompt_tokens: int) -> Dict[str, Any]:
    """A list of embedding objects (each a list of floats, or base64 text of little-endian float32)."""
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": index, "embedding": vector} for index, vector in enumerate(vectors)],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def model_entry(name: str, created: int, owned_by: str) -> Dict[str, Any]:
    """A model object of /v1/models."""
    return {"id": name, "object": "model", "created": created, "owned_by": owned_by}


def sse_event(document: Any) -> bytes:
    """One server-sent event carrying a JSON document."""
    return b"data: " + orjson.dumps(document) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
