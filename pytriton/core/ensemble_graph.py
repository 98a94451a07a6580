"""An ensemble's steps and the checks Triton makes of them when it loads the ensemble, in Triton's words.

An ensemble is a graph of bound models: each step reads ensemble tensors into its model's inputs (`input_map`:
model input -> ensemble tensor) and writes its model's outputs to ensemble tensors (`output_map`: model output
-> ensemble tensor). The ensemble's inputs are the first tensors; its outputs are gathered from the steps'.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from pytriton.core.tensors.datatypes import config_enum

Mapping = Tuple[Tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class EnsembleStepDef:
    """One step: the model it runs (version -1: the latest), and its input and output maps as (model, tensor)."""

    model_name: str
    model_version: int
    input_map: Mapping
    output_map: Mapping


@dataclasses.dataclass(frozen=True)
class EnsembleGraph:
    """An ensemble's steps, in the order they were declared (they run as their inputs become available)."""

    steps: Tuple[EnsembleStepDef, ...]


class StepModel:
    """What the checks need of a step's model: its batch size limit, tensors and whether it is decoupled."""

    def __init__(
        self,
        max_batch_size: int,
        inputs: Sequence[Tuple[str, str, Tuple[int, ...], bool]],
        outputs: Sequence[Tuple[str, str, Tuple[int, ...]]],
        decoupled: bool,
    ) -> None:
        """`inputs`: (name, datatype, dims, optional); `outputs`: (name, datatype, dims); dims without batch."""
        self.max_batch_size = max_batch_size
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.decoupled = decoupled


class _Tensor:
    """An ensemble tensor as one model declares it (Triton's TensorNode)."""

    __slots__ = ("datatype", "dims", "full_dims", "model")

    def __init__(self, model: str, batching: bool, datatype: str, dims: Tuple[int, ...]) -> None:
        self.model = model
        self.datatype = datatype
        self.dims = dims
        self.full_dims = (-1, *dims) if batching else dims


def _dims_agree(left: Tuple[int, ...], right: Tuple[int, ...]) -> bool:
    return len(left) == len(right) and all(a == b or a == -1 or b == -1 for a, b in zip(left, right))


def _show(dims: Tuple[int, ...]) -> str:
    return "[" + ",".join(str(dim) for dim in dims) + "]"


def _consistent(known: _Tensor, other: _Tensor, prefix: str) -> None:
    """Triton's ValidateTensorConsistency: one datatype, and shapes that agree (with or without the batch dim)."""
    if known.datatype != other.datatype:
        raise ValueError(
            f"{prefix}inconsistent data type: {config_enum(known.datatype)} is inferred from model {known.model} "
            f"while {config_enum(other.datatype)} is inferred from model {other.model}"
        )
    if not _dims_agree(known.dims, other.dims) and not _dims_agree(known.full_dims, other.full_dims):
        raise ValueError(
            f"{prefix}inconsistent shape: {_show(known.full_dims)} is inferred from model {known.model} while "
            f"{_show(other.full_dims)} is inferred from model {other.model}"
        )


def check_structure(name: str, graph: EnsembleGraph, inputs: Sequence[str], outputs: Sequence[str]) -> None:
    """Triton's ValidateEnsembleSchedulingConfig: every step complete, each tensor written once, the data flowing.

    A cycle leaves its tensors never written: Triton reports it as an output "not written" or a tensor "unused".

    Raises:
        ValueError: Triton's message.
    """
    if not graph.steps:
        raise ValueError(f"must specify 'step' for ensemble '{name}'")
    written: Set[str] = set()
    # Per tensor: the tensors each step that writes it reads (Triton's prev_nodes), and those that read it.
    sources: Dict[str, List[str]] = {}
    readers: Dict[str, List[str]] = {}
    for index, step in enumerate(graph.steps):
        if not step.model_name:
            raise ValueError(f"must specify 'model_name' in step {index} of ensemble '{name}'")
        if not step.input_map:
            raise ValueError(f"must specify 'input_map' in step {index} of ensemble '{name}'")
        if not step.output_map:
            raise ValueError(f"must specify 'output_map' in step {index} of ensemble '{name}'")
        for _, tensor in step.output_map:
            if tensor in written:
                raise ValueError(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble '{name}' "
                    f"step {index}"
                )
            written.add(tensor)
            sources.setdefault(tensor, [])
            readers.setdefault(tensor, [])
        for _, tensor in step.input_map:
            sources.setdefault(tensor, [])
            readers.setdefault(tensor, [])
            for _, output in step.output_map:
                sources[output].append(tensor)
                readers[tensor].append(output)
    ready: Set[str] = set()
    queue: List[str] = []
    for tensor in inputs:
        if tensor not in sources:
            raise ValueError(f"ensemble input '{tensor}' for ensemble {name}' is not used")  # sic: Triton's quotes
        ready.add(tensor)
        queue.append(tensor)
    while queue:
        for following in readers[queue.pop(0)]:
            if following not in ready and all(source in ready for source in sources[following]):
                ready.add(following)
                queue.append(following)
    for tensor in outputs:
        if tensor not in sources:
            raise ValueError(f"ensemble output '{tensor}' for ensemble {name}' is not used")  # sic
        if tensor not in ready:
            raise ValueError(_not_written(name, tensor, sources, ready))
    for tensor in sources:
        if tensor not in outputs and (tensor not in ready or not readers[tensor]):
            raise ValueError(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def _not_written(name: str, tensor: str, sources: Dict[str, List[str]], ready: Set[str]) -> str:
    """Triton's message for an output never written, naming the first tensor up its way that nothing writes."""
    message = f"output '{tensor}' for ensemble '{name}' is not written"
    last = tensor
    seen: Set[str] = set()
    previous: Optional[List[str]] = sources[tensor]
    while previous:
        candidates, previous = previous, None
        for node in candidates:
            if node not in ready and node not in seen:
                seen.add(node)
                last = node
                previous = sources[node]
                break
    if last != tensor:
        message += f": at least one of its depending tensors, '{last}', is not connected"
    return message


def check_steps(
    name: str,
    max_batch_size: int,
    inputs: Sequence[Tuple[str, str, Tuple[int, ...]]],
    outputs: Sequence[Tuple[str, str, Tuple[int, ...]]],
    graph: EnsembleGraph,
    model_of: Callable[[EnsembleStepDef], StepModel],
) -> bool:
    """Triton's ValidateEnsembleConfig: each step's model takes the batch, and maps its tensors consistently.

    `model_of(step)` returns the step's model (or raises ValueError when it is not bound). Returns whether the
    ensemble is decoupled: as Triton sets its `model_transaction_policy`, when one of its steps' models is.

    Raises:
        ValueError: Triton's message.
    """
    batching = max_batch_size > 0
    tensors: Dict[str, _Tensor] = {}
    for tensor_name, datatype, dims in inputs:
        tensors[tensor_name] = _Tensor(name, batching, datatype, dims)
    for tensor_name, datatype, dims in outputs:
        tensors[tensor_name] = _Tensor(name, batching, datatype, dims)
    decoupled: List[bool] = []
    for step in graph.steps:
        model = model_of(step)
        decoupled.append(model.decoupled)
        if model.max_batch_size != 0 and model.max_batch_size < max_batch_size:
            raise ValueError(
                f"ensemble {name} allows maximum batch size {max_batch_size}, but it contains model "
                f"{step.model_name} which only allows maximum batch size to be {model.max_batch_size}"
            )
        _check_mapping(name, step, model, tensors)
    return _check_decoupled_origins(
        name, graph, decoupled, [t for t, _, _ in inputs], [t for t, _, _ in outputs], tensors
    )


def _check_decoupled_origins(
    name: str,
    graph: EnsembleGraph,
    decoupled: Sequence[bool],
    inputs: Sequence[str],
    outputs: Sequence[str],
    tensors: Dict[str, _Tensor],
) -> bool:
    """Triton's check of a decoupled data flow: a step (or the ensemble's outputs) reads tensors of one origin.

    A tensor's origin is the last decoupled step on its way (the request, before any): each response of that step
    makes one set of the tensors after it, and a step reading two origins would pair responses that do not belong
    together. Returns whether any step is decoupled.
    """
    origin: Dict[str, int] = {tensor: 0 for tensor in inputs}
    labels = 0
    waiting = list(range(len(graph.steps)))
    progress = True
    while progress:
        progress = False
        for index in list(waiting):
            step = graph.steps[index]
            read = [tensor for _, tensor in step.input_map]
            if not all(tensor in origin for tensor in read):
                continue
            waiting.remove(index)
            progress = True
            if len({origin[tensor] for tensor in read}) > 1:
                written = step.output_map[0][1]
                raise ValueError(
                    f"in ensemble {name}, step of model '{tensors[written].model}' receives inputs originated from "
                    "different decoupled models"
                )
            if decoupled[index]:
                labels += 1
            label = labels if decoupled[index] else origin[read[0]]
            for _, tensor in step.output_map:
                origin[tensor] = label
    if len({origin.get(tensor, 0) for tensor in outputs}) > 1:
        raise ValueError(
            f"in ensemble {name}, step of model '{name}' receives inputs originated from different decoupled models"
        )
    return labels > 0


def _check_mapping(name: str, step: EnsembleStepDef, model: StepModel, tensors: Dict[str, _Tensor]) -> None:
    """Triton's ValidateTensorMapping for one step."""
    step_batching = model.max_batch_size > 0
    input_names = {input_name for input_name, _, _, _ in model.inputs}
    for model_input, tensor in step.input_map:
        if model_input not in input_names:
            raise ValueError(
                f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input {model_input} in "
                f"model {step.model_name}"
            )
    mapped = dict(step.input_map)
    for input_name, datatype, dims, optional in model.inputs:
        source = mapped.get(input_name)
        if source is None:
            if optional:
                continue
            raise ValueError(
                f"in ensemble {name}, input {input_name} in model {step.model_name} is not mapped to any ensemble "
                "tensors"
            )
        _meet(tensors, source, _Tensor(step.model_name, step_batching, datatype, dims), name)
    output_names = {output_name for output_name, _, _ in model.outputs}
    declared = {output_name: (datatype, dims) for output_name, datatype, dims in model.outputs}
    for model_output, tensor in step.output_map:
        if model_output not in output_names:
            raise ValueError(
                f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output {model_output} "
                f"in model {step.model_name}"
            )
        datatype, dims = declared[model_output]
        _meet(tensors, tensor, _Tensor(step.model_name, step_batching, datatype, dims), name)


def _meet(tensors: Dict[str, _Tensor], tensor: str, declared: _Tensor, name: str) -> None:
    """Record an ensemble tensor as a model declares it, checked against what another declared first."""
    known = tensors.get(tensor)
    if known is None:
        tensors[tensor] = declared
    else:
        _consistent(known, declared, f"in ensemble {name}, ensemble tensor {tensor}: ")
