"""Commits measured side by side on this 2-core VM: each one's server pinned to one core, the client on the other.

What `python -m bench cpu_ab` and `python -m bench.composition_cpu` share: the commits' trees (`git archive`; `.`
is this checkout as it is), a bench server started from one of them on `SERVER_CPU`, and the rounds in which the
commits take turns, in alternating order. Unpinned, this VM's figures fall in two modes about 20 us apart.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Iterator, List, Sequence, Tuple

ROOT = pathlib.Path(__file__).resolve().parent.parent
SERVER_CPU, CLIENT_CPU = "1", 0


def export_tree(ref: str, into: pathlib.Path) -> pathlib.Path:
    """A folder whose `pytriton` is the commit's (`.`: this checkout's)."""
    if ref == ".":
        return ROOT
    folder = into / ref.replace("/", "_")
    folder.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "pytriton"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


@contextlib.contextmanager
def pinned_server(tree: pathlib.Path, script: str, arguments: Sequence[str]) -> Iterator[subprocess.Popen[bytes]]:
    """`bench/<script>` running `tree`'s `pytriton` on `SERVER_CPU`, its output discarded; stopped on exit."""
    command = ["taskset", "-c", SERVER_CPU, sys.executable, str(ROOT / "bench" / script), *arguments]
    env = dict(os.environ, PYTHONPATH=str(tree))
    # In the tree: its frontend processes start as `python -m ...`, with the working directory first on their path.
    server = subprocess.Popen(command, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield server
    finally:
        server.terminate()
        server.wait(10)


def alternating_rounds(
    refs: Sequence[str], rounds: int, scratch_prefix: str
) -> Iterator[Tuple[int, List[Tuple[str, pathlib.Path]]]]:
    """Each round's index and its commits with their trees, forwards in even rounds and backwards in odd ones.

    Pins this process (the client) to `CLIENT_CPU` first; the exported trees live until the last round is taken.
    """
    os.sched_setaffinity(0, {CLIENT_CPU})
    with tempfile.TemporaryDirectory(prefix=scratch_prefix) as scratch:
        trees = {ref: export_tree(ref, pathlib.Path(scratch)) for ref in refs}
        for round_index in range(rounds):
            order = refs if round_index % 2 == 0 else list(reversed(refs))
            yield round_index, [(ref, trees[ref]) for ref in order]
