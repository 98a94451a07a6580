"""A load generator for streamed chat completions: C concurrent `POST ... "stream": true` requests, read as SSE.

Each stream is read chunk by chunk as it arrives (aiohttp's `iter_any`), split into lines by hand, and each
`data:` line parsed with orjson: a content delta (OpenAI's `choices[0].delta.content`, or the KServe generate
extension's `text_output` for the stand-in route) is one token; `data: [DONE]`, or the end of the body, ends
the stream. Time to first token runs from just before the request is sent to the arrival of the chunk holding
the first content delta. The client's own CPU is read with getrusage around the run, so that a report can say
what share of the two cores the client took.
"""

from __future__ import annotations

import asyncio
import dataclasses
import resource
import time
from typing import Any, Dict, List, Optional, Tuple

import aiohttp
import orjson

DONE = b"[DONE]"


@dataclasses.dataclass
class Stream:
    """One streamed request: when it started, its first token, its end, and what it carried."""

    started: float
    first_token: Optional[float] = None
    finished: Optional[float] = None
    tokens: int = 0
    done: bool = False  # saw `data: [DONE]`
    error: str = ""
    text: List[str] = dataclasses.field(default_factory=list)


def chat_body(model: str, max_tokens: int) -> bytes:
    """The request every stream sends: a short user message, streamed, `max_tokens` tokens."""
    return orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Say something."}],
            "stream": True,
            "max_tokens": max_tokens,
        }
    )


def _content(event: Dict[str, Any]) -> Optional[str]:
    """The text a server-sent event carries: an OpenAI chunk's delta content, or `text_output` (generate_stream)."""
    choices = event.get("choices")
    if choices is not None:
        content = choices[0].get("delta", {}).get("content") if choices else None
        return content if isinstance(content, str) else None
    output = event.get("text_output")
    return output if isinstance(output, str) else None


async def read_stream(session: aiohttp.ClientSession, url: str, body: bytes, keep_text: bool = False) -> Stream:
    """Send one streamed request and read its events to the end."""
    stream = Stream(started=time.perf_counter())
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
            if response.status != 200:
                stream.error = f"HTTP {response.status}: {(await response.read())[:200]!r}"
                return stream
            pending = b""
            async for chunk in response.content.iter_any():
                lines = (pending + chunk).split(b"\n") if pending else chunk.split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == DONE:
                        stream.done = True
                        continue
                    event = orjson.loads(data)
                    if "error" in event:
                        stream.error = str(event["error"])[:200]
                        continue
                    content = _content(event)
                    if content:
                        if stream.first_token is None:
                            stream.first_token = time.perf_counter()
                        stream.tokens += 1
                        if keep_text:
                            stream.text.append(content)
    except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError) as error:
        stream.error = f"{type(error).__name__}: {error}"
    stream.finished = time.perf_counter()
    return stream


@dataclasses.dataclass
class LoadResult:
    """Every stream of one run, its wall time and the client's CPU seconds over it."""

    streams: List[Stream]
    wall_s: float
    client_cpu_s: float


def _cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _load(url: str, body: bytes, concurrency: int, seconds: float) -> LoadResult:
    """`concurrency` streams back to back each, new ones started until `seconds` have passed."""
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    streams: List[Stream] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        started, cpu_before = time.perf_counter(), _cpu_now()
        deadline = started + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                streams.append(await read_stream(session, url, body))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - started, _cpu_now() - cpu_before
    return LoadResult(streams, wall, cpu)


def _run(coroutine: Any) -> Any:
    """Run on uvloop when it is installed (cheaper per chunk), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def run_load(url: str, body: bytes, concurrency: int, seconds: float) -> LoadResult:
    """Closed-loop load: `concurrency` streams in flight for `seconds` (those in flight at the end finish)."""
    result: LoadResult = _run(_load(url, body, concurrency, seconds))
    return result


def fetch_one(url: str, body: bytes) -> Stream:
    """One stream, its text kept: what verification reads."""

    async def one() -> Stream:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            return await read_stream(session, url, body, keep_text=True)

    stream: Stream = _run(one())
    return stream


def percentile(values: List[float], q: float) -> float:
    """Nearest-rank percentile (q in 0-100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def summarize(result: LoadResult) -> Tuple[Dict[str, float], List[str]]:
    """tokens/s, TTFT p50/p99 (ms), requests and errors of one run, and the first few error texts."""
    good = [s for s in result.streams if not s.error and s.first_token is not None]
    errors = [s.error or "no token" for s in result.streams if s.error or s.first_token is None]
    tokens = sum(s.tokens for s in good)
    ttft_ms = [((s.first_token or 0.0) - s.started) * 1e3 for s in good]
    figures = {
        "tokens_s": tokens / result.wall_s if result.wall_s else 0.0,
        "tokens": float(tokens),
        "requests": float(len(good)),
        "errors": float(len(errors)),
        "ttft_p50_ms": percentile(ttft_ms, 50),
        "ttft_p99_ms": percentile(ttft_ms, 99),
        "wall_s": result.wall_s,
        "client_cpu_s": result.client_cpu_s,
        "client_us_per_token": result.client_cpu_s / tokens * 1e6 if tokens else 0.0,
    }
    return figures, errors[:3]
