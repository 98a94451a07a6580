"""Model instances served by other processes: spawned (`ProcessInstances`) or attached (`RemoteTriton`).

| module | job |
|---|---|
| `protocol.py` | the messages (INIT, JOB, RESULT, ...) and errors that travel (`RemoteError`) |
| `spawn.py` | starting an instance process: the callable pickled by cloudpickle, its environment, the handshake |
| `host.py` | the far side: runs the callable for each job (sync, async, generators), one at a time |
| `input_arena.py` | a batch's inputs in the server's arena, lent to the process until nothing there views them |
| `result_arena.py` | results without a copy in the server: regions of the process's arena lent to the server |
| `long_outputs.py` | long object (BYTES) outputs: pickled in pieces in the process, rebuilt off the server's loop |
| `instance.py` | the server side: jobs out, results back, death detected, the process started again |
"""
