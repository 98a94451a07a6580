"""`http_header_forward_pattern` and `grpc_header_forward_pattern` read as tritonserver reads them.

Triton compiles them with RE2 and matches a header's name anywhere in it (a partial match), case-insensitively
unless the pattern turns that off with RE2's `(?-i)`: measured on nvidia-pytriton 0.7 (tritonserver 2.51),
`X-FWD-.*` forwards `x-fwd-a` and `X-Fwd-B`, `(?-i)X-FWD-.*` forwards `X-FWD-B` alone, and Triton's own tests
(L0_parameters) say the same. Python's `re` takes a flag group such as `(?-i)` only scoped (`(?-i:...)`), and
global ones only at the start: RE2's are rewritten into scoped groups that end where the group they stand in
ends, as RE2 applies them (an alternative after them, `|`, gets them too).
"""

from __future__ import annotations

import re
from typing import List, Pattern

from pytriton.exceptions import PyTritonValidationError

# An RE2 flag group that applies to the rest of its enclosing group: (?i), (?-i), (?is-m), ...
_FLAG_GROUP = re.compile(r"\(\?([imsU]*(?:-[imsU]*)?)\)")


def forward_pattern(pattern: str, option: str) -> Pattern[str]:
    """The compiled `pattern` of the TritonConfig field `option`; `search` it in a header's name.

    Raises:
        PyTritonValidationError: the pattern is no regular expression this server can read.
    """
    try:
        return re.compile(_scoped_flags(pattern), re.IGNORECASE)
    except (re.error, ValueError) as error:
        message = f"{option}: {pattern!r} is not a regular expression this server reads: {error}"
        raise PyTritonValidationError(message) from None


def _scoped_flags(pattern: str) -> str:
    """`pattern` with each RE2 flag group `(?flags)` made a scoped group `(?flags:...)` up to its group's end."""
    out: List[str] = []
    pending: List[List[str]] = [[]]  # per open group: the scoped groups' flags opened in it, closed when it closes
    index, size, in_class = 0, len(pattern), False
    while index < size:
        char = pattern[index]
        if char == "\\":
            out.append(pattern[index : index + 2])
            index += 2
            continue
        if in_class:
            in_class = char != "]"
            out.append(char)
            index += 1
            continue
        if char == "[":
            in_class = True
            start = index + 1
            start += pattern.startswith("^", start)
            start += pattern.startswith("]", start)  # a "]" first in a class is one of its characters
            out.append(pattern[index:start])
            index = start
            continue
        flags = _FLAG_GROUP.match(pattern, index) if char == "(" else None
        if flags is not None:
            if "U" in flags.group(1):
                raise ValueError("the flag U (ungreedy) has no equivalent in Python's re")
            out.append(f"(?{flags.group(1)}:")
            pending[-1].append(flags.group(1))
            index = flags.end()
            continue
        if char == "(":
            pending.append([])
            out.append(char)
        elif char == ")" and len(pending) > 1:
            out.append(")" * len(pending.pop()) + char)
        elif char == "|" and pending[-1]:
            opened = pending[-1]
            out.append(")" * len(opened) + char + "".join(f"(?{flag}:" for flag in opened))
        else:
            out.append(char)
        index += 1
    out.append(")" * len(pending[0]))
    return "".join(out)
