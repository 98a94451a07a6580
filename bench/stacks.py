"""py-spy profiles of a server process tree under load, and where their samples went, by source file.

`record` runs `py-spy record --subprocesses --format raw` (collapsed stacks, one line per distinct stack with
its sample count; idle threads are not sampled) on a process and its children for a window. `by_file` reads
such a file back and shares the samples out by the file of each stack's innermost frame (the code that was
running), which is the first thing to read when deciding what to optimise.
"""

from __future__ import annotations

import collections
import pathlib
import re
import subprocess
import sys
import threading
from typing import List, Tuple

_FRAME_FILE = re.compile(r"\(([^()]*?)(?::\d+)?\)$")


def _executable() -> str:
    beside = pathlib.Path(sys.executable).with_name("py-spy")  # a venv's, when the venv is not activated
    return str(beside) if beside.exists() else "py-spy"


def record(pid: int, seconds: float, path: pathlib.Path) -> threading.Thread:
    """Start recording `pid` and its children for `seconds` (whole seconds, at least 1) into `path`; join it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    command = [_executable(), "record", "--pid", str(pid), "--subprocesses", "--rate", "250"]
    command += ["--duration", str(max(1, int(seconds))), "--format", "raw", "--nonblocking", "-o", str(path)]
    thread = threading.Thread(
        target=subprocess.run, args=(command,), kwargs={"capture_output": True, "check": False}, daemon=True
    )
    thread.start()
    return thread


def by_file(path: pathlib.Path, top: int = 8) -> List[Tuple[str, float]]:
    """The `top` source files by share of samples (innermost frame), from a collapsed-stacks file."""
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        match = _FRAME_FILE.search(stack.rsplit(";", 1)[-1])
        counts[match.group(1) if match else "(native)"] += int(count)
    total = sum(counts.values())
    return [(name, count / total) for name, count in counts.most_common(top)] if total else []
