"""How the server's processes share work: shared memory, messages over Unix sockets, packed tensors.

Every process the server starts uses these: model instances (core/process_instances/) and RemoteTriton's
attached processes. Nothing here knows what a model or a request is.

| module | job |
|---|---|
| `segments.py` | `SharedSegment`: a mapped shared-memory file (an anonymous memfd, or a client's named POSIX segment) |
| `channel.py` | messages over a Unix stream socket: a pickled head, a raw body, descriptors by SCM_RIGHTS |
| `tensors.py` | dicts of arrays packed into the sender's arena (`ArenaWriter`) and rebuilt over it (`ArenaReader`) |
| `regions.py` | regions of an arena lent to the receiver until it gives them back (`LendingArena`) |
| `spawn.py` | how a helper process ended, and stopping one |
"""
