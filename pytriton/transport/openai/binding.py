"""What a model bound with `openai=...` must declare, checked when it is bound."""

from __future__ import annotations

from typing import Any

from pytriton.core.spec import ModelSpec
from pytriton.core.tensors.datatypes import BYTES
from pytriton.exceptions import PyTritonModelConfigError
from pytriton.options.openai import OPENAI_OPTIONS, OpenAIChat, OpenAIEmbeddings
from pytriton.transport.openai.generation import EMBEDDING_OUTPUT, TEXT_INPUT, TEXT_OUTPUT
from pytriton.transport.openai.templates import check_template


def check_binding(spec: ModelSpec, option: Any) -> None:
    """Refuse a binding the OpenAI routes could not serve, saying what it lacks.

    Raises:
        PyTritonModelConfigError: a tensor is missing or of the wrong type, or the chat template is unusable.
    """
    if not isinstance(option, OPENAI_OPTIONS):
        names = ", ".join(kind.__name__ for kind in OPENAI_OPTIONS)
        raise PyTritonModelConfigError(f"model '{spec.name}': openai must be one of {names} or None, not {option!r}")
    text_input = spec.input_by_name.get(TEXT_INPUT)
    if text_input is None or text_input.datatype != BYTES:
        raise PyTritonModelConfigError(
            f"model '{spec.name}': the OpenAI API needs an input '{TEXT_INPUT}' of dtype bytes (np.bytes_ or object)"
        )
    if isinstance(option, OpenAIEmbeddings):
        if EMBEDDING_OUTPUT not in spec.output_by_name:
            raise PyTritonModelConfigError(
                f"model '{spec.name}': an OpenAIEmbeddings model needs an output '{EMBEDDING_OUTPUT}' (its vector)"
            )
        if spec.decoupled:
            raise PyTritonModelConfigError(f"model '{spec.name}': an OpenAIEmbeddings model cannot be decoupled")
        return
    limit = option.max_answer_bytes
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise PyTritonModelConfigError(f"model '{spec.name}': max_answer_bytes must be a positive int, not {limit!r}")
    output = spec.output_by_name.get(TEXT_OUTPUT)
    if output is None or output.datatype != BYTES:
        raise PyTritonModelConfigError(
            f"model '{spec.name}': the OpenAI API needs an output '{TEXT_OUTPUT}' of dtype bytes (np.bytes_ or object)"
        )
    if isinstance(option, OpenAIChat):
        try:
            check_template(option.chat_template)
        except (TypeError, ValueError, ImportError) as error:
            raise PyTritonModelConfigError(f"model '{spec.name}': {error}") from None
