"""Triton's system shared-memory extension in messages: registration, status, and tensors held in regions.

Both transports use it: a tensor whose parameters name `shared_memory_region` (with `shared_memory_byte_size`
and an optional `shared_memory_offset`) is read from, or written into, a region of `SystemSharedMemory`.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from tritonclient.grpc import service_pb2

from pytriton.core.errors import InferenceError
from pytriton.core.request import OutputTensor
from pytriton.core.shared_memory.system import Read, SystemRegion, SystemSharedMemory, Write
from pytriton.core.tensors.datatypes import ELEMENT_SIZE, numpy_dtype
from pytriton.core.tensors.raw_tensors import array_from_raw, raw_from_array

REGION, OFFSET, BYTE_SIZE = "shared_memory_region", "shared_memory_offset", "shared_memory_byte_size"


class TensorRegion:
    """Where a tensor lies in shared memory: a region, an offset in it and a size."""

    __slots__ = ("byte_size", "offset", "region")

    def __init__(self, region: str, offset: int, byte_size: int) -> None:
        """Point at `byte_size` bytes from `offset` of the region named `region`."""
        self.region = region
        self.offset = offset
        self.byte_size = byte_size


def status_document(regions: Sequence[SystemRegion]) -> List[Dict[str, Any]]:
    """GET .../status: one object per region."""
    return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regions]


def status_message(regions: Sequence[SystemRegion]) -> Any:
    """SystemSharedMemoryStatus's response: regions by name."""
    response = service_pb2.SystemSharedMemoryStatusResponse()
    for region in regions:
        status = response.regions[region.name]
        status.name, status.key, status.offset, status.byte_size = (
            region.name,
            region.key,
            region.offset,
            region.byte_size,
        )
    return response


def tensor_region(parameters: Optional[Mapping[str, Any]], kind: str, name: str) -> Optional[TensorRegion]:
    """The region the parameters (plain values) of a tensor (`kind` "input" or "output") name, or None when none.

    Read as Triton's HTTP frontend reads them (CheckSharedMemoryData): the region a string (an empty one is looked
    up, and not found), then the offset and the byte size unsigned integers, in TritonJson's words (its 500 a 400
    here). A missing byte size is 0, which the region's check refuses at offset 0 as Triton 2.51 does. An offset
    or byte size without a region is read too (and refused when it is no unsigned integer), as Triton reads it.
    """
    if not parameters or (REGION not in parameters and OFFSET not in parameters and BYTE_SIZE not in parameters):
        return None
    named = REGION in parameters
    region = parameters.get(REGION)
    if named and not isinstance(region, str):
        raise InferenceError.invalid(f"Unable to parse '{REGION}': attempt to access JSON non-string as string")
    offset = parameters.get(OFFSET, 0)
    if type(offset) is not int or offset < 0:
        unsigned(OFFSET, offset)
    byte_size = parameters.get(BYTE_SIZE, 0)
    if type(byte_size) is not int or byte_size < 0:
        unsigned(BYTE_SIZE, byte_size)
    if not isinstance(region, str):  # no region: one that is no string was refused above
        return None
    return TensorRegion(region, offset, byte_size)


def input_array(
    memory: SystemSharedMemory,
    where: TensorRegion,
    datatype: str,
    shape: Sequence[int],
    name: str,
    model: str,
    reads: List[Read],
) -> np.ndarray:
    """An input's array, in its region (its size must be the tensor's, as Triton checks).

    A BYTES tensor is read at once (its data tells its size); any other is located in its region and added to
    `reads`, for `memory.read_all` to fill once the request's inputs are all known.
    """
    fixed = _FIXED_SIZE.get(datatype)
    if fixed is None:
        data = memory.read(where.region, where.offset, where.byte_size)
        return array_from_raw(data.data, datatype, shape, name, model)
    expected = fixed[0] * math.prod(shape)
    if expected != where.byte_size:
        memory.check(where.region, where.offset, where.byte_size)  # an unknown region or range first, as Triton
        raise InferenceError.invalid_input(
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, "
            f"got {where.byte_size}"
        )
    fd, position = memory.locate(where.region, where.offset, expected)
    array = np.empty(shape, fixed[1])
    reads.append((fd, position, array, where.region))
    return array


# Element size and numpy dtype of each fixed-size datatype.
_FIXED_SIZE: Dict[str, Tuple[int, np.dtype]] = {name: (size, numpy_dtype(name)) for name, size in ELEMENT_SIZE.items()}


class Located:
    """Where a request plan's inputs lie, as one request found them: valid while its registry is at `generation`.

    `inputs` has, for each input of the plan, the descriptor, file position and numpy dtype of the input's bytes;
    None for an input not in shared memory, or in it as BYTES (read at once: its data tells its size). A request
    that finds the registry unchanged since needs neither to look those regions up nor to check their ranges (nor
    the plan's output regions'): none can have changed.
    """

    __slots__ = ("generation", "inputs")

    def __init__(self, generation: int, inputs: List[Optional[Tuple[int, int, np.dtype]]]) -> None:
        """Keep the registry's generation and the inputs' places."""
        self.generation = generation
        self.inputs = inputs


def locate_plan(
    memory: SystemSharedMemory, inputs: Sequence[Tuple[str, Optional[TensorRegion]]], reads: Sequence[Read]
) -> Located:
    """What a request located of its `inputs` (datatype, region) in `reads`, once every check of it passed."""
    located: List[Optional[Tuple[int, int, np.dtype]]] = []
    index = 0
    for datatype, region in inputs:
        if region is None or datatype not in _FIXED_SIZE:
            located.append(None)
            continue
        fd, position, array, _ = reads[index]
        located.append((fd, position, array.dtype))
        index += 1
    return Located(memory.generation, located)


def still_located(located: Optional[Located], memory: Optional[SystemSharedMemory]) -> Optional[Located]:
    """A plan's `Located` while the registry it was found in is unchanged (same generation), else None."""
    if located is None or memory is None or located.generation != memory.generation:
        return None
    return located


def region_input(
    located: Optional[Located],
    index: int,
    memory: SystemSharedMemory,
    where: TensorRegion,
    datatype: str,
    shape: Sequence[int],
    name: str,
    model: str,
    reads: List[Read],
) -> np.ndarray:
    """`input_array`, or the place an earlier request of the plan found input `index` at (`located`).

    A place from `still_located` needs no look-up and no range check: the registry has not changed since.
    """
    place = located.inputs[index] if located is not None else None
    if place is None:
        return input_array(memory, where, datatype, shape, name, model, reads)
    array = np.empty(shape, place[2])
    reads.append((place[0], place[1], array, where.region))
    return array


def output_write(where: TensorRegion, output: OutputTensor) -> Write:
    """An output's write into its region (which must hold its raw bytes), for `SystemSharedMemory.write_all`."""
    raw = raw_from_array(output.array, output.datatype)
    size = raw.nbytes if isinstance(raw, memoryview) else len(raw)
    if size > where.byte_size:
        raise InferenceError.invalid(
            f"shared memory size specified with the request for output '{output.name}' ({where.byte_size} bytes) "
            f"should be at least {size} bytes to hold the results"
        )
    return where.region, where.offset, raw


def unsigned(field: str, value: Any) -> int:
    """A parameter read as TritonJson's `AsUInt` reads it (an integer, not a bool, from 0 to 2**64 - 1)."""
    if type(value) is not int or not 0 <= value < 2**64:
        raise InferenceError.invalid(
            f"Unable to parse '{field}': attempt to access JSON non-unsigned-integer as unsigned-integer"
        )
    return value
