"""Messages between the server and an instance process over a Unix stream socket.

A message is a fixed header, a pickled head (what to do, tensor descriptors, parameters: small, plain
tuples, which pickle ten times faster than classes), a body of raw bytes (tensors sent inline when shared
memory cannot hold them) and, rarely, file descriptors (shared-memory segments) passed with SCM_RIGHTS.
Every read is a `recvmsg` with room for descriptors, and each header says how many are its own, so
descriptors and messages stay paired however the bytes arrive. A small message arrives in one system
call; a large body is read straight into its own buffer.

`BlockingChannel` serves the instance process (one thread, blocking calls); `LoopChannel` serves the
server's event loop (a reader callback, writes queued while the socket is full).
"""

from __future__ import annotations

import array
import asyncio
import io
import logging
import os
import pickle
import socket
import struct
import weakref
from collections import deque
from typing import Any, Callable, Deque, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from pytriton.ipc.tensors import Buffer

# head length, body length, number of descriptors
_HEADER = struct.Struct("<IQI")
MAX_FDS = 4
_FD_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
_READ_BYTES = 256 * 1024
_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL
LOGGER = logging.getLogger(__name__)


class Message(NamedTuple):
    """One message received; its descriptors belong to whoever takes the message."""

    head: Any
    body: memoryview
    fds: List[int]
    lost: int = 0  # the size of a body there was no memory for, read and dropped (`body` is then empty)


class ChannelClosed(ConnectionError):
    """The other side closed the channel (or died)."""


def encode(
    head: Any, body: Sequence[Buffer] = (), fds: Sequence[int] = (), body_size: Optional[int] = None
) -> List[Buffer]:
    """The buffers of one message, to send in order (descriptors go with the first).

    `body_size` is the body's length when the caller knows it. A small body is joined to the head: one buffer
    is one cheap send, where each part of a batch of small tensors would cost a memoryview to send it as it is.
    """
    if len(fds) > MAX_FDS:
        raise ValueError(f"at most {MAX_FDS} descriptors go with one message")
    pickled = pickle.dumps(head, _PICKLE_PROTOCOL)
    if not body:
        return [_HEADER.pack(len(pickled), 0, len(fds)) + pickled]  # one buffer: one cheap send
    if body_size is None:
        body_size = sum(memoryview(part).nbytes for part in body)
    header = _HEADER.pack(len(pickled), body_size, len(fds)) + pickled
    if body_size <= JOINED_BODY_BYTES:
        return [b"".join([header, *body])]
    return [header, *body]


# Bodies up to this size are copied behind their head (see encode); larger ones go out from where they lie.
JOINED_BODY_BYTES = 16 * 1024


def loads(data: Buffer) -> Any:
    """A message's head unpickled; a class or function this process cannot import comes as a stand-in (Unimportable).

    A model's process may send an object of a class only it can import (a module its factory imported from a path of
    its own): the message stays readable, and says what it carried, where the channel was closed (and the process,
    alive, taken for dead). The stand-ins cost nothing until a head fails to unpickle.
    """
    try:
        return pickle.loads(data)
    except (ImportError, AttributeError):
        return _Tolerant(io.BytesIO(data)).load()


class Unimportable:
    """Stands in for an object whose class (module and qualified name: the stand-in's) this process cannot import."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Unimportable:
        """Whatever the original took."""
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.{type(self).__qualname__} object, of a class this process cannot import>"


_STAND_INS: Dict[Tuple[str, str], type] = {}


class _Tolerant(pickle.Unpickler):
    """An unpickler that gives a stand-in for what it cannot import."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            found = _STAND_INS.get((module, name))
            if found is None:
                attributes = {"__module__": module, "__qualname__": name}
                found = _STAND_INS[(module, name)] = type(name.rpartition(".")[2], (Unimportable,), attributes)
            return found


def _descriptors(ancillary: List[Tuple[int, int, bytes]]) -> List[int]:
    """The descriptors an SCM_RIGHTS control message carried."""
    fds: List[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(data[: len(data) - len(data) % received.itemsize])
            fds.extend(received)
    return fds


def _rights(fds: Sequence[int]) -> List[Tuple[int, int, bytes]]:
    """The control message that passes descriptors."""
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []


class _Reader:
    """Cuts the bytes that arrive into messages; a large body is read into its own buffer directly.

    A large body there is no memory for (MemoryError: the process's memory limit) of a message `drops(head)` accepts
    is read and dropped, its message handed over with `lost` set, so that the receiver can fail what it carried and
    the channel goes on; any other's MemoryError is raised.
    """

    def __init__(self, drops: Optional[Callable[[Any], bool]] = None) -> None:
        self.drops = drops
        self._buffer = bytearray()
        self._fds: Deque[int] = deque()
        # recvmsg(n) allocates n bytes for every call (a 256 KiB malloc is an mmap: ~25 us); this is reused.
        self.receive_buffer = memoryview(bytearray(_READ_BYTES))
        self._whole_messages: List[Message] = []
        # head, fd count, body (None: dropped), bytes of it read, its size
        self._big: Optional[Tuple[Any, int, Optional[bytearray], int, int]] = None

    @property
    def idle(self) -> bool:
        """Whether no message is partly read."""
        return not self._buffer and self._big is None

    def big_body(self) -> Optional[memoryview]:
        """Where the next bytes go when a large body is being read, else None (read into the buffer)."""
        if self._big is None:
            return None
        _, _, body, got, size = self._big
        if body is None:  # dropped: read into the receive buffer, and forgotten
            return self.receive_buffer[: min(size - got, len(self.receive_buffer))]
        return memoryview(body)[got:]

    def got_body_bytes(self, count: int) -> None:
        """`count` bytes were read into big_body()."""
        assert self._big is not None
        head, nfds, body, got, size = self._big
        self._big = (head, nfds, body, got + count, size)

    def receive(self, sock: socket.socket, flags: int = 0) -> bool:
        """Read what the socket has into the buffer (with its descriptors); False at the end of the stream."""
        count, ancillary, _, _ = sock.recvmsg_into([self.receive_buffer], _FD_SPACE, flags)
        if ancillary:
            self._fds.extend(_descriptors(ancillary))
        if not count:
            return False
        if not self._buffer and self._big is None and self._whole(count):
            return True
        self._buffer += self.receive_buffer[:count]
        return True

    def _whole(self, count: int) -> bool:
        """The usual case, one small message read whole: cut it out of the receive buffer without copying it first."""
        view = self.receive_buffer
        if count < _HEADER.size:
            return False
        head_size, body_size, nfds = _HEADER.unpack_from(view)
        head_end = _HEADER.size + head_size
        if head_end + body_size != count:
            return False
        head = loads(view[_HEADER.size : head_end])
        body = memoryview(bytearray(view[head_end:count]) if body_size else b"")
        self._whole_messages.append(Message(head, body, self._take_fds(nfds)))
        return True

    def messages(self) -> List[Message]:
        """Every message now whole."""
        whole = self._whole_messages
        if whole:
            self._whole_messages = []
            return whole
        found: List[Message] = []  # never the list above: a message read in pieces would be handed over twice
        if self._big is not None:
            head, nfds, body, got, size = self._big
            if got < size:
                return found
            self._big = None
            if body is None:
                found.append(Message(head, memoryview(b""), self._take_fds(nfds), size))
            else:
                found.append(Message(head, memoryview(body), self._take_fds(nfds)))
        buffer = self._buffer
        start = 0
        while len(buffer) - start >= _HEADER.size:
            head_size, body_size, nfds = _HEADER.unpack_from(buffer, start)
            head_end = start + _HEADER.size + head_size
            if len(buffer) < head_end:
                break
            head = loads(buffer[start + _HEADER.size : head_end])
            end = head_end + body_size
            if len(buffer) < end:
                have = len(buffer) - head_end
                part: Optional[bytearray] = None  # None: dropped
                try:
                    part = bytearray(body_size)
                except MemoryError:
                    if self.drops is None or not self.drops(head):
                        raise
                else:
                    part[:have] = buffer[head_end:]
                self._big = (head, nfds, part, have, body_size)
                start = len(buffer)
                break
            found.append(Message(head, memoryview(buffer[head_end:end]), self._take_fds(nfds)))  # a copy: owned
            start = end
        if start:
            del buffer[:start]
        return found

    def _take_fds(self, count: int) -> List[int]:
        """The descriptors of the message being cut out."""
        return [self._fds.popleft() for _ in range(min(count, len(self._fds)))]


class BlockingChannel:
    """A channel for a thread that may block: the instance process's side."""

    def __init__(self, sock: socket.socket, drops: Optional[Callable[[Any], bool]] = None) -> None:
        """Use a connected Unix stream socket (blocking); `drops`: the messages whose body may be lost (_Reader)."""
        sock.setblocking(True)
        self.sock = sock
        self._reader = _Reader(drops)
        self._ready: Deque[Message] = deque()
        _BLOCKING.add(self)

    def send(self, head: Any, body: Sequence[Buffer] = (), fds: Sequence[int] = ()) -> None:
        """Send one message whole."""
        self.send_encoded(encode(head, body, fds), fds)

    def send_encoded(self, message: List[Buffer], fds: Sequence[int] = ()) -> None:
        """Send a message `encode` made (with the descriptors it was made for)."""
        try:
            self._send_encoded(message, fds)
        except OSError:
            if self.sock.fileno() == -1:  # closed in this process: a child the callable forked returns here
                raise ChannelClosed("the channel is closed in this process") from None
            raise

    def _send_encoded(self, message: List[Buffer], fds: Sequence[int]) -> None:
        if len(message) == 1 and not fds:
            self.sock.sendall(message[0])
            return
        buffers = [memoryview(part).cast("B") for part in message]
        ancillary = _rights(fds)
        while buffers:
            sent = self.sock.sendmsg(buffers, ancillary)
            ancillary = []
            while buffers and sent >= buffers[0].nbytes:
                sent -= buffers.pop(0).nbytes
            if buffers and sent:
                buffers[0] = buffers[0][sent:]

    def receive(self) -> Message:
        """Wait for the next message; ChannelClosed when the other side is gone."""
        while not self._ready:
            self._fill(blocking=True)
        return self._ready.popleft()

    def readable(self) -> bool:
        """Whether a message (or the end of the channel) waits, without blocking."""
        if not self._ready:
            self._fill(blocking=False)
        return bool(self._ready)

    def _fill(self, blocking: bool) -> None:
        """Read what the socket has (waiting for something when `blocking`)."""
        flags = 0 if blocking else socket.MSG_DONTWAIT
        try:
            target = self._reader.big_body()
            if target is not None:
                count = self.sock.recv_into(target, 0, flags)
                if not count:
                    raise ChannelClosed("the other side closed the channel")
                self._reader.got_body_bytes(count)
            elif not self._reader.receive(self.sock, flags):
                raise ChannelClosed("the other side closed the channel")
        except BlockingIOError:
            return
        self._ready.extend(self._reader.messages())

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


class LoopChannel:
    """A channel on the event loop: each message whole goes to `on_message`, the end to `on_closed`.

    Reads happen in a reader callback; a write that the socket cannot take at once is queued and
    finished by a writer callback, in order.
    """

    def __init__(
        self,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        on_message: Callable[[Message], None],
        on_closed: Callable[[], None],
    ) -> None:
        """Start reading from a connected Unix stream socket."""
        sock.setblocking(False)
        self.sock = sock
        self._fileno = sock.fileno()
        self._loop = loop
        self._on_message = on_message
        self._on_closed = on_closed
        self._reader = _Reader()
        # What the socket has not taken yet: (bytes, descriptors to pass with them, descriptors to close once sent);
        # a Reserved, the place of a message still being made, holds back what follows it.
        self._pending: Deque[Tuple[Union[memoryview, Reserved], List[Tuple[int, int, bytes]], Sequence[int]]] = deque()
        self.closed = False
        loop.add_reader(self._fileno, self._read)

    def handle(self, on_message: Callable[[Message], None], on_closed: Callable[[], None]) -> None:
        """Hand the messages that come from now on, and the end, to other callbacks."""
        self._on_message = on_message
        self._on_closed = on_closed

    def drop_bodies(self, drops: Callable[[Any], bool]) -> None:
        """From now on, a large body there is no memory for of a message `drops(head)` accepts is lost (_Reader)."""
        self._reader.drops = drops

    def send(
        self,
        head: Any,
        body: Sequence[Buffer] = (),
        fds: Sequence[int] = (),
        give: bool = False,
        body_size: Optional[int] = None,
    ) -> None:
        """Send one message, now if the socket takes it, else as soon as it can.

        With `give` the descriptors are the channel's: closed once sent, or when the channel closes (also when
        this raises ChannelClosed); without it they must stay open until the message is out. `body_size`: the
        body's length, when the caller knows it.
        """
        if self.closed:
            if give:
                _close_all(fds)
            raise ChannelClosed("the channel is closed")
        message = encode(head, body, fds, body_size)
        if len(message) == 1 and not fds and not self._pending:
            try:
                sent = self.sock.send(message[0])
            except BlockingIOError:
                sent = 0
            except OSError:
                self._close()
                raise ChannelClosed("the other side closed the channel") from None
            if sent == len(message[0]):
                return
            self._loop.add_writer(self._fileno, self._write)
            self._pending.append((memoryview(message[0])[sent:], [], ()))
            return
        buffers = [memoryview(part).cast("B") for part in message]
        ancillary = _rights(fds)
        if not self._pending:
            try:
                sent = self.sock.sendmsg(buffers, ancillary)
            except BlockingIOError:
                sent = 0
            except OSError:
                if give:
                    _close_all(fds)
                self._close()
                raise ChannelClosed("the other side closed the channel") from None
            else:
                ancillary = []
                if give:
                    _close_all(fds)
                    give = False
            while buffers and sent >= buffers[0].nbytes:
                sent -= buffers.pop(0).nbytes
            if not buffers:
                return
            buffers[0] = buffers[0][sent:]
            self._loop.add_writer(self._fileno, self._write)
        for index, buffer in enumerate(buffers):
            first = index == 0
            self._pending.append((buffer, ancillary if first else [], fds if first and give else ()))

    def reserve(self) -> Reserved:
        """The place of a message whose head is still being made (off the loop): what is sent meanwhile goes after it.

        Raises:
            ChannelClosed: the channel is closed.
        """
        if self.closed:
            raise ChannelClosed("the channel is closed")
        place = Reserved(self)
        self._pending.append((place, [], ()))
        return place

    def _fill(self, place: Reserved, message: List[Buffer], fds: Sequence[int]) -> None:
        """Put a message (none: `message` empty) where `place` is in the queue; what waited behind it goes on."""
        if self.closed:
            if message:
                raise ChannelClosed("the channel is closed")
            return
        pending = self._pending
        at = next(index for index, entry in enumerate(pending) if entry[0] is place)
        del pending[at]
        ancillary = _rights(fds)
        for offset, part in enumerate(message):
            pending.insert(at + offset, (memoryview(part).cast("B"), ancillary if offset == 0 else [], ()))
        if at == 0 and pending:  # the writer stopped at the place (or never started): it goes on
            self._loop.add_writer(self._fileno, self._write)

    def _write(self) -> None:
        """Writer callback: send what is queued, in order, up to the first place still reserved."""
        pending = self._pending
        while pending:
            buffer, ancillary, given = pending[0]
            if isinstance(buffer, Reserved):
                self._loop.remove_writer(self._fileno)  # Reserved's fill starts it again
                return
            try:
                sent = self.sock.sendmsg([buffer], ancillary)
            except BlockingIOError:
                return
            except OSError:
                self._close()
                return
            _close_all(given)
            if sent < buffer.nbytes:
                pending[0] = (buffer[sent:], [], ())
                return
            pending.popleft()
        self._loop.remove_writer(self._fileno)

    def _read(self) -> None:
        """Reader callback: read what has arrived, handing over each whole message."""
        reader = self._reader
        try:
            while not self.closed:
                target = reader.big_body()
                if target is not None:
                    count = self.sock.recv_into(target)
                    if not count:
                        break
                    reader.got_body_bytes(count)
                elif not reader.receive(self.sock):
                    break
                for message in reader.messages():
                    self._on_message(message)
                if reader.idle:
                    return  # nothing partial: skip the read that would only say EAGAIN (the loop calls again)
            else:
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        except Exception:  # a message that cannot be read: the channel is of no further use
            LOGGER.exception("unreadable message on an instance channel; closing it")
        self._close()

    def _close(self) -> None:
        """The other side is gone: stop watching the socket and say so once."""
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._fileno)
        if self._pending:
            self._loop.remove_writer(self._fileno)
            for _, _, given in self._pending:
                _close_all(given)
            self._pending.clear()
        self.sock.close()
        self._on_closed()

    def close(self) -> None:
        """Close from this side (on_closed is called too)."""
        self._close()


class Reserved:
    """The place of one message in a LoopChannel's order (`reserve`), kept until it is filled or dropped."""

    def __init__(self, channel: LoopChannel) -> None:
        """A place at the end of `channel`'s queue (LoopChannel.reserve puts it there)."""
        self._channel: Optional[LoopChannel] = channel

    def fill(self, head: Any, body: Sequence[Buffer] = (), fds: Sequence[int] = ()) -> None:
        """Send the message in its place (as LoopChannel.send without `give`: its descriptors stay open until sent).

        Raises:
            ChannelClosed: the channel closed meanwhile.
            Exception: what pickling the head raised (the place is kept: drop it).
        """
        channel = self._channel
        if channel is None:
            raise RuntimeError("a reserved place is filled once")
        message = encode(head, body, fds)
        self._channel = None
        channel._fill(self, message, fds)

    def drop(self) -> None:
        """No message after all: what waits behind the place goes on (nothing when it was filled)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel._fill(self, [], ())


# This process's blocking channels, whose copies a forked child closes (`_close_in_child`).
_BLOCKING: weakref.WeakSet[BlockingChannel] = weakref.WeakSet()


def _close_in_child() -> None:
    """In a child a callable forked (os.fork, multiprocessing's fork): close its copies of the channels.

    The other end learns that this process ended when its channels close: a child that lived on held them open,
    and a server waited for the child's end to fail the batch of an instance process that had died.
    """
    for channel in list(_BLOCKING):
        try:
            channel.sock.close()
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


def _close_all(fds: Sequence[int]) -> None:
    """Close descriptors a message was given, once it no longer needs them."""
    for fd in fds:
        os.close(fd)
