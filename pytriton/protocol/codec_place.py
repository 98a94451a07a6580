"""Where an infer codec runs (`place`), and what it leaves to a worker thread when it runs on the event loop.

ANYWHERE: as the codec always ran (a caller that never awaits). ON_LOOP: on the server's event loop, where a
message that would hold the loop for more than a few ms raises OffLoop before the codec changed anything (but its
caches of headers); the transport then runs it again OFF_LOOP, in a worker thread (transport/codec_threads.py),
where its long steps go a piece at a time (protocol/json_pieces.py, tensors._numeric_in_pieces) so that the loop
gets the GIL between them.
"""

from __future__ import annotations

# OFF_LOOP is 0: a codec asks `if place:` (a step less than `!= OFF_LOOP`, in each small request).
OFF_LOOP, ON_LOOP, ANYWHERE = 0, 1, 2
# On the loop: a JSON header this long or more (about 3 ms of parsing and arrays), BYTES data this long in the
# body or raw contents (about 2 ms of strings), or BYTES contents or an output of this many values to be written
# as JSON or BYTES, raises OffLoop.
OFF_LOOP_JSON_BYTES = 256 * 1024
OFF_LOOP_STRING_BYTES = 64 * 1024
OFF_LOOP_VALUES = 16384


class OffLoop(Exception):
    """The message is long to decode or encode: the caller does it again in a worker thread (`place=OFF_LOOP`)."""
