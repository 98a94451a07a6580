"""The OpenAI API's pure parts: stop sequences over pieces, templates, options pickled by value, request checks."""

from __future__ import annotations

import json
import pickle
import time
from typing import List

import pytest

from pytriton.exceptions import PyTritonModelConfigError
from pytriton.model_config import Tensor
from pytriton.openai import OpenAIChat, OpenAICompletions, default_template
from pytriton.protocol.openai_codec import OpenAIError, parse_chat, parse_embeddings
from pytriton.transport.openai.generation import StopScanner
from pytriton.transport.openai.templates import TemplateError, render
from pytriton.triton import Triton


def _scan(stops: List[str], pieces: List[str]) -> str:
    scanner = StopScanner(stops)
    out = []
    for piece in pieces:
        text, stopped = scanner.feed(piece)
        out.append(text)
        if stopped:
            return "".join(out) + "|stopped"
    return "".join(out) + scanner.flush()


def test_a_stop_sequence_split_over_pieces_ends_the_text_before_it() -> None:
    assert _scan(["END"], ["abc E", "N", "D more"]) == "abc |stopped"
    assert _scan(["END"], ["abc E", "NX"]) == "abc ENX"  # a prefix that did not become the stop goes out
    assert _scan(["xy", "b"], ["aax", "b"]) == "aax|stopped"
    assert _scan([], ["a", "b"]) == "ab"
    long = "x" * 20 + "END"  # longer than the first characters looked for at once
    assert _scan([long], ["abc" + "x" * 10, "x" * 10 + "EN", "D tail"]) == "abc|stopped"
    assert _scan([long], ["abc" + "x" * 10, "x" * 10 + "EN", "d tail"]) == "abc" + "x" * 20 + "ENd tail"


def test_a_long_stop_sequence_costs_time_linear_in_the_answer() -> None:
    """A client chooses the stop sequences: comparing each end of a 1 MB answer with a 0.5 MB one took about 9 s."""
    started = time.monotonic()
    assert StopScanner(["y" * 500_000]).feed("x" * 1_000_000) == ("x" * 1_000_000, False)
    assert time.monotonic() - started < 1


def test_templates() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    assert default_template(messages) == "<|user|>\nHi\n<|assistant|>\n"
    assert render("{{ bos }}{% for m in messages %}{{ m.content }}{% endfor %}", messages, {"bos": "<s>"}) == "<s>Hi"
    with pytest.raises(TemplateError, match="no system"):
        render("{{ raise_exception('no system') }}", messages)
    with pytest.raises(TemplateError, match="ZeroDivisionError"):
        render(lambda _: str(1 / 0), messages)


def test_options_travel_by_value_with_their_callables() -> None:
    option = OpenAIChat(chat_template=lambda messages: "x", token_counter=lambda text: 3)
    copy = pickle.loads(pickle.dumps(option))
    assert copy.chat_template([]) == "x" and copy.token_counter("") == 3 and copy.created == option.created


def test_a_binding_without_the_conventional_tensors_is_refused() -> None:
    triton = Triton()
    try:
        with pytest.raises(PyTritonModelConfigError, match="needs an input 'text_input'"):
            triton.bind("m", lambda r: r, [Tensor(name="x", dtype=bytes, shape=(1,))], [], openai=OpenAIChat())
        with pytest.raises(PyTritonModelConfigError, match="not a valid Jinja2 template"):
            triton.bind(
                "m",
                lambda r: r,
                [Tensor(name="text_input", dtype=bytes, shape=(1,))],
                [Tensor(name="text_output", dtype=bytes, shape=(1,))],
                openai=OpenAIChat("{% for %}"),
            )
        for limit in (0, 1.5, True):
            with pytest.raises(PyTritonModelConfigError, match="max_answer_bytes must be a positive int"):
                triton.bind(
                    "m",
                    lambda r: r,
                    [Tensor(name="text_input", dtype=bytes, shape=(1,))],
                    [Tensor(name="text_output", dtype=bytes, shape=(1,))],
                    openai=OpenAICompletions(max_answer_bytes=limit),  # type: ignore[arg-type]
                )
    finally:
        triton.stop()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "m", "messages": [{"role": "robot", "content": "x"}]}', "messages.[0].role"),
        (b'{"model": "m", "messages": [{"role": "user", "content": null}]}', "messages.[0].content"),
        (b'{"model": "m", "messages": [{"role": "tool", "tool_call_id": "c"}]}', "messages.[0].content"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x", "name": 5}]}', "messages.[0].name"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}', "n"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], '
            b'"tools": [{"type": "function", "function": {"name": "f"}}, 5]}',
            "tools.[1]",
        ),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["a","b","c","d","e"]}', "stop"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {}}', "stream_options"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "modalities": ["audio"]}', "modalities"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "function_call": {"name": "f"}}',
            "function_call",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": "text"}',
            "response_format",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}',
            "response_format.type",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": "x"}',
            "parallel_tool_calls",
        ),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "reasoning_effort": 5}', "reasoning_effort"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "logit_bias": [1]}', "logit_bias"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "audio": {"voice": "a", "format": "wav"}}',
            "audio",
        ),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "moderation": {"model": "m"}}', "moderation"),
    ],
)
def test_chat_requests_openai_refuses_are_refused_naming_the_field(body: bytes, param: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        parse_chat(body)
    assert refused.value.status == 400 and refused.value.param == param


def test_embedding_requests_are_checked() -> None:
    assert parse_embeddings(b'{"model": "e", "input": "a", "dimensions": 3}').dimensions == 3
    with pytest.raises(OpenAIError, match="encoding_format"):
        parse_embeddings(b'{"model": "e", "input": "a", "encoding_format": "int8"}')


def test_an_error_message_repeats_a_refused_value_only_in_part() -> None:
    with pytest.raises(OpenAIError) as refused:
        parse_chat(
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "%s"}' % (b"9" * 10**6)
        )
    assert refused.value.param == "max_tokens" and len(refused.value.message) < 200


def test_an_assistant_message_may_have_no_content_beside_its_call() -> None:
    calls = b'"tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]'
    for assistant in (b'"content": null', calls, b'"function_call": {"name": "f", "arguments": "{}"}'):
        request = parse_chat(b'{"model": "m", "messages": [{"role": "assistant", %s}]}' % assistant)
        assert request.messages[0]["content"] == ""
    with pytest.raises(OpenAIError, match="no 'content'"):
        parse_chat(b'{"model": "m", "messages": [{"role": "assistant"}]}')


def test_a_tool_choice_that_lets_the_model_answer_text_is_taken() -> None:
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": allowed}
    assert json.loads(parse_chat(json.dumps(body).encode()).sampling.parameters["tool_choice"]) == allowed
    body["tool_choice"] = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": []}}
    with pytest.raises(OpenAIError, match="never tool calls"):
        parse_chat(json.dumps(body).encode())


def test_an_assistants_refusal_part_is_its_text() -> None:
    refusal = [{"type": "refusal", "refusal": "No."}, {"type": "text", "text": " Sorry."}]
    request = parse_chat(json.dumps({"model": "m", "messages": [{"role": "assistant", "content": refusal}]}).encode())
    assert request.messages[0]["content"] == "No. Sorry."
    with pytest.raises(OpenAIError, match="only text parts"):
        parse_chat(json.dumps({"model": "m", "messages": [{"role": "user", "content": refusal}]}).encode())
