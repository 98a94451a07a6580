"""HTTP/REST infer messages: JSON with the binary tensor extension, both directions."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np

from pytriton.core.classification import top_classes
from pytriton.core.errors import InferenceError
from pytriton.core.hash_map_order import hash_map_order, visited_before
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.shared_memory.system import Read, SystemSharedMemory, Write, WriteRun
from pytriton.core.spec import EmptyBatchError, ModelSpec
from pytriton.core.tensors.datatypes import BYTES, ELEMENT_SIZE, is_known_datatype, numpy_dtype
from pytriton.core.tensors.raw_tensors import (
    array_from_raw,
    deserialize_bytes_tensor,
    element_count,
    raw_from_array,
    string_count,
)
from pytriton.protocol import json_pieces, json_text
from pytriton.protocol.codec_place import (
    ANYWHERE,
    OFF_LOOP_JSON_BYTES,
    OFF_LOOP_STRING_BYTES,
    OFF_LOOP_VALUES,
    ON_LOOP,
    OffLoop,
)
from pytriton.protocol.parameters import ENSEMBLE_RESPONSE_PARAMETERS, split_parameters
from pytriton.protocol.system_memory_codec import (
    REGION,
    Located,
    TensorRegion,
    input_array,
    locate_plan,
    output_write,
    region_input,
    still_located,
    tensor_region,
)
from pytriton.protocol.tensors import OutOfRange, array_from_json, array_from_json_in_pieces, json_from_array

Body = Union[bytes, bytearray, memoryview]  # memoryview: a body the HTTP server read into its final buffer


class OutputFormat:
    """Which outputs a request wants as binary data (the rest go as JSON), in shared memory, or as top classes."""

    __slots__ = ("binary_by_name", "binary_default", "classes", "regions")

    def __init__(
        self,
        binary_by_name: Dict[str, bool],
        binary_default: bool,
        regions: Optional[Dict[str, TensorRegion]] = None,
        classes: Optional[Dict[str, int]] = None,
    ) -> None:
        """Create the format from per-output flags, the request-wide default, the outputs' regions and class counts."""
        self.binary_by_name = binary_by_name
        self.binary_default = binary_default
        self.regions = regions
        self.classes = classes


def decode_infer_request(
    spec: ModelSpec,
    body: Body,
    header_length: Optional[int],
    forwarded_headers: Optional[Mapping[str, str]] = None,
    memory: Optional[SystemSharedMemory] = None,
    deferred: Optional[List[Read]] = None,
    place: int = ANYWHERE,
) -> Tuple[InferenceRequest, OutputFormat]:
    """Decode an infer request body (JSON, optionally followed by binary tensors); also say which outputs go binary.

    Tensors in shared memory are read from, or checked against, the regions of `memory`; with `deferred`, large
    reads are added there instead, for the caller to carry out (`off_loop.read_off_loop`) before using the request.
    `place`: where this runs (ON_LOOP: a long decode raises OffLoop).
    """
    size = len(body)
    if header_length is None:
        header_length = size
    elif header_length == 0:
        return _decode_raw_body(spec, body, forwarded_headers)
    elif header_length < 0 or header_length > size:
        raise InferenceError.invalid(  # Triton's words
            f"inference header size should be in range (0, {size}), got: {header_length}"
        )
    header = body if header_length == size else memoryview(body)[:header_length]
    key = _plan_key(header)
    plan = _PLANS.get(key) if key is not None else None
    if plan is not None:  # never one of a long BYTES input (_long_strings): the path below refuses it on the loop
        return _decode_planned(spec, plan, body, header_length, forwarded_headers, memory, deferred)
    if header_length >= OFF_LOOP_JSON_BYTES and place != ANYWHERE:
        if place == ON_LOOP:
            raise OffLoop
        document = parse_json_object(header, json_pieces.loads)
    else:
        document = parse_json_object(header)
    # What tritonserver's HTTP frontend reads, in its order: the id, the parameters, every input (header, source,
    # binary bytes, JSON data), the outputs; only then does its core check them against the model.
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise InferenceError.invalid("Unable to parse 'id': attempt to access JSON non-string as string")  # Triton's
    user_parameters, options = split_parameters(
        request_parameters(document.get("parameters", _ABSENT)), forwarded_headers
    )
    raw_inputs = document.get("inputs", _ABSENT)
    if type(raw_inputs) is not list:
        raise InferenceError.invalid(  # Triton's words
            "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"
            if raw_inputs is _ABSENT
            else "Unable to parse 'inputs': attempt to access JSON non-array as array"
        )
    inputs: Dict[str, Any] = {}
    batch_sizes: List[int] = []
    reads: List[Read] = []
    offset = header_length
    view = memoryview(body) if header_length < size else None
    planned: Optional[List[_PlannedInput]] = None  # what the header says of each input, when it is to be kept
    if key is not None:
        if key in _SEEN:  # a header seen twice is kept: one with an id of its own per request is not
            planned = []
        else:
            if len(_SEEN) >= _KEPT_PLANS:
                _SEEN.clear()
            _SEEN[key] = None
    # Triton's core checks nothing before its frontend has read every input and the outputs: the model's first
    # refusal (of the input at `refused`, -1 for the input count) waits for them, and no array is built after it.
    refused: Optional[int] = None if spec.input_count_fits(len(raw_inputs)) else -1
    refusal: Optional[InferenceError] = None
    try:
        for index, raw in enumerate(raw_inputs):
            # Triton's frontend checks where the data is before it reads the name (JSON data alone passes)
            if type(raw) is dict and ("parameters" in raw or "data" not in raw):
                _check_one_source(raw)
            name, datatype, shape, tensor_parameters = _tensor_header(raw)
            if name in inputs:
                raise InferenceError.invalid_input(f"input '{name}' already exists in request")
            binary_size = tensor_parameters.get("binary_data_size")
            region = _input_region(tensor_parameters, name) if tensor_parameters else None
            rows: Optional[int] = None
            if refused is None:
                given = None
                if shape and not shape[0]:  # a batch of 0 is refused naming its data's size, or read in the request's
                    given = _data_size(region, binary_size, datatype, view, offset)  # rows (empty_batch_rows)
                    rows = _empty_batch_rows(spec, raw_inputs)
                try:
                    batch_sizes.append(spec.check_input(name, datatype, shape, False, given, rows))
                except InferenceError as error:
                    refused, refusal = index, error
            if planned is not None:
                planned.append((name, datatype, shape, binary_size, region))
            if rows is not None and refused is None:  # a batch of 0 that 2.51 serves, in the shape it reads it in
                shape = spec.rows_shape(shape, rows)
            if region is not None:
                _only_shared_memory(raw, binary_size)
                (memory or _memory(memory)).check(region.region, region.offset, region.byte_size)
                if refused is None:
                    try:
                        inputs[name] = input_array(
                            memory or _memory(memory), region, datatype, shape, name, spec.name, reads
                        )
                    except InferenceError as error:
                        refused, refusal = index, error
            elif binary_size is not None or "binary_data_size" in tensor_parameters:  # null: set, as Triton reads it
                if "data" in raw:
                    _one_source_only(["data", "binary_data_size"])
                if isinstance(binary_size, bool) or not isinstance(binary_size, int) or binary_size < 0:
                    raise InferenceError.invalid(f"'binary_data_size' of input '{name}' must be a non-negative integer")
                data = _binary(view, offset, binary_size, size, name, spec.name)
                offset += binary_size
                if place == ON_LOOP and binary_size >= OFF_LOOP_STRING_BYTES and datatype == BYTES:
                    raise OffLoop
                if refused is None:
                    try:
                        inputs[name] = array_from_raw(data, datatype, shape, name, spec.name)
                    except InferenceError as error:
                        refused, refusal = index, error
            elif "data" in raw:
                planned = None  # values: never part of a key
                array: Optional[np.ndarray] = None  # none for a shape of no elements, as Triton reads none
                if datatype == UNKNOWN_DATATYPE:
                    # The frontend cannot read the values (Triton's words), an array; one of no elements (a shape
                    # [] has none to Triton) it does not read, and the core refuses the datatype (check_input).
                    if shape and 0 not in shape:
                        _json_array(raw["data"])
                        raise InferenceError.invalid(f"invalid datatype for input {name}")
                elif 0 not in shape:
                    try:
                        if not place:  # OFF_LOOP: a piece at a time, its values freed so (json_pieces.release)
                            array = array_from_json_in_pieces(
                                _json_array(raw["data"]), datatype, shape, name, spec.name
                            )
                            json_pieces.release(raw["data"])
                        else:  # the other's jump, not this one's, is over the branch after it
                            array = array_from_json(_json_array(raw["data"]), datatype, shape, name, spec.name)
                    except InferenceError as error:  # the frontend's refusal, or the core's (`_json_read`)
                        array, core_error = _json_read(raw["data"], datatype, shape, name, spec.name, error)
                        if refused is None and core_error is not None:
                            refused, refusal = index, core_error
                if refused is None:
                    inputs[name] = array if array is not None else np.empty(shape, numpy_dtype(datatype))
            else:
                _one_source_only([])
            if refused is not None:
                inputs[name] = None  # no array: named, for the check of names given twice
        _no_binary_left(offset, size, spec.name)
        requested, output_format = _requested_outputs(
            spec, document.get("outputs", _ABSENT), options.binary_data_output, memory
        )
        if refused is not None:
            raise _refusal(spec, raw_inputs, refused, refusal, view, header_length)
        batch_size = spec.check_input_set(list(inputs), batch_sizes)
        if reads:
            SystemSharedMemory.read_all(reads, deferred)
    except InferenceError as error:
        # The refusal kept here has a traceback that holds this frame: without it, that is no reference cycle, so
        # the body goes with the answer, not at the cycle collector's next full pass (1 GiB bodies refused held
        # 1 GiB each until then).
        refusal = core_error = None
        if error.of_request:  # Triton's core names the request
            raise error.for_request(request_id) from None
        raise
    if planned is not None and key is not None and not _long_strings(planned):
        if len(_PLANS) >= _KEPT_PLANS:
            _PLANS.clear()
        parameters = request_parameters(document.get("parameters", _ABSENT))
        _PLANS[key] = _Plan(planned, request_id, parameters, requested, output_format)
    request = InferenceRequest(
        request_id=request_id,
        inputs=inputs,
        parameters=user_parameters,
        requested_outputs=requested,
        batch_size=batch_size,
        priority=options.priority,
        timeout_us=options.timeout_us,
        sequence=options.sequence,
    )
    return request, output_format


# An input's JSON data as the frontend read it: its array (None: a shape of no elements) and the core's refusal.
_JsonRead = Tuple[Optional[np.ndarray], Optional[InferenceError]]


def _refusal(
    spec: ModelSpec,
    raw_inputs: List[Any],
    refused: int,
    refusal: Optional[InferenceError],
    view: Optional[memoryview],
    offset: int,
) -> InferenceError:
    """The refusal of the model's that Triton's core names, once every input and output was read (raised if later).

    `refused` is -1 for the input count; else `refusal` is the first refusal, of the input at `refused`, and the
    core names the first input from there that the model refuses in its hash map's order (`_check_later_inputs`).
    `view` is the body, whose binary data starts at `offset` (every input's data there was read already).
    Returned, not raised: raised here, its traceback would hold this frame, which holds it (a reference cycle).
    """
    shapes = [(name, shape) for name, _, shape, _ in (_tensor_header(raw) for raw in raw_inputs)]
    if refused < 0 or refusal is None:
        spec.check_input_count([_tensor_header(raw)[0] for raw in raw_inputs])  # (it raises: names are distinct)
        refusal = InferenceError.invalid(f"the inputs do not fit model '{spec.name}'")
    else:  # the core looks every input up, and reads every input's batch dimension, first
        first = spec.first_refusal(shapes)
        if first is not None:
            return first
        refusal = spec.with_request_rows(refusal, shapes)  # a batch of 0 has the rows of the request's batch size
    names = [_tensor_header(raw)[0] for raw in raw_inputs]
    later: List[Tuple[str, str, List[int], Union[int, _JsonRead]]] = []
    for index, raw in enumerate(raw_inputs):
        name, datatype, shape, tensor_parameters = _tensor_header(raw)
        region = _input_region(tensor_parameters, name) if tensor_parameters else None
        binary_size = tensor_parameters.get("binary_data_size") if region is None else None
        start, offset = offset, offset + (binary_size or 0)
        if index <= refused:
            continue
        if region is not None:
            later.append((name, datatype, shape, region.byte_size))
        elif datatype == BYTES and binary_size is not None and shape and not shape[0] and spec.batching:
            later.append((name, datatype, shape, _data_size(None, binary_size, datatype, view, start) or 0))  # strings
        elif datatype == BYTES and binary_size is not None:
            later.append((name, datatype, shape, _strings_read(view, start, offset, shape, name, spec.name)))
        elif "binary_data_size" in tensor_parameters:
            later.append((name, datatype, shape, tensor_parameters["binary_data_size"]))
        elif datatype == UNKNOWN_DATATYPE:  # of no elements (others were refused): its datatype is the refusal
            later.append((name, datatype, shape, (None, None)))
        else:
            later.append((name, datatype, shape, _json_read(raw["data"], datatype, shape, name, spec.name)))
    rows = spec.empty_batch_rows(shapes) if spec.batching else None
    try:
        _check_later_inputs(spec, names, refused, later, isinstance(refusal, OutOfRange), rows)
    except EmptyBatchError as error:  # a batch of 0 has the rows of the request's batch size
        return spec.with_request_rows(error.with_traceback(None), shapes)
    return refusal


def _empty_batch_rows(spec: ModelSpec, raw_inputs: List[Any]) -> Optional[int]:
    """ModelSpec.empty_batch_rows of the request's inputs (None where one is refused as the frontend reads it)."""
    if not spec.batching:
        return None
    try:
        shapes = [(name, shape) for name, _, shape, _ in map(_tensor_header, raw_inputs)]
    except InferenceError:
        return None
    return spec.empty_batch_rows(shapes)


def _input_region(parameters: Mapping[str, Any], name: str) -> Optional[TensorRegion]:
    """The region an input's parameters name (tensor_region); one of binary data names none.

    tritonserver 2.51's frontend reads no shared-memory parameter of an input with `binary_data_size` (null too):
    a `shared_memory_offset` or `shared_memory_byte_size` of any value beside it is passed over (200). With a
    `shared_memory_region` it is the one-source refusal, checked before.
    """
    if "binary_data_size" in parameters and REGION not in parameters:
        return None
    return tensor_region(parameters, "input", name)


def _strings_read(
    view: Optional[memoryview], start: int, end: int, shape: Sequence[int], name: str, model: str
) -> _JsonRead:
    """A BYTES input's binary data `view[start:end]` as the core reads it: no array, and its refusal of the strings.

    The core counts the strings (a last one cut short is the model's refusal, later: not named here), and checks
    them in the visit in which it checks the input's datatype and shape: 2.51 names an input of too many strings
    before a later-visited input of a wrong shape or datatype.
    """
    try:
        deserialize_bytes_tensor(view[start:end] if view is not None else b"", name, model, element_count(shape))
    except InferenceError as error:
        if not error.in_response:
            return None, error.with_traceback(None)
    return None, None


def _check_later_inputs(
    spec: ModelSpec,
    names: Sequence[str],
    failed: int,
    later: Sequence[Tuple[str, str, List[int], Union[int, _JsonRead]]],
    every: bool = False,
    rows: Optional[int] = None,
) -> None:
    """Check the `later` inputs (after `names[failed]`, the first to fail) that Triton's core visits before it.

    Each comes with the byte size of its data, or its JSON data as read. Triton's core checks each input's
    datatype, shape and byte size in its hash map's order (core/hash_map_order.py): of several inputs that fail, it
    names the first it visits. With `every` (the first refusal is one Triton does not make: OutOfRange) every later
    input is checked, in that order. `rows`: the request's, for an input of batch size 0 (ModelSpec.empty_batch_rows).
    """
    later_names = [name for name, _, _, _ in later]
    if every:
        position = {name: place for place, name in enumerate(hash_map_order(names))}
        order = sorted(range(len(later)), key=lambda index: position[later_names[index]])
    else:
        order = visited_before(names, names[failed], later_names)
    for index in order:
        name, datatype, shape, given = later[index]
        if shape and not shape[0]:  # a batch of 0: the byte size of the request's rows, where it has that
            spec.check_input(name, datatype, shape, False, given if isinstance(given, int) else None, rows)
            if rows is not None:
                shape = spec.rows_shape(shape, rows)
        else:
            spec.check_input(name, datatype, shape, False)
        if isinstance(given, tuple):
            if given[1] is not None and not isinstance(given[1], OutOfRange):
                raise given[1]
            continue
        element_size = ELEMENT_SIZE.get(datatype)  # BYTES: its strings tell their size
        if element_size is not None and given != element_count(shape) * element_size:
            raise InferenceError.invalid_input(
                f"input byte size mismatch for input '{name}' for model '{spec.name}'. Expected "
                f"{element_count(shape) * element_size}, got {given}"
            )


def _binary(view: Optional[memoryview], offset: int, binary_size: int, size: int, name: str, model: str) -> memoryview:
    """An input's `binary_size` bytes of the body from `offset` (an empty view for a body of the header alone)."""
    if offset + binary_size > size:
        missing = offset + binary_size - size
        raise InferenceError.invalid(  # Triton's words
            f"unexpected size for input '{name}', expecting {missing} additional bytes for model '{model}'"
        )
    return view[offset : offset + binary_size] if view is not None else memoryview(b"")


def _check_body(inputs: Sequence[_PlannedInput], header_length: int, size: int, model: str) -> None:
    """Refuse a body whose bytes after the header are not the planned inputs' (in Triton's words)."""
    offset = header_length
    for name, _, _, binary_size, region in inputs:
        if region is None:
            _binary(None, offset, binary_size or 0, size, name, model)
            offset += binary_size or 0
    _no_binary_left(offset, size, model)


def _planned_later(
    spec: ModelSpec, inputs: Sequence[_PlannedInput], failed: int, view: Optional[memoryview], offset: int
) -> List[Tuple[str, str, List[int], Union[int, _JsonRead]]]:
    """The planned inputs after `inputs[failed]`, each with its data's size (a BYTES input's strings as read).

    A batching model's BYTES input of batch size 0 comes with its count of strings (ModelSpec.check_input).
    """
    later: List[Tuple[str, str, List[int], Union[int, _JsonRead]]] = []
    model = spec.name
    for index, planned in enumerate(inputs):
        name, datatype, shape, binary_size, region = planned
        start, offset = offset, offset + ((binary_size or 0) if region is None else 0)
        if index <= failed:
            continue
        if region is None and datatype == BYTES and shape and not shape[0] and spec.batching:
            later.append((name, datatype, shape, _data_size(None, binary_size, datatype, view, start) or 0))
        elif region is None and datatype == BYTES:
            later.append((name, datatype, shape, _strings_read(view, start, offset, shape, name, model)))
        else:
            later.append((name, datatype, shape, _planned_size(planned)))
    return later


def _planned_rows(spec: ModelSpec, inputs: Sequence[_PlannedInput]) -> Optional[int]:
    """ModelSpec.empty_batch_rows of the planned inputs (None for a model without batching)."""
    return spec.empty_batch_rows([(planned[0], planned[2]) for planned in inputs]) if spec.batching else None


def _planned_size(planned: _PlannedInput) -> int:
    """The byte size a planned input gives its data (in its region or in the body)."""
    region = planned[4]
    return region.byte_size if region is not None else planned[3] or 0


def _no_binary_left(offset: int, size: int, model: str) -> None:
    """Refuse binary data after the last input's (in Triton's words)."""
    if offset != size:
        raise InferenceError.invalid(f"unexpected additional input data for model '{model}'")


# What an input's header says: name, datatype, shape, binary_data_size (None: none) and region (None: none).
_PlannedInput = Tuple[str, str, List[int], Optional[int], Optional[TensorRegion]]


def _long_strings(inputs: List[_PlannedInput]) -> bool:
    """Whether a BYTES input in the body is long enough to be decoded off the loop (OffLoop).

    A header of such inputs is not planned: the full decode refuses it on the loop, and a small request's planned
    decode has no check to make (its instructions a request).
    """
    return any(
        planned[1] == BYTES and planned[4] is None and (planned[3] or 0) >= OFF_LOOP_STRING_BYTES for planned in inputs
    )


class _Plan:
    """What a request's JSON header says, once it was read without error (`_PLANS`).

    Only what the header itself says: each request still checks it against the model, its regions against those
    registered, and its binary sizes against its body.
    """

    __slots__ = (
        "binary_by_name",
        "binary_bytes",
        "binary_default",
        "classes",
        "inputs",
        "located",
        "parameters",
        "regions",
        "request_id",
        "requested",
        "split",
    )

    def __init__(
        self,
        inputs: List[_PlannedInput],
        request_id: str,
        parameters: Dict[str, Any],
        requested: Optional[List[str]],
        output_format: OutputFormat,
    ) -> None:
        """Keep what the decode of the header found."""
        self.inputs = inputs
        self.binary_bytes = sum(planned[3] or 0 for planned in inputs if planned[4] is None)  # the body's, after it
        self.request_id = request_id
        self.parameters = parameters
        self.split = split_parameters(parameters)  # without forwarded headers
        self.requested = list(requested) if requested is not None else None  # the first request has the other
        self.binary_by_name = output_format.binary_by_name
        self.binary_default = output_format.binary_default
        self.regions = output_format.regions
        self.classes = output_format.classes
        # Its regions as a request found them in a registry of that generation (`Located`): None until then.
        self.located: Optional[Located] = None


# Plans of the JSON headers seen last, by their bytes: a client sends the same header again and again (the same
# names, shapes, binary sizes or shared-memory regions, and parameters).
_PLANS: Dict[bytes, _Plan] = {}
_SEEN: Dict[bytes, None] = {}  # headers seen once
_KEPT_PLANS = 1024  # when full, the cache starts over
_KEPT_PLAN_BYTES = 2048  # longer headers are read each time


def _plan_key(header: Body) -> Optional[bytes]:
    """A JSON header's bytes as the key of its plan, when it is short enough to be one."""
    if len(header) > _KEPT_PLAN_BYTES:
        return None
    return header if type(header) is bytes else bytes(header)


def _decode_planned(
    spec: ModelSpec,
    plan: _Plan,
    body: Body,
    header_length: int,
    forwarded_headers: Optional[Mapping[str, str]],
    memory: Optional[SystemSharedMemory],
    deferred: Optional[List[Read]],
) -> Tuple[InferenceRequest, OutputFormat]:
    """Decode a request whose JSON header an earlier request had: the checks that depend on more than the header."""
    if forwarded_headers:
        user_parameters, options = split_parameters(plan.parameters, forwarded_headers)
    else:
        user, options = plan.split
        user_parameters = dict(user)
    size = len(body)
    inputs: Dict[str, np.ndarray] = {}
    batch_sizes: List[int] = []
    reads: List[Read] = []
    offset = header_length
    view = memoryview(body) if header_length < size else None
    located = still_located(plan.located, memory)
    if header_length + plan.binary_bytes != size:  # an input short of its bytes, or bytes after the last one's
        _check_body(plan.inputs, header_length, size, spec.name)
    requested = plan.requested
    if requested is not None:  # the outputs first, as Triton's core checks them
        if plan.regions and located is None:
            for output_region in plan.regions.values():
                (memory or _memory(memory)).check(output_region.region, output_region.offset, output_region.byte_size)
        spec.check_requested_outputs(requested)
        requested = list(requested)
    try:
        if not spec.input_count_fits(len(plan.inputs)):
            spec.check_input_count([planned[0] for planned in plan.inputs])
        for index, (name, datatype, shape, binary_size, region) in enumerate(plan.inputs):
            try:
                given = rows = None
                if shape and not shape[0]:  # a batch of 0 (decode_infer_request)
                    given = _data_size(region, binary_size, datatype, view, offset)
                    rows = _planned_rows(spec, plan.inputs)
                batch_sizes.append(spec.check_input(name, datatype, shape, False, given, rows))
                if rows is not None:
                    shape = spec.rows_shape(shape, rows)
                if region is not None:
                    inputs[name] = region_input(
                        located, index, memory or _memory(memory), region, datatype, shape, name, spec.name, reads
                    )
                    continue
                end = offset + (binary_size or 0)  # (never None: an input of a plan is in a region or in the body)
                raw = view[offset:end] if view is not None else memoryview(b"")
                inputs[name] = array_from_raw(raw, datatype, shape, name, spec.name)
                offset = end
            except InferenceError:
                names = [planned[0] for planned in plan.inputs]
                _check_later_inputs(
                    spec,
                    names,
                    index,
                    _planned_later(spec, plan.inputs, index, view, header_length),
                    rows=_planned_rows(spec, plan.inputs),
                )
                raise
        batch_size = spec.check_input_set(list(inputs), batch_sizes)
        if reads:
            SystemSharedMemory.read_all(reads, deferred)
    except InferenceError as error:
        if error.of_request:  # Triton's core names the request
            raise error.for_request(plan.request_id) from None
        raise
    if located is None and memory is not None and (reads or plan.regions):
        plan.located = locate_plan(memory, [(planned[1], planned[4]) for planned in plan.inputs], reads)
    output_format = OutputFormat(plan.binary_by_name, plan.binary_default, plan.regions, plan.classes)
    request = InferenceRequest(
        request_id=plan.request_id,
        inputs=inputs,
        parameters=user_parameters,
        requested_outputs=requested,
        batch_size=batch_size,
        priority=options.priority,
        timeout_us=options.timeout_us,
        sequence=options.sequence,
    )
    return request, output_format


def _decode_raw_body(
    spec: ModelSpec, body: Body, forwarded_headers: Optional[Mapping[str, str]]
) -> Tuple[InferenceRequest, OutputFormat]:
    """`Inference-Header-Content-Length: 0`: the whole body is the model's single input, as Triton's core reads it.

    Its shape is the model's, with the batch dimension 1 and its one -1 dimension what the body's size leaves; a
    BYTES input (of shape [1]) is the body as one string.
    """
    if len(spec.inputs) != 1:
        message = (  # Triton's words; a raw request has no id
            f"Raw request must only have 1 input (found 1) to be deduced but got {len(spec.inputs)} inputs in "
            f"'{spec.name}' model configuration"
        )
        raise InferenceError.invalid_input(message).for_request("")
    tensor = spec.inputs[0]
    dims = list(tensor.dims)
    if dims.count(-1) > 1:
        raise InferenceError.invalid_input(
            f"The shape of the raw input '{tensor.name}' can not be deduced because there are more than one "
            "variable-sized dimension"
        ).for_request("")
    known = element_count([dim for dim in dims if dim != -1])
    shape = [1, *dims] if spec.batching else dims
    user_parameters, _ = split_parameters(None, forwarded_headers)
    if tensor.datatype == BYTES:
        if -1 in dims or known != 1:
            raise InferenceError.invalid_input(
                f"For BYTE datatype raw input '{tensor.name}', the model must have input shape [1]"
            ).for_request("")
        spec.check_input(tensor.name, tensor.datatype, shape)
        array = np.empty(1, dtype=np.object_)
        array[0] = bytes(body)
        inputs = {tensor.name: array.reshape(shape)}
    else:
        size = ELEMENT_SIZE.get(tensor.datatype)
        if size is None:
            raise InferenceError.invalid(f"a request without an inference header cannot carry {tensor.datatype} data")
        if -1 in dims:
            wildcard = shape.index(-1)
            shape[wildcard] = len(body) // known // size if known else 0
        expected = element_count(shape) * size
        if expected != len(body):  # Triton's core names the input by the frontend's name for it
            raise InferenceError.invalid_input(
                f"input byte size mismatch for input 'raw_input' for model '{spec.name}'. Expected {expected}, got "
                f"{len(body)}"
            ).for_request("")
        spec.check_input(tensor.name, tensor.datatype, shape)
        inputs = {tensor.name: array_from_raw(memoryview(body), tensor.datatype, shape, tensor.name, spec.name)}
    request = InferenceRequest(
        request_id="", inputs=inputs, parameters=user_parameters, requested_outputs=None, batch_size=1
    )
    return request, OutputFormat({}, True)


def parse_json_object(data: Body, loads: Callable[[Body], Any] = json_text.loads) -> Dict[str, Any]:
    """Parse a JSON object with `loads`, or raise a 400 with the parser's message."""
    try:
        document = loads(data)
    except json_text.JsonError as error:
        raise InferenceError.invalid(f"failed to parse the request JSON buffer: {error}") from None
    if not isinstance(document, dict):
        raise InferenceError.invalid("the request JSON must be an object")
    return document


def parse_json_members(data: Body) -> Dict[str, Any]:
    """The members of a JSON body as Triton's handlers find them: a document that is no object has none.

    Triton looks fields up with TritonJson's `Find`, which finds nothing in an array, a number or null, so
    `[1]` posted to /v2/logging changes nothing and a register request of `5` has "no 'key' field".
    """
    try:
        document = json_text.loads(data)
    except json_text.JsonError as error:
        raise InferenceError.invalid(f"failed to parse the request JSON buffer: {error}") from None
    return document if isinstance(document, dict) else {}


# What a document's get() gives for a member it does not have: one that is null is there (Triton refuses it).
_ABSENT: Any = object()


def request_parameters(value: Any) -> Dict[str, Any]:
    """A request's optional `parameters` object (_ABSENT: none); anything else, null too, is refused as 2.51 does.

    In tritonserver 2.51's words (its 500).
    """
    if value is _ABSENT:
        return {}
    if type(value) is not dict:
        raise InferenceError.invalid("failed to get request params.: attempt to get members for non-object")
    return value


def _tensor_parameters(value: Any) -> Dict[str, Any]:
    """A tensor's `parameters`, none when they are no object (a list, a string, null).

    tritonserver 2.51 looks their keys up with TritonJson's Find, which finds none in a value that is no object.
    """
    return value if type(value) is dict else {}


# The datatype Triton's core names for one it does not know (it refuses it against the model's).
UNKNOWN_DATATYPE = "<invalid>"


def _tensor_header(raw: Any) -> Tuple[str, str, List[int], Dict[str, Any]]:
    """Name, datatype (UNKNOWN_DATATYPE for a string no datatype), shape and parameters of one input, type-checked."""
    if type(raw) is not dict:
        raise InferenceError.invalid("each element of 'inputs' must be a JSON object")
    name = raw.get("name")
    datatype = raw.get("datatype")
    shape = raw.get("shape")
    if type(name) is not str:
        raise InferenceError.invalid("each input must have a string 'name'")
    if datatype is None and "datatype" not in raw:
        raise InferenceError.invalid(_MISSING.format(key="datatype"))
    if type(datatype) is not str:  # Triton's words (its 500)
        raise InferenceError.invalid("Unable to parse 'datatype': attempt to access JSON non-string as string")
    if not is_known_datatype(datatype):  # JSON data refuses it (_unknown_datatype); the core checks binary data's
        datatype = UNKNOWN_DATATYPE
    if type(shape) is not list:
        if shape is None and "shape" not in raw:
            raise InferenceError.invalid(_MISSING.format(key="shape"))
        raise InferenceError.invalid("Unable to parse 'shape': attempt to access JSON non-array as array")
    for dim in shape:
        if type(dim) is not int or dim < 0 or dim > _UINT64_MAX:
            raise InferenceError.invalid(_NOT_A_DIM)
    return name, datatype, shape, _tensor_parameters(raw.get("parameters"))


# tritonserver 2.51's words (500s there, for what the client sent) for an input's header field it cannot read.
_MISSING = "Unable to parse '{key}': attempt to access non-existing object member '{key}'"
_NOT_A_DIM = "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"
_UINT64_MAX = (1 << 64) - 1


def _json_read(
    data: Any, datatype: str, shape: List[int], name: str, model: str, error: Optional[InferenceError] = None
) -> _JsonRead:
    """An input's JSON `data` read as tritonserver 2.51's HTTP frontend reads it, before the model's checks.

    Returns the array (None for a shape of no elements: Triton reads no data for one, whatever `data` holds) and
    the error of Triton's core for it (a BYTES input's string count), which comes only after the model's checks
    of the input; the frontend's own refusals (values, their count, FP16 or BF16 as JSON) are raised. `error`:
    the refusal of reading `data` already, if it was read.

    Triton counts the elements of a shape of no dimensions as 0 too (and its core then refuses the shape), so any
    refusal of a scalar's data comes after the model's checks, which only a model of scalars passes here.
    """
    if 0 in shape:
        return None, None
    if error is None:
        try:
            return array_from_json(_json_array(data), datatype, shape, name, model), None
        except InferenceError as refused:
            error = refused.with_traceback(None)  # kept in this frame, which its traceback holds: a reference cycle
    if not error.of_request and shape and not isinstance(error, OutOfRange):
        raise error
    return None, error


def _json_array(data: Any) -> List[Any]:
    """An input's `data`, which must be a JSON array, flat or nested (tritonserver 2.51's words; a 500 there)."""
    if type(data) is not list:
        raise InferenceError.invalid("Unable to parse 'data': attempt to access JSON non-array as array")
    return data


def _only_shared_memory(raw: Dict[str, Any], binary_size: Any) -> None:
    """Refuse an input that gives its data in shared memory and in the request as well (Triton's message)."""
    if binary_size is None and "data" not in raw:
        return
    given = [
        name for name, present in (("data", "data" in raw), ("binary_data_size", binary_size is not None)) if present
    ]
    _one_source_only([*given, "shared_memory_region"])


def _data_bytes(region: Optional[TensorRegion], binary_size: Any) -> Optional[int]:
    """The size of an input's data in a region or the binary body (None: neither, or a size of the wrong type)."""
    if region is not None:
        return region.byte_size
    return binary_size if type(binary_size) is int else None


def _data_size(
    region: Optional[TensorRegion], binary_size: Any, datatype: str, view: Optional[memoryview], offset: int
) -> Optional[int]:
    """_data_bytes, but a BYTES input's in the body (from `offset`) in strings (None: in a region, not read here)."""
    if datatype != BYTES:
        return _data_bytes(region, binary_size)
    if region is not None or type(binary_size) is not int or binary_size < 0:
        return None
    return string_count(view[offset : offset + binary_size]) if view is not None else 0


def _check_one_source(raw: Dict[str, Any]) -> None:
    """Refuse an input without exactly one source of data (Triton's ValidateInputContentType), a null one too."""
    parameters = _tensor_parameters(raw.get("parameters"))
    given = [
        name
        for name, present in (
            ("data", "data" in raw),
            ("binary_data_size", "binary_data_size" in parameters),
            ("shared_memory_region", REGION in parameters),
        )
        if present
    ]
    if len(given) != 1:
        _one_source_only(given)


def _one_source_only(given: List[str]) -> None:
    """Refuse an input whose data comes from none, or more than one, of its possible sources (Triton's message)."""
    listed = " ".join(f"'{name}'" for name in given) if given else "no field is set"
    raise InferenceError.invalid(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
        f"'shared_memory_region' in 'parameters'. But {'set ' if given else ''}{listed}"
    )


def _memory(memory: Optional[SystemSharedMemory]) -> SystemSharedMemory:
    """The regions a request's shared-memory tensors are in; endpoints without them refuse such tensors."""
    if memory is None:
        raise InferenceError.invalid("this endpoint does not take tensors in shared memory")
    return memory


def _check_output_in_region(parameters: Dict[str, Any]) -> None:
    """Refuse an output in shared memory that is also asked for as classes or as binary, in Triton's words.

    Triton's ValidateOutputParameter: a class count is refused by its key alone (`"classification": 0` too),
    binary_data when true (a 500 there for a value that is no boolean, 400 here).
    """
    if "classification" in parameters:
        raise InferenceError.invalid("Output can't set both 'shared_memory_region' and 'classification'")
    as_binary = parameters.get("binary_data", False)
    if type(as_binary) is not bool:
        raise InferenceError.invalid("Unable to set 'binary_data': attempt to access JSON non-boolean as boolean")
    if as_binary:
        raise InferenceError.invalid("Output can't set both 'shared_memory_region' and 'binary_data'")


def _requested_outputs(
    spec: ModelSpec, raw_outputs: Any, binary_default: bool, memory: Optional[SystemSharedMemory]
) -> Tuple[Optional[List[str]], OutputFormat]:
    """The requested output names (None = all), their binary flags and the regions of those in shared memory."""
    if raw_outputs is _ABSENT or raw_outputs == []:  # Triton answers an empty 'outputs' with every output
        return None, OutputFormat({}, binary_default)
    if not isinstance(raw_outputs, list):
        raise InferenceError.invalid("Unable to parse 'outputs': attempt to access JSON non-array as array")  # Triton's
    names: List[str] = []
    binary: Dict[str, bool] = {}  # an output named without parameters goes as JSON
    regions: Dict[str, TensorRegion] = {}
    classes: Dict[str, int] = {}
    for raw in raw_outputs:
        name = raw.get("name") if type(raw) is dict else None
        if type(name) is not str:
            raise InferenceError.invalid("each element of 'outputs' must be an object with a string 'name'")
        # Named again: one output, with the first naming's parameters, as Triton answers; it checks the others.
        first = name not in binary
        if first:
            names.append(name)
        parameters = raw.get("parameters")
        if parameters is None:
            if first:
                binary[name] = False
            continue
        parameters = _tensor_parameters(parameters)
        if REGION in parameters:
            _check_output_in_region(parameters)
        count = parameters.get("classification", 0)
        if type(count) is not int or count < 0:  # null too: Triton reads the key as set (a 500 there, 400 here)
            raise InferenceError.invalid(
                "Unable to set 'classification': attempt to access JSON non-unsigned-integer as unsigned-integer"
            )
        as_binary = parameters.get("binary_data", False)
        if type(as_binary) is not bool:  # tritonserver 2.51's words (a 500 there: 400 here, the client sent it)
            raise InferenceError.invalid("Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean")
        region = tensor_region(parameters, "output", name) if parameters else None
        if region is not None:
            (memory or _memory(memory)).check(region.region, region.offset, region.byte_size)
        if not first:
            continue
        if count:
            classes[name] = count
        binary[name] = as_binary
        if region is not None:
            regions[name] = region
    spec.check_requested_outputs(names)
    return names, OutputFormat(binary, binary_default, regions or None, classes or None)


def encode_infer_response(
    spec: ModelSpec,
    request_id: str,
    response: InferenceResponse,
    output_format: OutputFormat,
    memory: Optional[SystemSharedMemory] = None,
    parameters: Optional[Dict[str, Any]] = None,
    deferred: Optional[List[WriteRun]] = None,
    place: int = ANYWHERE,
) -> Tuple[Union[bytes, bytearray, memoryview], Sequence[Any], int]:
    """Encode a response: the JSON part, the binary parts after it (none of 0 bytes), and the JSON part's length.

    Outputs the request placed in shared memory are written into their regions of `memory` and carry no data;
    with `deferred`, large writes are added there, for the caller to carry out (`off_loop.write_off_loop`).
    `place`: where this runs (ON_LOOP: a long encode raises OffLoop).
    """
    outputs: List[Dict[str, Any]] = []
    binary_parts: List[Any] = []
    binary_by_name, binary_default = output_format.binary_by_name, output_format.binary_default
    regions = output_format.regions or {}
    writes: List[Write] = []
    classes = output_format.classes
    for output in response.outputs:
        if classes is not None and output.name in classes:
            declared = spec.output_by_name.get(output.name)
            labels = declared.labels if declared is not None else None
            output = _in_response(top_classes, output, classes[output.name], spec.batching, spec.name, labels)
        entry: Dict[str, Any] = {"name": output.name, "datatype": output.datatype, "shape": output.array.shape}
        region = regions.get(output.name)
        if region is not None:
            writes.append(output_write(region, output))
        elif binary_by_name.get(output.name, binary_default):
            if output.datatype == BYTES and place == ON_LOOP and output.array.size >= OFF_LOOP_VALUES:
                raise OffLoop
            raw = raw_from_array(output.array, output.datatype)
            size = len(raw)  # bytes, or a view of format "B"
            entry["parameters"] = {"binary_data_size": size}
            if size:  # as Triton: an answer whose binary outputs are all empty goes as JSON, without the header
                binary_parts.append(raw)
        else:
            if output.array.size >= OFF_LOOP_VALUES and place == ON_LOOP:
                raise OffLoop
            try:  # _in_response's, without its call: a step of every small JSON answer
                entry["data"] = json_from_array(output.array, output.datatype)
            except InferenceError as error:
                error.in_response = True
                raise
        outputs.append(entry)
    if writes:
        (memory or _memory(memory)).write_all(writes, deferred)
    document: Dict[str, Any] = {"id": request_id} if request_id else {}  # first, as Triton writes it
    document["model_name"] = spec.name
    document["model_version"] = spec.version_str
    if spec.ensemble is not None and response.outputs:  # Triton's ensemble answers with its steps' sequence
        # parameters (an answer without outputs, a step having left them out, with none)
        parameters = {**ENSEMBLE_RESPONSE_PARAMETERS, **(response.parameters or {}), **(parameters or {})}
    if parameters:
        document["parameters"] = parameters  # before the outputs, as Triton writes them
    document["outputs"] = outputs
    if place:  # not OFF_LOOP
        header = json_text.dumps(document)
        return header, binary_parts, len(header)
    pieced = json_pieces.dumps(document)
    for entry in outputs:  # BYTES outputs' strings, freed a piece at a time
        if type(entry.get("data")) is list:
            json_pieces.release(entry["data"])
    return pieced, binary_parts, len(pieced)


_R = TypeVar("_R")


def _in_response(write: Callable[..., _R], *args: Any) -> _R:
    """`write(*args)`, its refusal marked as the request's answer (`InferenceError.in_response`).

    tritonserver writes outputs in its response callback: an output it cannot write (FP16 asked for as JSON, the
    classes of a BOOL output) is answered there, with no content type set (text/plain), as a model's failure is.
    """
    try:
        return write(*args)
    except InferenceError as error:
        error.in_response = True
        raise
