"""Chat templates: a request's messages as the prompt a model reads.

A template is a Jinja2 string in Hugging Face's format (a tokenizer's `chat_template`), rendered in Jinja2's
sandbox, or a function of the messages; the built-in one writes each message as `<|role|>` and its content.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional

from pytriton.options.openai import ChatTemplate, Message

DEFAULT_TEMPLATE_TEXT = "<|{role}|>\n{content}\n"
GENERATION_PROMPT = "<|assistant|>\n"


class TemplateError(ValueError):
    """A template could not render a request's messages (the request's 400)."""


def default_template(messages: List[Message]) -> str:
    """Each message as `<|role|>`, a newline, its content and a newline; then `<|assistant|>` and a newline."""
    parts = [DEFAULT_TEMPLATE_TEXT.format(role=message["role"], content=message["content"]) for message in messages]
    return "".join(parts) + GENERATION_PROMPT


def check_template(template: ChatTemplate) -> None:
    """Refuse at bind time a template that can never render (neither a string nor a function, no Jinja2, bad syntax)."""
    if template is None or callable(template):
        return
    if not isinstance(template, str):
        raise TypeError(f"chat_template must be a Jinja2 string or a function of the messages, not {type(template)}")
    _compiled(template)


def render(
    template: ChatTemplate,
    messages: List[Message],
    variables: Optional[Dict[str, Any]] = None,
    tools: Optional[List[Any]] = None,
) -> str:
    """The prompt of `messages` (TemplateError when the template fails on them).

    A Jinja2 template also gets the request's `tools` (None without), as Hugging Face's `apply_chat_template(...,
    tools=...)` and vLLM hand them to a tokenizer's template, which writes them into the prompt.
    """
    try:
        if template is None:
            return default_template(messages)
        if callable(template):
            return str(template(messages))
        context = {**(variables or {}), "messages": messages, "add_generation_prompt": True, "tools": tools}
        return str(_compiled(template).render(context))
    except TemplateError:
        raise
    except Exception as error:  # noqa: BLE001 - a user's template or function: its failure is the request's
        raise TemplateError(f"the chat template failed on these messages: {type(error).__name__}: {error}") from None


@functools.lru_cache(maxsize=64)
def _compiled(source: str) -> Any:
    """A Jinja2 template compiled once in the sandbox (as transformers compiles chat templates)."""
    try:
        from jinja2 import TemplateSyntaxError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ImportError(
            "a chat_template string is a Jinja2 template: install jinja2 (pip install jinja2), "
            "or pass a function of the messages"
        ) from None
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = _raise
    try:
        return environment.from_string(source)
    except TemplateSyntaxError as error:
        raise ValueError(f"chat_template is not a valid Jinja2 template: {error}") from None


def _raise(message: str) -> None:
    """What a template calls to refuse its messages (`raise_exception`, as Hugging Face's templates do)."""
    raise TemplateError(message)


TemplateFunction = Callable[[List[Message]], str]
