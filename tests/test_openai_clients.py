"""The OpenAI API with LangChain's ChatOpenAI, with curl -N (the raw SSE framing), and every body checked
against the schemas OpenAI publishes (tests/openai_schema.py)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from typing import Any, Dict, Iterator, List, Tuple

import jsonschema
import openai
import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI, OpenAIEmbeddings

from pytriton.triton import Triton, TritonSecurityConfig
from tests import openai_models, openai_schema
from tests.conftest import ACCESS_TOKEN, running_triton
from tests.http_helpers import request
from tests.openai_models import default_prompt, sdk_client, tokens_for
from tests.server_process import ServerProcess, free_port_env

USER = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(openai_models.bind_models) as server:
        yield server


def _base(triton: Triton) -> str:
    return f"http://127.0.0.1:{triton.http_port}/v1"


def test_langchain_chat_openai_invoke_and_stream(triton: Triton) -> None:
    chat = ChatOpenAI(model="toy", base_url=_base(triton), api_key="none", max_retries=0, max_tokens=4)  # type: ignore[call-arg]
    messages = [SystemMessage("Be brief."), HumanMessage("Hi")]
    prompt = "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
    answer = chat.invoke(messages)
    assert answer.content == "".join(tokens_for(prompt, 4))
    assert answer.response_metadata["finish_reason"] == "length"
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] == 4
    chunks = list(chat.stream(messages))
    assert [chunk.content for chunk in chunks if chunk.content] == tokens_for(prompt, 4)


def test_langchain_async_and_embeddings(triton: Triton) -> None:
    import asyncio

    chat = ChatOpenAI(model="toy-jinja", base_url=_base(triton), api_key="none", max_retries=0)  # type: ignore[call-arg]

    async def run() -> List[str]:
        return [str((await chat.ainvoke("Hi")).content), "".join([str(c.content) async for c in chat.astream("Hi")])]

    assert asyncio.run(run()) == ["".join(tokens_for("[user]Hi>"))] * 2
    embeddings = OpenAIEmbeddings(
        model="embed", base_url=_base(triton), api_key="none", check_embedding_ctx_length=False, max_retries=0
    )  # type: ignore[call-arg]
    vectors = embeddings.embed_documents(["hello", "world"])
    assert [len(vector) for vector in vectors] == [8, 8]
    assert embeddings.embed_query("hello") == pytest.approx(vectors[0])


def test_langchain_sees_an_unknown_model_as_the_sdks_not_found(triton: Triton) -> None:
    chat = ChatOpenAI(model="nope", base_url=_base(triton), api_key="none", max_retries=0)  # type: ignore[call-arg]
    with pytest.raises(openai.NotFoundError):
        chat.invoke("Hi")


def _curl(*args: str) -> subprocess.CompletedProcess[bytes]:
    curl = shutil.which("curl")
    assert curl is not None, "curl is not installed (apt-get install curl)"
    return subprocess.run([curl, "-sS", "--max-time", "30", *args], capture_output=True, timeout=60, check=True)


def test_curl_no_buffer_reads_the_raw_event_stream(triton: Triton) -> None:
    body = json.dumps({"model": "toy", "messages": USER, "stream": True, "max_tokens": 3})
    result = _curl(
        "-N",
        "-i",
        f"{_base(triton)}/chat/completions",
        "-H",
        "Content-Type: application/json",
        "-d",
        body,
    )
    head, _, stream = result.stdout.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"content-type: text/event-stream" in head.lower()
    events = stream.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    assert all(event.startswith(b"data: {") for event in events[:-2])
    chunks = [json.loads(event[len(b"data: ") :]) for event in events[:-2]]
    for chunk in chunks:
        jsonschema.validate(chunk, openai_schema.CHAT_CHUNK)
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == [
        "",
        *tokens_for(default_prompt("Say something."), 3),
        None,
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_curl_completion_stream_and_an_error(triton: Triton) -> None:
    body = json.dumps({"model": "toy", "prompt": "Once", "stream": True, "max_tokens": 2})
    result = _curl("-N", f"{_base(triton)}/completions", "-H", "Content-Type: application/json", "-d", body)
    events = result.stdout.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    texts = [json.loads(event[6:])["choices"][0]["text"] for event in events[:-2]]
    assert "".join(texts) == "".join(tokens_for("Once", 2))
    missing = _curl(
        "-w", "%{http_code}", f"{_base(triton)}/chat/completions", "-d", '{"model": "nope", "messages": []}'
    )
    assert missing.stdout.endswith(b"400")


def _events(body: bytes) -> List[Any]:
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""], body
    return [json.loads(event[len(b"data: ") :]) for event in events[:-2]]


def _post(triton: Triton, path: str, document: Dict[str, Any]) -> Tuple[int, bytes]:
    status, _, body = request(triton.http_port or 0, "POST", path, json.dumps(document))
    return status, body


def test_every_response_body_follows_openais_schema(triton: Triton) -> None:
    port = triton.http_port or 0
    status, _, body = request(port, "GET", "/v1/models")
    jsonschema.validate(json.loads(body), openai_schema.MODEL_LIST)
    status, _, body = request(port, "GET", "/v1/models/toy")
    jsonschema.validate(json.loads(body), openai_schema.MODEL)
    whole: List[Tuple[str, Dict[str, Any], Dict[str, Any]]] = [
        ("/v1/chat/completions", {"model": "toy", "messages": USER}, openai_schema.CHAT_COMPLETION),
        (
            "/v1/chat/completions",
            {"model": "toy", "messages": USER, "n": 2, "max_tokens": 2},
            openai_schema.CHAT_COMPLETION,
        ),
        ("/v1/chat/completions", {"model": "whole", "messages": USER}, openai_schema.CHAT_COMPLETION),
        ("/v1/completions", {"model": "toy", "prompt": ["a", "b"], "max_tokens": 2}, openai_schema.COMPLETION),
        ("/v1/completions", {"model": "whole-completions", "prompt": "a", "echo": True}, openai_schema.COMPLETION),
        ("/v1/embeddings", {"model": "embed", "input": ["a", "b"]}, openai_schema.EMBEDDINGS),
        ("/v1/embeddings", {"model": "embed", "input": "a", "encoding_format": "base64"}, openai_schema.EMBEDDINGS),
        ("/v1/embeddings", {"model": "embed", "input": "a", "dimensions": 2}, openai_schema.EMBEDDINGS),
    ]
    for path, document, schema in whole:
        status, body = _post(triton, path, document)
        assert status == 200, body
        jsonschema.validate(json.loads(body), schema)
    streamed: List[Tuple[str, Dict[str, Any], Dict[str, Any]]] = [
        ("/v1/chat/completions", {"model": "toy", "messages": USER}, openai_schema.CHAT_CHUNK),
        ("/v1/chat/completions", {"model": "whole", "messages": USER, "n": 2}, openai_schema.CHAT_CHUNK),
        ("/v1/completions", {"model": "toy", "prompt": "a", "echo": True}, openai_schema.COMPLETION),
    ]
    for path, document, schema in streamed:
        for options in ({}, {"stream_options": {"include_usage": True}}):
            status, body = _post(triton, path, {**document, **options, "stream": True})
            assert status == 200, body
            chunks = _events(body)
            for chunk in chunks:
                jsonschema.validate(chunk, schema)
            if options:
                assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    errors: List[Tuple[str, Dict[str, Any], int]] = [
        ("/v1/chat/completions", {"model": "nope", "messages": USER}, 404),
        ("/v1/chat/completions", {"model": "toy"}, 400),
        ("/v1/chat/completions", {"model": "failing", "messages": USER}, 500),
        ("/v1/embeddings", {"model": "embed", "input": []}, 400),
        ("/v1/completions", {"model": "toy", "prompt": [1, 2]}, 400),
    ]
    for path, document, expected in errors:
        status, body = _post(triton, path, document)
        assert status == expected, body
        jsonschema.validate(json.loads(body), openai_schema.ERROR)
    status, _, body = request(port, "POST", "/v1/chat/completions", b"{not json")
    assert status == 400
    jsonschema.validate(json.loads(body), openai_schema.ERROR)
    status, _, body = request(port, "GET", "/v1/nowhere")
    assert status == 404
    jsonschema.validate(json.loads(body), openai_schema.ERROR)
    for method, path, allowed in (("GET", "/v1/chat/completions", "POST"), ("DELETE", "/v1/models/toy", "GET")):
        status, headers, body = request(port, method, path)
        assert (status, headers.get("allow")) == (405, allowed), (method, path)
        jsonschema.validate(json.loads(body), openai_schema.ERROR)
    status, body = _post(
        triton, "/v1/chat/completions", {"model": "failing", "messages": USER, "stream": True, "user": "late"}
    )
    assert status == 200
    last = body.split(b"\n\n")[-2]
    jsonschema.validate(json.loads(last[len(b"data: ") :]), openai_schema.ERROR)


def test_an_unauthorized_body_follows_the_schema() -> None:
    security = TritonSecurityConfig(access_token=ACCESS_TOKEN, openai_api_key="sk-x")
    with running_triton(lambda triton: None, security_config=security) as server:
        status, _, body = request(server.http_port or 0, "GET", "/v1/models", headers={"Authorization": "Bearer no"})
        assert status == 401
        jsonschema.validate(json.loads(body), openai_schema.ERROR)
        status, _, body = request(server.http_port or 0, "GET", "/v1/models", headers={"Authorization": "Bearer sk-x"})
        assert status == 200 and json.loads(body) == {"object": "list", "data": []}


def test_pytriton_serve_with_openai_port_and_key_from_the_environment() -> None:
    command = [
        sys.executable,
        "-m",
        "pytriton",
        "serve",
        "examples/openai_chat/server.py:bind_toy",
        "--openai-port",
        "0",
    ]
    with ServerProcess(command, env=free_port_env(PYTRITON_OPENAI_API_KEY="sk-env")) as server:
        port = int(server.wait_for(r"INFO pytriton: the OpenAI API: http://0\.0\.0\.0:(\d+)/v1$").group(1))
        with sdk_client(port, "sk-env") as client:
            answer = client.chat.completions.create(
                model="toy", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
            )
        assert answer.usage is not None and answer.usage.completion_tokens == 2
        with sdk_client(port, "wrong") as client, pytest.raises(openai.AuthenticationError):
            client.models.list()
        server.signal(signal.SIGINT)
        assert server.wait() == 0
