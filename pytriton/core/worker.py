"""A daemon worker thread that runs sync callables and settles asyncio futures on the loop."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Tuple

from pytriton.core.doorbell import Doorbell, LoopInbox, inbox_of

# (the submitting loop's inbox, future, fn, args, whether the submitter waits to hear that the thread took the job)
_Job = Tuple[LoopInbox, "asyncio.Future[Any]", Callable[..., Any], Tuple[Any, ...], bool]
# How long submit(hand_over=True) waits for the thread to take its job.
HAND_OVER_S = 0.001
# `IN_WORKER.yes` is True in a worker's thread (absent in others): each job it runs ends with a post that wakes the
# loop. Read inline by a direct inner call (core/scheduling/direct_runs.py), where a function to ask cost a frame per
# call.
IN_WORKER = threading.local()


class WorkerThread:
    """One daemon thread with a job queue; a hung callable never keeps the process alive.

    Jobs and results travel through deques, each direction woken by a Doorbell (see core/doorbell.py).
    """

    def __init__(self, name: str, prepare: Optional[Callable[[], None]] = None) -> None:
        """Create the worker; its thread and (unless `open` came first) its pipe start with the first job.

        `prepare()` runs in the thread when it starts, before its first job.
        """
        self.name = name
        self._prepare = prepare
        self._jobs: Deque[Optional[_Job]] = deque()
        self._doorbell: Optional[Doorbell] = None
        self._started = False
        self._taken: queue.SimpleQueue[None] = queue.SimpleQueue()  # one item per handed-over job taken
        self._unfinished = 0  # jobs submitted and not finished yet (read and written on the loop only)
        self._on_idle: List[Tuple[Callable[..., None], Tuple[Any, ...]]] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the loop of the last submit, and its inbox
        self._inbox: Optional[LoopInbox] = None
        self._loop_thread = 0  # the thread that ran `_loop` then

    def open(self) -> Doorbell:
        """Open the thread's doorbell now rather than with the first job; return it.

        A job then needs no file descriptor: a process out of them (EMFILE) fails here, when the model
        is bound, and not its first request.
        """
        if self._doorbell is None:
            self._doorbell = Doorbell(blocking=True)
        return self._doorbell

    def when_idle(self, callback: Callable[..., None], *args: Any) -> None:
        """Call `callback(*args)` on the loop once every submitted job has finished (at once when none is left)."""
        if self._unfinished:
            self._on_idle.append((callback, args))
        else:
            callback(*args)

    def submit(self, fn: Callable[..., Any], *args: Any, hand_over: bool = False) -> asyncio.Future[Any]:
        """Run `fn(*args)` in the thread; the returned future settles on the calling loop.

        With `hand_over`, wait (at most HAND_OVER_S) until the thread has taken the job. A loop with
        more work waiting (responses to send, requests to read) keeps the GIL for as long as the
        interpreter's switch interval (5 ms): without the hand-over the job waits that long to start.
        """
        loop, inbox = self._loop, self._inbox
        # The last submit's loop while it still runs on the thread that submitted then: asking the running loop
        # is a getpid system call on Python 3.11 and older, and inbox_of a WeakKeyDictionary lookup (0.3 us).
        if loop is None or inbox is None or self._loop_thread != threading.get_ident() or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
            inbox = self._inbox = inbox_of(loop)
            self._loop_thread = threading.get_ident()
        future: asyncio.Future[Any] = loop.create_future()
        doorbell = self._doorbell or self.open()
        if not self._started:
            threading.Thread(target=self._work, args=(doorbell,), name=self.name, daemon=True).start()
            self._started = True
        self._unfinished += 1
        self._jobs.append((inbox, future, fn, args, hand_over))
        doorbell.ring()
        if hand_over:
            try:
                self._taken.get(timeout=HAND_OVER_S)
            except queue.Empty:
                pass  # it will take the job later; its note of it is read by the next hand-over
        return future

    def _work(self, doorbell: Doorbell) -> None:
        """Run jobs until told to stop; nothing of a finished job stays referenced here while it waits.

        A batch's inputs held while idle would keep their request buffer from being reused, and its outputs
        their memory. And a torch tensor among them was freed by this thread when it ended at exit, while the
        interpreter finalized: freeing a tensor releases the GIL, a daemon thread that asks for it back then
        is ended by `pthread_exit`, whose unwinding through torch's C++ aborted the process.
        """
        IN_WORKER.yes = True
        if self._prepare is not None:
            self._prepare()
        jobs = self._jobs
        while True:
            while not jobs:
                doorbell.take()
            if not self._run(jobs.popleft()):
                return

    def _run(self, job: Optional[_Job]) -> bool:
        """Run one job and post its outcome to its loop; False for the stop mark (None)."""
        if job is None:
            return False
        inbox, future, fn, args, handed_over = job
        del job
        if handed_over:
            self._taken.put(None)
        result: Any = None
        error: Optional[BaseException] = None
        try:
            result = fn(*args)
        except BaseException as raised:  # noqa: BLE001 - handed to the waiter on the loop
            error = raised
        # Let go of the callable and its inputs before the loop hears of the end: a client that got its answer
        # and stopped the server finds the model let go, not held here until this thread gets the GIL back.
        del fn, args
        try:
            inbox.post(self._finished, future, result, error)
        except RuntimeError:  # the loop closed while the job ran: nobody is waiting
            pass
        del inbox, future, result, error  # a raised error's traceback keeps this frame: not the job
        return True

    def _finished(self, future: asyncio.Future[Any], result: Any, error: Optional[BaseException]) -> None:
        """On the loop: settle a job's future unless its waiter gave up; run the idle callbacks after the last job."""
        self._unfinished -= 1
        if not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        if not self._unfinished and self._on_idle:
            callbacks, self._on_idle = self._on_idle, []
            for callback, args in callbacks:
                callback(*args)

    def close(self) -> None:
        """Stop the thread after the job it is running, if any."""
        self._jobs.append(None)
        if self._doorbell is not None:
            self._doorbell.ring()
