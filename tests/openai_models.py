"""Models the OpenAI API tests serve (toy generators, a whole-answer model, embedding models) and their clients."""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import openai

from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.openai import OpenAIChat, OpenAICompletions, OpenAIEmbeddings
from pytriton.triton import Triton

VOCABULARY = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()
DEFAULT_TOKENS = 6
TEXT_IN = Tensor(name="text_input", dtype=bytes, shape=(1,))
TEXT_OUT = Tensor(name="text_output", dtype=bytes, shape=(1,))
JINJA_TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
)

# What the generators saw: batch sizes of their calls, and whether a stream was stopped early.
batch_sizes: List[int] = []
endless_stopped = threading.Event()
endless_started = threading.Event()


def tokens_for(prompt: str, count: int = DEFAULT_TOKENS) -> List[str]:
    """The toy's tokens for a prompt: the same words for the same prompt."""
    start = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "little")
    return [VOCABULARY[(start + index) % len(VOCABULARY)] + " " for index in range(count)]


def _text(request: Any) -> str:
    return bytes(request["text_input"].reshape(-1)[0]).decode()


def _out(text: str) -> Dict[str, np.ndarray]:
    return {"text_output": np.array([[text.encode()]], dtype=object)}


def toy(requests: List[Any]) -> Iterator[List[Optional[Dict[str, np.ndarray]]]]:
    """One token a step for each request, `max_tokens` of them (DEFAULT_TOKENS without)."""
    batch_sizes.append(len(requests))
    plans = [tokens_for(_text(r), int((r.parameters or {}).get("max_tokens", DEFAULT_TOKENS))) for r in requests]
    for step in range(max(len(plan) for plan in plans)):
        yield [_out(plan[step]) if step < len(plan) else None for plan in plans]


def whole(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """A plain callable: the prompt and the parameters it got, as one JSON text."""
    return [_out(json.dumps({"prompt": _text(r), "parameters": r.parameters or {}}, sort_keys=True)) for r in requests]


def with_inputs(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Sampling fields as inputs: what arrived where."""
    answers = []
    for r in requests:
        seen = {name: np.asarray(r[name]).reshape(-1)[0].item() for name in ("max_tokens", "temperature") if name in r}
        seen["messages"] = json.loads(bytes(r["messages"].reshape(-1)[0])) if "messages" in r else None
        answers.append(_out(json.dumps({"inputs": seen, "parameters": r.parameters or {}}, sort_keys=True)))
    return answers


def endless(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    """Streams until stopped; says so."""
    endless_started.set()
    try:
        for index in range(100_000):
            yield [_out(f"t{index} ") for _ in requests]
            threading.Event().wait(0.005)
    finally:
        endless_stopped.set()


def failing(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    """Fails before its first token, or after two when asked (parameter fail_late)."""
    if (requests[0].parameters or {}).get("user") == "late":
        yield [_out("one ") for _ in requests]
        yield [_out("two ") for _ in requests]
    raise ValueError("the toy model broke")


# Byte-level tokens of "café €", a character split over two responses (and over two elements of one), then the
# first byte of "€" that no response finishes.
SPLIT_CHARACTERS = [[b"caf\xc3"], [b"\xa9 \xe2", b"\x82"], [b"\xac"], [b"!\xe2"]]


def split_characters(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    """Streams SPLIT_CHARACTERS, one response a list of elements."""
    for elements in SPLIT_CHARACTERS:
        yield [{"text_output": np.array([elements], dtype=object)} for _ in requests]


def embed(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """An 8-float unit vector of each text's hash."""
    answers = []
    for r in requests:
        digest = hashlib.sha256(bytes(r["text_input"].reshape(-1)[0])).digest()
        vector = np.frombuffer(digest, dtype=np.uint8)[:8].astype(np.float32) - 127.5
        answers.append({"embedding": (vector / np.linalg.norm(vector)).reshape(1, -1)})
    return answers


def embed_dims(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """A vector of as many ones as the `dimensions` input asks (3 without)."""
    answers = []
    for r in requests:
        size = int(np.asarray(r["dimensions"]).reshape(-1)[0]) if "dimensions" in r else 3
        answers.append({"embedding": np.ones((1, size), dtype=np.float32)})
    return answers


def bind_models(triton: Triton) -> None:
    """Every model of the OpenAI tests."""
    batched = ModelConfig(
        decoupled=True, max_batch_size=4, batcher=DynamicBatcher(max_queue_delay_microseconds=2_000_000)
    )
    triton.bind("toy", toy, [TEXT_IN], [TEXT_OUT], config=ModelConfig(decoupled=True), openai=OpenAIChat())
    triton.bind("toy-batched", toy, [TEXT_IN], [TEXT_OUT], config=batched, openai=OpenAIChat())
    triton.bind(
        "toy-jinja", toy, [TEXT_IN], [TEXT_OUT], config=ModelConfig(decoupled=True), openai=OpenAIChat(JINJA_TEMPLATE)
    )
    triton.bind(
        "toy-fn",
        toy,
        [TEXT_IN],
        [TEXT_OUT],
        config=ModelConfig(decoupled=True),
        openai=OpenAIChat(lambda messages: "|".join(m["content"] for m in messages)),
    )
    triton.bind("whole", whole, [TEXT_IN], [TEXT_OUT], openai=OpenAIChat())
    triton.bind("whole-completions", whole, [TEXT_IN], [TEXT_OUT], openai=OpenAICompletions())
    triton.bind(
        "with-inputs",
        with_inputs,
        [
            TEXT_IN,
            Tensor(name="max_tokens", dtype=np.int32, shape=(1,), optional=True),
            Tensor(name="temperature", dtype=np.float32, shape=(1,), optional=True),
            Tensor(name="messages", dtype=bytes, shape=(1,), optional=True),
        ],
        [TEXT_OUT],
        openai=OpenAIChat(),
    )
    triton.bind("endless", endless, [TEXT_IN], [TEXT_OUT], config=ModelConfig(decoupled=True), openai=OpenAIChat())
    triton.bind(
        "split-characters",
        split_characters,
        [TEXT_IN],
        [Tensor(name="text_output", dtype=bytes, shape=(-1,))],
        config=ModelConfig(decoupled=True),
        openai=OpenAIChat(),
    )
    triton.bind("failing", failing, [TEXT_IN], [TEXT_OUT], config=ModelConfig(decoupled=True), openai=OpenAIChat())
    embedding = Tensor(name="embedding", dtype=np.float32, shape=(-1,))
    triton.bind("embed", embed, [TEXT_IN], [embedding], openai=OpenAIEmbeddings(truncate_dimensions=True))
    triton.bind("embed-fixed", embed, [TEXT_IN], [embedding], openai=OpenAIEmbeddings())
    triton.bind(
        "embed-dims",
        embed_dims,
        [TEXT_IN, Tensor(name="dimensions", dtype=np.int32, shape=(1,), optional=True)],
        [embedding],
        openai=OpenAIEmbeddings(),
    )
    triton.bind("plain", whole, [TEXT_IN], [TEXT_OUT])  # no OpenAI routes


def default_prompt(content: str) -> str:
    """The built-in template's prompt of one user message."""
    return f"<|user|>\n{content}\n<|assistant|>\n"


@contextlib.contextmanager
def sdk_client(port: Optional[int], api_key: str = "none", **options: Any) -> Iterator[openai.OpenAI]:
    """An `openai` client of a server's /v1 (no retries), closed after use: no socket is left for the collector."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=api_key, max_retries=0, **options)
    try:
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def raw_chat(port: Optional[int], document: Dict[str, Any]) -> Iterator[socket.socket]:
    """A connection that has sent POST /v1/chat/completions of `document`; closing it on exit leaves mid-answer."""
    body = json.dumps(document).encode()
    with socket.create_connection(("127.0.0.1", port or 0), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        yield sock


def read_events(sock: socket.socket, count: int) -> bytes:
    """What the connection receives until `count` server-sent events have begun."""
    received = b""
    while received.count(b"data: ") < count:
        received += sock.recv(65536)
    return received
