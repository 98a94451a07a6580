"""A call whose request declared a content-length: its DATA must add up to it (RFC 9113 8.1.1, h2spec 8.1.2.6).

gRPC clients send no content-length, so the usual call is a plain GrpcCall and pays nothing for the check:
the session makes a SizedCall only for a request that carries one (its syntax, digits and once, is the
header decoder's). DATA past the declared length, or END_STREAM short of it, makes the request malformed:
a stream error PROTOCOL_ERROR, which resets that stream alone (tritonserver 2.51's grpc core ignores
content-length and serves such a request).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Sequence

from pytriton.core.tensors.raw_tensors import Buffer
from pytriton.transport.grpc import frames as h2
from pytriton.transport.grpc.call import GrpcCall
from pytriton.transport.grpc.headers import Header
from pytriton.transport.grpc.messages import MessageReader

if TYPE_CHECKING:
    from pytriton.transport.grpc.handlers import Method
    from pytriton.transport.grpc.session import Http2Session


class SizedCall(GrpcCall):
    """A GrpcCall that counts its request's DATA (padding aside) against the content-length it declared."""

    __slots__ = ("content_left",)

    def __init__(
        self,
        session: Http2Session,
        stream_id: int,
        method: Method,
        headers: List[Header],
        reader: MessageReader,
        send_window: int,
        content_length: int,
    ) -> None:
        """A call on stream `stream_id` whose DATA must carry `content_length` bytes in all."""
        super().__init__(session, stream_id, method, headers, reader, send_window)
        self.content_left = content_length

    def receive(self, pieces: Sequence[Buffer], length: int, in_place: bool = False) -> None:
        """DATA of the stream (see GrpcCall.receive); past the declared length, none of it is taken.

        Raises:
            StreamError: PROTOCOL_ERROR, the DATA go past the content-length (the connection's room comes back).
        """
        self.content_left -= length if in_place else sum(map(len, pieces))
        if self.content_left < 0:
            self.session.inflow.dropped(length)
            raise h2.StreamError(self.stream_id, h2.PROTOCOL_ERROR)
        super().receive(pieces, length, in_place)

    def close_remote(self) -> None:
        """The client ended its side (see GrpcCall.close_remote).

        Raises:
            StreamError: PROTOCOL_ERROR, the DATA fall short of the content-length.
        """
        if self.content_left:
            raise h2.StreamError(self.stream_id, h2.PROTOCOL_ERROR)
        super().close_remote()
