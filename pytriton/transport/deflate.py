"""Compressing a response body, in a worker thread once it is large, awaited by the request on the event loop.

zlib releases the GIL while it compresses: a 64 MiB infer response gzipped on the loop (a client sending
`Accept-Encoding: gzip`, as Python's `requests` does by default) held every other client of the server, health
checks among them, for 1.8 s on the 2-core VM, where tritonserver 2.51 compresses in its HTTP worker thread (its
other clients waited 6 ms). Done here, the loop serves them meanwhile. A smaller body is compressed on the loop,
where a thread's round trip would cost more than the work.
"""

from __future__ import annotations

import os
import zlib
from typing import Union

from pytriton.core.daemon_threads import DaemonThreads, awaited

# A body of this size or more is compressed in a worker thread (about 2 ms of zlib's default level here).
OFF_LOOP_BYTES = 64 * 1024

# The threads that compress; each compression takes a core, so a few.
COMPRESSORS = DaemonThreads(2, "pytriton-compress")


def _fresh_compressors() -> None:
    """In a forked child, a pool of its own: the parent's threads are not there, though counted."""
    global COMPRESSORS
    COMPRESSORS = DaemonThreads(2, "pytriton-compress")


os.register_at_fork(after_in_child=_fresh_compressors)


def deflate(body: Union[bytes, bytearray, memoryview], wbits: int) -> bytes:
    """`body` compressed with zlib's default level, in the container `wbits` names (gzip: 16 + MAX_WBITS)."""
    compressor = zlib.compressobj(wbits=wbits)
    return compressor.compress(body) + compressor.flush()


async def compressed(body: Union[bytes, bytearray, memoryview], wbits: int) -> bytes:
    """`deflate(body, wbits)`, off the event loop when `body` has OFF_LOOP_BYTES or more."""
    if len(body) < OFF_LOOP_BYTES:
        return deflate(body, wbits)
    return await awaited(COMPRESSORS, lambda: deflate(body, wbits))
