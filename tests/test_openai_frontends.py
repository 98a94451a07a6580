"""The OpenAI API where the server has more than one process.

Frontend processes (frontends=3): the same answers, streams stopped on the hub when their client leaves, token
metrics counted once per request on the hub. Also: its own port, process instances, a RemoteTriton's model.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Iterator, List

import openai
import pytest

from pytriton.exceptions import PyTritonValidationError
from pytriton.instances import ProcessInstances
from pytriton.model_config import ModelConfig
from pytriton.openai import OpenAIChat
from pytriton.remote_triton import RemoteTriton
from pytriton.triton import Triton, TritonConfig
from tests import openai_models
from tests.conftest import running_triton
from tests.http_helpers import request
from tests.openai_models import default_prompt, raw_chat, read_events, sdk_client, tokens_for
from tests.test_metrics import sample, scrape
from tests.waiting import wait_until

USER = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    with running_triton(openai_models.bind_models, frontends=3) as server:
        yield server


def test_chat_completions_embeddings_and_models_through_frontend_processes(triton: Triton) -> None:
    expected = "".join(tokens_for(default_prompt("Say something."), 4))
    for _ in range(4):  # a client, so a connection, each time: the hub hands connections to each frontend in turn
        with sdk_client(triton.http_port) as client:
            answer = client.chat.completions.create(model="toy", messages=USER, max_tokens=4)
            assert answer.choices[0].message.content == expected
            stream = client.chat.completions.create(model="toy", messages=USER, max_tokens=4, stream=True)
            assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == expected
            # a function template (a lambda), pickled by value into the frontend process
            templated = client.chat.completions.create(model="toy-fn", messages=USER, max_tokens=2)
            assert templated.choices[0].message.content == "".join(tokens_for("Say something.", 2))
    with sdk_client(triton.http_port) as client:
        assert "toy" in {model.id for model in client.models.list()}
        vectors = client.embeddings.create(model="embed", input=["a", "b"], dimensions=4, encoding_format="float")
        assert [len(item.embedding) for item in vectors.data] == [4, 4]
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="nope", messages=USER)


def test_token_metrics_are_counted_once_on_the_hub(triton: Triton) -> None:
    labels = {"model": "toy-jinja", "version": "1"}
    families = scrape(triton)
    before = sample(families, "pytriton_openai_output_tokens", **labels)
    first_before = sample(families, "pytriton_openai_time_to_first_token_seconds", "_count", **labels)
    for _ in range(6):  # a new client, so a new connection, each time: both frontends serve some
        with sdk_client(triton.http_port) as client:
            list(client.chat.completions.create(model="toy-jinja", messages=USER, max_tokens=3, stream=True))
    # A frontend counts a generation in a message to the hub, posted before its client sees the stream end but
    # read by the hub in a loop turn of its own: a scrape may come first. Once there, each is counted once.
    wait_until(
        lambda: (
            sample(scrape(triton), "pytriton_openai_time_to_first_token_seconds", "_count", **labels)
            >= first_before + 6
        ),
        "the six generations counted on the hub",
    )
    families = scrape(triton)
    assert sample(families, "pytriton_openai_output_tokens", **labels) - before == 18
    assert sample(families, "pytriton_openai_time_to_first_token_seconds", "_count", **labels) - first_before == 6


def test_a_client_leaving_stops_the_generator_on_the_hub(triton: Triton) -> None:
    openai_models.endless_stopped.clear()
    with raw_chat(triton.http_port, {"model": "endless", "messages": USER, "stream": True}) as sock:
        read_events(sock, 3)
    assert openai_models.endless_stopped.wait(10), "the generator went on after its client left"


@pytest.mark.parametrize("frontends", [1, 3])
def test_the_openai_api_on_a_port_of_its_own(frontends: int) -> None:
    config = TritonConfig(http_port=0, grpc_port=0, metrics_port=0)
    triton = Triton(config=config, frontends=frontends, openai_port=0)
    try:
        openai_models.bind_models(triton)
        triton.run()
        assert triton.openai_port not in (None, triton.http_port)
        with sdk_client(triton.openai_port) as client:
            answer = client.chat.completions.create(model="toy", messages=USER, max_tokens=2)
            assert "toy" in {model.id for model in client.models.list()}
        assert answer.choices[0].message.content == "".join(tokens_for(default_prompt("Say something."), 2))
        status, _, _ = request(triton.http_port or 0, "GET", "/v1/models")
        assert status == 404  # the HTTP port serves Triton's routes only
        assert request(triton.openai_port or 0, "GET", "/v2/health/ready")[0] == 404
    finally:
        triton.stop()


def test_a_generator_in_process_instances_streams_through_the_openai_api() -> None:
    def bind(server: Triton) -> None:
        server.bind(
            "toy-process",
            ProcessInstances(openai_models.toy, count=2),
            [openai_models.TEXT_IN],
            [openai_models.TEXT_OUT],
            config=ModelConfig(decoupled=True),
            openai=OpenAIChat(),
        )

    with running_triton(bind) as server:
        with sdk_client(server.http_port) as client:
            stream = client.chat.completions.create(model="toy-process", messages=USER, max_tokens=3, stream=True)
            pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
        assert pieces == tokens_for(default_prompt("Say something."), 3)


def test_a_model_bound_through_remote_triton_answers_the_openai_api() -> None:
    with running_triton(lambda server: None) as server:
        with RemoteTriton(url=f"http://127.0.0.1:{server.http_port}") as remote:
            remote.bind(
                "remote-toy",
                openai_models.toy,
                [openai_models.TEXT_IN],
                [openai_models.TEXT_OUT],
                config=ModelConfig(decoupled=True),
                openai=OpenAIChat(chat_template=lambda messages: messages[-1]["content"]),
            )
            with sdk_client(server.http_port) as client:
                answer = client.chat.completions.create(model="remote-toy", messages=USER, max_tokens=2)
        assert answer.choices[0].message.content == "".join(tokens_for("Say something.", 2))


def test_an_option_that_cannot_reach_another_process_is_refused_at_bind_in_words() -> None:
    """A token counter holding a lock bound while frontends served: bind returned, the hub's message carrying the
    model to the frontend failed to pickle on its loop (with the other messages of that batch), the frontend was
    killed 30 s later for taking no change, and could never start again. Bound before run(), run() raised pickle's
    TypeError; through a RemoteTriton, bind did."""
    lock = threading.Lock()

    def counter(text: str) -> int:
        with lock:
            return len(text.split())

    def bind_counted(server: Any) -> None:
        server.bind(
            "counted",
            openai_models.toy,
            [openai_models.TEXT_IN],
            [openai_models.TEXT_OUT],
            config=ModelConfig(decoupled=True),
            openai=OpenAIChat(token_counter=counter),
        )

    words = "OpenAIChat's token_counter cannot be sent to another process (TypeError: cannot pickle '_thread.lock'"
    before = Triton(config=TritonConfig(http_port=0, grpc_port=0, metrics_port=0), frontends=2)
    with pytest.raises(PyTritonValidationError, match=re.escape(words)):
        bind_counted(before)
    before.stop()
    with running_triton(openai_models.bind_models, frontends=2) as server:
        with pytest.raises(PyTritonValidationError, match=re.escape(words)):
            bind_counted(server)
        with RemoteTriton(url=f"http://127.0.0.1:{server.http_port}") as remote:
            with pytest.raises(PyTritonValidationError, match=re.escape(words)):
                bind_counted(remote)
        for _ in range(3):  # new connections: each process serves some, the frontend among them
            with sdk_client(server.http_port) as client:
                answer = client.chat.completions.create(model="toy", messages=USER, max_tokens=2)
                assert answer.choices[0].message.content == "".join(tokens_for(default_prompt("Say something."), 2))
                assert "counted" not in {model.id for model in client.models.list()}


def _logging_template(messages: Any) -> str:
    """A chat template (it runs in the frontend process) that logs through a logger of its own, and asyncio's.

    Its content "flood" logs 1000 warnings at once, "long" one of a megabyte.
    """
    import asyncio
    import logging

    log = logging.getLogger("tests.templates")
    content = messages[-1]["content"]
    log.info("rendering %d messages", len(messages))
    if content == "flood":
        for number in range(1000):
            log.warning("flood %d", number)
    elif content == "long":
        log.warning("long %s", "x" * 1_000_000)
    elif content == "callback":
        asyncio.get_running_loop().call_soon(lambda: 1 / 0)  # asyncio logs "Exception in callback ..."
    return content


def test_records_of_other_loggers_in_a_frontend_process_reach_the_hubs_handlers_a_flood_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # They went to the frontend's stderr (logging.lastResort: WARNING and above, bare), past the application's
    # handlers and levels; INFO records nowhere.
    import logging

    from pytriton.runtime.frontends.log_records import OTHERS_BURST, OTHERS_CHARS

    caplog.set_level(logging.INFO, logger="tests.templates")  # a level the hub's logger has: the frontends' take it

    def bind(server: Triton) -> None:
        config = ModelConfig(decoupled=True)
        server.bind("logs", openai_models.toy, [openai_models.TEXT_IN], [openai_models.TEXT_OUT], config=config,
                    openai=OpenAIChat(_logging_template))  # fmt: skip

    with running_triton(bind, frontends=3) as server:
        pool = server._runtime._pool
        assert pool is not None
        frontends = {frontend.pid for frontend in pool._frontends}

        def chat(content: str) -> None:
            with sdk_client(server.http_port) as client:
                client.chat.completions.create(model="logs", messages=[{"role": "user", "content": content}])

        def records(name: str) -> List[logging.LogRecord]:
            return [record for record in caplog.records if record.name == name and record.process in frontends]

        chat("callback")
        wait_until(lambda: len(records("asyncio")) == 1, "asyncio's record, from the frontend")
        (callback,) = records("asyncio")
        assert callback.levelno == logging.ERROR and callback.getMessage().startswith("Exception in callback")
        assert callback.exc_text is not None and "ZeroDivisionError: division by zero" in callback.exc_text
        (rendering,) = records("tests.templates")
        assert (rendering.levelno, rendering.getMessage()) == (logging.INFO, "rendering 1 messages")

        chat("long")
        wait_until(lambda: any(r.getMessage().startswith("long") for r in records("tests.templates")), "the long one")
        (long,) = [record for record in records("tests.templates") if record.getMessage().startswith("long")]
        assert long.getMessage() == f"long {'x' * (OTHERS_CHARS - 5)}... ({1_000_005 - OTHERS_CHARS} more characters)"

        caplog.clear()
        chat("flood")

        def held_back() -> List[str]:
            return [r.getMessage() for r in caplog.records if "of other loggers not sent to the hub" in r.getMessage()]

        wait_until(lambda: len(held_back()) == 1, "the line that counts the records held back")
        count = int(re.findall(r"frontend \d+: (\d+) more log records", held_back()[0])[0])
        flood = [record for record in records("tests.templates") if record.getMessage().startswith("flood")]
        assert 0 < len(flood) <= OTHERS_BURST
        assert len(flood) + count == 1000
        assert held_back()[0].endswith(f"(at most {OTHERS_BURST} a second are); the last: tests.templates: flood %d")
