"""JSON read and written a piece at a time (protocol/json_pieces.py), and long JSON lists made arrays in pieces.

Each is checked against the whole-document reading it stands for (json_text, numeric_array) on random documents,
valid and broken, with the pieces made tiny so that every document is cut: the same values, the same text, the
same refusals. Then, at full size, that no single call of orjson or numpy is given more than a piece: the calls
are what holds the GIL, and the loop waits for the GIL (no timing).
"""

from __future__ import annotations

import json
import random
from typing import Any, Callable, Iterator, List, Tuple

import numpy as np
import orjson
import pytest

from pytriton.core.errors import InferenceError
from pytriton.protocol import json_pieces, json_text, tensors


@pytest.fixture
def tiny_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of a few values and arrays cut from 16 bytes: every random document below is cut."""
    monkeypatch.setattr(json_pieces, "CUT_BYTES", 16)
    monkeypatch.setattr(json_pieces, "_RUN_BYTES", 8)
    monkeypatch.setattr(json_pieces, "_WINDOW", 7)
    monkeypatch.setattr(json_pieces, "PIECE_VALUES", 4)
    monkeypatch.setattr(tensors, "_PIECE_VALUES", 8)


def _outcome(read: Callable[[Any], Any], data: Any) -> Tuple[str, str]:
    try:
        return "ok", repr(read(data))
    except json_text.JsonError as error:
        return "refused", str(error)


def _scalar(rng: random.Random) -> Any:
    return rng.choice([rng.random() * 1e3, rng.randint(-(10**6), 10**6), 's,"]x', True, None, "a\\b", 1e300, "é"])


def _value(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.random()
    if depth > 3 or pick < 0.4:
        return _scalar(rng)
    if pick < 0.7:
        return [_value(rng, depth + 1) if rng.random() < 0.2 else _scalar(rng) for _ in range(rng.randint(0, 30))]
    return {f"k{index}": _value(rng, depth + 1) for index in range(rng.randint(0, 4))}


_NOISE = b' ,[]{}":0123456789.-eEtrufalsn\\\x00NaIfiy\t\n'
_INSERTS = [b"NaN", b"Infinity", b"-Inf", b",", b"]", b"[", b"\xef\xbb\xbf", b"\x00x", b"\xff"]


def _broken(rng: random.Random, text: bytes) -> bytes:
    """`text` with a few bytes taken out or put in."""
    out = bytearray(text)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(out) + 1)
        pick = rng.random()
        if pick < 0.4 and out:
            del out[min(at, len(out) - 1)]
        elif pick < 0.8:
            out[at:at] = bytes([rng.choice(_NOISE)])
        else:
            out[at:at] = rng.choice(_INSERTS)
    return bytes(out)


def _documents(count: int, seed: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    for _ in range(count):
        separators = rng.choice([(",", ":"), (", ", ": ")])
        text = json.dumps(_value(rng), separators=separators, ensure_ascii=rng.random() < 0.5).encode()
        yield _broken(rng, text) if rng.random() < 0.5 else text


@pytest.mark.usefixtures("tiny_pieces")
@pytest.mark.parametrize("seed", range(4))
def test_loads_reads_and_refuses_as_the_whole_document_is_read(seed: int) -> None:
    cut = 0
    for text in _documents(3000, seed):
        for form in (text, memoryview(bytearray(text))):
            assert _outcome(json_pieces.loads, form) == _outcome(json_text.loads, form), text
        try:
            cut += bool(json_pieces._cuts(text))
        except json_pieces._NotCut:
            pass
    assert cut > 500  # the cutting was what was compared


def _array(rng: random.Random) -> Any:
    count = rng.randint(0, 12)
    kind = rng.choice(["f8", "f4", "i4", "u1", "b", "strings", "mixed", "2d"])
    if kind == "strings":
        return [rng.choice(["a", "é", '"x"', ""]) for _ in range(count)]
    if kind == "mixed":
        return [rng.choice(["a", None, 1.5, float("nan")]) for _ in range(count)]
    if kind == "b":
        return np.array([rng.random() < 0.5 for _ in range(count)])
    if kind == "2d":
        return np.array([rng.random() for _ in range(count * 2)]).reshape(2, count)
    values = [rng.choice([rng.random(), -3.0, float("nan"), float("inf"), -float("inf"), 1e300]) for _ in range(count)]
    with np.errstate(all="ignore"):
        return np.array(values).astype(kind)


@pytest.mark.usefixtures("tiny_pieces")
def test_dumps_writes_what_the_whole_document_is_written_as() -> None:
    rng = random.Random(7)
    for _ in range(5000):
        outputs = [{"name": f"o{index}", "data": _array(rng)} for index in range(rng.randint(0, 3))]
        document: Any = {"id": "x", "model_name": "m", "outputs": outputs}
        if rng.random() < 0.2:
            document["parameters"] = {"p": rng.choice([None, 1.5, float("nan"), "s"])}
        assert bytes(json_pieces.dumps(document)) == json_text.dumps(document)


def _numbers(rng: random.Random) -> Tuple[Any, List[int]]:
    makers: List[Callable[[], Any]] = [
        lambda: rng.random() * 10,
        lambda: rng.randint(-300, 300),
        lambda: 2**63,
        lambda: -(2**63),
        lambda: 2**64 - 1,
        lambda: 1e39,
        lambda: True,
        lambda: None,
        lambda: "2",
        lambda: 16777217,
        lambda: 2**53 + 1,
    ]
    weights = [rng.random() for _ in makers]

    def value() -> Any:
        return rng.choices(makers, weights)[0]() if rng.random() < 0.3 else rng.choice(makers[:2])()

    count = rng.randint(0, 40)
    pick = rng.random()
    if pick < 0.5:
        return [value() for _ in range(count)], [count]
    if pick < 0.8:
        width = rng.randint(1, 4)
        rows = [[value() for _ in range(width)] for _ in range(count)]
        if rows and rng.random() < 0.1:
            rows[rng.randrange(count)].append(1.0)  # rows of unequal lengths
        return rows, [count, width]
    return [[value() for _ in range(count)]], [1, count]


def _made(data: Any, datatype: str, shape: List[int], in_pieces: bool) -> Tuple[str, ...]:
    try:
        read = tensors.array_from_json_in_pieces if in_pieces else tensors.array_from_json
        array = read(data, datatype, shape, "in", "m")
    except InferenceError as error:
        return ("refused", error.message)
    return ("ok", array.dtype.str, str(array.shape), array.tobytes().hex())


def test_long_lists_are_made_arrays_as_the_whole_list_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensors, "_PIECE_VALUES", 8)
    rng = random.Random(3)
    pieced = 0
    for _ in range(6000):
        data, shape = _numbers(rng)
        for datatype in ("FP32", "FP64", "INT8", "INT32", "INT64", "UINT8", "UINT64"):
            whole = _made(data, datatype, shape, in_pieces=False)
            assert _made(data, datatype, shape, in_pieces=True) == whole, (data, datatype)
            pieced += whole[0] == "ok"
    assert pieced > 3000  # (lists of fewer than 8 values are made whole)


def _large_request(count: int) -> bytes:
    values = b",".join(b"%d.25" % (index % 1000) for index in range(count))
    return b'{"inputs":[{"name":"in","datatype":"FP32","shape":[%d],"data":[%s]}]}' % (count, values)


def test_no_call_of_orjson_reads_or_writes_more_than_a_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _large_request(1 << 20)  # 7 MB
    sizes: List[int] = []
    loads, dumps = orjson.loads, orjson.dumps

    def counted_loads(data: Any) -> Any:
        sizes.append(len(data))
        return loads(data)

    def counted_dumps(value: Any, **options: Any) -> bytes:
        written = dumps(value, **options)
        sizes.append(len(written))
        return written

    monkeypatch.setattr(orjson, "loads", counted_loads)
    monkeypatch.setattr(orjson, "dumps", counted_dumps)
    document = json_pieces.loads(text)
    assert len(sizes) > 100 and max(sizes) < 64 * 1024  # never the whole document at once (the fallback's)
    assert document == loads(text)
    sizes.clear()
    written = json_pieces.dumps({"outputs": [{"data": np.arange(1 << 20, dtype=np.float64)}]})
    assert len(sizes) > 100 and max(sizes) < 64 * 1024
    assert written == dumps({"outputs": [{"data": np.arange(1 << 20, dtype=np.float64)}]}, option=json_text.OPTIONS)


def test_no_call_of_numpy_makes_more_than_a_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    values = [index * 0.5 for index in range(1 << 20)]
    lengths: List[int] = []
    array = np.array

    def counted(data: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        lengths.append(len(data) if isinstance(data, list) else 0)
        return array(data, *args, **kwargs)

    monkeypatch.setattr(tensors.np, "array", counted)
    made = tensors.array_from_json_in_pieces(values, "FP32", [1 << 20], "in", "m")
    assert len(lengths) > 16 and max(lengths) <= tensors._PIECE_VALUES
    assert (made == np.arange(1 << 20, dtype=np.float32) * 0.5).all()


def test_release_empties_a_list_a_piece_at_a_time() -> None:
    values = [[float(index) for index in range(100_000)]]  # a batch of one, as [[...]]
    inner = values[0]
    json_pieces.release(values)
    assert inner == [] and len(values) == 1


def _vm_flags(address: int) -> List[str]:
    """The kernel's flags of the mapping of this process that holds `address` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(bound, 16) for bound in head.split("-"))
                inside = start <= address < end
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_large_text_is_put_together_in_memory_advised_for_huge_pages() -> None:
    """The text is freed on the loop once written: its munmap of 4 KiB pages held the loop 85-440 ms for 1.2 GB.

    numpy advises the kernel to back a buffer of 4 MiB or more with huge pages (madvise, flag `hg`); a bytearray's
    memory is not advised.
    """
    document = {"outputs": [{"data": np.arange(1 << 20, dtype=np.float64)}]}
    written = json_pieces.dumps(document)
    assert len(written) > 8 * 2**20
    assert written == orjson.dumps(document, option=json_text.OPTIONS)
    address = np.frombuffer(written, np.uint8).ctypes.data
    assert "hg" in _vm_flags(address + len(written) // 2)
