"""A failure's traceback as text that stays bounded however deep the stack was that raised it.

A callable that recursed 100,000 frames deep before it raised has a traceback of 300,000 lines (14 MB), and
`traceback.format_exception` takes seconds to make it. A traceback of more than `DEEP_FRAMES` frames (counted over
its chain of causes, cheaply) is made here instead: of each exception's frames, the first and last `EDGE_FRAMES`,
and a line saying how many were left out between them; and any traceback text (one made in another process too)
keeps its first and last `EDGE_LINES` lines, and says how many it left out.
"""

from __future__ import annotations

import traceback
from collections import deque
from types import TracebackType
from typing import Any, Deque, List, Optional, Set, Tuple

# Tracebacks of at most this many frames, over an exception and its causes, are formatted as Python does.
DEEP_FRAMES = 100
# Of a deeper one, each exception's first and last frames kept.
EDGE_FRAMES = 50
# Of any traceback's text, at most this many lines are kept: the first and last EDGE_LINES.
EDGE_LINES = 250

_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"
# Causes and contexts followed at most (a chain of failed retries may be long too).
_CHAIN = 20


def is_deep(error: BaseException) -> bool:
    """Whether the tracebacks of `error` and its causes hold more than DEEP_FRAMES frames (walked up to that)."""
    frames = 0
    for exception in _chain(error):
        tb = exception.__traceback__
        while tb is not None:
            frames += 1
            if frames > DEEP_FRAMES:
                return True
            tb = tb.tb_next
    return False


def bounded_traceback(error: BaseException) -> str:
    """`error`'s traceback as `traceback.format_exception` writes it, when not deep; else cut to its edges.

    Either way, at most 2 * EDGE_LINES lines and the one that says how many more there were.
    """
    if not is_deep(error):
        return cut_lines("".join(traceback.format_exception(type(error), error, error.__traceback__)))
    parts: List[str] = []
    for exception, link in reversed(list(_links(error))):
        parts.extend(_one(exception))
        parts.append(link)
    return cut_lines("".join(parts))


def cut_lines(text: str) -> str:
    """`text`, or its first and last EDGE_LINES lines and a line between them saying how many were left out."""
    if text.count("\n") <= 2 * EDGE_LINES + 1:
        return text
    end = "\n" if text.endswith("\n") else ""
    lines = text[: len(text) - len(end)].split("\n")
    if len(lines) <= 2 * EDGE_LINES + 1:
        return text
    left_out = len(lines) - 2 * EDGE_LINES
    kept = [*lines[:EDGE_LINES], f"... ({left_out} more lines not logged) ...", *lines[-EDGE_LINES:]]
    return "\n".join(kept) + end


def _chain(error: BaseException) -> List[BaseException]:
    """`error` and the exceptions it was raised from or while handling, as Python prints them, newest first."""
    return [exception for exception, _ in _links(error)]


def _links(error: BaseException) -> List[Tuple[BaseException, str]]:
    """Each exception of the chain, newest first, with the text Python prints after it ("" after the newest)."""
    links: List[Tuple[BaseException, str]] = []
    seen: Set[int] = set()
    exception: Optional[BaseException] = error
    link = ""
    while exception is not None and id(exception) not in seen and len(links) < _CHAIN:
        seen.add(id(exception))
        links.append((exception, link))
        if exception.__cause__ is not None:
            exception, link = exception.__cause__, _CAUSE
        elif exception.__context__ is not None and not exception.__suppress_context__:
            exception, link = exception.__context__, _CONTEXT
        else:
            exception = None
    return links


def _one(exception: BaseException) -> List[str]:
    """One exception's traceback: its first and last EDGE_FRAMES frames, how many were left out, its line."""
    head: List[Tuple[Any, int]] = []
    tail: Deque[Tuple[Any, int]] = deque(maxlen=EDGE_FRAMES)
    frames = 0
    tb: Optional[TracebackType] = exception.__traceback__
    while tb is not None:
        if frames < EDGE_FRAMES:
            head.append((tb.tb_frame, tb.tb_lineno))
        else:
            tail.append((tb.tb_frame, tb.tb_lineno))
        frames += 1
        tb = tb.tb_next
    parts: List[str] = []
    if frames:
        parts.append("Traceback (most recent call last):\n")
        parts.extend(traceback.StackSummary.extract(iter(head)).format())
        left_out = frames - len(head) - len(tail)
        if left_out:
            parts.append(f"  ... ({left_out} more frames not logged) ...\n")
        parts.extend(traceback.StackSummary.extract(iter(tail)).format())
    parts.extend(traceback.format_exception_only(type(exception), exception))
    return parts
