"""Triton's system shared-memory regions: POSIX segments of other processes on this host, registered by key.

A client (tritonclient.utils.shared_memory) creates a segment, registers part of it under a name, and then
names the region, an offset and a size instead of sending tensor bytes: inputs are read from it, outputs
written into it. Every access is checked against the region. Tensors move through the segment's file
descriptor (pread, pwrite), not through its mapping: a segment the client shrank reads short, where touching
the mapping past the file's end would be SIGBUS. Inputs are copied out, so the client cannot change a request
while the model runs. Messages and statuses are Triton's, except that
a key that cannot be opened, which Triton refuses with INTERNAL, is a client's mistake here: INVALID_ARGUMENT;
and regions Triton 2.51 refuses for how it maps them (an offset that is no multiple of the page size, a second
region of a segment, whose first region's closed descriptor it reuses) are taken.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from pytriton.core.errors import InferenceError, Status
from pytriton.core.tensors.raw_tensors import Buffer
from pytriton.ipc.segments import SegmentTooSmall, SharedMemoryUnavailable, SharedSegment

# Linux moves at most this many bytes in one read or write call (MAX_RW_COUNT).
MAX_CALL_BYTES = 0x7FFFF000
# At most this many buffers in one preadv or pwritev (IOV_MAX).
MAX_BUFFERS = 1024
# A run of at least this many bytes is read or written by a worker thread when the caller can wait for it
# (`read_all`'s and `write_all`'s `deferred`): a 1 GiB copy on the event loop stalled every other client for seconds.
OFF_LOOP_BYTES = 8 << 20
# Each region holds a file descriptor and a mapping: a bound keeps clients from exhausting the process's descriptors.
MAX_REGIONS = 512
# Every registry takes the next of these numbers at its start and at each change of its regions: a number names one
# state of one registry, and is never used again by any.
_GENERATIONS = itertools.count(1)


@dataclasses.dataclass(frozen=True)
class SystemRegion:
    """One registered region: `byte_size` bytes from `offset` of the POSIX segment `key`."""

    name: str
    key: str
    offset: int
    byte_size: int


class _Descriptor:
    """A region's file held by its descriptor alone, unmapped: every access goes through the descriptor anyway."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        """Hold `fd` (taken)."""
        self._fd = fd

    def fileno(self) -> int:
        """The descriptor."""
        return self._fd

    def close(self) -> None:
        """Close the descriptor (once)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


class _Mapped:
    """A registered region with what each access needs at hand: its segment's descriptor and where it starts."""

    __slots__ = ("fd", "region", "registered", "segment", "size", "start")

    def __init__(self, region: SystemRegion, segment: Union[SharedSegment, _Descriptor], registered: int) -> None:
        self.region = region
        self.registered = registered  # the registry's generation it made: the same values registered again differ
        self.segment = segment
        self.fd = segment.fileno()
        self.start = region.offset
        self.size = region.byte_size


class SystemSharedMemory:
    """The system shared-memory regions registered with one server (used on the event loop)."""

    def __init__(self) -> None:
        """No regions."""
        self._regions: Dict[str, _Mapped] = {}
        # The registry's state as a number unique to it (_GENERATIONS): what was located or checked in it at one
        # generation (the descriptors, positions and ranges of `locate` and `check`) holds while it has not changed.
        self.generation = next(_GENERATIONS)
        # Regions in-flight requests write outputs into, with how many: Triton refuses to unregister them.
        self._held: Dict[str, int] = {}

    def status(self, name: str = "") -> List[SystemRegion]:
        """Every region, by name as Triton lists them, or the one named (NOT_FOUND when it is not registered)."""
        if not name:
            return [self._regions[key].region for key in sorted(self._regions)]
        found = self._regions.get(name)
        if found is None:
            raise InferenceError.not_found(f"Unable to find system shared memory region: '{name}'")
        return [found.region]

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map `byte_size` bytes from `offset` of the segment `key` and register them as `name`."""
        if not name:
            raise InferenceError.invalid("'region name' is necessary to register system shared memory region")
        if name in self._regions:
            raise InferenceError(Status.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        if len(self._regions) >= MAX_REGIONS:
            raise InferenceError.invalid(
                f"failed to register shared memory region '{name}': {MAX_REGIONS} regions are registered already"
            )
        if not key or "/" in key[1:] or "\0" in key:
            raise InferenceError.invalid(f"Unable to open shared memory region: '{key}'")
        try:
            segment = SharedSegment.open_named(key, offset, byte_size)
        except SegmentTooSmall:
            raise InferenceError.invalid(f"failed to register shared memory region '{name}': invalid args") from None
        except SharedMemoryUnavailable as error:
            if error.errno is not None:  # the segment could not be opened at all
                raise InferenceError.invalid(f"Unable to open shared memory region: '{key}'") from None
            # Triton's mmap of 0 bytes fails with EINVAL, its message run on into strerror's
            raise InferenceError.invalid(
                f"failed to register shared memory region '{name}': unable to process address spaceInvalid argument"
            ) from None
        self.generation = next(_GENERATIONS)
        self._regions[name] = _Mapped(SystemRegion(name, key, offset, byte_size), segment, self.generation)

    def adopt(self, name: str, key: str, offset: int, byte_size: int, fd: int) -> None:
        """Register `name` as another registry's region, accessed through that registry's descriptor `fd` (taken).

        A frontend process follows its hub this way: the key may name another file by now (the client unlinked it
        once registered, and another took it), while the hub's descriptor is the file it registered. The range is
        not checked against the file, nor mapped: a file the client shrank since the hub registered it is accessed
        as the hub accesses it (a read past its end is refused as `_shrunk`, a write grows it back), not left out.

        Raises:
            SharedMemoryUnavailable: `fd` is no open descriptor.
        """
        try:
            os.fstat(fd)
        except OSError as error:
            raise SharedMemoryUnavailable(error.errno, f"cannot use shared memory '{key}': {error.strerror}") from None
        segment = _Descriptor(fd)
        old = self._regions.pop(name, None)
        if old is not None:
            old.segment.close()
        self.generation = next(_GENERATIONS)
        self._regions[name] = _Mapped(SystemRegion(name, key, offset, byte_size), segment, self.generation)

    def descriptor(self, name: str) -> int:
        """The descriptor of region `name`'s segment (KeyError when it is not registered)."""
        return self._regions[name].fd

    def registration(self, name: str) -> int:
        """A number of region `name`'s registration, another each time the name is registered (KeyError: it is not)."""
        return self._regions[name].registered

    def unregister(self, name: str = "", *, force: bool = False) -> None:
        """Unregister and unmap one region, or all of them; an unknown name is not an error (as in Triton).

        A region an in-flight request will write an output into (`hold`) stays, as tritonserver 2.51 keeps it: one
        named is refused, and all are unregistered but those, which the error lists (500 / INTERNAL, its words).
        `force` unregisters them too (the server's stop, a frontend following its hub).
        """
        held = () if force else self._held
        if name and name in held and name in self._regions:
            raise InferenceError(
                Status.INTERNAL, f"Cannot unregister shared memory region '{name}', it is currently in use."
            )
        busy = []
        for key in [name] if name else sorted(self._regions):
            if key in held:
                busy.append(key)
                continue
            found = self._regions.pop(key, None)
            if found is not None:
                found.segment.close()
                self.generation = next(_GENERATIONS)
        if busy:
            raise InferenceError(
                Status.INTERNAL,
                "Failed to unregister the following system shared memory regions: " + "".join(f"{b} ," for b in busy),
            )

    def hold(self, names: Iterable[str]) -> None:
        """Keep the regions `names` from being unregistered until `release`d: an in-flight request's outputs'."""
        held = self._held
        for name in names:
            held[name] = held.get(name, 0) + 1

    def held_names(self) -> List[str]:
        """The regions in-flight requests hold (`hold`), each once."""
        return list(self._held)

    def release(self, names: Iterable[str]) -> None:
        """Let go of regions `hold` kept."""
        held = self._held
        for name in names:
            count = held[name] - 1
            if count:
                held[name] = count
            else:
                del held[name]

    def read(self, name: str, offset: int, byte_size: int) -> np.ndarray:
        """A copy of `byte_size` bytes of a region from `offset`, in a new writable uint8 array."""
        data = np.empty(byte_size, dtype=np.uint8)
        fd, position = self.locate(name, offset, byte_size)
        _read_run(fd, position, [data], byte_size, name)
        return data

    def locate(self, name: str, offset: int, byte_size: int) -> Tuple[int, int]:
        """The descriptor and file position of `byte_size` bytes from `offset` of region `name` (checked inside it).

        Valid until a region is unregistered: for `read_all` in the same call on the loop, not across an await.
        """
        mapped = self._regions.get(name)
        if (
            mapped is None
            or offset < 0
            or byte_size < 0
            or offset + byte_size > mapped.size
            or (not byte_size and not 0 < offset < mapped.size)
        ):
            # 0 bytes at offset 0, or at the region's end, too, as tritonserver 2.51 (see `_refusal`)
            raise _refusal(name, mapped, offset)
        return mapped.fd, mapped.start + offset

    def check(self, name: str, offset: int, byte_size: int) -> None:
        """Raise Triton's error unless `byte_size` bytes from `offset` lie inside the registered region `name`."""
        self.locate(name, offset, byte_size)

    @staticmethod
    def read_all(reads: Sequence[Read], deferred: Optional[List[Read]] = None) -> None:
        """Fill each array of `reads` from where `locate` put it; consecutive ones in a file: one preadv.

        With `deferred`, a run of OFF_LOOP_BYTES or more is left to its caller, added there (for `off_loop`).
        """
        count = len(reads)
        index = 0
        while index < count:
            fd, position, array, name = reads[index]
            end = position + array.nbytes
            index += 1
            if index == count or reads[index][0] != fd or reads[index][1] != end:  # the common case: one array
                if deferred is not None and end - position >= OFF_LOOP_BYTES:
                    deferred.append(reads[index - 1])
                    continue
                try:
                    # The array itself, a buffer: no memoryview to make (numpy's stubs do not say it is one).
                    if os.preadv(fd, (array,), position) == end - position:  # type: ignore[arg-type]
                        continue
                except OSError:
                    pass
                _read_run(fd, position, [array], end - position, name)  # a short read, or an error: read again
                continue
            first = index - 1
            buffers = [array]
            while index < count and len(buffers) < MAX_BUFFERS and reads[index][0] == fd and reads[index][1] == end:
                following = reads[index][2]
                buffers.append(following)
                end += following.nbytes
                index += 1
            if deferred is not None and end - position >= OFF_LOOP_BYTES:
                deferred.extend(reads[first:index])
                continue
            _read_run(fd, position, buffers, end - position, name)

    def write_all(self, writes: Sequence[Write], deferred: Optional[List[WriteRun]] = None) -> None:
        """Copy each buffer of `writes` into its region from its offset; consecutive ones in a region: one pwritev.

        Regions are looked up here, not at the request's decode: one unregistered since is refused, never written
        through a descriptor that may by now be another file's. A segment the client shrank since its registration
        grows back to hold the bytes written: no fault, and no file check per write (an fstat costs more than the
        pwrite). With `deferred`, a run of OFF_LOOP_BYTES or more is added there (for `off_loop`), not written:
        checked, with its region's descriptor as it is now.
        """
        count = len(writes)
        index = 0
        while index < count:
            name, offset, data = writes[index]
            size = data.nbytes if isinstance(data, memoryview) else len(data)
            mapped = self._regions.get(name)
            if mapped is None or offset < 0 or offset + size > mapped.size:
                raise _refusal(name, mapped, offset)
            index += 1
            if index == count or writes[index][0] != name or writes[index][1] != offset + size:  # one buffer
                if deferred is not None and size >= OFF_LOOP_BYTES:
                    deferred.append((mapped.fd, mapped.start + offset, [data], size, name))
                    continue
                try:
                    if os.pwrite(mapped.fd, data, mapped.start + offset) == size:
                        continue
                except OSError:
                    pass
                _write_run(mapped.fd, mapped.start + offset, [data], size, name)  # short, or an error: again
                continue
            buffers = [data]
            end = offset + size
            while index < count and len(buffers) < MAX_BUFFERS and writes[index][0] == name and writes[index][1] == end:
                following = writes[index][2]
                end += following.nbytes if isinstance(following, memoryview) else len(following)
                if end > mapped.size:
                    raise _refusal(name, mapped, offset)
                buffers.append(following)
                index += 1
            if deferred is not None and end - offset >= OFF_LOOP_BYTES:
                deferred.append((mapped.fd, mapped.start + offset, buffers, end - offset, name))
                continue
            _write_run(mapped.fd, mapped.start + offset, buffers, end - offset, name)


# An input's read: the descriptor and position `locate` gave, the array to fill, and the region's name.
Read = Tuple[int, int, np.ndarray, str]
# An output's write: the region's name, the offset in it, and the bytes (C-contiguous).
Write = Tuple[str, int, Buffer]
# A run of writes into one file: its descriptor, the position, the buffers, their size together, the region's name.
WriteRun = Tuple[int, int, List[Buffer], int, str]


def read_runs(reads: Sequence[Read]) -> None:
    """`SystemSharedMemory.read_all(reads)`, for a worker thread."""
    SystemSharedMemory.read_all(reads)


def write_runs(runs: Sequence[WriteRun]) -> None:
    """Carry out each of `runs` (`write_all`'s deferred ones), for a worker thread."""
    for fd, position, buffers, size, name in runs:
        _write_run(fd, position, buffers, size, name)


def _read_run(fd: int, position: int, buffers: List[np.ndarray], size: int, name: str) -> None:
    """Fill `buffers` (C-contiguous, `size` bytes together) from `position` of the file `fd`."""
    try:
        # The arrays themselves, buffers: no memoryview to make (numpy's stubs do not say they are).
        done = os.preadv(fd, buffers, position) if size else 0  # type: ignore[arg-type]
        if done == size:
            return
        # Linux's cap on one call, or the file ends before the region does: the rest, piece by piece.
        for view in _pieces(buffers, done):
            while view:
                count = os.preadv(fd, (view[:MAX_CALL_BYTES],), position + done)
                if not count:
                    raise _shrunk(name)
                done += count
                view = view[count:]
    except OSError as error:
        raise _unreadable(name, error) from None


def _write_run(fd: int, position: int, buffers: List[Buffer], size: int, name: str) -> None:
    """Copy `buffers` (`size` bytes together) to `position` of the file `fd`."""
    try:
        if not size:
            return
        done = os.pwrite(fd, buffers[0], position) if len(buffers) == 1 else os.pwritev(fd, buffers, position)
        if done == size:
            return
        for view in _pieces(buffers, done):  # Linux's cap on one call
            while view:
                count = os.pwrite(fd, view[:MAX_CALL_BYTES], position + done)
                if not count:
                    raise _unreadable(name, OSError(f"no byte of {size - done} written"))
                done += count
                view = view[count:]
    except OSError as error:
        raise _unreadable(name, error) from None


def _pieces(buffers: Sequence[Any], done: int) -> List[memoryview]:
    """Byte views of what `buffers` hold past their first `done` bytes."""
    left: List[memoryview] = []
    for buffer in buffers:
        view = memoryview(buffer).cast("B")
        if done >= view.nbytes:
            done -= view.nbytes
            continue
        left.append(view[done:])
        done = 0
    return left


def _refusal(name: str, mapped: Optional[_Mapped], offset: int) -> InferenceError:
    """Triton's error for an access at `offset` to a region not registered (`mapped` None), or outside it.

    tritonserver 2.51 checks the offset against the region, then `offset + byte_size - 1` against its last byte,
    unsigned: 0 bytes at offset 0 (a tensor without `shared_memory_byte_size`) is refused there too.
    """
    if mapped is None:
        return InferenceError.not_found(f"Unable to find shared memory region: '{name}'")
    if not 0 <= offset < mapped.size:
        return InferenceError.invalid(f"Invalid offset for shared memory region: '{name}'")
    return InferenceError.invalid(f"Invalid offset + byte size for shared memory region: '{name}'")


def _shrunk(name: str) -> InferenceError:
    """The error for a region whose segment's file no longer holds it."""
    return InferenceError.invalid(
        f"shared memory region '{name}' is smaller than when it was registered: unregister it"
    )


def _unreadable(name: str, error: OSError) -> InferenceError:
    """The error for a region whose segment refused a read or a write."""
    return InferenceError.invalid(f"shared memory region '{name}' cannot be accessed: {error.strerror or error}")
