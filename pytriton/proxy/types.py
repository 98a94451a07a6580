"""Request and Response types seen by inference callables."""

from __future__ import annotations

import dataclasses
from typing import Any, ContextManager, Dict, ItemsView, Iterator, KeysView, List, Optional, Union, ValuesView

import numpy as np

from pytriton.proxy.telemetry import traced_span

Parameters = Dict[str, Union[str, int, bool, float]]


class _TensorMapping:
    """Mapping access over a `data` dict of named arrays."""

    data: Dict[str, np.ndarray]

    def __getitem__(self, name: str) -> np.ndarray:
        """Get a tensor by name."""
        return self.data[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        """Set a tensor by name."""
        self.data[name] = value

    def __delitem__(self, name: str) -> None:
        """Delete a tensor by name."""
        del self.data[name]

    def __contains__(self, name: object) -> bool:
        """Tell whether a tensor of that name is present."""
        return name in self.data

    def __len__(self) -> int:
        """Number of tensors."""
        return len(self.data)

    def __iter__(self) -> Iterator[str]:
        """Iterate over tensor names."""
        return iter(self.data)

    def items(self) -> ItemsView[str, np.ndarray]:
        """Names and tensors."""
        return self.data.items()

    def keys(self) -> KeysView[str]:
        """Tensor names."""
        return self.data.keys()

    def values(self) -> ValuesView[np.ndarray]:
        """Tensors."""
        return self.data.values()

    def get(self, name: str, default: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
        """Get a tensor by name, or a default."""
        return self.data.get(name, default)


@dataclasses.dataclass
class Request(_TensorMapping):
    """One inference request: named input arrays plus parameters and forwarded headers.

    `span` is the request's OpenTelemetry span when the server traces it (trace_config mode=opentelemetry);
    `requested_output_names` lists the outputs the client asked for (every output when it named none).
    `is_cancelled()` tells whether its client cancelled it or went away while it runs.

    For a model with a sequence batcher (ModelConfig.sequence_batcher): `sequence_id` is the client's sequence
    id (an int or a str), `sequence_start` and `sequence_end` its flags, and `sequence_state` a dict that the
    sequence's requests share: empty at START, forgotten after END or once the sequence was idle
    max_sequence_idle_microseconds. `sequence_serial` numbers the sequence's run (an id reused after END
    starts a new one). Requests of other models have None, False and 0 there.
    """

    data: Dict[str, np.ndarray]
    parameters: Optional[Parameters] = None
    span: Optional[Any] = None
    requested_output_names: Optional[List[str]] = None
    sequence_id: Optional[Union[int, str]] = None
    sequence_start: bool = False
    sequence_end: bool = False
    sequence_state: Optional[Dict[str, Any]] = None
    sequence_serial: int = dataclasses.field(default=0, repr=False)
    _cancelled = False  # not a dataclass field (no annotation): set by the engine's mark_cancelled

    def is_cancelled(self) -> bool:
        """Whether the request's client cancelled it (a gRPC cancel, a closed stream or connection) since it started.

        As in Triton's Python backend, the call is not interrupted: a callable that checks may stop early and
        return anything (or raise); its response goes nowhere and the request counts as cancelled.
        """
        return self._cancelled

    def traced_span(self, span_name: str) -> ContextManager[None]:
        """A child span of the request's span around a block; nothing happens when the request is not traced.

        Examples:
            with request.traced_span("preprocess"):
                ...
        """
        return traced_span(self, span_name)


@dataclasses.dataclass
class Response(_TensorMapping):
    """One inference response: named output arrays."""

    data: Dict[str, np.ndarray]


def mark_cancelled(request: Request) -> None:
    """The engine's: the request's client cancelled it; `is_cancelled()` says so from now on."""
    request._cancelled = True


Requests = List[Request]
Responses = List[Response]
ResponsesOrError = Union[Responses, Exception]
ResponsesNoneOrError = Union[Responses, None, Exception]
Scope = Dict[str, Any]
