"""Giving the heap the server froze back to the collector at its stop, and taking it back at the process's exit.

The server freezes the heap alive when it starts (`gc.freeze()`: collections skip it while it serves) and
unfreezes it at its stop, so that a process that goes on can collect what the server held. But a process
that ends right after the stop (`serve()` returning at SIGINT or SIGTERM, most often) then paid for it at
exit: the interpreter's last collections walk every object of the heap. With torch imported (a few hundred
thousand objects) that kept the process alive 1.2-1.8 s after it logged "stopped", on busy cores; with the
heap frozen again at exit they skip it, as they skipped it while the server served. The operating system
frees that memory at exit anyway. What changes: objects in reference cycles still alive at exit are not
collected then, so their `__del__` does not run (Python does not promise it for them; its other exit steps,
atexit handlers, `weakref.finalize` and the flush of the standard streams, still run).
"""

from __future__ import annotations

import atexit
import gc

_freeze_at_exit = False


def thaw() -> None:
    """Let the collector reach the frozen heap again until the process exits, when it is frozen again."""
    global _freeze_at_exit
    gc.unfreeze()
    if not _freeze_at_exit:
        _freeze_at_exit = True
        atexit.register(gc.freeze)
