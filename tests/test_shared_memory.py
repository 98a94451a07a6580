"""Shared-memory segments: anonymous ones for process instances, named ones for Triton's shm extension."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Iterator

import numpy as np
import pytest
from tritonclient.utils import shared_memory as client_shm

from pytriton.ipc.segments import SharedMemoryUnavailable, SharedSegment


@pytest.fixture
def named_region() -> Iterator[str]:
    """A POSIX segment of 64 KiB created by tritonclient, as a Triton client creates it."""
    key = f"/pytriton-test-{os.getpid()}"
    handle = client_shm.create_shared_memory_region("test", key, 65536)
    try:
        yield key
    finally:
        client_shm.destroy_shared_memory_region(handle)


def test_an_anonymous_segment_is_shared_through_its_descriptor() -> None:
    with SharedSegment.create(1 << 20) as segment:
        mine = np.frombuffer(segment.view(4096, 400), dtype=np.float32)
        mine[:] = 3.5
        with SharedSegment.attach(os.dup(segment.fileno()), 1 << 20) as other:
            assert np.frombuffer(other.view(4096, 400), dtype=np.float32).tolist() == [3.5] * 100


def test_an_anonymous_segment_is_visible_to_a_child_process() -> None:
    with SharedSegment.create(4096) as segment:
        segment.view(0, 5)[:] = b"hello"
        code = "import os, sys; print(os.pread(int(sys.argv[1]), 5, 0).decode())"
        fd = segment.fileno()
        out = subprocess.run(
            [sys.executable, "-c", code, str(fd)], pass_fds=[fd], capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == "hello"


def test_views_outlive_a_closed_segment() -> None:
    segment = SharedSegment.create(4096)
    array = np.frombuffer(segment.view(0, 16), dtype=np.int32)
    array[:] = [1, 2, 3, 4]
    segment.close()
    assert array.tolist() == [1, 2, 3, 4]


def test_an_anonymous_segment_cannot_be_shrunk_by_a_peer() -> None:
    if not sys.platform.startswith("linux"):
        pytest.fail("memfd seals are Linux's; this test runs on Linux")
    with SharedSegment.create(8192) as segment, pytest.raises(PermissionError):
        os.ftruncate(segment.fileno(), 10)


def test_no_name_is_left_behind() -> None:
    # Asked of each segment's descriptor, not of /dev/shm's listing: the suite's other workers (system shared
    # memory tests) add and remove names there at any time.
    segments = [SharedSegment.create(4096) for _ in range(4)]
    try:
        for segment in segments:
            target = os.readlink(f"/proc/self/fd/{segment.fileno()}")
            assert target.endswith(" (deleted)"), f"segment {target!r} has a name"  # a memfd's or an unlinked one
    finally:
        for segment in segments:
            segment.close()


def test_more_than_the_machine_has_is_refused_not_fatal() -> None:
    with pytest.raises(SharedMemoryUnavailable):
        SharedSegment.create(1 << 50)


def test_a_process_out_of_descriptors_gets_shared_memory_unavailable() -> None:
    """EMFILE from memfd_create (or shm_open) is SharedMemoryUnavailable, which callers fall back on."""
    code = textwrap.dedent(
        """
        import errno, os, resource
        from pytriton.ipc.segments import SharedMemoryUnavailable, SharedSegment

        resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        held = []
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as error:
            assert error.errno == errno.EMFILE
        try:
            SharedSegment.create(4096)
        except SharedMemoryUnavailable as error:
            print("unavailable", errno.errorcode.get(error.errno))
        os.close(held.pop())
        os.close(held.pop())  # one for the memfd, one for mmap's own duplicate
        with SharedSegment.create(4096):
            print("created once a descriptor is free")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.splitlines() == ["unavailable EMFILE", "created once a descriptor is free"], result.stderr


def test_views_are_bounds_checked() -> None:
    with SharedSegment.create(4096) as segment:
        for offset, size in ((-1, 1), (0, 4097), (4000, 97), (4096, 1)):
            with pytest.raises(ValueError):
                segment.view(offset, size)
        assert len(segment.view(4096, 0)) == 0


def test_a_named_region_is_mapped_at_its_offset(named_region: str) -> None:
    with SharedSegment.open_named(named_region, 5000, 1000) as region:
        region.view(0, 5)[:] = b"abcde"
    with SharedSegment.open_named(named_region, 4998, 10) as region:
        assert bytes(region.view(2, 5)) == b"abcde"


@pytest.mark.parametrize(("key", "offset", "size"), [("/no-such-region", 0, 10), ("", 0, 10), ("/a/b", 0, 10)])
def test_a_bad_key_is_refused(key: str, offset: int, size: int) -> None:
    with pytest.raises(SharedMemoryUnavailable):
        SharedSegment.open_named(key, offset, size)


@pytest.mark.parametrize(("offset", "size"), [(65000, 1000), (-1, 10), (0, 0), (0, 1 << 40)])
def test_a_range_outside_the_region_is_refused(named_region: str, offset: int, size: int) -> None:
    with pytest.raises(SharedMemoryUnavailable):
        SharedSegment.open_named(named_region, offset, size)


def test_a_region_shrunk_under_its_mapping_is_noticed(named_region: str) -> None:
    with SharedSegment.open_named(named_region, 0, 65536) as region:
        region.check_size()
        fd = os.open("/dev/shm" + named_region, os.O_RDWR)
        try:
            os.ftruncate(fd, 100)
        finally:
            os.close(fd)
        with pytest.raises(SharedMemoryUnavailable, match="smaller"):
            region.check_size()


def test_an_array_over_a_closed_segment_keeps_its_memory() -> None:
    """numpy keeps the mmap object, not the buffer export, so closing must never unmap under an array."""
    segment = SharedSegment.create(1 << 20)
    whole = np.ndarray((1 << 20,), np.uint8, segment.view())
    part = whole[:16].view(np.float32)
    part[:] = 7
    del whole
    segment.close()
    replacement = SharedSegment.create(1 << 20)  # would take the freed addresses if they had been unmapped
    np.ndarray((1 << 20,), np.uint8, replacement.view())[:] = 0
    assert part.tolist() == [7.0] * 4
    replacement.close()
    with pytest.raises(ValueError, match="closed"):
        segment.view()
