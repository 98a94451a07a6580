"""Calls from a callable (or a custom route) to another bound model, in-process (docs/composition.md).

`path`: the call path a running batch hands its callable (cycles, deadlines, cancellation); `inner_call`: a call
through the model's queue, as a client's request; `direct`: a call to an idle sync model that skips the queue;
`process_callers` and `async_callers`: where the calls of a callable outside the server's process go;
`ensemble`: a model declared as a graph of bound models (Triton's ensembles; its steps: core/ensemble_graph.py),
checked at load and run as inner calls.
"""
