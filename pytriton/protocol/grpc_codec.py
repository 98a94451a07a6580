"""gRPC infer messages (tritonclient's service_pb2) to and from engine requests and responses."""

from __future__ import annotations

import operator
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from pytriton.core.classification import top_classes
from pytriton.core.errors import InferenceError
from pytriton.core.hash_map_order import visited_before
from pytriton.core.model import RepositoryEntry, ServedModel
from pytriton.core.request import EMPTY_FINAL_RESPONSE_PARAMETER, InferenceRequest, InferenceResponse
from pytriton.core.shared_memory.system import Read, SystemSharedMemory, Write, WriteRun
from pytriton.core.spec import EmptyBatchError, ModelSpec
from pytriton.core.tensors.datatypes import BYTES, ELEMENT_SIZE, is_known_datatype, numpy_dtype
from pytriton.core.tensors.raw_tensors import (
    Buffer,
    array_from_raw,
    deserialize_bytes_tensor,
    element_count,
    object_array,
    raw_from_array,
    string_count,
)
from pytriton.protocol import documents
from pytriton.protocol.codec_place import ANYWHERE, OFF_LOOP_STRING_BYTES, OFF_LOOP_VALUES, ON_LOOP, OffLoop
from pytriton.protocol.parameters import ENSEMBLE_RESPONSE_PARAMETERS, GRPC_RULES, RequestOptions, split_parameters
from pytriton.protocol.system_memory_codec import (
    BYTE_SIZE,
    OFFSET,
    REGION,
    Located,
    TensorRegion,
    locate_plan,
    output_write,
    region_input,
    still_located,
    tensor_region,
)
from pytriton.protocol.tensors import numeric_array

Message = Any  # generated protobuf messages carry no static types
FINAL_RESPONSE_PARAMETER = "triton_final_response"

# Datatype -> the InferTensorContents field that carries it (FP16 and BF16 have none).
_CONTENTS_FIELD: Dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    BYTES: "bytes_contents",
}
# The datatype Triton names for values found in a contents field (int_contents holds INT8 and INT16 too).
_CONTENTS_TYPE = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}


class DecodedRequest:
    """A gRPC infer request decoded for the engine."""

    __slots__ = ("classes", "options", "regions", "request")

    def __init__(
        self,
        request: InferenceRequest,
        options: RequestOptions,
        regions: Optional[Dict[str, TensorRegion]] = None,
        classes: Optional[Dict[str, int]] = None,
    ) -> None:
        """Bundle the engine request with its reserved parameters' options, its outputs' regions and class counts."""
        self.request = request
        self.options = options
        self.regions = regions
        self.classes = classes


def decode_infer_request(
    spec: ModelSpec,
    message: Message,
    raw_contents: Optional[Sequence[Buffer]] = None,
    forwarded_headers: Optional[Mapping[str, str]] = None,
    memory: Optional[SystemSharedMemory] = None,
    data: Optional[bytes] = None,
    deferred: Optional[List[Read]] = None,
    place: int = ANYWHERE,
) -> DecodedRequest:
    """Decode a ModelInferRequest; `raw_contents` overrides its raw_input_contents (already split off).

    Inputs in shared memory (which have no raw contents) are read from the regions of `memory`; with `deferred`,
    large reads are added there instead, for the caller to carry out (`off_loop.read_off_loop`) first. `data`, the
    message's bytes when the transport has them, finds what an earlier request of the same bytes said. `place`:
    where this runs (ON_LOOP: many strings to read raise OffLoop).
    """
    contents = message.raw_input_contents if raw_contents is None else raw_contents
    keyed = data is not None and not contents  # a message of headers alone
    plan = _PLANS.get(data) if keyed else None  # type: ignore[arg-type]
    if plan is None:
        plan = _MessagePlan(message)
        if keyed and plan.outputs is not None and not any(header.has_contents for header in plan.inputs):
            if len(_PLANS) >= _KEPT_HEADERS:
                _PLANS.clear()
            _PLANS[data] = plan  # type: ignore[index]
    headers = plan.inputs
    if forwarded_headers or plan.options is None:
        user_parameters, options = split_parameters(plan.parameters, forwarded_headers, GRPC_RULES)
    else:
        user_parameters, options = dict(plan.user_parameters), plan.options
    expected = plan.raw_count
    # As Triton: raw contents past the inputs' are ignored (and not even listed), missing ones refused below.
    raw = [contents[index] for index in range(min(len(contents), expected))] if contents else []
    inputs: Dict[str, np.ndarray] = {}
    names: List[str] = []
    batch_sizes: List[int] = []
    reads: List[Read] = []
    raw_index = 0
    located = still_located(plan.located, memory)
    try:
        # Triton's gRPC frontend adds every input to the request (refusing a name given twice), then reads each
        # input's data, then the requested outputs' parameters; its core then checks the outputs, then the inputs
        # against the model.
        if plan.faulty:
            if plan.repeated:
                _check_names_once(message.inputs)
            # an input's wrong parameters: the inputs before it are read first (their data, their regions)
            _check_input_data(spec.name, headers, message, len(contents) if contents else 0, plan.in_regions, memory)
            assert plan.input_error is not None
            raise plan.input_error
        find_regions = located is None and plan.in_regions
        if plan.typed or len(raw) < expected or find_regions:
            _check_input_data(spec.name, headers, message, len(contents) if contents else 0, find_regions, memory)
        outputs = plan.outputs if plan.outputs is not None else _output_headers(message.outputs)
        requested, output_regions, classes = _requested_outputs(spec, outputs, memory, located is not None)
        if not spec.input_count_fits(len(headers)):
            spec.check_input_count([header.name for header in headers])
        for index, header in enumerate(headers):
            name, datatype, shape, region = header.name, header.datatype, header.shape, header.region
            if not header.known_datatype:  # Triton's name for it, which no input has: check_input refuses it
                datatype = "<invalid>"
            has_contents = header.has_contents
            try:
                given = rows = None
                if shape and not shape[0]:  # a batch of 0 is refused naming its data's size, or read in the
                    given = _data_size(region, raw, raw_index, datatype, message.inputs[index])  # request's rows
                    rows = spec.empty_batch_rows([(h.name, h.shape) for h in headers]) if spec.batching else None
                batch_sizes.append(spec.check_input(name, datatype, shape, True, given, rows))
                if rows is not None:  # one 2.51 serves, in the shape it reads it in
                    shape = tuple(spec.rows_shape(shape, rows))
                if region is not None:
                    if has_contents:
                        raise InferenceError.invalid(_contents_in_shared_memory(name, spec.name))
                    inputs[name] = region_input(
                        located, index, memory or _memory(memory), region, datatype, shape, name, spec.name, reads
                    )
                elif raw:
                    if has_contents:
                        raise InferenceError.invalid(
                            f"contents field must not be specified when using raw_input_contents for '{name}' for "
                            f"model '{spec.name}'"
                        )
                    if raw_index == len(raw):
                        raise InferenceError.invalid(_no_data(name, spec.name))
                    if datatype == BYTES and place == ON_LOOP and len(raw[raw_index]) >= OFF_LOOP_STRING_BYTES:
                        raise OffLoop  # many strings to read (nothing the decode did so far is seen outside it)
                    inputs[name] = array_from_raw(raw[raw_index], datatype, shape, name, spec.name)
                    raw_index += 1
                elif has_contents:
                    typed = message.inputs[index].contents
                    if datatype == BYTES and place == ON_LOOP and len(typed.bytes_contents) >= OFF_LOOP_VALUES:
                        raise OffLoop
                    inputs[name] = array_from_contents(typed, datatype, shape, name, spec.name)
                else:
                    raise InferenceError.invalid(_no_data(name, spec.name))
            except InferenceError as error:
                if error.of_request or name not in spec.input_by_name:  # the core's: names, batch dimensions first
                    _check_names_and_batch(spec, headers)
                first_raw = raw_index + 1 if region is None and raw and raw_index < len(raw) else raw_index
                shapes = [(header.name, header.shape) for header in headers]
                try:
                    _check_later_inputs(spec, headers, index, message.inputs[index + 1 :], raw[first_raw:])
                except EmptyBatchError as later:  # a batch of 0 has the rows of the request's batch size
                    raise spec.with_request_rows(later, shapes) from None
                refusal = spec.with_request_rows(error, shapes)
                if refusal is not error:
                    raise refusal from None
                raise
            names.append(name)
        batch_size = spec.check_input_set(names, batch_sizes)
        if reads:
            SystemSharedMemory.read_all(reads, deferred)
    except InferenceError as error:
        if error.of_request:  # Triton's core names the request
            raise error.for_request(message.id) from None
        raise
    if located is None and keyed and memory is not None and (reads or output_regions):
        plan.located = locate_plan(memory, [(header.datatype, header.region) for header in headers], reads)
    request = InferenceRequest(
        request_id=message.id,
        inputs=inputs,
        parameters=user_parameters,
        requested_outputs=requested,
        batch_size=batch_size,
        priority=options.priority,
        timeout_us=options.timeout_us,
        sequence=options.sequence,
    )
    return DecodedRequest(request, options, output_regions, classes)


def _data_size(
    region: Optional[TensorRegion], raw: Sequence[Buffer], raw_index: int, datatype: str, tensor: Message
) -> Optional[int]:
    """The size of an input's data in a region or raw contents, a BYTES input's in strings (None: not known)."""
    if region is not None:
        return region.byte_size if datatype != BYTES else None
    if raw:
        if raw_index >= len(raw):
            return None
        return len(raw[raw_index]) if datatype != BYTES else string_count(raw[raw_index])
    if datatype == BYTES:
        return len(tensor.contents.bytes_contents)
    field = _CONTENTS_FIELD.get(datatype)
    return len(getattr(tensor.contents, field)) * ELEMENT_SIZE[datatype] if field is not None else None


def _check_names_and_batch(spec: ModelSpec, headers: Sequence[_InputHeader]) -> None:
    """Raise what Triton's core refuses first of the inputs' names and batch dimensions (ModelSpec.first_refusal)."""
    refusal = spec.first_refusal([(header.name, header.shape) for header in headers])
    if refusal is not None:
        raise refusal


def _check_later_inputs(
    spec: ModelSpec,
    all_headers: Sequence[_InputHeader],
    failed: int,
    tensors: Sequence[Message],
    raw: Sequence[Buffer],
) -> None:
    """Check the inputs after `all_headers[failed]` (the first to fail) that Triton's core visits before it.

    `tensors` and `raw` are those inputs' messages and raw contents. Triton's core checks each input's datatype,
    shape and byte size in its hash map's order (core/hash_map_order.py): of several inputs that fail, it names the
    first it visits. A BYTES input's size is its count of strings (raw contents or `bytes_contents`; in a region
    they are not read here), checked in the same visit: 2.51 names a batching model's BYTES input of too many
    strings before a later-visited input of another datatype. Names are distinct (_check_names_once).
    """
    headers = all_headers[failed + 1 :]
    later: List[Tuple[str, str, Sequence[int], Optional[int], Optional[Buffer]]] = []
    raw_left = iter(raw)
    for header, tensor in zip(headers, tensors):
        datatype = header.datatype if header.known_datatype else "<invalid>"
        element_size = ELEMENT_SIZE.get(datatype)
        given: Optional[int] = None
        content: Optional[Buffer] = None
        if header.region is not None:
            given = header.region.byte_size if datatype != BYTES else None  # its strings are not read here
        elif raw:
            content = next(raw_left, None)
            given = len(content) if content is not None else None
        elif header.has_contents and element_size is not None:
            field = _CONTENTS_FIELD.get(datatype)
            given = len(getattr(tensor.contents, field)) * element_size if field is not None else 0
        elif header.has_contents and datatype == BYTES:
            given = len(tensor.contents.bytes_contents)  # its count of strings
        later.append((header.name, datatype, header.shape, given, content))
    names = [header.name for header in all_headers]
    shapes = [(header.name, header.shape) for header in all_headers]
    for index in visited_before(names, names[failed], [header.name for header in headers]):
        name, datatype, shape, given, content = later[index]
        if shape and not shape[0]:  # a batch of 0 names its data's size (a BYTES input's in strings), or is read in
            size = string_count(content) if datatype == BYTES and content is not None else given  # the request's rows
            rows = spec.empty_batch_rows(shapes) if spec.batching else None
            spec.check_input(name, datatype, shape, True, size, rows)
            if rows is not None:
                shape = spec.rows_shape(shape, rows)
        else:
            spec.check_input(name, datatype, shape, True)
        element_size = ELEMENT_SIZE.get(datatype)
        if element_size is not None and given is not None and given != element_count(shape) * element_size:
            raise InferenceError.invalid_input(
                f"input byte size mismatch for input '{name}' for model '{spec.name}'. Expected "
                f"{element_count(shape) * element_size}, got {given}"
            )
        if datatype == BYTES:
            _check_later_strings(content, given, shape, name, spec.name)


def _check_later_strings(
    content: Optional[Buffer], given: Optional[int], shape: Sequence[int], name: str, model: str
) -> None:
    """Raise the core's refusal of a BYTES input's strings: a wrong count (of raw `content`, or `given` typed).

    A last string cut short is not the core's refusal (the model's, later): passed here.
    """
    count = element_count(shape)
    if content is not None:
        try:
            deserialize_bytes_tensor(content, name, model, count)
        except InferenceError as error:
            if not error.in_response:
                raise
    elif given is not None and given != count:
        _check_string_count(count, given, name, model)


def request_parameters_from_message(parameters: Mapping[str, Message]) -> Dict[str, Any]:
    """A request's parameters as plain Python values, the reserved ones checked first as Triton's gRPC frontend does.

    Triton reads a negative int64 `timeout` as unsigned: a timeout too far off to matter, so it is left out; and a
    negative `sequence_id` as the unsigned id of the same bits.
    """
    for key, kinds in _RESERVED_KINDS.items():
        parameter = parameters.get(key)
        if parameter is None:
            continue
        choice = parameter.WhichOneof("parameter_choice")
        if choice not in kinds:
            raise InferenceError.invalid(f"invalid value type for '{key}' parameter, expected {' or '.join(kinds)}.")
        if key == "priority" and parameter.int64_param < 0:
            raise InferenceError.invalid("invalid value for 'priority', expected value >= 0.")
    for key in _in_order(parameters):
        if key in _RESERVED_KINDS:
            continue
        choice = parameters[key].WhichOneof("parameter_choice")
        if key == EMPTY_FINAL_RESPONSE_PARAMETER:
            if choice != "bool_param":
                raise InferenceError.invalid(f"invalid value type for '{key}' parameter, expected bool_param.")
        elif key.startswith("triton_"):
            if choice is None:  # refused for its name, as any `triton_` key, before its value (tritonserver 2.51)
                raise InferenceError.invalid(GRPC_RULES.triton_prefix_refusal)
        elif choice not in _PLAIN_KINDS:  # Triton's words (it takes doubles too)
            raise InferenceError.invalid(
                f"invalid value type for '{key}' parameter, expected int64_param, bool_param, or string_param."
            )
    values = parameters_from_message(parameters)
    if values.get("timeout", 0) < 0:
        del values["timeout"]
    sequence_id = values.get("sequence_id")
    if isinstance(sequence_id, int) and sequence_id < 0:  # an int64 Triton reads as the uint64 it stands for
        values["sequence_id"] = sequence_id + (1 << 64)
    return values


# The kinds of value Triton's gRPC frontend takes for its reserved parameters.
_RESERVED_KINDS = {
    "sequence_id": ("int64_param", "string_param"),
    "sequence_start": ("bool_param",),
    "sequence_end": ("bool_param",),
    "priority": ("int64_param", "uint64_param"),
    "timeout": ("int64_param",),
}


# The kinds of value Triton's gRPC frontend takes for a request's other parameters.
_PLAIN_KINDS = ("int64_param", "bool_param", "string_param", "double_param")


def _in_order(parameters: Mapping[str, Message]) -> Any:
    """A protobuf map's keys in one order in every process: sorted.

    upb iterates a map in an order its hash seed, the address of a static, picks anew in each process: the
    frontend processes of one server refused a request with two bad parameters each for another one, and a
    callable saw its request's parameters in another order in each.
    """
    return sorted(parameters) if len(parameters) > 1 else parameters


def parameters_from_message(parameters: Mapping[str, Message], valueless: bool = False) -> Dict[str, Any]:
    """A protobuf map<string, InferParameter> as plain Python values; one without a value is refused.

    With `valueless`, one without a value is left out (Triton reads a tensor's parameters by name, and takes
    those it does not read, with or without a value).
    """
    values: Dict[str, Any] = {}
    for key in _in_order(parameters):  # not .items(): a protobuf map's items view is Python code, a third of the cost
        parameter = parameters[key]
        choice = parameter.WhichOneof("parameter_choice")
        if choice is None:
            if valueless:
                continue
            raise InferenceError.invalid(f"parameter '{key}' has no value")
        values[key] = getattr(parameter, choice)
    return values


def _check_names_once(tensors: Sequence[Message]) -> None:
    """Refuse the first input whose name an earlier one has, as Triton's gRPC frontend does before it reads any data."""
    seen: Set[str] = set()
    for tensor in tensors:
        if tensor.name in seen:
            raise InferenceError.invalid_input(f"input '{tensor.name}' already exists in request")
        seen.add(tensor.name)


def _check_input_data(
    model: str,
    headers: Sequence[_InputHeader],
    message: Message,
    raw_count: int,
    find_regions: bool = False,
    memory: Optional[SystemSharedMemory] = None,
) -> None:
    """Check that each input has data, in one place only, as Triton's gRPC frontend does before its core runs.

    `raw_count` is the number of the request's raw contents. With `find_regions`, an input's region is looked up in
    `memory` (a region not registered, or a range outside it, refused) as the frontend reads that input, before the
    next one.
    """
    has_raw, raw_left = raw_count > 0, raw_count
    for index, header in enumerate(headers):
        name = header.name
        region = header.region
        if region is not None:
            if header.has_contents:
                raise InferenceError.invalid(_contents_in_shared_memory(name, model))
            if find_regions:
                (memory or _memory(memory)).check(region.region, region.offset, region.byte_size)
        elif header.has_contents:
            if has_raw:
                raise InferenceError.invalid(
                    f"contents field must not be specified when using raw_input_contents for '{name}' for model "
                    f"'{model}'"
                )
            datatype = header.datatype if header.known_datatype else "<invalid>"
            _check_contents_fields(message.inputs[index].contents, datatype, name, model)
        elif raw_left:
            raw_left -= 1
        else:
            raise InferenceError.invalid(_no_data(name, model))


def _contents_in_shared_memory(name: str, model: str) -> str:
    """Triton's message for an input in shared memory that has typed contents too."""
    return f"unexpected 'content' provided when using shared memory for input tensor '{name}' for model '{model}'"


def _no_data(name: str, model: str) -> str:
    """Triton's message for an input that has no data in the request."""
    return f"unable to find data for input tensor '{name}' for model '{model}' in request."


def array_from_contents(contents: Message, datatype: str, shape: Sequence[int], name: str, model: str) -> np.ndarray:
    """Build an array from the typed `contents` of input `name` of `model`, as Triton's gRPC frontend reads them.

    The fields set are checked first (`_check_contents_fields`). An integer too wide for an 8- or 16-bit datatype
    keeps its low bytes (Triton copies them out of the 32-bit value), and contents with no field set are data of
    no bytes.
    """
    field = _check_contents_fields(contents, datatype, name, model)
    values: Sequence[Any] = getattr(contents, field) if field is not None else ()
    count = element_count(shape)
    if datatype == BYTES:
        _check_string_count(count, len(values), name, model)
        return object_array(list(values)).reshape(shape)
    size = ELEMENT_SIZE[datatype]
    if len(values) != count:
        raise InferenceError.invalid_input(
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected {count * size}, "
            f"got {len(values) * size}"
        )
    if field is None:
        return np.empty(shape, numpy_dtype(datatype))  # no values (count is 0)
    wraps = _WRAPPED.get(datatype)
    if wraps is not None:  # Triton keeps the low bytes of each 32-bit value
        return np.array(values, wraps).astype(numpy_dtype(datatype)).reshape(shape)
    return numeric_array(list(values), numpy_dtype(datatype)).reshape(shape)


def _check_contents_fields(contents: Message, datatype: str, name: str, model: str) -> Optional[str]:
    """The contents field of `datatype` (None for FP16 and BF16, which have none), the fields set checked.

    Triton looks at them in their order: the first one set must be the datatype's, any later one set is data
    "already supplied".
    """
    field = _CONTENTS_FIELD.get(datatype)
    found = False
    for other, _ in contents.ListFields():  # the fields that hold values, in field order (Triton's order)
        if found:
            raise InferenceError.invalid(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model}', binary data was "
                "already supplied."
            )
        if other.name != field:
            raise InferenceError.invalid(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model}' of type "
                f"'{_CONTENTS_TYPE[other.name]}', expected datatype '{datatype}'"
            )
        found = True
    return field


# The 32-bit type Triton's gRPC frontend reads an 8- or 16-bit datatype's contents as (it keeps their low bytes).
_WRAPPED = {"INT8": np.int32, "INT16": np.int32, "UINT8": np.uint32, "UINT16": np.uint32}


def _check_string_count(count: int, got: int, name: str, model: str) -> None:
    """Refuse `got` strings for a BYTES input of `count` elements, in the words of Triton's core.

    Its check stops at the first element too many, which it names: count + 1.
    """
    if got > count:
        raise InferenceError.invalid_input(
            f"unexpected number of string elements {count + 1} for inference input '{name}' for model '{model}', "
            f"expecting {count}"
        )
    if got < count:
        raise InferenceError.invalid_input(
            f"expected {count} string elements for inference input '{name}' for model '{model}', got {got}"
        )


def _requested_outputs(
    spec: ModelSpec, outputs: Sequence[_OutputHeader], memory: Optional[SystemSharedMemory], checked: bool = False
) -> Tuple[Optional[List[str]], Optional[Dict[str, TensorRegion]], Optional[Dict[str, int]]]:
    """The requested output names (None = all), the regions of those to write into shared memory, class counts.

    The regions are checked in `memory`, unless `checked` (they were, in the registry as it still is).
    """
    if not outputs:
        return None, None, None
    names: Dict[str, None] = {}  # in order; a dict, as a list's lookups made 100,000 names minutes of CPU
    regions: Dict[str, TensorRegion] = {}
    classes: Dict[str, int] = {}
    for name, count, region in outputs:
        if count and name not in classes:  # named again: the first class count asked for, as Triton answers
            classes[name] = count
        if region is not None:
            if not checked:
                (memory or _memory(memory)).check(region.region, region.offset, region.byte_size)
            regions[name] = region
        names[name] = None  # named again: one output, as Triton answers
    ordered = list(names)
    spec.check_requested_outputs(ordered)
    return ordered, regions or None, classes or None


# A requested output: its name, classification count (0: none) and region (None: not in shared memory).
_OutputHeader = Tuple[str, int, Optional[TensorRegion]]


def _output_headers(outputs: Sequence[Message]) -> List[_OutputHeader]:
    """What a request says of its requested outputs."""
    return [(output.name, 0, None) if not output.parameters else _output_header(output) for output in outputs]


class _MessagePlan:
    """What a request message says besides its tensors' data, read once per distinct message (`_PLANS`).

    Only what the message itself says: each request still checks it against the model, and its regions against
    those registered. Kept only for a message whose every part was read without error (`outputs` not None): one
    in error is read again in the order Triton checks it; and without typed contents, which are data.
    """

    __slots__ = (
        "faulty",
        "in_regions",
        "input_error",
        "inputs",
        "located",
        "message",
        "options",
        "outputs",
        "parameters",
        "raw_count",
        "repeated",
        "typed",
        "user_parameters",
    )

    def __init__(self, message: Message) -> None:
        """Read the inputs' headers, the request's parameters and (when they are right) the requested outputs."""
        self.message = message  # parsed once for every request of the same bytes (`kept_message`)
        # An input's wrong shared-memory parameters, raised by the request after its own parameters and names are
        # checked (Triton reads them as it reads the inputs' data).
        self.input_error: Optional[InferenceError] = None
        try:
            self.inputs = [_input_header(tensor) for tensor in message.inputs]
            count = len(self.inputs)
            self.repeated = count > 1 and len(set(map(_NAME, self.inputs))) != count  # an input named twice
        except InferenceError as error:
            self.input_error = error
            self.inputs = _headers_before_error(message.inputs)
            names = [tensor.name for tensor in message.inputs]
            self.repeated = len(set(names)) != len(names)
        self.faulty = self.repeated or self.input_error is not None  # one check for the request's common path
        self.raw_count = sum(1 for header in self.inputs if header.region is None)
        self.in_regions = self.raw_count < len(self.inputs)  # some input is in shared memory
        self.typed = any(header.has_contents for header in self.inputs)
        parameters = message.parameters
        self.parameters = request_parameters_from_message(parameters) if parameters else None
        self.user_parameters: Dict[str, Any] = {}
        self.options: Optional[RequestOptions] = None
        self.outputs: Optional[List[_OutputHeader]] = None
        # Its regions as a request found them in a registry of that generation (`Located`): None until then.
        self.located: Optional[Located] = None
        try:
            self.user_parameters, self.options = split_parameters(self.parameters, None, GRPC_RULES)
            if self.input_error is None and not self.repeated:
                self.outputs = _output_headers(message.outputs)
        except InferenceError:  # raised again by the request, in its turn
            pass


_NAME = operator.attrgetter("name")


def _headers_before_error(tensors: Sequence[Message]) -> List[_InputHeader]:
    """The headers of the inputs before the first whose parameters are wrong."""
    headers: List[_InputHeader] = []
    for tensor in tensors:
        try:
            headers.append(_input_header(tensor))
        except InferenceError:
            break
    return headers


# Plans of the request messages seen last, by their bytes (small messages only: wire.KEYED_MESSAGE_BYTES). A
# client whose tensors are in shared memory sends the same message again and again.
_PLANS: Dict[bytes, _MessagePlan] = {}


def kept_message(data: bytes) -> Optional[Message]:
    """The message of these bytes as parsed for a plan kept of it (nothing writes into a received message), if any.

    A message of headers alone (its tensors in shared memory) comes again and again, and protobuf takes longer to
    parse its parameter maps (0.7 us) than the rest of the codec to read it; only plans of such messages are kept.
    """
    plan = _PLANS.get(data)
    return plan.message if plan is not None else None


class _InputHeader:
    """What a request says of one input besides its data: read once per distinct tensor message (`_input_header`)."""

    __slots__ = ("datatype", "has_contents", "known_datatype", "name", "region", "shape")

    def __init__(self, tensor: Message, has_contents: bool) -> None:
        """Read an InferInputTensor (its shared-memory parameters checked: InferenceError when they are wrong)."""
        self.region = _region(tensor.parameters, "input", tensor) if tensor.parameters else None
        self.name: str = tensor.name
        self.datatype: str = tensor.datatype
        self.shape: Tuple[int, ...] = tuple(tensor.shape)
        self.known_datatype = is_known_datatype(self.datatype)
        self.has_contents = has_contents


# Headers of the input and output tensor messages seen last, by their serialized bytes: a client sends the same
# tensors again and again (the same names, shapes and shared-memory regions), and reading a parameter map out of
# protobuf costs microseconds where serializing the tensor back costs a fifth of one. Only what the message
# itself says is kept: each request still checks it against the model, and its regions against those registered.
_INPUT_HEADERS: Dict[bytes, _InputHeader] = {}
_OUTPUT_HEADERS: Dict[bytes, _OutputHeader] = {}
_KEPT_HEADERS = 1024  # per kind; when full, the cache starts over
_KEPT_HEADER_BYTES = 1024  # larger tensor messages (long parameters) are read each time


def _input_header(tensor: Message) -> _InputHeader:
    """The header of an input tensor message; those without typed contents are read once per distinct message."""
    if tensor.HasField("contents"):  # its values: never a key
        return _InputHeader(tensor, True)
    key: bytes = tensor.SerializeToString()
    header = _INPUT_HEADERS.get(key)
    if header is None:
        header = _InputHeader(tensor, False)
        if len(key) <= _KEPT_HEADER_BYTES:
            if len(_INPUT_HEADERS) >= _KEPT_HEADERS:
                _INPUT_HEADERS.clear()
            _INPUT_HEADERS[key] = header
    return header


def _output_header(output: Message) -> Tuple[str, int, Optional[TensorRegion]]:
    """(name, classification count, region) of a requested output with parameters, read once per distinct message."""
    key: bytes = output.SerializeToString()
    header = _OUTPUT_HEADERS.get(key)
    if header is None:
        header = _read_output_header(output)
        if len(key) <= _KEPT_HEADER_BYTES:
            if len(_OUTPUT_HEADERS) >= _KEPT_HEADERS:
                _OUTPUT_HEADERS.clear()
            _OUTPUT_HEADERS[key] = header
    return header


def _read_output_header(output: Message) -> Tuple[str, int, Optional[TensorRegion]]:
    """(name, classification count, region) of a requested output with parameters."""
    parameters = output.parameters
    if "classification" not in parameters:
        return output.name, 0, _region(parameters, "output", output)
    _check_region_parameters(parameters, output.name)  # Triton's order: these, the count, then both together
    count = parameters["classification"]  # Triton takes an int64_param above 0 only, in these words
    if count.WhichOneof("parameter_choice") != "int64_param":
        raise InferenceError.invalid("invalid value type for 'classification' parameter, expected int64_param")
    if count.int64_param <= 0:
        raise InferenceError.invalid("invalid value for 'classification' parameter, expected >= 0")
    if REGION in parameters:
        raise InferenceError.invalid("output can't set both 'shared_memory_region' and 'classification'")
    return output.name, count.int64_param, _region(parameters, "output", output)


def _region(parameters: Mapping[str, Message], kind: str, tensor: Message) -> Optional[TensorRegion]:
    """The shared-memory region the parameters of a tensor (an input or output `kind`) name, if any."""
    if not parameters:
        return None
    if REGION in parameters and BYTE_SIZE in parameters and len(parameters) == (3 if OFFSET in parameters else 2):
        found = _plain_region(parameters)  # what clients send, read straight from the messages
        if found is not None:
            return found
    return generic_region(parameters, kind, tensor.name)


def generic_region(parameters: Mapping[str, Message], kind: str, name: str) -> Optional[TensorRegion]:
    """`_region` of any parameters: Triton's checks of their kinds (`_check_region_parameters`), then the values."""
    _check_region_parameters(parameters, name)
    values = parameters_from_message(parameters, valueless=True)
    for key in (OFFSET, BYTE_SIZE):  # int64s Triton casts to size_t: -1 is an offset or size past any region
        value = values.get(key)
        if type(value) is int and value < 0:
            values[key] = value + 2**64
    return tensor_region(values, kind, name)


def _check_region_parameters(parameters: Mapping[str, Message], name: str) -> None:
    """Check a tensor's shared-memory parameters as Triton's gRPC frontend does (ParseSharedMemoryParams).

    In its words: the region a string, the offset and byte size int64s and only with a region, the size required.
    """
    region = parameters.get(REGION)
    if region is not None and region.WhichOneof("parameter_choice") != "string_param":
        raise InferenceError.invalid(
            f"invalid value type for '{REGION}' parameter for tensor '{name}', expected string_param."
        )
    for key in (OFFSET, BYTE_SIZE):
        value = parameters.get(key)
        if value is None:
            continue
        if region is None:
            raise InferenceError.invalid(
                f"'{key}' can not be specified without '{REGION}' parameter for tensor '{name}'"
            )
        if value.WhichOneof("parameter_choice") != "int64_param":
            raise InferenceError.invalid(
                f"invalid value type for '{key}' parameter for tensor '{name}', expected int64_param."
            )
    if region is not None and BYTE_SIZE not in parameters:
        raise InferenceError.invalid(
            f"'{BYTE_SIZE}' must be specified along with '{REGION}' parameter for tensor '{name}'"
        )


_UNSIGNED_CHOICES = ("int64_param",)  # Triton takes no uint64_param for these


def _plain_region(parameters: Mapping[str, Message]) -> Optional[TensorRegion]:
    """A region named by a string and sized (and placed) by non-negative integers; None for anything else."""
    region, size = parameters[REGION], parameters[BYTE_SIZE]
    size_choice = size.WhichOneof("parameter_choice")
    if region.WhichOneof("parameter_choice") != "string_param" or size_choice not in _UNSIGNED_CHOICES:
        return None
    offset = 0
    if OFFSET in parameters:
        place = parameters[OFFSET]
        offset_choice = place.WhichOneof("parameter_choice")
        if offset_choice not in _UNSIGNED_CHOICES:
            return None
        offset = getattr(place, offset_choice)
    name: str = region.string_param
    byte_size: int = getattr(size, size_choice)
    return TensorRegion(name, offset, byte_size) if name and byte_size >= 0 and offset >= 0 else None


def _memory(memory: Optional[SystemSharedMemory]) -> SystemSharedMemory:
    """The regions shared-memory tensors are in (always given by the servicer)."""
    if memory is None:
        raise InferenceError.invalid("this call does not take tensors in shared memory")
    return memory


class EncodedResponse:
    """A ModelInferResponse without raw_output_contents, plus those contents as buffers not yet copied."""

    __slots__ = ("message", "raw_outputs")

    def __init__(self, message: Message, raw_outputs: List[Buffer]) -> None:
        """Pair the response header message with its raw output buffers (one per output, in order)."""
        self.message = message
        self.raw_outputs = raw_outputs

    def to_message(self) -> Message:
        """The complete ModelInferResponse (copies the outputs; the server serializes without it)."""
        message = service_pb2.ModelInferResponse()
        message.CopyFrom(self.message)
        message.raw_output_contents.extend(bytes(raw) for raw in self.raw_outputs)
        return message


def encode_infer_response(
    spec: ModelSpec,
    request_id: str,
    response: InferenceResponse,
    final: Optional[bool] = None,
    decoded: Optional[DecodedRequest] = None,
    memory: Optional[SystemSharedMemory] = None,
    deferred: Optional[List[WriteRun]] = None,
    place: int = ANYWHERE,
) -> EncodedResponse:
    """A response with raw outputs; `final` sets the triton_final_response parameter (streams).

    Outputs `decoded` placed in shared memory are written into their regions of `memory` and have empty contents;
    with `deferred`, large writes are added there, for the caller to carry out (`off_loop.write_off_loop`).
    `place`: where this runs (ON_LOOP: a BYTES output of many strings raises OffLoop).
    """
    message = service_pb2.ModelInferResponse(model_name=spec.name, model_version=spec.version_str, id=request_id)
    add_output = message.outputs.add
    raw_outputs: List[Buffer] = []
    writes: List[Write] = []
    regions = (decoded.regions if decoded is not None else None) or {}
    classes = decoded.classes if decoded is not None else None
    for output in response.outputs:
        if classes is not None and output.name in classes:
            declared = spec.output_by_name.get(output.name)
            labels = declared.labels if declared is not None else None
            output = top_classes(output, classes[output.name], spec.batching, spec.name, labels)
        add_output(name=output.name, datatype=output.datatype, shape=output.array.shape)
        region = regions.get(output.name)
        if region is not None:
            writes.append(output_write(region, output))
            raw_outputs.append(b"")
        else:
            if output.datatype == BYTES and place == ON_LOOP and output.array.size >= OFF_LOOP_VALUES:
                raise OffLoop
            raw_outputs.append(raw_from_array(output.array, output.datatype))
    if writes:
        (memory or _memory(memory)).write_all(writes, deferred)
    if spec.ensemble is not None and response.outputs:  # Triton's ensemble answers with its steps' sequence
        # parameters (an answer without outputs, a step having left them out, with none)
        given = {**ENSEMBLE_RESPONSE_PARAMETERS, **(response.parameters or {})}
        sequence_id = given["sequence_id"]
        if isinstance(sequence_id, str):
            message.parameters["sequence_id"].string_param = sequence_id
        else:  # an unsigned id over int64's range is sent as the int64 of the same bits, as Triton's
            message.parameters["sequence_id"].int64_param = (
                sequence_id - (1 << 64) if sequence_id >= 1 << 63 else sequence_id
            )
        message.parameters["sequence_start"].bool_param = bool(given["sequence_start"])
        message.parameters["sequence_end"].bool_param = bool(given["sequence_end"])
    if final is not None:
        message.parameters[FINAL_RESPONSE_PARAMETER].bool_param = final
    return EncodedResponse(message, raw_outputs)


def empty_final_response(spec: ModelSpec, request_id: str, asked_version: str = "") -> EncodedResponse:
    """The response without outputs that closes a stream request (triton_enable_empty_final_response).

    As Triton's, it names the version the request asked for (none when it asked for none), not the one that ran.
    """
    message = service_pb2.ModelInferResponse(model_name=spec.name, model_version=asked_version, id=request_id)
    message.parameters[FINAL_RESPONSE_PARAMETER].bool_param = True
    return EncodedResponse(message, [])


def stream_error(
    request_id: str, error_message: str, spec: Optional[ModelSpec] = None, asked_version: str = ""
) -> Message:
    """A ModelStreamInferResponse carrying an error, as Triton's: the request's id, and the model's.

    The model's name, the version the request asked for (none when it asked for none, as nvidia-pytriton 0.7
    answered), and the final-response flag, only when it failed in the model (`spec`).
    """
    infer_response = service_pb2.ModelInferResponse(id=request_id)
    if spec is not None:
        infer_response.model_name = spec.name
        infer_response.model_version = asked_version
        infer_response.parameters[FINAL_RESPONSE_PARAMETER].bool_param = True
    return service_pb2.ModelStreamInferResponse(error_message=error_message, infer_response=infer_response)


def server_metadata(name: str, version: str) -> Message:
    """ServerMetadataResponse."""
    return json_format.ParseDict(documents.server_metadata(name, version), service_pb2.ServerMetadataResponse())


def model_metadata(spec: ModelSpec) -> Message:
    """ModelMetadataResponse."""
    return json_format.ParseDict(documents.model_metadata(spec), service_pb2.ModelMetadataResponse())


def model_config(spec: ModelSpec) -> Message:
    """ModelConfigResponse holding the model config the HTTP /config endpoint shows."""
    config = json_format.ParseDict(
        documents.model_config(spec), model_config_pb2.ModelConfig(), ignore_unknown_fields=True
    )
    return service_pb2.ModelConfigResponse(config=config)


def model_statistics(models: List[ServedModel]) -> Message:
    """ModelStatisticsResponse, built field by field from the statistics document the HTTP API answers.

    json_format.ParseDict walked the descriptors in Python: 85 us a model, 134 ms of the loop for 1,600 models.
    """
    document = documents.model_statistics(models)
    return service_pb2.ModelStatisticsResponse(model_stats=[_model_stats(entry) for entry in document["model_stats"]])


def _model_stats(entry: Dict[str, Any]) -> Message:
    """One ModelStatistics from its document (core/stats.py's `as_dict`)."""
    durations = service_pb2.StatisticDuration
    return service_pb2.ModelStatistics(
        name=entry["name"],
        version=entry["version"],
        last_inference=entry["last_inference"],
        inference_count=entry["inference_count"],
        execution_count=entry["execution_count"],
        inference_stats=service_pb2.InferStatistics(
            **{key: durations(**value) for key, value in entry["inference_stats"].items()}
        ),
        response_stats={
            key: service_pb2.InferResponseStatistics(**{name: durations(**value) for name, value in stats.items()})
            for key, stats in entry["response_stats"].items()
        },
        batch_stats=[
            service_pb2.InferBatchStatistics(
                **{key: value if key == "batch_size" else durations(**value) for key, value in batch.items()}
            )
            for batch in entry["batch_stats"]
        ],
        memory_usage=[service_pb2.MemoryUsage(**usage) for usage in entry["memory_usage"]],
    )


def repository_index(entries: List[RepositoryEntry], ready_only: bool) -> Message:
    """RepositoryIndexResponse (only ready models when asked)."""
    shown = documents.repository_index([entry for entry in entries if entry.ready or not ready_only])
    return json_format.ParseDict({"models": shown}, service_pb2.RepositoryIndexResponse())


def check_load_parameters(parameters: Mapping[str, Message]) -> None:
    """Refuse a RepositoryModelLoad's parameters as Triton's gRPC frontend does, before any load is tried.

    Raises:
        InferenceError: INVALID_ARGUMENT, for a parameter other than `config` and `file:...`, a `config`
            that is not a string_param, or a `file:...` that is not a bytes_param.
    """
    for key, value in parameters.items():
        if key == "config":
            if value.WhichOneof("parameter_choice") != "string_param":
                raise InferenceError.invalid("invalid value type for load parameter 'config', expected string_param.")
        elif key.startswith("file:"):
            if value.WhichOneof("parameter_choice") != "bytes_param":
                raise InferenceError.invalid(f"invalid value type for load parameter '{key}', expected bytes_param.")
        else:
            raise InferenceError.invalid(f"unrecognized load parameter '{key}'.")


def check_unload_parameters(parameters: Mapping[str, Message]) -> None:
    """Refuse a RepositoryModelUnload's `unload_dependents` that is no bool_param, as Triton's gRPC frontend does.

    Triton reads no other parameter of an unload; the model is not unloaded when this refuses.

    Raises:
        InferenceError: INVALID_ARGUMENT, in Triton's words.
    """
    dependents = parameters.get("unload_dependents")
    if dependents is not None and dependents.WhichOneof("parameter_choice") != "bool_param":
        raise InferenceError.invalid("invalid value type for 'unload_dependents' parameter, expected bool_param.")
