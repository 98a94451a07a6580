"""One choice of a completion: the model's request built from a prompt, its text read as it comes.

The prompt goes to the model's `text_input`; the sampling fields go as request parameters, and as inputs
where the model declares inputs of their names (Triton's generate convention: `max_tokens`, `temperature`,
`stream`, ...). The server honours `stop` and `max_tokens` itself as well: a streamed model's generator is
stopped at a stop sequence, or after `max_tokens` responses (or, for a whole answer, at `max_answer_bytes`).
"""

from __future__ import annotations

import codecs
import time
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence, Tuple

import numpy as np

from pytriton.core.errors import InferenceError
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.serving import ServingModel
from pytriton.core.spec import ModelSpec
from pytriton.core.tensors.datatypes import BYTES
from pytriton.options.openai import TokenCounter, counted
from pytriton.protocol.generate_codec import input_array
from pytriton.protocol.openai_codec import invalid, json_text

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
MESSAGES_INPUT = "messages"
EMBEDDING_OUTPUT = "embedding"


def build_request(
    spec: ModelSpec, text: str, parameters: Dict[str, Any], messages: Optional[List[Dict[str, Any]]] = None
) -> InferenceRequest:
    """The model's request: `text` in `text_input`, parameters as inputs where the model declares them.

    Raises:
        OpenAIError: the model requires an input the request does not give.
    """
    inputs: Dict[str, np.ndarray] = {}
    rest = dict(parameters)
    for tensor in spec.inputs:
        value: Any
        if tensor.name == TEXT_INPUT:
            value = text
        elif tensor.name == MESSAGES_INPUT and messages is not None:
            value = json_text(messages, MESSAGES_INPUT)
        elif tensor.name in rest:
            value = rest.pop(tensor.name)
            if tensor.datatype == BYTES and not isinstance(value, str):
                value = json_text(value, tensor.name)
        elif tensor.optional:
            continue
        else:
            raise invalid(
                f"model '{spec.name}' requires input '{tensor.name}', which this request does not give",
                param=tensor.name,
            )
        try:
            inputs[tensor.name] = input_array(spec, tensor, value)
        except InferenceError as error:
            raise invalid(f"'{tensor.name}': {error.message}", param=tensor.name) from None
    return InferenceRequest(
        request_id="",
        inputs=inputs,
        parameters=rest,
        requested_outputs=None,
        batch_size=1,
    )


def bytes_of(response: InferenceResponse, name: str = TEXT_OUTPUT) -> bytes:
    """The bytes of a response's output (its elements joined), b"" when it has none."""
    for output in response.outputs:
        if output.name == name:
            items = output.array.reshape(-1).tolist()
            return b"".join(item if isinstance(item, bytes) else str(item).encode() for item in items)
    return b""


# How many first characters of a stop sequence are looked for (at C speed) before a place is compared in full.
_PROBE = 16


def _begun(buffer: str, stop: str) -> int:
    """The length of the longest end of `buffer` that `stop` begins with and is shorter than it (0: none).

    Linear in the buffer for what a client can choose alone (the stop sequences): a place is compared in full only
    where the stop's first characters and the buffer's last one fit there (comparing every end was quadratic: a
    1 MB answer and a 1 MB stop sequence held the event loop for a minute).
    """
    size = len(buffer)
    position = max(size - len(stop) + 1, 0)
    head = stop[:_PROBE]
    last = buffer[-1:]
    while position < size - _PROBE:
        position = buffer.find(head, position)
        if position < 0 or position >= size - _PROBE:
            break
        if stop[size - position - 1] == last and stop.startswith(buffer[position:]):
            return size - position
        position += 1
    for start in range(max(position, size - _PROBE, 0), size):
        if stop.startswith(buffer[start:]):
            return size - start
    return 0


class StopScanner:
    """Finds stop sequences in text that arrives in pieces; holds back what may begin one."""

    def __init__(self, stops: Sequence[str]) -> None:
        """Watch for `stops` (none: every piece passes as it is)."""
        self._stops = tuple(stops)
        self._held = ""

    def feed(self, text: str) -> Tuple[str, bool]:
        """The text that may go out now, and whether a stop sequence ended the generation."""
        if not self._stops:
            return text, False
        buffer = self._held + text
        found = [index for index in (buffer.find(stop) for stop in self._stops) if index >= 0]
        if found:
            self._held = ""
            return buffer[: min(found)], True
        hold = max(_begun(buffer, stop) for stop in self._stops) if buffer else 0
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return buffer[: len(buffer) - hold], False

    def flush(self) -> str:
        """What was held back when the generation ended without a stop."""
        held, self._held = self._held, ""
        return held


class TextBudget:
    """The bytes of text the generations of one whole answer may still gather, together."""

    __slots__ = ("left",)

    def __init__(self, max_bytes: int) -> None:
        self.left = max_bytes

    def take(self, size: int) -> bool:
        """Take `size` bytes if they are left (False: they would pass the bound, and none are taken)."""
        if size > self.left:
            return False
        self.left -= size
        return True


class Generation:
    """One choice: its text pieces as they come, its finish reason, its tokens and their times."""

    def __init__(
        self,
        model: ServingModel,
        request: InferenceRequest,
        *,
        stop: Sequence[str],
        max_tokens: Optional[int],
        counter: TokenCounter,
        started_ns: int,
        budget: Optional[TextBudget] = None,
    ) -> None:
        """A generation of `request` on `model`, timed from `started_ns` (monotonic, when the request came).

        `budget`: the text a streamed model's generations of one whole answer gather at most, together; a
        response that would pass it ends its generation (`length`) without its text.
        """
        self._model = model
        self._request = request
        self._scanner = StopScanner(stop)
        self._max_tokens = max_tokens
        self._budget = budget if model.spec.decoupled else None
        self._counter = counter
        self._decoupled = model.spec.decoupled
        self.finish_reason = "stop"
        self.tokens = 0
        self.started_ns = started_ns
        self.first_token_ns: Optional[int] = None  # after started_ns
        self.gaps_ns: List[int] = []  # between one response's text and the next
        self._last_ns = 0

    async def pieces(self) -> AsyncIterator[str]:
        """The text as it comes; leaving early (the client went away) stops the model's generator."""
        responses = self._model.stream(self._request)
        # A character may be split over two responses (a byte-level token of a multi-byte character): its first
        # bytes wait for the rest rather than each going out as U+FFFD.
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        try:
            async for response in responses:
                data = bytes_of(response)
                if not data:
                    continue
                if self._budget is not None and not self._budget.take(len(data)):
                    self.finish_reason = "length"
                    break
                text = decoder.decode(data)
                self._timed()
                self.tokens += counted(self._counter, text) if (self._counter or not self._decoupled) else 1
                out, stopped = self._scanner.feed(text)
                if out:
                    yield out
                if stopped:
                    self.finish_reason = "stop"
                    return
                if self._max_tokens is not None and self.tokens >= self._max_tokens:
                    self.finish_reason = "length"
                    break
            out, stopped = self._scanner.feed(decoder.decode(b"", final=True))  # a character left unfinished: U+FFFD
            if stopped:
                self.finish_reason = "stop"
            rest = out if stopped else out + self._scanner.flush()
            if rest:
                yield rest
        finally:
            await responses.aclose()  # type: ignore[attr-defined]

    async def whole(self) -> str:
        """The whole text."""
        return "".join([piece async for piece in self.pieces()])

    def _timed(self) -> None:
        now = time.monotonic_ns()
        if self.first_token_ns is None:
            self.first_token_ns = now - self.started_ns
        else:
            self.gaps_ns.append(now - self._last_ns)
        self._last_ns = now
