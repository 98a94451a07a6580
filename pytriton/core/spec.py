"""A bound model's static description and the request checks that follow from it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from pytriton.core.ensemble_graph import EnsembleGraph
from pytriton.core.errors import InferenceError, Status
from pytriton.core.hash_map_order import hash_map_order, visited_before
from pytriton.core.tensors.datatypes import BYTES, ELEMENT_SIZE
from pytriton.model_config.common import DynamicBatcher, QueuePolicy
from pytriton.model_config.sequence import SequenceBatcher
from pytriton.model_config.triton_model_config import TensorSpec

Shape = Tuple[int, ...]


# What Triton adds to a shape error of a model with batching (and, without, the ". " it ends with alone).
_BATCH_DIMENSION_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to "
    "each input shape. If you want to specify the full shape including the batch dim in your input dims config, "
    "try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)


@dataclasses.dataclass(frozen=True)
class TensorDef:
    """A model tensor as the engine sees it: name, protocol datatype, dims without batch axis.

    An input may have an image `format` (FORMAT_NCHW, FORMAT_NHWC); an output its classification `labels` (by
    class index) and the name of the file they came from (`label_filename`), as Triton's model config shows them.
    """

    name: str
    datatype: str
    dims: Shape
    optional: bool = False
    format: str = "FORMAT_NONE"
    labels: Optional[Tuple[str, ...]] = None
    label_filename: str = ""


class EmptyBatchError(InferenceError):
    """The refusal of an input of batch size 0, with what it was made of: rows again once the request's are known."""

    def __init__(
        self, message: str, name: str, datatype: str, dims: Sequence[int], data_bytes: Optional[int], fits: bool
    ) -> None:
        """The error of `message` (Triton's core's words, of the request) for input `name` of `dims` past its batch.

        `fits`: the data is that of the rows Triton expects, and they have elements (tritonserver 2.51 serves it).
        """
        super().__init__(Status.INVALID_ARGUMENT, message)
        self.of_request = True
        self.input = (name, datatype, tuple(dims), data_bytes)
        self.fits = fits


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Everything the engine needs to know about a bound model, resolved once at bind time."""

    name: str
    version: int
    inputs: Tuple[TensorDef, ...]
    outputs: Tuple[TensorDef, ...]
    max_batch_size: int
    batcher: Optional[DynamicBatcher]
    decoupled: bool
    response_cache: bool
    instance_count: int
    strict: bool
    input_specs: Tuple[TensorSpec, ...] = ()
    output_specs: Tuple[TensorSpec, ...] = ()
    # The config's `parameters` (name, string value), as a load's config override sets them.
    parameters: Tuple[Tuple[str, str], ...] = ()
    # The inputs of each warm-up request, run on every instance before the model is ready.
    warmup: Tuple[Dict[str, np.ndarray], ...] = dataclasses.field(default=(), repr=False, compare=False)
    # Server limits the engine applies to the model's requests (0: none).
    max_tensor_elements: int = 0
    max_response_bytes: int = 0
    # Triton's sequence batcher (then `batcher` is None): requests belong to sequences, each holding one slot.
    sequence_batcher: Optional[SequenceBatcher] = None
    # How the model answers the OpenAI API (options/openai.py: OpenAIChat, ...); None: it does not.
    openai: Any = None
    # An ensemble's steps (core/scheduling/ensemble.py runs them); None: the model runs a callable on its instances.
    ensemble: Optional[EnsembleGraph] = None
    input_by_name: Mapping[str, TensorDef] = dataclasses.field(init=False, repr=False, compare=False)
    output_by_name: Mapping[str, TensorDef] = dataclasses.field(init=False, repr=False, compare=False)
    required_inputs: FrozenSet[str] = dataclasses.field(init=False, repr=False, compare=False)
    output_names: Tuple[str, ...] = dataclasses.field(init=False, repr=False, compare=False)
    input_names: Tuple[str, ...] = dataclasses.field(init=False, repr=False, compare=False)
    # Whether the first dimension of each tensor is the batch.
    batching: bool = dataclasses.field(init=False, repr=False, compare=False)
    # The version as the wire shows it.
    version_str: str = dataclasses.field(init=False, repr=False, compare=False)
    # Inner calls' signatures that passed the checks: the inputs' (name, dtype, shape) -> batch size, and the
    # outputs' (name, dtype) answered as they are -> their wire datatype, None where they need the checks
    # (core/composition/inner_call.py, core/outputs.py).
    passed_inputs: Dict[Tuple[Any, ...], int] = dataclasses.field(init=False, repr=False, compare=False)
    passed_outputs: Dict[Tuple[str, Any], Optional[str]] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Index tensors by name once."""
        object.__setattr__(self, "input_by_name", {tensor.name: tensor for tensor in self.inputs})
        object.__setattr__(self, "output_by_name", {tensor.name: tensor for tensor in self.outputs})
        object.__setattr__(self, "required_inputs", frozenset(t.name for t in self.inputs if not t.optional))
        object.__setattr__(self, "output_names", tuple(tensor.name for tensor in self.outputs))
        object.__setattr__(self, "input_names", tuple(tensor.name for tensor in self.inputs))
        object.__setattr__(self, "batching", self.max_batch_size > 0)
        object.__setattr__(self, "version_str", str(self.version))
        object.__setattr__(self, "passed_inputs", {})
        object.__setattr__(self, "passed_outputs", {})

    def queue_policy(self, level: int) -> QueuePolicy:
        """The queue policy of a priority level (the default policy where none is given)."""
        batcher = self.batcher
        if batcher is None:
            return QueuePolicy()
        if batcher.priority_queue_policy and level in batcher.priority_queue_policy:
            return batcher.priority_queue_policy[level]
        return batcher.default_queue_policy or QueuePolicy()

    def check_input(
        self,
        name: str,
        datatype: str,
        shape: Sequence[int],
        wildcards: bool = False,
        data_bytes: Optional[int] = None,
        rows: Optional[int] = None,
    ) -> int:
        """Check one input against the config; return its batch size (1 for non-batching models).

        With `wildcards` a -1 dimension gets the words of Triton's core (`_check_wildcards`): the gRPC frontend hands
        it negative dimensions, where the HTTP frontend refuses them as it reads the JSON. `data_bytes`, the size of
        the input's binary data when the caller knows it (of a BYTES input: its count of strings), is named in the
        refusal of a batch of 0. An input of batch size 0 whose data is that of the request's `rows`
        (empty_batch_rows; None: not known) passes, as tritonserver 2.51 serves it: its data is read in the shape
        rows_shape gives, and its batch size is `rows`, 1 for 0 (Triton's batcher and statistics count such a
        request as one).
        """
        tensor = self.input_by_name.get(name)
        if tensor is not None and datatype == tensor.datatype:
            batch_size = self._fits(tensor, shape)
            if batch_size >= 0:
                return batch_size
        return self._check_input(tensor, name, datatype, shape, wildcards, data_bytes, rows)

    def empty_batch_rows(self, inputs: Sequence[Tuple[str, Sequence[int]]]) -> Optional[int]:
        """The rows tritonserver 2.51 reads the data of a request's inputs of batch size 0 as (a batching model's).

        `inputs` are (name, shape), all of them. Its core takes the request's batch size from the first input its
        hash map visits whose batch dimension is not 0 (first_refusal), and gives each input visited before it that
        many rows: UINT8 `[0, 3]` beside `[2, 4]` is read as `[2, 3]`. Where every batch dimension is 0 the request
        has no batch size (0): each input is read in its shape past it (`[0, 3]` as `[3]`), and its model runs on
        that. None where first_refusal refuses the inputs, or the batch dimension is no int32.
        """
        if self.first_refusal(inputs) is not None:
            return None
        shapes = dict(inputs)
        for name in hash_map_order(list(shapes)):
            batch_size = shapes[name][0]
            if batch_size:
                return batch_size if 0 < batch_size < 2**31 else None
        return 0

    @staticmethod
    def rows_shape(shape: Sequence[int], rows: int) -> List[int]:
        """The shape tritonserver 2.51 reads an input of batch size 0 in, for the request's `rows` (0: none)."""
        return [rows, *shape[1:]] if rows else list(shape[1:])

    def in_declared_order(self, inputs: Dict[str, Any]) -> Dict[str, Any]:
        """A request's `inputs` in the order the model declares them (callers skip those in that order already).

        NVIDIA's PyTriton 0.7 hands a callable its request's inputs so (its proxy reads them by the config's names):
        `@batch`'s keyword arguments, a request's keys, and the batch size `@batch` reads off the first input.
        """
        return {name: inputs[name] for name in self.input_names if name in inputs}

    def first_refusal(self, inputs: Sequence[Tuple[str, Sequence[int]]]) -> Optional[InferenceError]:
        """What Triton's core refuses first of the inputs (name, shape, all of them), before any input's own checks.

        In its hash map's order (core/hash_map_order.py), each input: a name the model does not have; for a batching
        model, in the same visit, no shape, or a batch size other than the first visited's (an unknown name visited
        after an input whose batch size differs is not reached, as 2.51 answers). Then that batch size past
        max_batch_size. None when these pass. The batch size is its uint32: a batch dimension of 0 is no batch size
        yet, a negative one no other's.
        """
        shapes = dict(inputs)
        visited = [(name, shapes[name]) for name in hash_map_order([name for name, _ in inputs])]
        known = self.input_by_name
        if not self.batching:
            for name, _ in visited:
                if name not in known:
                    return InferenceError.invalid(f"unexpected inference input '{name}' for model '{self.name}'")
            return None
        batch_size = 0
        for name, shape in visited:
            if name not in known:
                return InferenceError.invalid(f"unexpected inference input '{name}' for model '{self.name}'")
            if not shape:
                return InferenceError.invalid_input(
                    f"input '{name}' has no shape but model requires batch dimension for '{self.name}'"
                )
            if not batch_size:
                batch_size = shape[0] & 0xFFFFFFFF
            elif shape[0] != batch_size:
                return InferenceError.invalid_input(
                    f"input '{name}' batch size does not match other inputs for '{self.name}'"
                )
        if batch_size < 2**31 and batch_size > self.max_batch_size:  # compared as an int
            return InferenceError.invalid_input(
                f"inference request batch-size must be <= {self.max_batch_size} for '{self.name}'"
            )
        return None

    def check_inputs_visited_before(
        self, inputs: Sequence[Tuple[str, str, Sequence[int]]], failed: int, wildcards: bool = False
    ) -> None:
        """check_input for the inputs after `inputs[failed]` (the first to fail, in order) that Triton checks first.

        Triton checks a request's inputs in its hash map's order (core/hash_map_order.py): of several inputs that
        fail, it names the first it visits. Raises at the first of them that fails.
        """
        names = [name for name, _, _ in inputs]
        later = inputs[failed + 1 :]
        for index in visited_before(names, names[failed], [name for name, _, _ in later]):
            name, datatype, shape = later[index]
            self.check_input(name, datatype, shape, wildcards)

    def _fits(self, tensor: TensorDef, shape: Sequence[int]) -> int:
        """The batch size of a well-formed shape for `tensor` (every check passes), -1 for any other shape."""
        wanted = tensor.dims
        if self.batching:
            if len(shape) != len(wanted) + 1:
                return -1
            batch_size = count = shape[0]
            if not 0 < batch_size <= self.max_batch_size:  # a batch of 0 is refused: _check_input
                return -1
            dims = shape[1:]
        else:
            if len(shape) != len(wanted):
                return -1
            batch_size, count, dims = 1, 1, shape
        for want, got in zip(wanted, dims):
            if got < 0 or (want != got and want != -1):
                return -1
            count *= got
        limit = self.max_tensor_elements
        if limit and (count > limit or (not count and shape and max(shape) > limit)):
            return -1
        return batch_size

    def _check_input(
        self,
        tensor: Optional[TensorDef],
        name: str,
        datatype: str,
        shape: Sequence[int],
        wildcards: bool = False,
        data_bytes: Optional[int] = None,
        rows: Optional[int] = None,
    ) -> int:
        """check_input's full checks, in Triton's order, each with its message."""
        if tensor is None:
            # Triton's one message of these without the request's id.
            raise InferenceError.invalid(f"unexpected inference input '{name}' for model '{self.name}'")
        if datatype != tensor.datatype:
            raise InferenceError.invalid_input(
                f"inference input '{name}' data-type is '{datatype}', but model '{self.name}' expects "
                f"'{tensor.datatype}'"
            )
        if shape and min(shape) < 0:
            if wildcards:
                self._check_wildcards(tensor, name, shape)
                if not self._rank_and_dims_fit(tensor, shape):  # the core's shape check comes first
                    raise self._shape_error(tensor, name, shape)
            raise InferenceError.invalid_input(f"invalid shape {list(shape)} for input '{name}': dims must be >= 0")
        dims = shape
        batch_size = 1
        if self.batching:
            if len(shape) == 0:
                raise InferenceError.invalid_input(
                    f"input '{name}' has no shape but model requires batch dimension for '{self.name}'"
                )
            batch_size = shape[0]
            if batch_size > self.max_batch_size:
                raise InferenceError.invalid_input(
                    f"inference request batch-size must be <= {self.max_batch_size} for '{self.name}'"
                )
            dims = shape[1:]
        wanted = tensor.dims
        if len(dims) != len(wanted) or (
            tuple(dims) != wanted and any(want != -1 and want != got for want, got in zip(wanted, dims))
        ):
            raise self._shape_error(tensor, name, shape)
        # This server's bound, after Triton's checks: a shape Triton refuses gets Triton's words.
        limit = self.max_tensor_elements
        if limit:
            count = math.prod(shape)
            if count > limit or (not count and shape and max(shape) > limit):
                raise InferenceError.invalid_input(
                    f"input '{name}' for model '{self.name}' has shape {_show(shape)}: more than the "
                    f"{limit} elements (or dimension) a tensor may have on this server"
                )
        if self.batching and batch_size == 0:
            error = self._empty_batch_error(name, datatype, dims, data_bytes, rows or 1)
            if rows is not None and error.fits:
                return rows or 1
            raise error
        return batch_size

    def _rank_and_dims_fit(self, tensor: TensorDef, shape: Sequence[int]) -> bool:
        """Whether `shape` (past a batching model's batch dimension) has the tensor's rank and its fixed dims."""
        dims = shape[1:] if self.batching else shape
        wanted = tensor.dims
        return len(dims) == len(wanted) and all(want in (-1, got) for want, got in zip(wanted, dims))

    def _shape_error(self, tensor: TensorDef, name: str, shape: Sequence[int]) -> InferenceError:
        """Triton's refusal of a shape that does not fit the input's dims (`unexpected shape`)."""
        expected = [-1, *tensor.dims] if self.batching else list(tensor.dims)
        note = _BATCH_DIMENSION_NOTE if self.batching else ""
        return InferenceError.invalid_input(
            f"unexpected shape for input '{name}' for model '{self.name}'. Expected {_show(expected)}, "
            f"got {_show(shape)}. {note}"
        )

    def _check_wildcards(self, tensor: TensorDef, name: str, shape: Sequence[int]) -> None:
        """Triton's answer to a -1 in a shape of the model's rank, before a dimension that does not fit.

        Its core walks the dimensions (past the batch dimension) and names a -1 there; other negative dimensions
        it multiplies into a byte size (`Expected -8`), where this server says the dimensions must be >= 0.
        """
        dims = shape
        if self.batching:
            if not shape or shape[0] < 0:
                return
            if shape[0] > self.max_batch_size:  # checked first
                raise InferenceError.invalid_input(
                    f"inference request batch-size must be <= {self.max_batch_size} for '{self.name}'"
                )
            dims = shape[1:]
        if len(dims) != len(tensor.dims):
            return
        for want, got in zip(tensor.dims, dims):
            if got == -1:
                raise InferenceError.invalid_input(
                    f"All input dimensions should be specified for input '{name}' for model '{self.name}', got "
                    f"{_show(shape)}"
                )
            if want not in (-1, got):
                return

    def _empty_batch_error(
        self, name: str, datatype: str, dims: Sequence[int], data_bytes: Optional[int] = None, rows: int = 1
    ) -> EmptyBatchError:
        """Triton 2.51's answer to an input of batch size 0 with `data_bytes` of binary data (none when not given).

        Of a BYTES input `data_bytes` is its count of strings: too many are named as Triton's core names them.

        Triton takes the request's batch size from the first input it visits with one (core/hash_map_order.py) and
        reads 0 as "no batch dimension yet": it expects the data of that many `rows` (one when no input has a batch
        size), and the request fails its byte-size check, in those words (`with_request_rows` sets the rows). Data of
        those rows passes (`fits`): 2.51 serves it, and check_input passes it where the request's rows are known.
        The model never runs on rows of no elements (`[0, 0]`): Triton's check passes and NVIDIA's PyTriton 0.7
        answers nothing (the request counts as a success), and this server says why.
        """
        count = rows * math.prod(dims)
        fits = data_bytes == (count if datatype == BYTES else count * ELEMENT_SIZE.get(datatype, 0))
        if count == 0 or fits:
            message = f"input '{name}' for model '{self.name}' has a batch size of 0: the model runs on one row or more"
        elif datatype == BYTES and data_bytes is not None and data_bytes > count:  # `data_bytes`: strings
            message = (
                f"unexpected number of string elements {count + 1} for inference input '{name}' for model "
                f"'{self.name}', expecting {count}"
            )
        elif datatype == BYTES:
            message = (
                f"expected {count} string elements for inference input '{name}' for model '{self.name}', got "
                f"{data_bytes or 0}"
            )
        else:
            message = (
                f"input byte size mismatch for input '{name}' for model '{self.name}'. "
                f"Expected {count * ELEMENT_SIZE.get(datatype, 0)}, got {data_bytes or 0}"
            )
        return EmptyBatchError(message, name, datatype, dims, data_bytes, fits and count > 0)

    def with_request_rows(self, error: InferenceError, inputs: Sequence[Tuple[str, Sequence[int]]]) -> InferenceError:
        """`error`, an input's of batch size 0 (EmptyBatchError), for the rows the request's batch size makes.

        `inputs` (name, shape, all of them) passed first_refusal: their batch sizes agree but for 0s, and the first
        visited that is not 0 is the request's (tritonserver 2.51 expects the input's data of that many rows: `X` of
        `[3, 2]` beside `Y` of `[0, 3]` UINT8, visited first, is `Expected 9`). Any other error is returned as it is.
        """
        if not isinstance(error, EmptyBatchError):
            return error
        shapes = dict(inputs)
        for name in hash_map_order([name for name, _ in inputs]):
            shape = shapes[name]
            if shape and shape[0]:
                rows = shape[0] & 0xFFFFFFFF
                return self._empty_batch_error(*error.input, rows) if rows > 1 else error
        return error

    def check_input_set(self, names: Sequence[str], batch_sizes: Sequence[int]) -> int:
        """Check that required inputs are present and batch sizes agree; return the request batch size.

        `names` are distinct and each checked by check_input already.
        """
        if len(batch_sizes) == 1 and len(self.inputs) == 1:  # the one input, present
            return batch_sizes[0]
        required = self.required_inputs
        if len(names) != len(self.inputs) and (len(names) < len(required) or not required.issubset(names)):
            raise self._count_error(names)
        if not batch_sizes:
            return 1
        if self.batching and len(batch_sizes) > 1 and batch_sizes.count(batch_sizes[0]) != len(batch_sizes):
            # Triton's words; it names the first input its hash map visits whose batch size differs from the first
            # visited's.
            size_of = dict(zip(names, batch_sizes))
            visited = hash_map_order(names)
            other = next(name for name in visited if size_of[name] != size_of[visited[0]])
            raise InferenceError.invalid_input(
                f"input '{other}' batch size does not match other inputs for '{self.name}'"
            )
        return batch_sizes[0]

    def input_count_fits(self, count: int) -> bool:
        """Whether a request of `count` inputs passes Triton's first check (see check_input_count)."""
        return len(self.required_inputs) <= count <= len(self.inputs)

    def check_input_count(self, names: Sequence[Optional[str]]) -> None:
        """Triton's first check of a request's inputs, before each input's own.

        No more than the model has, and at least as many as it requires. Skipped when a name is missing or
        repeated: reading the inputs refuses those, as Triton does while it adds them.
        """
        if self.input_count_fits(len(names)) or None in names or len(set(names)) != len(names):
            return
        raise self._count_error([name for name in names if name is not None])

    def _count_error(self, names: Sequence[str]) -> InferenceError:
        """Triton 2.51's words for a request without the inputs the model requires, or with more than it has."""
        required = self.required_inputs
        missing = [tensor.name for tensor in self.inputs if tensor.name in required and tensor.name not in names]
        expected = (
            f"expected {len(self.inputs)} inputs"
            if len(required) == len(self.inputs)
            else f"expected number of inputs between {len(required)} and {len(self.inputs)}"
        )
        # The request's inputs in the order Triton's unordered_map gives them.
        return InferenceError.invalid_input(
            f"{expected} but got {len(names)} inputs for model '{self.name}'. "
            f"Got input(s) {_names(hash_map_order(names)) if names else '[]'}, but missing required input(s) "
            f"{_names(missing)}. Please provide all required input(s)."
        )

    def check_requested_outputs(self, names: Sequence[str]) -> None:
        """Check that every requested output exists; of several unknown ones, name the first in byte order.

        tritonserver 2.51 keeps a request's output names in an `std::set` (sorted by their bytes) and names the
        first it does not find: `B` before `a`, `a` before `zeta`, whatever order they came in.
        """
        known = self.output_by_name
        for name in names:
            if name not in known:
                unknown = [other for other in names if other not in known]
                first = min(unknown, key=lambda other: other.encode("utf-8", "surrogatepass"))
                raise InferenceError.invalid(f"unexpected inference output '{first}' for model '{self.name}'")


def _show(shape: Sequence[int]) -> str:
    """Shape as Triton prints it: [1,2,3]."""
    return "[" + ",".join(str(dim) for dim in shape) + "]"


def _names(names: Sequence[str]) -> str:
    """Names as Triton 2.51 prints them: ['a','b'], and none as "]" (it drops the last character of "[" + "'a',")."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]" if names else "]"
