"""How a model answers the OpenAI API (`bind(..., openai=...)`): plain data the transports read.

A binding's option travels with the model's spec into frontend processes; callables in it (a chat template
function, a token counter) travel there by value (cloudpickle), as process instances' callables do.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import cloudpickle

from pytriton.exceptions import PyTritonValidationError

Message = Dict[str, Any]
ChatTemplate = Union[str, Callable[[List[Message]], str], None]
TokenCounter = Optional[Callable[[str], int]]
# The text a whole answer gathers at most, its choices together (an endless generator's had grown without end).
MAX_ANSWER_BYTES = 16 << 20


class _ByValue:
    """Pickles the dataclass's callables by value, so a function of the user's `__main__` reaches a frontend process."""

    def __reduce__(self) -> Tuple[Any, ...]:
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}  # type: ignore[arg-type]
        try:
            pickled = cloudpickle.dumps(fields)
        except Exception as error:  # noqa: BLE001 - whatever pickling raises, the user reads which field and why
            raise PyTritonValidationError(_cannot_travel(self, fields, error)) from None
        return (_rebuild, (type(self), pickled))


def _cannot_travel(option: Any, fields: Dict[str, Any], error: Exception) -> str:
    """Why `option` cannot reach another process: its first field that does not pickle, and what to do."""
    name = next((key for key, value in fields.items() if not _pickles(value)), None)
    what = type(option).__name__ if name is None else f"{type(option).__name__}'s {name}"
    return (
        f"{what} cannot be sent to another process ({type(error).__name__}: {error}): frontend processes "
        "(frontends >= 2) and the server a RemoteTriton binds into get it by value (cloudpickle). Give one that "
        "pickles (one that makes what it holds, a lock or a native handle, on its first call); a Triton with "
        "frontends=1 keeps it in its own process"
    )


def _pickles(value: Any) -> bool:
    try:
        cloudpickle.dumps(value)
    except Exception:  # noqa: BLE001
        return False
    return True


def ensure_sendable(option: Any) -> None:
    """Raise now what sending `option` to a frontend process would raise later, on the server's loop.

    Raises:
        PyTritonValidationError: a field of it does not pickle.
    """
    pickle.dumps(option, pickle.HIGHEST_PROTOCOL)


def _rebuild(kind: Any, pickled: bytes) -> Any:
    """A configuration from what `_ByValue.__reduce__` wrote."""
    fields = cloudpickle.loads(pickled)
    created = fields.pop("created")
    option = kind(**fields)
    object.__setattr__(option, "created", created)
    return option


def _now() -> int:
    return int(time.time())


@dataclasses.dataclass(frozen=True, eq=False)
class OpenAIChat(_ByValue):
    """Serve a text-generation model at /v1/chat/completions and /v1/completions.

    The model takes `text_input` (BYTES) and gives `text_output` (BYTES): a generator callable
    (`ModelConfig(decoupled=True)`) streams one piece of text per response, a plain callable answers whole.

    Args:
        chat_template: turns a request's `messages` into the model's `text_input`: a Jinja2 template string
            (Hugging Face's format: `messages`, `add_generation_prompt`, plus `template_variables`), or a
            function of the messages that returns the prompt. None: the built-in template (each message as
            `<|role|>`, a newline, its content and a newline; then `<|assistant|>` and a newline). A model that
            declares an input named `messages` also gets the request's messages as JSON there, for its own template.
        template_variables: more variables for a Jinja2 template (`bos_token`, `eos_token`, ...).
        token_counter: counts the tokens of a text for `usage` (e.g. `lambda s: len(tokenizer.encode(s))`);
            None: the prompt's whitespace-separated words, and a streamed model's responses (a plain model's
            words).
        owned_by: the `owned_by` of the model in /v1/models.
        max_answer_bytes: the most text a whole (not streamed) answer of a generator gathers, all its choices
            together, in UTF-8 bytes; a choice whose next response would pass it ends there with `finish_reason`
            `length` (its generator is stopped). A stream is paced by its client instead and has no such bound.
    """

    chat_template: ChatTemplate = None
    template_variables: Optional[Dict[str, Any]] = None
    token_counter: TokenCounter = None
    owned_by: str = "pytriton"
    max_answer_bytes: int = MAX_ANSWER_BYTES
    # When it was bound: /v1/models' `created`.
    created: int = dataclasses.field(default_factory=_now, init=False, compare=False)

    @property
    def serves_chat(self) -> bool:
        """Whether /v1/chat/completions is served."""
        return True


@dataclasses.dataclass(frozen=True, eq=False)
class OpenAICompletions(_ByValue):
    """Serve a text-generation model at /v1/completions only (the prompt goes to `text_input` as it is).

    Args:
        token_counter: as OpenAIChat's.
        owned_by: the `owned_by` of the model in /v1/models.
        max_answer_bytes: as OpenAIChat's.
    """

    token_counter: TokenCounter = None
    owned_by: str = "pytriton"
    max_answer_bytes: int = MAX_ANSWER_BYTES
    # When it was bound: /v1/models' `created`.
    created: int = dataclasses.field(default_factory=_now, init=False, compare=False)

    @property
    def serves_chat(self) -> bool:
        """Whether /v1/chat/completions is served."""
        return False


@dataclasses.dataclass(frozen=True, eq=False)
class OpenAIEmbeddings(_ByValue):
    """Serve an embedding model at /v1/embeddings: `text_input` (BYTES) in, `embedding` (a vector) out.

    Args:
        truncate_dimensions: whether the server answers `dimensions` by keeping a vector's first
            `dimensions` values, normalized again (a Matryoshka-trained model). A model that declares an
            input named `dimensions` gets the request's value there instead. Otherwise a request with
            `dimensions` is refused.
        token_counter: as OpenAIChat's (usage.prompt_tokens).
        owned_by: the `owned_by` of the model in /v1/models.
    """

    truncate_dimensions: bool = False
    token_counter: TokenCounter = None
    owned_by: str = "pytriton"
    # When it was bound: /v1/models' `created`.
    created: int = dataclasses.field(default_factory=_now, init=False, compare=False)


OpenAIOption = Union[OpenAIChat, OpenAICompletions, OpenAIEmbeddings]
OPENAI_OPTIONS = (OpenAIChat, OpenAICompletions, OpenAIEmbeddings)


PORT_VARIABLE = "PYTRITON_OPENAI_PORT"


def resolve_openai_port(explicit: Optional[int], environ: Mapping[str, str] = os.environ) -> Optional[int]:
    """The port of the OpenAI API: `explicit` when given, else PYTRITON_OPENAI_PORT, else None (the HTTP port's).

    Raises:
        PyTritonValidationError: not a port number (0: a free port).
    """
    if explicit is not None:
        source, value = "openai_port", explicit
    elif environ.get(PORT_VARIABLE, "").strip():
        source, text = PORT_VARIABLE, environ[PORT_VARIABLE].strip()
        try:
            value = int(text)
        except ValueError:
            raise PyTritonValidationError(f"{PORT_VARIABLE}={text!r} is not a port number") from None
    else:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise PyTritonValidationError(f"{source}: {value!r} is not a port number (0 to 65535; 0: a free port)")
    return value


def counted(counter: TokenCounter, text: str) -> int:
    """The tokens of `text`: the counter's, else its whitespace-separated words."""
    if counter is not None:
        return int(counter(text))
    return len(text.split())


__all__ = [
    "MAX_ANSWER_BYTES",
    "OPENAI_OPTIONS",
    "ChatTemplate",
    "Message",
    "OpenAIChat",
    "OpenAICompletions",
    "OpenAIEmbeddings",
    "OpenAIOption",
    "TokenCounter",
    "counted",
    "resolve_openai_port",
]
