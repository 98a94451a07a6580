"""Frontend processes: the HTTP and gRPC servers on several cores, in front of one set of models (the hub).

With `frontends=N` (N >= 2) the server's own process, the hub, keeps the models, their batchers and instances,
and listens on the HTTP and gRPC ports; N processes of their own parse and answer the requests, each on a loop
of its own. A request crosses to the hub as a message of a batch (ipc/outbox.py) and its answer comes back the
same way.

| module | process | job |
|---|---|---|
| `pool.py` | hub | starts, restarts and stops the frontend processes; mirrors models and regions into them |
| `acceptor.py` | hub | accepts each connection and hands it to the next frontend (also the attach socket's) |
| `hub.py` | hub | one frontend's requests into the models' schedulers, their answers back (`RemoteSink`) |
| `process.py` | frontend | the process: its servers, and what it does when the hub calls |
| `remote.py` | frontend | the engine the servers see: mirrored specs, requests sent to the hub (`RemoteModel`) |
| `forwarding.py` | both | every API request but inference, answered by the hub's own app and servicer |
| `protocol.py` | both | the messages of the request path |
"""
