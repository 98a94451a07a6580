"""The OpenAI API with the `openai` SDK against a running server: chat, completions, embeddings, errors."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Tuple, cast

import httpx
import numpy as np
import openai
import pytest

from pytriton.model_config import DynamicBatcher, ModelConfig
from pytriton.openai import OpenAIChat
from pytriton.options.openai import MAX_ANSWER_BYTES
from pytriton.triton import ServerLimits, Triton, TritonSecurityConfig
from tests import openai_models
from tests.conftest import ACCESS_TOKEN, HTTP_AUTH, running_triton
from tests.http_helpers import get_json, post_json, request
from tests.openai_models import (
    DEFAULT_TOKENS,
    JINJA_TEMPLATE,
    TEXT_IN,
    TEXT_OUT,
    default_prompt,
    raw_chat,
    read_events,
    sdk_client,
    tokens_for,
)
from tests.test_metrics import sample, scrape
from tests.test_robustness import HELD_STEPS, steps_once_held, unread_socket

USER = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(openai_models.bind_models) as server:
        yield server


@pytest.fixture(scope="module")
def client(triton: Triton) -> Iterator[openai.OpenAI]:
    with sdk_client(triton.http_port) as sdk:
        yield sdk


def _expected(content: str, count: int = DEFAULT_TOKENS) -> str:
    return "".join(tokens_for(default_prompt(content), count))


def test_models_lists_the_models_bound_with_an_openai_option(client: openai.OpenAI) -> None:
    ids = sorted(model.id for model in client.models.list())
    assert ids == sorted(
        [
            *("toy", "toy-batched", "toy-jinja", "toy-fn", "whole", "whole-completions", "with-inputs"),
            *("endless", "failing", "split-characters", "embed", "embed-fixed", "embed-dims"),
        ]
    )
    model = client.models.retrieve("toy")
    assert (model.id, model.object, model.owned_by) == ("toy", "model", "pytriton")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("plain")


@pytest.mark.parametrize("frontends", [None, 2])
def test_a_model_unloaded_through_the_repository_api_is_not_listed_and_is_again_once_loaded(frontends: Any) -> None:
    """Its chat requests were 404 `model_not_found` while /v1/models still listed it."""

    def bind(triton: Triton) -> None:
        for name in ("toy", "other"):
            triton.bind(
                name, openai_models.toy, [TEXT_IN], [TEXT_OUT], config=ModelConfig(decoupled=True), openai=OpenAIChat()
            )

    with running_triton(bind, frontends=frontends) as triton, sdk_client(triton.http_port) as sdk:
        port = triton.http_port or 0
        assert request(port, "POST", "/v2/repository/models/toy/unload", b"", HTTP_AUTH)[0] == 200
        assert [model.id for model in sdk.models.list()] == ["other"]
        with pytest.raises(openai.NotFoundError):
            sdk.models.retrieve("toy")
        with pytest.raises(openai.NotFoundError):
            sdk.chat.completions.create(model="toy", messages=USER)
        assert request(port, "POST", "/v2/repository/models/toy/load", b"", HTTP_AUTH)[0] == 200
        assert sorted(model.id for model in sdk.models.list()) == ["other", "toy"]
        assert sdk.models.retrieve("toy").id == "toy"


def test_chat_completion_whole(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="toy", messages=USER)
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-") and answer.model == "toy"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == _expected("Say something.")
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None
    assert answer.usage.completion_tokens == DEFAULT_TOKENS
    assert answer.usage.prompt_tokens == len(default_prompt("Say something.").split())
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + DEFAULT_TOKENS


def test_max_tokens_ends_with_length(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="toy", messages=USER, max_tokens=3)
    assert answer.choices[0].message.content == _expected("Say something.", 3)
    assert answer.choices[0].finish_reason == "length"
    newer = client.chat.completions.create(model="toy", messages=USER, max_completion_tokens=2)
    assert newer.choices[0].message.content == _expected("Say something.", 2)


def test_chat_completion_streamed_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="toy",
        messages=USER,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == _expected("Say something.")
    pieces = [
        chunk.choices[0].delta.content for chunk in chunks[1:] if chunk.choices and chunk.choices[0].delta.content
    ]
    assert pieces == tokens_for(default_prompt("Say something."))  # a chunk a token, in order
    finished = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finished == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == DEFAULT_TOKENS
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_stream_without_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="toy", messages=USER, stream=True))
    assert all(chunk.choices for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_sequence_ends_the_text_before_it(client: openai.OpenAI) -> None:
    tokens = tokens_for(default_prompt("stop here"))
    stop = tokens[2].strip()
    answer = client.chat.completions.create(
        model="toy",
        messages=[{"role": "user", "content": "stop here"}],
        stop=[stop],
    )
    assert answer.choices[0].message.content == "".join(tokens[:2])
    assert answer.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "stop here"}], stop=stop, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "".join(tokens[:2])


def test_a_character_split_over_responses_arrives_whole(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="split-characters", messages=USER)
    assert answer.choices[0].message.content == "café €!\ufffd"  # the last character never finished
    streamed = client.chat.completions.create(model="split-characters", messages=USER, stream=True)
    pieces = [chunk.choices[0].delta.content for chunk in streamed if chunk.choices and chunk.choices[0].delta.content]
    assert pieces == ["caf", "é ", "€", "!", "\ufffd"]
    stopped = client.chat.completions.create(model="split-characters", messages=USER, stop="é")
    assert stopped.choices[0].message.content == "caf"


def test_n_choices(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="toy", messages=USER, n=2, max_tokens=2)
    assert [choice.index for choice in answer.choices] == [0, 1]
    assert all(choice.message.content == _expected("Say something.", 2) for choice in answer.choices)
    assert answer.usage is not None and answer.usage.completion_tokens == 4
    streamed = list(client.chat.completions.create(model="toy", messages=USER, n=2, max_tokens=2, stream=True))
    for index in (0, 1):
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices and c.choices[0].index == index)
        assert text == _expected("Say something.", 2)


def test_async_streams_in_parallel_are_batched_and_each_keeps_its_order(triton: Triton) -> None:
    """Four concurrent streams fill one batch of the dynamic batcher (max_batch_size 4, a long queue delay)."""

    async def run() -> List[str]:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{triton.http_port}/v1", api_key="none", max_retries=0)

        async def one(index: int) -> str:
            stream = await client.chat.completions.create(
                model="toy-batched", messages=[{"role": "user", "content": f"prompt {index}"}], stream=True
            )
            return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])

        try:
            return await asyncio.gather(*(one(index) for index in range(4)))
        finally:
            await client.close()

    openai_models.batch_sizes.clear()
    texts = asyncio.run(run())
    assert texts == [_expected(f"prompt {index}") for index in range(4)]
    assert openai_models.batch_sizes == [4]


def test_async_whole_answer(triton: Triton) -> None:
    async def run() -> str:
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{triton.http_port}/v1", api_key="none", max_retries=0
        ) as client:
            answer = await client.chat.completions.create(model="toy-jinja", messages=USER)
            return answer.choices[0].message.content or ""

    assert asyncio.run(run()) == "".join(tokens_for("[user]Say something.>"))


def test_chat_templates_jinja_and_function(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    jinja = client.chat.completions.create(model="toy-jinja", messages=messages)
    assert jinja.choices[0].message.content == "".join(tokens_for("[system]Be brief.[user]Hi>"))
    assert JINJA_TEMPLATE  # the template the model was bound with
    function = client.chat.completions.create(model="toy-fn", messages=messages)
    assert function.choices[0].message.content == "".join(tokens_for("Be brief.|Hi"))


def test_plain_callable_gets_the_prompt_and_the_sampling_parameters(client: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    answer = client.chat.completions.create(
        model="whole",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
        temperature=0.5,
        top_p=0.9,
        seed=7,
        user="u1",
        max_tokens=50,
        presence_penalty=0.1,
        tools=tools,
        tool_choice="auto",
        response_format={"type": "json_object"},
        verbosity="low",
        safety_identifier="s1",
        prompt_cache_key="k1",
        prompt_cache_retention="24h",  # fields of the SDK's create() that change nothing here are taken too
    )
    seen = json.loads(answer.choices[0].message.content or "")
    assert seen["prompt"] == default_prompt("Hi there")
    parameters = seen["parameters"]
    assert parameters["temperature"] == 0.5 and parameters["top_p"] == 0.9 and parameters["seed"] == 7
    assert parameters["user"] == "u1" and parameters["max_tokens"] == 50 and parameters["stream"] is False
    assert json.loads(parameters["tools"]) == tools and parameters["tool_choice"] == "auto"
    assert json.loads(parameters["response_format"]) == {"type": "json_object"}
    assert (parameters["verbosity"], parameters["safety_identifier"], parameters["prompt_cache_key"]) == (
        "low",
        "s1",
        "k1",
    )
    assert answer.choices[0].finish_reason == "stop"


TOOLS_TEMPLATE = (
    "{% if tools %}<tools>{% for tool in tools %}{{ tool.function.name }}: {{ tool.function.description }};"
    "{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
    "{% for call in m.tool_calls or [] %}<call {{ call.function.name }}({{ call.function.arguments }})>{% endfor %}"
    "{% endfor %}>"
)


def test_a_jinja_chat_template_gets_the_requests_tools_as_apply_chat_template_does() -> None:
    """A tokenizer's template writes the tools into the prompt (Hugging Face's `apply_chat_template(tools=...)`)."""

    def bind(triton: Triton) -> None:
        option = OpenAIChat(chat_template=TOOLS_TEMPLATE, template_variables={"tools": "not the request's"})
        triton.bind("tooled", openai_models.whole, [TEXT_IN], [TEXT_OUT], openai=option)

    weather = {"name": "weather", "description": "The weather of a city", "parameters": {"type": "object"}}
    messages: List[Any] = [
        {"role": "user", "content": "Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    with running_triton(bind) as triton, sdk_client(triton.http_port) as sdk:
        answer = sdk.chat.completions.create(
            model="tooled", messages=messages, tools=[{"type": "function", "function": weather}], tool_choice="auto"
        )
        seen = json.loads(answer.choices[0].message.content or "")
        assert seen["prompt"] == (
            '<tools>weather: The weather of a city;</tools>[user]Paris?[assistant]<call weather({"city": "Paris"})>'
            "[tool]sunny>"
        )
        assert json.loads(seen["parameters"]["tools"]) == [{"type": "function", "function": weather}]
        plain = sdk.chat.completions.create(model="tooled", messages=USER)
        assert json.loads(plain.choices[0].message.content or "")["prompt"] == "[user]Say something.>"


def test_sampling_fields_become_inputs_the_model_declares(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="with-inputs", messages=USER, max_tokens=9, temperature=0.25)
    seen = json.loads(answer.choices[0].message.content or "")
    assert seen["inputs"] == {"max_tokens": 9, "temperature": 0.25, "messages": USER}
    assert "max_tokens" not in seen["parameters"] and "temperature" not in seen["parameters"]


def test_plain_callable_streams_as_one_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="whole", messages=USER, stream=True))
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(contents) == 1 and json.loads(contents[0])["parameters"]["stream"] is True


def test_completions(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="toy", prompt="Once", max_tokens=3)
    assert answer.object == "text_completion" and answer.id.startswith("cmpl-")
    assert answer.choices[0].text == "".join(tokens_for("Once", 3)) and answer.choices[0].finish_reason == "length"
    several = client.completions.create(model="toy", prompt=["a", "b"], n=2, max_tokens=2)
    assert [choice.text for choice in several.choices] == ["".join(tokens_for(p, 2)) for p in ("a", "a", "b", "b")]
    echoed = client.completions.create(model="whole-completions", prompt="raw", echo=True)
    assert echoed.choices[0].text.startswith("raw{")
    unechoed = client.completions.create(model="whole-completions", prompt="raw", echo=None)  # sent as null
    assert unechoed.choices[0].text.startswith("{")
    streamed = list(client.completions.create(model="toy", prompt="Once", max_tokens=3, stream=True))
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == "".join(tokens_for("Once", 3))
    with pytest.raises(openai.BadRequestError, match="not served at /v1/chat/completions"):
        client.chat.completions.create(model="whole-completions", messages=USER)


def test_embeddings_float_base64_and_dimensions(client: openai.OpenAI) -> None:
    floats = client.embeddings.create(model="embed", input=["hello", "world"], encoding_format="float")
    assert [item.index for item in floats.data] == [0, 1] and floats.model == "embed"
    vectors = [np.array(item.embedding) for item in floats.data]
    assert [vector.shape for vector in vectors] == [(8,), (8,)]
    assert all(abs(np.linalg.norm(vector) - 1) < 1e-5 for vector in vectors)
    decoded = client.embeddings.create(model="embed", input=["hello", "world"])  # the SDK asks base64 and decodes it
    assert np.allclose([item.embedding for item in decoded.data], vectors)
    raw = client.embeddings.with_raw_response.create(model="embed", input="hello", encoding_format="base64")
    text = json.loads(raw.text)["data"][0]["embedding"]
    assert np.allclose(np.frombuffer(base64.b64decode(text), dtype="<f4"), vectors[0])
    short = client.embeddings.create(model="embed", input="hello", dimensions=4, encoding_format="float")
    assert np.allclose(short.data[0].embedding, vectors[0][:4] / np.linalg.norm(vectors[0][:4]), atol=1e-6)
    assert floats.usage.prompt_tokens == 2
    by_model = client.embeddings.create(model="embed-dims", input="x", dimensions=5, encoding_format="float")
    assert by_model.data[0].embedding == [1.0] * 5
    with pytest.raises(openai.BadRequestError, match="does not support 'dimensions'"):
        client.embeddings.create(model="embed-fixed", input="x", dimensions=4)
    with pytest.raises(openai.BadRequestError, match="at most 8"):
        client.embeddings.create(model="embed", input="x", dimensions=9)


def test_errors_are_the_sdks_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="nope", messages=USER)
    assert not_found.value.code == "model_not_found" and not_found.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="plain", messages=USER)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="toy", messages=[])
    assert bad.value.param == "messages" and bad.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.chat.completions.create(model="toy", messages=USER, logprobs=True)
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(model="toy", messages=USER, tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="toy", messages=USER, temperature=3)
    with pytest.raises(openai.BadRequestError, match="only text parts"):
        client.chat.completions.create(
            model="toy",
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        )
    with pytest.raises(openai.BadRequestError, match="'web_search_options' is not supported") as unsupported:
        client.chat.completions.create(model="toy", messages=USER, web_search_options={})
    assert unsupported.value.param == "web_search_options"
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: bogus"):
        client.chat.completions.create(model="toy", messages=USER, extra_body={"bogus": 1})


def test_a_failing_model_is_a_server_error_or_an_error_event(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError, match="ValueError: the toy model broke"):
        client.chat.completions.create(model="failing", messages=USER)
    with pytest.raises(openai.APIError, match="the toy model broke"):
        list(client.chat.completions.create(model="failing", messages=USER, stream=True, user="late"))


def test_api_key_is_required_when_configured() -> None:
    security = TritonSecurityConfig(access_token=ACCESS_TOKEN, openai_api_key="sk-test")
    with running_triton(openai_models.bind_models, security_config=security) as server:
        with pytest.raises(openai.AuthenticationError) as denied, sdk_client(server.http_port, "wrong") as wrong:
            wrong.models.list()
        assert denied.value.code == "invalid_api_key"
        status, document = post_json(server.http_port or 0, "/v1/chat/completions", {"model": "toy", "messages": USER})
        assert status == 401 and "didn't provide an API key" in document["error"]["message"]
        status, _ = get_json(server.http_port or 0, "/v2/health/ready")  # Triton's routes ask no OpenAI key
        assert status == 200
        with sdk_client(server.http_port, "sk-test") as allowed:
            answer = allowed.chat.completions.create(model="toy", messages=USER, max_tokens=1)
        assert answer.choices[0].message.content == _expected("Say something.", 1)
        models = f"http://127.0.0.1:{server.http_port}/v1/models"
        for keys, status in ((("sk-test", "wrong"), 200), (("wrong", "sk-test"), 401)):  # the first header counts
            headers = [("Authorization", f"Bearer {key}") for key in keys]
            assert httpx.get(models, headers=headers).status_code == status


def test_a_client_leaving_mid_stream_stops_the_generator(triton: Triton) -> None:
    openai_models.endless_stopped.clear()
    records: List[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("pytriton.openai")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)  # whatever the test run's logging configuration lets through
    with raw_chat(triton.http_port, {"model": "endless", "messages": USER, "stream": True}) as sock:
        assert read_events(sock, 3).startswith(b"HTTP/1.1 200")
    try:
        assert openai_models.endless_stopped.wait(10), "the generator went on after its client left"
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert any("client disconnected from stream" in record.getMessage() for record in records), records


def _token_metrics(triton: Triton, model: str) -> Tuple[float, float, float, float]:
    """Output tokens, prompt tokens, first-token observations and between-token observations of a model."""
    families = scrape(triton)
    labels = {"model": model, "version": "1"}
    return (
        sample(families, "pytriton_openai_output_tokens", **labels),
        sample(families, "pytriton_openai_prompt_tokens", **labels),
        sample(families, "pytriton_openai_time_to_first_token_seconds", "_count", **labels),
        sample(families, "pytriton_openai_time_between_tokens_seconds", "_count", **labels),
    )


def test_token_metrics_count_each_generation_once(triton: Triton, client: openai.OpenAI) -> None:
    before = _token_metrics(triton, "toy-fn")
    client.chat.completions.create(model="toy-fn", messages=USER, max_tokens=5)
    list(client.chat.completions.create(model="toy-fn", messages=USER, max_tokens=3, stream=True))
    after = _token_metrics(triton, "toy-fn")
    prompt_tokens = len("Say something.".split())
    assert [b - a for a, b in zip(before, after)] == [8, 2 * prompt_tokens, 2, 4 + 2]
    families = scrape(triton)
    assert (
        sample(
            families, "pytriton_openai_time_to_first_token_seconds", "_bucket", model="toy-fn", version="1", le="+Inf"
        )
        == after[2]
    )
    assert not [s for s in families["pytriton_openai_output_tokens"].samples if s.labels["model"] == "embed"]


def test_a_stopping_server_answers_503_and_ends_open_streams_with_an_error_event() -> None:
    with running_triton(openai_models.bind_models, exit_timeout_secs=1) as server:
        port = server.http_port or 0
        # The client is made first: the 503 must come within the drain (1 s, as long as the stream holds it).
        with raw_chat(port, {"model": "endless", "messages": USER, "stream": True}) as sock, sdk_client(port) as client:
            received = read_events(sock, 2)
            stopping = threading.Thread(target=server.stop)
            stopping.start()
            deadline = time.monotonic() + 10
            while get_json(port, "/v2/health/ready")[0] == 200:  # the stop refuses new requests from now on
                assert time.monotonic() < deadline, "the server never stopped being ready"
                time.sleep(0.02)
            with pytest.raises(openai.InternalServerError) as refused:
                client.chat.completions.create(model="toy", messages=USER)
            assert refused.value.status_code == 503 and refused.value.code == "service_unavailable"
            while not received.endswith(b"0\r\n\r\n"):  # the stream's end, after the drain's cut-off
                part = sock.recv(65536)
                assert part, "the connection closed before the stream ended"
                received += part
        stopping.join(30)
    assert b'"code":"service_unavailable"' in received.split(b"data: ")[-1]


def test_a_client_leaving_a_whole_answer_stops_the_generator(triton: Triton) -> None:
    openai_models.endless_stopped.clear()
    openai_models.endless_started.clear()
    with raw_chat(triton.http_port, {"model": "endless", "messages": USER}):
        assert openai_models.endless_started.wait(10)
    assert openai_models.endless_stopped.wait(10), "the generator went on after its client left"


def test_restricting_inference_with_the_access_token_restricts_the_openai_routes() -> None:
    security = TritonSecurityConfig(access_token=ACCESS_TOKEN, restricted_endpoints=["inference"])
    with running_triton(openai_models.bind_models, security_config=security) as server:
        with sdk_client(server.http_port) as plain:
            with pytest.raises(openai.PermissionDeniedError, match="triton-access-token"):
                plain.chat.completions.create(model="toy", messages=USER)
            assert "toy" in {model.id for model in plain.models.list()}  # metadata is not restricted
        with sdk_client(server.http_port, default_headers={"triton-access-token": ACCESS_TOKEN}) as allowed:
            answer = allowed.chat.completions.create(model="toy", messages=USER, max_tokens=1)
        assert answer.choices[0].message.content == _expected("Say something.", 1)


def test_one_binding_answers_the_generate_extension_too(triton: Triton) -> None:
    status, _, body = request(
        triton.http_port or 0,
        "POST",
        "/v2/models/toy/generate_stream",
        json.dumps({"text_input": "raw prompt", "max_tokens": 3}),
    )
    assert status == 200
    events = [json.loads(line[len(b"data: ") :]) for line in body.split(b"\n\n") if line.startswith(b"data: ")]
    assert [event["text_output"] for event in events] == tokens_for("raw prompt", 3)


DEEP = b"[" * 300 + b"]" * 300
BAD_BODIES = [
    ("/v1/chat/completions", b'{"model": "toy", "messages": [', 400, None),
    ("/v1/chat/completions", b"[1, 2]", 400, None),
    ("/v1/chat/completions", b'{"model": "toy", "messages": "hi"}', 400, "messages"),
    (
        "/v1/chat/completions",
        b'{"model": "toy", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}',
        400,
        "max_tokens",
    ),
    (
        "/v1/chat/completions",
        b'{"model": "toy", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
        400,
        "stream",
    ),
    (
        "/v1/chat/completions",
        b'{"model": "toy", "messages": [{"role": "user", "content": "x"}], "bogus": 1}',
        400,
        "bogus",
    ),
    (
        "/v1/chat/completions",
        b'{"model": "toy", "messages": [{"role": "user", "content": "x"}], "n": 100000}',
        400,
        "n",
    ),
    ("/v1/chat/completions", b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    # Values the server cannot hash or write back (orjson writes 254 levels, reads 1024) are the request's fault.
    (
        "/v1/chat/completions",
        b'{"model": "toy", "messages": [{"role": ["user"], "content": "x"}]}',
        400,
        "messages.[0].role",
    ),
    (
        "/v1/chat/completions",
        b'{"model": "toy", "messages": [{"role": "user", "content": "x"}], "max_tokens": %s}' % DEEP,
        400,
        "max_tokens",
    ),
    (
        "/v1/chat/completions",
        b'{"model": "toy", "messages": [{"role": "user", "content": "x"}], "metadata": {"a": %s}}' % DEEP,
        400,
        "metadata",
    ),
    (
        "/v1/chat/completions",
        b'{"model": "with-inputs", "messages": [{"role": "user", "content": "x", "x": %s}]}' % DEEP,
        400,
        "messages",
    ),
    ("/v1/embeddings", b'{"model": "embed", "input": "x", "dimensions": %s}' % DEEP, 400, "dimensions"),
    (
        "/v1/chat/completions",
        b'{"model": "toy", "messages": [{"role": "user", "content": [{"type": %s}]}]}' % (b"[" * 1010 + b"]" * 1010),
        400,
        "messages.[0].content",
    ),
    ("/v1/completions", b'{"model": "toy"}', 400, "prompt"),
    ("/v1/embeddings", b'{"model": "embed", "input": 5}', 400, "input"),
    ("/v1/embeddings", b"\xff\xfe", 400, None),
]


def test_bad_requests_get_openai_errors_and_leave_a_running_stream_whole(client: openai.OpenAI, triton: Triton) -> None:
    stream = client.chat.completions.create(model="toy", messages=USER, stream=True)
    pieces = [next(iter(stream)).choices[0].delta.content or ""]  # the stream runs
    for path, body, status, param in BAD_BODIES:
        got, _, answer = request(triton.http_port, "POST", path, body, {"content-type": "application/json"})
        error = json.loads(answer)["error"]
        assert (got, error["type"], error["param"]) == (status, "invalid_request_error", param), (path, body, answer)
        assert error["message"]
    with socket.create_connection(("127.0.0.1", triton.http_port), timeout=30) as sock:  # 413 from the head alone
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (1 << 40))
        head, _, body = b"".join(iter(lambda: sock.recv(65536), b"")).partition(b"\r\n\r\n")  # then it closes
        assert head.startswith(b"HTTP/1.1 413"), head
        assert json.loads(body)["error"]["type"] == "invalid_request_error", body  # OpenAI's shape, not Triton's
    pieces += [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert "".join(pieces) == _expected(USER[0]["content"])


def _with(**fields: Any) -> bytes:
    return json.dumps({"model": "whole", "messages": USER, **fields}).encode()


def _calls(*calls: Any) -> bytes:
    return json.dumps(
        {"model": "whole", "messages": [*USER, {"role": "assistant", "tool_calls": list(calls)}]}
    ).encode()


def _call(**fields: Any) -> Dict[str, Any]:
    call: Dict[str, Any] = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    call.update(fields)
    return {key: value for key, value in call.items() if value is not ...}


# (path, body, the error's param, a piece of its message): OpenAI answers each with a 400 invalid_request_error.
MISTYPED_FIELDS = {
    "a logit_bias key that is not a token id": (
        "/v1/chat/completions",
        _with(logit_bias={"hello": 1}),
        "logit_bias",
        "Invalid key in 'logit_bias': \"hello\"",
    ),
    "a negative token id": ("/v1/chat/completions", _with(logit_bias={"-5": 1}), "logit_bias", "non-negative"),
    "a logit_bias value past 100": (
        "/v1/chat/completions",
        _with(logit_bias={"50256": 101}),
        "logit_bias",
        "between -100 and 100, got 101",
    ),
    "a logit_bias value that is not a number": (
        "/v1/completions",
        json.dumps({"model": "whole-completions", "prompt": "x", "logit_bias": {"7": "-100"}}).encode(),
        "logit_bias",
        'got "-100"',
    ),
    "a logit_bias value that is a boolean": (
        "/v1/chat/completions",
        _with(logit_bias={"7": True}),
        "logit_bias",
        "got true",
    ),
    "tool_calls not a list": (
        "/v1/chat/completions",
        json.dumps({"model": "whole", "messages": [*USER, {"role": "assistant", "tool_calls": {"id": "c1"}}]}).encode(),
        "messages.[1].tool_calls",
        "expected an array",
    ),
    "a tool call that is not an object": (
        "/v1/chat/completions",
        _calls("c1"),
        "messages.[1].tool_calls.[0]",
        "expected an object",
    ),
    "a tool call without an id": (
        "/v1/chat/completions",
        _calls(_call(id=...)),
        "messages.[1].tool_calls.[0].id",
        "Missing required parameter: 'messages[1].tool_calls[0].id'",
    ),
    "a tool call id that is a number": (
        "/v1/chat/completions",
        _calls(_call(id=7)),
        "messages.[1].tool_calls.[0].id",
        "expected a string, got 7",
    ),
    "a tool call of an unknown type": (
        "/v1/chat/completions",
        _calls(_call(), _call(type="search")),
        "messages.[1].tool_calls.[1].type",
        "supported: function, custom",
    ),
    "a tool call whose function is a string": (
        "/v1/chat/completions",
        _calls(_call(function="f")),
        "messages.[1].tool_calls.[0].function",
        "expected an object",
    ),
    "a function call whose arguments are an object": (
        "/v1/chat/completions",
        _calls(_call(function={"name": "f", "arguments": {"city": "Paris"}})),
        "messages.[1].tool_calls.[0].function.arguments",
        "expected a string",
    ),
    "a function call without a name": (
        "/v1/chat/completions",
        _calls(_call(function={"arguments": "{}"})),
        "messages.[1].tool_calls.[0].function.name",
        "Missing required parameter",
    ),
}


@pytest.mark.parametrize("case", list(MISTYPED_FIELDS))
def test_a_mistyped_logit_bias_or_tool_call_gets_a_400_naming_it(triton: Triton, case: str) -> None:
    # They were handed to the model (logit_bias as JSON text, tool_calls to the chat template) as they came.
    path, body, param, words = MISTYPED_FIELDS[case]
    status, _, answer = request(triton.http_port, "POST", path, body, {"content-type": "application/json"})
    error = json.loads(answer)["error"]
    assert (status, error["type"], error["param"], error["code"]) == (400, "invalid_request_error", param, None), answer
    assert words in error["message"], error["message"]


def test_a_well_formed_logit_bias_and_tool_calls_are_taken(client: openai.OpenAI) -> None:
    custom = {"id": "c2", "type": "custom", "custom": {"name": "grep", "input": "x"}}
    messages: List[Any] = [*USER, {"role": "assistant", "content": None, "tool_calls": [_call(), custom]}]
    answer = client.chat.completions.create(model="whole", messages=messages, logit_bias={"50256": -100, "7": 2.5})
    parameters = json.loads(answer.choices[0].message.content or "")["parameters"]
    assert json.loads(parameters["logit_bias"]) == {"50256": -100, "7": 2.5}


ASKED = [*USER, {"role": "assistant", "content": None, "tool_calls": [_call()]}]  # what a tool message answers
WEATHER = {"type": "function", "function": {"name": "weather"}}


def _allowed(*tools: Any) -> Dict[str, Any]:
    return {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": list(tools)}}


# (messages, create()'s other fields, the error's param, a piece of its message): the SDK sends each as it is given
# (its types are not checked at run time) and OpenAI answers each with a 400 invalid_request_error.
MISTYPED_MESSAGES_AND_TOOLS: Dict[str, Tuple[List[Any], Dict[str, Any], str, str]] = {
    "a tool message without tool_call_id": (
        [*ASKED, {"role": "tool", "content": "sunny"}],
        {},
        "messages.[2].tool_call_id",
        "Missing required parameter: 'messages[2].tool_call_id'.",
    ),
    "a tool_call_id that is a number": (
        [*ASKED, {"role": "tool", "content": "sunny", "tool_call_id": 1}],
        {},
        "messages.[2].tool_call_id",
        "Invalid type for 'messages[2].tool_call_id': expected a string, got 1",
    ),
    "a text part whose text is a number": (
        [{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": 5}]}],
        {},
        "messages.[0].content.[1].text",
        "Invalid type for 'messages[0].content[1].text': expected a string, got 5",
    ),
    "a function_call that is a string": (
        [*USER, {"role": "assistant", "function_call": "weather"}],
        {},
        "messages.[1].function_call",
        "expected an object",
    ),
    "a function_call without arguments": (
        [*USER, {"role": "assistant", "content": None, "function_call": {"name": "weather"}}],
        {},
        "messages.[1].function_call.arguments",
        "Missing required parameter: 'messages[1].function_call.arguments'.",
    ),
    "a function_call whose name is a number": (
        [*USER, {"role": "assistant", "content": None, "function_call": {"name": 1, "arguments": "{}"}}],
        {},
        "messages.[1].function_call.name",
        "expected a string, got 1",
    ),
    "a function message without a name": (
        [*USER, {"role": "function", "content": "sunny"}],
        {},
        "messages.[1].name",
        "Missing required parameter: 'messages[1].name'.",
    ),
    "an assistant's refusal that is a number": (
        [*USER, {"role": "assistant", "content": "No.", "refusal": 1}],
        {},
        "messages.[1].refusal",
        "expected a string, got 1",
    ),
    "an assistant's audio without an id": (
        [*USER, {"role": "assistant", "content": "Yes.", "audio": {}}],
        {},
        "messages.[1].audio.id",
        "Missing required parameter",
    ),
    "a tool without a type": (
        USER,
        {"tools": [{"function": {"name": "weather"}}]},
        "tools.[0].type",
        "Missing required parameter: 'tools[0].type'.",
    ),
    "a tool of an unknown type": (
        USER,
        {"tools": [WEATHER, {"type": "search"}]},
        "tools.[1].type",
        "supported: function, custom",
    ),
    "a function tool without its function": (
        USER,
        {"tools": [{"type": "function"}]},
        "tools.[0].function",
        "Missing required parameter",
    ),
    "a function tool without a name": (
        USER,
        {"tools": [{"type": "function", "function": {"description": "The weather"}}]},
        "tools.[0].function.name",
        "Missing required parameter",
    ),
    "a function tool whose parameters are text": (
        USER,
        {"tools": [{"type": "function", "function": {"name": "weather", "parameters": "{}"}}]},
        "tools.[0].function.parameters",
        "expected an object",
    ),
    "a function tool whose strict is text": (
        USER,
        {"tools": [{"type": "function", "function": {"name": "weather", "strict": "yes"}}]},
        "tools.[0].function.strict",
        "expected a boolean",
    ),
    "a custom tool without a name": (
        USER,
        {"tools": [{"type": "custom", "custom": {"description": "grep"}}]},
        "tools.[0].custom.name",
        "Missing required parameter",
    ),
    "a function that is a string": (USER, {"functions": ["weather"]}, "functions.[0]", "expected an object"),
    "a function without a name": (
        USER,
        {"functions": [{"parameters": {"type": "object"}}]},
        "functions.[0].name",
        "Missing required parameter",
    ),
    "an unknown tool_choice": (
        USER,
        {"tools": [WEATHER], "tool_choice": "any"},
        "tool_choice",
        "Invalid value for 'tool_choice': \"any\"; supported: none, auto, required",
    ),
    "an unknown function_call": (
        USER,
        {"functions": [{"name": "weather"}], "function_call": "required"},
        "function_call",
        "supported: none, auto",
    ),
    "allowed tools that are not a list": (
        USER,
        {"tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto"}}},
        "tool_choice.allowed_tools.tools",
        "Missing required parameter",
    ),
    "an allowed tool without a name": (
        USER,
        {"tools": [WEATHER], "tool_choice": _allowed({"type": "function", "function": {}})},
        "tool_choice.allowed_tools.tools.[0].function.name",
        "Missing required parameter",
    ),
}


@pytest.mark.parametrize("case", list(MISTYPED_MESSAGES_AND_TOOLS))
def test_a_mistyped_message_or_tool_field_gets_a_400_naming_it(client: openai.OpenAI, case: str) -> None:
    # Each reached the model and its chat template as it came (a 200), or was refused in other words.
    messages, fields, param, words = MISTYPED_MESSAGES_AND_TOOLS[case]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="whole", messages=messages, **fields)
    error = refused.value
    assert (error.status_code, error.type, error.param, error.code) == (400, "invalid_request_error", param, None)
    assert words in cast(Dict[str, Any], error.body)["message"], error.body


def test_a_tool_calling_round_trip_and_the_older_function_calls_are_taken(client: openai.OpenAI) -> None:
    """The SDK's round trip: the answer's message with its tool call goes back, then the tool's answer to it."""
    answered = openai.types.chat.ChatCompletionMessage.model_validate(
        {"role": "assistant", "content": None, "refusal": None, "annotations": [], "tool_calls": [_call()]}
    )  # as the SDK reads OpenAI's answer of a tool call
    weather = {"name": "weather", "description": "The weather of a city", "parameters": {"type": "object"}}
    messages: List[Any] = [*USER, answered, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    tools: List[Any] = [
        {"type": "function", "function": {**weather, "strict": True}},
        {"type": "custom", "custom": {"name": "grep", "description": "Lines that match", "format": {"type": "text"}}},
    ]
    answer = client.chat.completions.create(
        model="with-inputs", messages=messages, tools=tools, tool_choice=_allowed(WEATHER)
    )
    seen = json.loads(answer.choices[0].message.content or "")
    assert seen["inputs"]["messages"][1:] == [
        {"role": "assistant", "content": "", "refusal": None, "annotations": [], "tool_calls": [_call()]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    assert json.loads(seen["parameters"]["tools"]) == tools
    older: List[Any] = [
        *USER,
        {"role": "assistant", "content": None, "function_call": {"name": "weather", "arguments": "{}"}},
        {"role": "function", "name": "weather", "content": None},  # OpenAI's spec lets it be null
        {"role": "assistant", "content": "Sunny.", "refusal": None, "audio": {"id": "audio_1"}, "name": "bot"},
    ]
    answer = client.chat.completions.create(
        model="with-inputs", messages=older, functions=[weather], function_call="auto"
    )
    seen = json.loads(answer.choices[0].message.content or "")
    assert [message["role"] for message in seen["inputs"]["messages"]] == ["user", "assistant", "function", "assistant"]
    assert json.loads(seen["parameters"]["functions"]) == [weather]


class TextFlood:
    """An endless chat model of 64 KiB tokens, as fast as it can; counts its steps, notes its end."""

    def __init__(self) -> None:
        self.steps = 0
        self.stopped = threading.Event()

    def __call__(self, requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
        try:
            while True:
                self.steps += 1
                yield [{"text_output": np.array([[b"x" * 65536]], dtype=object)} for _ in requests]
        finally:
            self.stopped.set()


@pytest.mark.parametrize("frontends", [None, 3])
def test_a_streamed_chat_whose_client_reads_nothing_holds_the_model_not_a_queue_of_text(frontends) -> None:
    flood = TextFlood()

    def bind(triton: Triton) -> None:
        triton.bind("flood", flood, [TEXT_IN], [TEXT_OUT], config=ModelConfig(decoupled=True), openai=OpenAIChat())

    with running_triton(bind, frontends=frontends) as triton:
        body = json.dumps({"model": "flood", "messages": USER, "stream": True}).encode()
        with unread_socket(triton.http_port) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            assert steps_once_held(flood) <= HELD_STEPS  # type: ignore[arg-type]
        assert flood.stopped.wait(10), "the generator went on after its client left"


@pytest.mark.parametrize("frontends", [None, 2])
def test_a_client_that_reads_nothing_does_not_hold_the_other_streams_of_its_batch(frontends: Any) -> None:
    """A raw client that never reads and an SDK client share a batch: the SDK client gets its whole answer.

    Holding the batch's generator for the client that read nothing had stalled the other stream until
    send_timeout_s cut that client off; now that client alone is cut off once it is far behind.
    """
    flood = TextFlood()
    batch_sizes: List[int] = []

    def flood_in_batches(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
        batch_sizes.append(len(requests))
        yield from flood(requests)

    def bind(triton: Triton) -> None:
        config = ModelConfig(
            decoupled=True,
            max_batch_size=2,
            batcher=DynamicBatcher(max_queue_delay_microseconds=60_000_000),  # runs once both are there
        )
        triton.bind("flood-batched", flood_in_batches, [TEXT_IN], [TEXT_OUT], config=config, openai=OpenAIChat())

    with running_triton(bind, frontends=frontends, limits=ServerLimits(send_timeout_s=600)) as triton:
        body = json.dumps({"model": "flood-batched", "messages": USER, "stream": True}).encode()
        with unread_socket(triton.http_port) as sock, sdk_client(triton.http_port, timeout=20) as sdk:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            stream = sdk.chat.completions.create(model="flood-batched", messages=USER, stream=True, max_tokens=1200)
            pieces = [chunk.choices[0].delta.content for chunk in stream if chunk.choices]
            assert batch_sizes == [2]
            assert len("".join(piece or "" for piece in pieces)) == 1200 * 65536
            received = b""
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            while not received.endswith(b"0\r\n\r\n"):  # the cut-off client ends with an error event
                chunk = sock.recv(1 << 20)
                assert chunk, received[-300:]
                received += chunk
            assert b"fell too far behind" in received[-2000:], received[-2000:]
            assert b"[DONE]" not in received
        assert flood.stopped.wait(10), "the generator went on after both its clients were gone"


def test_a_whole_answer_of_an_endless_generator_ends_at_max_answer_bytes() -> None:
    """Not streamed and without max_tokens, an endless generator's answer had grown without end in the server."""
    floods = {"bounded": TextFlood(), "default": TextFlood()}

    def bind(triton: Triton) -> None:
        config = ModelConfig(decoupled=True)
        bounded = OpenAIChat(max_answer_bytes=(1 << 20) + 100)
        triton.bind("bounded", floods["bounded"], [TEXT_IN], [TEXT_OUT], config=config, openai=bounded)
        triton.bind("default", floods["default"], [TEXT_IN], [TEXT_OUT], config=config, openai=OpenAIChat())

    with running_triton(bind) as triton, sdk_client(triton.http_port, timeout=60) as sdk:
        answer = sdk.chat.completions.create(model="bounded", messages=USER)
        assert answer.choices[0].finish_reason == "length"
        assert answer.choices[0].message.content == "x" * (1 << 20)  # 16 pieces: the 17th would pass the bound
        assert floods["bounded"].stopped.wait(10), "the generator went on after the answer ended"
        texts = sdk.completions.create(model="bounded", prompt="go", n=2)  # the bound holds for both together
        assert {choice.finish_reason for choice in texts.choices} == {"length"}
        assert sum(len(choice.text) for choice in texts.choices) == 1 << 20
        echoed = sdk.completions.create(model="bounded", prompt="p" * 100_000, n=2, echo=True)  # echo counts too
        assert sum(len(choice.text) for choice in echoed.choices) == 200_000 + 12 * 65536
        with pytest.raises(openai.BadRequestError, match="'echo' of these prompts") as refused:
            sdk.completions.create(model="bounded", prompt="p" * 600_000, n=2, echo=True)
        assert refused.value.body["param"] == "echo"  # type: ignore[index]
        whole = sdk.chat.completions.create(model="default", messages=USER)
        assert whole.choices[0].finish_reason == "length"
        assert len(whole.choices[0].message.content or "") == MAX_ANSWER_BYTES
        streamed = sdk.chat.completions.create(model="bounded", messages=USER, stream=True, max_tokens=40)
        assert sum(len(chunk.choices[0].delta.content or "") for chunk in streamed if chunk.choices) == 40 * 65536


def _counted_by(token_counter: Callable[[str], int]) -> Callable[[Triton], None]:
    """Binds the toy chat model as "counted", its prompts counted by `token_counter`."""

    def bind(triton: Triton) -> None:
        option = OpenAIChat(token_counter=token_counter)
        triton.bind(
            "counted", openai_models.toy, [TEXT_IN], [TEXT_OUT], config=ModelConfig(decoupled=True), openai=option
        )

    return bind


def test_a_slow_token_counter_on_a_large_prompt_holds_no_other_client() -> None:
    """A tokenizer counting a prompt of megabytes ran on the event loop: every other client waited for it."""
    counting = threading.Event()
    release = threading.Event()

    def token_counter(text: str) -> int:
        if len(text) > 100_000:  # the large prompt: its count waits for the test, as a slow tokenizer would
            counting.set()
            release.wait(30)
        return len(text.split())

    with running_triton(_counted_by(token_counter)) as triton, sdk_client(triton.http_port, timeout=20) as sdk:
        large = [{"role": "user", "content": "word " * 50_000}]
        results: List[Any] = []
        worker = threading.Thread(
            target=lambda: results.append(sdk.chat.completions.create(model="counted", messages=large))
        )
        worker.start()
        try:
            assert counting.wait(20)
            small = sdk.chat.completions.create(model="counted", messages=USER)  # answered while the count waits
            assert small.choices[0].finish_reason == "stop"
        finally:
            release.set()
            worker.join(30)
        assert results and results[0].usage.prompt_tokens == len(default_prompt(large[0]["content"]).split())


def test_a_token_counter_that_raises_stop_iteration_on_a_large_prompt_fails_its_request() -> None:
    """Counted in a thread, its StopIteration never reached the request (asyncio refuses it on a future): it hung."""

    def token_counter(text: str) -> int:
        if len(text) > 100_000:
            return next(iter(()))
        return len(text.split())

    with running_triton(_counted_by(token_counter)) as triton, sdk_client(triton.http_port, timeout=20) as sdk:
        with pytest.raises(openai.InternalServerError):
            sdk.chat.completions.create(model="counted", messages=[{"role": "user", "content": "word " * 50_000}])
        assert sdk.chat.completions.create(model="counted", messages=USER).choices[0].finish_reason == "stop"


def test_a_client_that_half_closes_gets_its_whole_answer(triton: Triton) -> None:
    """A client that stopped sending (shutdown(SHUT_WR), `nc -N`) still reads, as the Triton routes answer it.

    It may be sent a `100 Continue` first (HTTP clients read past it), which one that closed answers with a reset.
    """
    with raw_chat(triton.http_port, {"model": "toy", "messages": USER}) as sock:
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    continued = b"HTTP/1.1 100 Continue\r\n\r\n"
    head, _, body = (received[len(continued) :] if received.startswith(continued) else received).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK"), received[:300]
    assert json.loads(body)["choices"][0]["message"]["content"] == _expected(USER[0]["content"])
