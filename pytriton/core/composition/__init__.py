"""Calls from a callable (or a custom route) to another bound model, in-process (docs/composition.md).

`path`: the call path a running batch hands its callable (cycles, deadlines, cancellation); `inner_call`: a call
through the model's queue, as a client's request; `direct`: a call to an idle sync model that skips the queue;
`process_callers` and `async_callers`: where the calls of a callable outside the server's process go. An
ensemble's steps are inner calls too (core/scheduling/ensemble.py runs them).
"""
