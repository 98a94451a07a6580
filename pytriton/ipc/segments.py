"""Memory that two processes map at once: the arenas of process instances and Triton's shared-memory regions.

Anonymous segments (`SharedSegment.create`) are memfd files on Linux. They live only as long as a
descriptor or a mapping of them does, so nothing is left behind after a crash or a SIGKILL, and they
are not bounded by the size of /dev/shm (64 MiB in a default Docker container), only by memory.
Where memfd is missing (macOS) they are POSIX segments unlinked as soon as they exist. Their pages
are reserved when they are created (posix_fallocate): a segment that cannot get its memory is not
created (`SharedMemoryUnavailable`), where a sparse one would kill the process with SIGBUS on the first
touch of a page the system cannot give. Their size is sealed: a peer cannot shrink them under us.

Named segments (`SharedSegment.open_named`) are the POSIX segments that clients create (Triton's system
shared-memory extension, tritonclient's `shared_memory` module), mapped by key. Their file is checked
before each use (`check_size`), since a file shrunk under a mapping turns an access into SIGBUS.
"""

from __future__ import annotations

import mmap
import os
import secrets
import sys
from typing import Optional

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

try:
    import _posixshmem
except ImportError:  # pragma: no cover - a Python built without POSIX shared memory
    _posixshmem = None

_MEMFD = sys.platform.startswith("linux") and hasattr(os, "memfd_create")
_SEALS = (
    getattr(fcntl, "F_SEAL_SHRINK", 0) | getattr(fcntl, "F_SEAL_GROW", 0) | getattr(fcntl, "F_SEAL_SEAL", 0)
    if fcntl is not None
    else 0
)


class SharedMemoryUnavailable(OSError):
    """A segment could not be created, opened or mapped: the caller falls back or refuses, never crashes."""


class SegmentTooSmall(SharedMemoryUnavailable):
    """The segment's file does not hold the bytes asked for (its range lies past the file's end)."""


class SharedSegment:
    """One mapped shared-memory file: its descriptor (to pass to another process) and bounds-checked views.

    Views handed out (`view`) keep the mapping alive: `close` releases the descriptor at once, and the
    memory once the last view of it is gone.
    """

    def __init__(self, fd: int, size: int, *, offset: int = 0, name: Optional[str] = None) -> None:
        """Map `size` bytes of the file `fd` from `offset`, taking ownership of the descriptor.

        Raises:
            SharedMemoryUnavailable: the file is smaller than `offset + size` (SegmentTooSmall), or cannot be mapped.
        """
        self._fd = fd
        self.size = size
        self.offset = offset
        self.name = name
        self._map: Optional[mmap.mmap] = None
        try:
            self.check_size()  # first: a range past the file's end is refused as that, whatever its size
            if size <= 0:
                raise SharedMemoryUnavailable(f"a shared-memory segment needs a positive size, got {size}")
            start = offset - offset % mmap.ALLOCATIONGRANULARITY  # mmap offsets must be aligned
            self._map = mmap.mmap(fd, size + offset - start, mmap.MAP_SHARED, offset=start)
            self._view = memoryview(self._map)[offset - start :]
        except OSError as error:
            os.close(fd)
            self._fd = -1
            if isinstance(error, SharedMemoryUnavailable):
                raise
            raise SharedMemoryUnavailable(error.errno, f"cannot map shared memory: {error.strerror}") from None

    @classmethod
    def create(cls, size: int, lazy: bool = False) -> SharedSegment:
        """A new anonymous segment of `size` bytes with its pages reserved and its size sealed.

        `lazy`: its pages are taken as they are first written, as a heap buffer's are, where a write can never fault
        for want of room (a memfd: no size limit but the memory's); elsewhere they are reserved all the same. A
        buffer whose size a client declares must be lazy: reserving (and zeroing) 2 GiB for a gRPC message whose
        length prefix lies took 0.5 s of the loop and 2 GiB of the machine's memory per connection.

        Raises:
            SharedMemoryUnavailable: the system cannot give that much shared memory now.
        """
        available = _available_memory()
        if available is not None and size > available // 2:
            # Reserving memfd pages past what the system has calls the OOM killer rather than failing.
            raise SharedMemoryUnavailable(f"{size} bytes of shared memory is over half of the {available} available")
        try:
            fd = _anonymous_file()
        except SharedMemoryUnavailable:
            raise
        except OSError as error:  # EMFILE, ENOMEM, a seccomp filter, no /dev/shm: never a plain OSError
            raise SharedMemoryUnavailable(error.errno, f"cannot create shared memory: {error.strerror}") from None
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate") and not (lazy and _MEMFD):
                os.posix_fallocate(fd, 0, size)
            if _MEMFD and _SEALS:
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        except OSError as error:
            os.close(fd)
            raise SharedMemoryUnavailable(error.errno, f"cannot reserve {size} bytes of shared memory") from None
        return cls(fd, size)

    @classmethod
    def attach(cls, fd: int, size: int) -> SharedSegment:
        """Map a segment whose descriptor another process sent (the descriptor now belongs to the segment)."""
        os.set_inheritable(fd, False)
        return cls(fd, size)

    @classmethod
    def open_named(cls, key: str, offset: int, size: int) -> SharedSegment:
        """Map `size` bytes from `offset` of the existing POSIX segment `key` (e.g. "/input0").

        Raises:
            SharedMemoryUnavailable: no such segment, no permission, or it is smaller than `offset + size`.
        """
        if not key or "/" in key[1:] or "\0" in key:
            raise SharedMemoryUnavailable(f"invalid shared-memory key '{key}'")
        if offset < 0:
            raise SharedMemoryUnavailable(f"invalid offset {offset}")
        name = key if key.startswith("/") else "/" + key
        try:
            if _posixshmem is not None:
                fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
            else:  # pragma: no cover - Linux keeps POSIX segments in /dev/shm
                fd = os.open("/dev/shm" + name, os.O_RDWR | os.O_CLOEXEC)
        except OSError as error:
            raise SharedMemoryUnavailable(error.errno, f"unable to open shared memory region '{key}'") from None
        return cls(fd, size, offset=offset, name=key)

    def fileno(self) -> int:
        """The descriptor, to send to another process."""
        return self._fd

    def check_size(self) -> None:
        """Raise SharedMemoryUnavailable unless the file still holds the mapped bytes."""
        if self._fd < 0:
            raise SharedMemoryUnavailable("the shared-memory segment is closed")
        if os.fstat(self._fd).st_size < self.offset + self.size:
            raise SegmentTooSmall(
                f"shared memory '{self.name or 'anonymous'}' is smaller than {self.offset + self.size} bytes"
            )

    def view(self, offset: int = 0, size: Optional[int] = None) -> memoryview:
        """The bytes [offset, offset + size) of the segment (to its end without `size`).

        Raises:
            ValueError: the range is not inside the segment.
        """
        if self._map is None:
            raise ValueError("the shared-memory segment is closed")
        if size is None:
            size = self.size - offset
        if offset < 0 or size < 0 or offset + size > self.size:
            raise ValueError(f"range [{offset}, {offset + size}) is outside the segment of {self.size} bytes")
        return self._view[offset : offset + size]

    def close(self) -> None:
        """Close the descriptor and let go of the mapping: it is unmapped when nothing views it any more.

        Never unmapped here: a numpy array made from a view keeps a reference to the mmap object but not
        the buffer export that would make `mmap.close()` refuse, so closing it would leave such an array
        pointing at unmapped (or, once reused, other) memory.
        """
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._map = None
        self._view = memoryview(b"")

    def __enter__(self) -> SharedSegment:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __del__(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)


def _available_memory() -> Optional[int]:
    """Bytes of memory this process could still get (the smaller of MemAvailable and the cgroup's room), if known."""
    found = []
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except OSError:
        pass
    try:
        with open("/sys/fs/cgroup/memory.max", "rb") as limit, open("/sys/fs/cgroup/memory.current", "rb") as used:
            maximum = limit.read().strip()
            if maximum != b"max":
                found.append(int(maximum) - int(used.read()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def _anonymous_file() -> int:
    """A new, empty shared-memory file that no name leads to."""
    if _MEMFD:
        flags = os.MFD_CLOEXEC | (getattr(os, "MFD_ALLOW_SEALING", 0) if _SEALS else 0)
        return os.memfd_create("pytriton", flags)
    if _posixshmem is None:  # pragma: no cover
        raise SharedMemoryUnavailable("this Python has no POSIX shared memory")
    name = f"/pytriton-{os.getpid()}-{secrets.token_hex(6)}"
    fd: int = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    _posixshmem.shm_unlink(name)
    os.set_inheritable(fd, False)
    return fd
