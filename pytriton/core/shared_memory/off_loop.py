"""Large system shared-memory reads and writes in worker threads, awaited by the request on the event loop.

pread and pwrite release the GIL: a 1 GiB copy done on the loop stalled every other client of the server for
seconds, done here it lets the loop serve them meanwhile. The thread works through duplicates of the regions'
descriptors, taken on the loop while they are valid: a region unregistered while it copies (its descriptor
closed, the number perhaps another file's by then) costs the copy nothing, as a request's inputs read before
the region's unregistration are its own.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional, Sequence

from pytriton.core.daemon_threads import DaemonThreads, awaited
from pytriton.core.shared_memory.system import Read, SystemSharedMemory, WriteRun, read_runs, write_runs

# The threads that copy; a few, as each copy is bound by the memory's bandwidth more than by a core.
COPIERS = DaemonThreads(4, "pytriton-shared-memory")


def _fresh_copiers() -> None:
    """In a forked child, a pool of its own: the parent's threads are not there, though counted."""
    global COPIERS
    COPIERS = DaemonThreads(4, "pytriton-shared-memory")


os.register_at_fork(after_in_child=_fresh_copiers)


async def read_off_loop(reads: Sequence[Read]) -> None:
    """Fill `reads` (`read_all`'s deferred ones) in a worker thread; its errors are raised here."""
    dups = _duplicates([read[0] for read in reads])
    if dups is None:  # no descriptor to spare: on the loop, as before
        SystemSharedMemory.read_all(reads)
        return
    moved = [(dups[fd], position, array, name) for fd, position, array, name in reads]
    await _in_thread(lambda: read_runs(moved), dups)


async def write_off_loop(runs: Sequence[WriteRun]) -> None:
    """Carry out `runs` (`write_all`'s deferred ones) in a worker thread; its errors are raised here."""
    dups = _duplicates([run[0] for run in runs])
    if dups is None:
        write_runs(runs)
        return
    moved = [(dups[fd], position, buffers, size, name) for fd, position, buffers, size, name in runs]
    await _in_thread(lambda: write_runs(moved), dups)


def _duplicates(fds: List[int]) -> Optional[Dict[int, int]]:
    """A duplicate of each of `fds`, by descriptor; None when the process has no descriptor left for one."""
    dups: Dict[int, int] = {}
    try:
        for fd in fds:
            if fd not in dups:
                dups[fd] = os.dup(fd)
    except OSError:
        for dup in dups.values():
            os.close(dup)
        return None
    return dups


async def _in_thread(job: Callable[[], None], dups: Dict[int, int]) -> None:
    """Run `job` in one of COPIERS, then close `dups`; a cancelled waiter leaves it to finish on its own.

    When no copier runs and none can be started (a thread limit, no memory for its stack), on the loop, as without
    a descriptor to spare: the request failed, and its duplicates stayed open.
    """

    def work() -> None:
        try:
            job()
        finally:
            for dup in dups.values():
                os.close(dup)

    try:
        copied = awaited(COPIERS, work)
    except RuntimeError:
        work()
        return
    await copied
