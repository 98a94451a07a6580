"""Calls from a callable (or a custom route) to another bound model, in-process (docs/composition.md).

`path`: the call path a running batch hands its callable (cycles, deadlines, cancellation); `inner_call`: a call
through the model's queue, as a client's request; `direct`: a call to an idle sync model that skips the queue;
`process_callers` and `async_callers`: where the calls of a callable outside the server's process go. The names
users import are here too.
"""

from __future__ import annotations

from pytriton.core.composition.async_callers import (
    AsyncProcessCaller,
    async_process_caller,
    use_async_caller_here,
)
from pytriton.core.composition.direct import call_here, call_here_async
from pytriton.core.composition.inner_call import CalledModel, InnerCall, build_request, outputs_of, thread_doorbell
from pytriton.core.composition.path import (
    CURRENT,
    CallArguments,
    CallPath,
    Cancellable,
    ModelCallError,
    Models,
    Origin,
    PathMaker,
    PathSource,
    run_in_path,
)
from pytriton.core.composition.process_callers import (
    ProcessCaller,
    process_caller,
    set_process_caller,
    use_caller_here,
)

__all__ = [
    "CURRENT",
    "AsyncProcessCaller",
    "CallArguments",
    "CallPath",
    "CalledModel",
    "Cancellable",
    "InnerCall",
    "ModelCallError",
    "Models",
    "Origin",
    "PathMaker",
    "PathSource",
    "ProcessCaller",
    "async_process_caller",
    "build_request",
    "call_here",
    "call_here_async",
    "outputs_of",
    "process_caller",
    "run_in_path",
    "set_process_caller",
    "thread_doorbell",
    "use_async_caller_here",
    "use_caller_here",
]
