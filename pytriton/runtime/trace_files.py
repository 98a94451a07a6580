"""Trace files (trace_config mode=triton): the JSON records tritonserver 2.51 writes, per sampled request.

A model's scheduler gets a `FileModelTracer` only while the model's trace settings are on, so a model that is not
traced pays nothing per request. A sampled request's `FileTrace` collects its timestamps (monotonic ns, as
Triton's steady clock): REQUEST_START and QUEUE_START when it was queued, COMPUTE_START when it left the queue,
COMPUTE_INPUT_END, COMPUTE_OUTPUT_START and COMPUTE_END from its batch's compute times, INFER_RESPONSE_COMPLETE
per response and REQUEST_END; with level TENSORS its inputs (TENSOR_QUEUE_INPUT) and outputs
(TENSOR_BACKEND_OUTPUT). A transport of this process adds its own (HTTP_RECV_START ... HTTP_SEND_END,
GRPC_WAITREAD_START ... GRPC_SEND_END) through the response (`TracedResponse`); a frontend process's through the
hub (runtime/frontends/hub.py: TRACED_RESPONSE, SENT). The requests a traced request's callable or ensemble makes
are traced with it (their records name it their parent, and have no INFER_RESPONSE_COMPLETE); an ensemble's
record has no compute timestamps.

As Triton's `TraceSetting`, the records of the server's settings (and of each model's own) gather in a stream of
their own, which goes to the file:
- `<file>.<n>` (n counting from 0 per file) once `log_frequency` records gathered, or once `trace_count` ran out
  and every sampled request's record is in;
- `<file>` itself (one JSON list, "[" at its first write, "]" at stop) when the settings change or the server
  stops, with `log_frequency` 0 (`<file>.<n>` otherwise).
Records are turned into JSON and written by a thread of their own: the event loop only hands them over.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from pytriton.core.request import InferenceResponse
from pytriton.core.request_spans import TracedResponse, arrival_stamps
from pytriton.options.log_trace import TraceSettings

LOGGER = logging.getLogger("pytriton")

# One record: (trace id, model, version, request id, parent id, [(name, ns)], [(activity, name, array, datatype)])
Stamp = Tuple[str, int]
TensorRecord = Tuple[str, str, Any, str]
_STOP = object()


class FileTrace:
    """The record of one sampled request, written once the request ended and its transport added its timestamps."""

    __slots__ = (
        "_claimed",
        "_composes",
        "_done",
        "_entry",
        "_files",
        "_frontend",
        "_owner",
        "_responses",
        "_stamps",
        "_start_ns",
        "_tensors",
        "_timestamps",
        "_trace_id",
        "_written",
        "level",
        "model",
        "parent_id",
        "version",
    )

    def __init__(
        self,
        files: TraceFiles,
        owner: str,
        model: str,
        version: str,
        entry: Any,
        level: Any,
        parent_id: int = 0,
        composes: bool = False,
        inner: bool = False,
    ) -> None:
        """Start the record of a request that leaves its queue now, with what `level` (TIMESTAMPS, TENSORS) asks.

        `parent_id`: the trace id of the traced request whose callable, or ensemble, made this one (0: a client's
        request). As tritonserver 2.51's: an ensemble's request (`composes`; its `entry` is its run) has no compute
        timestamps, and a request another one made (`inner`: an ensemble's step, a callable's call) no
        INFER_RESPONSE_COMPLETE: Triton's frontends stamp it, and they answer the outer request only.
        """
        self._files = files
        self.level = level
        self.parent_id = parent_id
        self._composes = composes
        self._responses = not inner
        self._owner = owner
        self.model = model
        self.version = version
        self._entry = entry
        self._trace_id = files.next_id()
        self._start_ns = time.monotonic_ns()
        self._stamps: List[Stamp] = []
        self._timestamps = "TIMESTAMPS" in level
        self._tensors: Optional[List[TensorRecord]] = [] if "TENSORS" in level else None
        self._claimed = self._done = self._written = False
        self._frontend: Optional[List[Stamp]] = None  # the transport's timestamps, once it sent the response
        if self._tensors is not None and entry is not None:
            for name, array in entry.request.inputs.items():  # copies: a request's buffers are reused after it
                self._tensors.append(("TENSOR_QUEUE_INPUT", name, _copy(array), ""))

    span: Any = None  # no OpenTelemetry span: the callable's Request carries none
    tracer: Any = None

    def responded(self, response: InferenceResponse) -> InferenceResponse:
        """Note a response (and its outputs with level TENSORS); it carries the record to its transport."""
        if self._responses:
            self._stamps.append(("INFER_RESPONSE_COMPLETE", time.monotonic_ns()))
        if self._tensors is not None:
            for output in response.outputs:
                array = _copy(output.array)  # the callable may change its arrays after
                self._tensors.append(("TENSOR_BACKEND_OUTPUT", output.name, array, output.datatype))
        return TracedResponse(response, self)

    def finish(self, error: Optional[str]) -> None:
        """The request ended: its record is written, unless its transport takes it first to add its timestamps."""
        self._stamps.append(("REQUEST_END", time.monotonic_ns()))
        self._done = True
        # The transport that awaits the response runs before this callback and claims the record.
        self._files.loop_call_soon(self._unclaimed)

    def claim(self) -> bool:
        """The transport will add its timestamps (`sent`); False when the record is written already."""
        if self._written:
            return False
        self._claimed = True
        return True

    def sent(self, protocol: str, stamps: Tuple[int, int, int, int]) -> None:
        """The transport's timestamps (received from, to, sent from, to): the record is complete once ended."""
        if protocol == "GRPC":
            names = ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END")
        else:
            names = ("HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END")
        self._frontend = list(zip(names, stamps)) if self._timestamps else []
        self._write(self._frontend)

    def abandon(self) -> None:
        """The transport that claimed the record adds no timestamps after all (a frontend process's that sent none)."""
        self._claimed = False
        self._unclaimed()

    def _unclaimed(self) -> None:
        """No transport of this process took the record (frontend processes, inner calls, streams): write it.

        A frontend process's transport noted when the request arrived: those are its receive timestamps.
        """
        if self._frontend is not None:
            self._write(self._frontend)  # sent before the request ended
        elif not self._claimed:
            entry = self._entry
            self._write(arrival_stamps(entry.request.arrival_ns) if entry is not None else [])

    def _write(self, frontend: List[Stamp]) -> None:
        """Hand the record to the trace files, once."""
        if self._written or not self._done:
            return
        self._written = True
        entry = self._entry
        request = entry.request if entry is not None else None
        enqueue_ns = entry.enqueue_ns if entry is not None else self._start_ns
        stamps: List[Stamp] = [("REQUEST_START", enqueue_ns), ("QUEUE_START", enqueue_ns)]
        if not self._composes and (entry is None or entry.compute_ns is not None):  # (None: a cache hit)
            start_ns = enqueue_ns + entry.queue_ns if entry is not None and entry.queue_ns else self._start_ns
            stamps.append(("COMPUTE_START", start_ns))
            compute = entry.compute_ns if entry is not None else (0, 0, 0)
            if any(compute):
                input_end = start_ns + compute[0]
                output_start = input_end + compute[1]
                stamps += [("COMPUTE_INPUT_END", input_end), ("COMPUTE_OUTPUT_START", output_start)]
                stamps.append(("COMPUTE_END", output_start + compute[2]))
            stamps.sort(key=lambda stamp: stamp[1])
        stamps += self._stamps  # responses and the end, in the order they came
        if not self._timestamps:
            stamps = []
        received, sent = frontend[:2], frontend[2:]  # only received ones when no transport claimed the record
        record = (
            self._trace_id,
            self.model,
            self.version,
            request.id if request is not None else "",
            self.parent_id,
            received + stamps + sent,
            self._tensors,
        )
        self._entry = None
        self._files.collect(self._owner, record, counted=not self.parent_id)

    @property
    def trace_id(self) -> int:
        """The record's trace id."""
        return self._trace_id

    @property
    def composes(self) -> bool:
        """Whether it is an ensemble request's record (its steps' records are its children)."""
        return self._composes

    @property
    def owner(self) -> str:
        """Whose settings sampled the request ("" for the server's)."""
        return self._owner


class FileModelTracer:
    """A model's trace source in mode triton: samples its requests by the trace settings and starts their records."""

    def __init__(self, name: str, version: str, files: TraceFiles, ensemble: bool = False) -> None:
        """Trace the requests of model `name` (an ensemble's: their steps' records name them their parent)."""
        self._name = name
        self._version = version
        self._files = files
        self._ensemble = ensemble

    def start(self, enqueue_ns: int, parent: Any = None, entry: Any = None) -> Optional[FileTrace]:
        """The record of a request that leaves the queue now (an ensemble's: that starts its steps now), if sampled.

        A request made by a traced request's callable or ensemble (`parent`, its record) is traced with it, as
        Triton traces the requests a traced request spawns: its record names the parent's trace id.
        """
        if isinstance(parent, FileTrace):
            return FileTrace(
                self._files,
                parent.owner,
                self._name,
                self._version,
                entry,
                parent.level,
                parent.trace_id,
                self._ensemble,
                inner=True,
            )
        if entry is not None and entry.request.origin is not None:
            return None  # an untraced request's inner call: Triton samples only what its frontends receive
        settings = self._files.settings
        if not settings.sample(self._name):
            return None
        if not settings.enabled(self._name):
            self._files.exhausted()
        owner, _ = settings.sampled(self._name)
        level = settings.effective(self._name).level or ()
        return FileTrace(self._files, owner, self._name, self._version, entry, level, composes=self._ensemble)


class _Stream:
    """The records of one owner of settings (the server's, or a model's own) not written yet."""

    __slots__ = ("collected", "in_stream", "records")

    def __init__(self) -> None:
        self.records: List[Any] = []
        self.collected = 0  # sampled requests' records, since the settings were made
        self.in_stream = 0  # of those, the ones not written yet


class TraceFiles:
    """The trace files of one server: the streams of records, and the thread that writes them."""

    def __init__(self, settings: TraceSettings) -> None:
        """Write where `settings` say (mode triton's `file`); the writer thread starts with the first record."""
        self.settings = settings
        self._ids = 0
        self._streams: Dict[str, _Stream] = {}
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._loop: Any = None
        self.on_exhausted: Any = None
        settings.before_change.append(self._settings_change)

    def next_id(self) -> int:
        """A new trace id (from 1, across the server, as Triton's)."""
        self._ids += 1
        return self._ids

    def bind_loop(self, loop: Any) -> None:
        """The event loop the records are collected on."""
        self._loop = loop

    def loop_call_soon(self, callback: Any) -> None:
        """Run `callback` on the loop's next turn."""
        self._loop.call_soon(callback)

    def exhausted(self) -> None:
        """trace_count ran out: stop tracing once the current request has its record."""
        if self.on_exhausted is not None:
            self._loop.call_soon(self.on_exhausted)

    def collect(self, owner: str, record: Any, counted: bool = True) -> None:
        """A complete record of `owner`'s settings: into its stream, written when Triton would (on the loop).

        `counted`: a sampled request's (a request its callable made goes with it: counted as none).
        """
        stream = self._streams.setdefault(owner, _Stream())
        stream.records.append(record)
        if not counted:
            return
        stream.collected += 1
        stream.in_stream += 1
        settings = self.settings.effective(owner)
        _, sampled = self.settings.sampled(owner)
        frequency = settings.log_frequency or 0
        if (settings.count == 0 and stream.collected >= sampled) or (frequency and stream.in_stream >= frequency):
            self._hand_over(owner, stream, indexed=True)

    def _settings_change(self, model: str) -> None:
        """Settings change: the records of those replaced go out, as Triton's replaced settings write theirs."""
        owners = [model] if model else list(self._streams)
        for owner in owners:
            self._write_rest(owner)

    def _write_rest(self, owner: str) -> None:
        """Hand over what an owner's stream holds: to the file, or a numbered file with a log frequency."""
        stream = self._streams.pop(owner, None)
        if stream is not None and stream.records:
            self._hand_over(owner, stream, indexed=bool(self.settings.effective(owner).log_frequency))

    def _hand_over(self, owner: str, stream: _Stream, indexed: bool) -> None:
        """Give a stream's records to the writer thread."""
        records, stream.records = stream.records, []
        stream.in_stream = 0
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_loop, name="pytriton-trace-files", daemon=True)
            self._thread.start()
        self._queue.put((self.settings.file_of(owner), indexed, records))

    def close(self) -> None:
        """Write what is left and close the files (their closing "]"); after the loop stopped."""
        for owner in list(self._streams):
            self._write_rest(owner)
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None

    def _write_loop(self) -> None:
        """The writer thread: JSON text of the records, to the files or their numbered files."""
        indexes: Dict[str, int] = {}
        opened: Dict[str, Any] = {}
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            path, indexed, records = item
            try:
                text = ",".join(_record_json(record) for record in records)
            except Exception:  # the thread goes on writing the others
                LOGGER.exception("trace file %s: records could not be written", path)
                continue
            try:
                if indexed:
                    index = indexes.get(path, 0)
                    indexes[path] = index + 1
                    with open(f"{path}.{index}", "w", encoding="utf-8") as numbered:
                        numbered.write(f"[{text}]")
                else:
                    _append(opened, path, text)
            except OSError as error:
                LOGGER.error("failed creating trace file: %s", error)
        for main in opened.values():
            try:
                main.write("]")
                main.close()
            except OSError as error:
                LOGGER.error("failed creating trace file: %s", error)


def _append(opened: Dict[str, Any], path: str, text: str) -> None:
    """Add records to a trace file: "[" at its first write (which truncates it), "," before the next ones."""
    main = opened.get(path)
    if main is None:
        main = opened[path] = open(path, "w", encoding="utf-8")  # open until the server stops
        main.write("[")
    else:
        main.write(",")
    main.write(text)
    main.flush()


def _copy(array: Any) -> Any:
    """A host copy of a tensor for its record; None (written without values) when it is not on the host."""
    try:
        return np.array(array, copy=True)
    except Exception:  # noqa: BLE001 - a device array: the record goes without its values, the request on
        return None


def _record_json(record: Any) -> str:
    """One request's objects in Triton's layout: its model, then one object per timestamp and per tensor.

    Input tensors follow QUEUE_START, outputs come before the first INFER_RESPONSE_COMPLETE; without timestamps
    (level TENSORS alone) only the tensors are written, as by Triton.
    """
    trace_id, model, version, request_id, parent_id, stamps, tensors = record
    inputs = [_tensor_json(trace_id, tensor) for tensor in tensors or () if tensor[0] == "TENSOR_QUEUE_INPUT"]
    outputs = [_tensor_json(trace_id, tensor) for tensor in tensors or () if tensor[0] != "TENSOR_QUEUE_INPUT"]
    if not stamps:
        return ",".join(inputs + outputs)
    head = f'{{"id":{trace_id},"model_name":{_quote(model)},"model_version":{int(version or 1)}'
    if request_id:
        head += f',"request_id":{_quote(request_id)}'
    if parent_id:
        head += f',"parent_id":{parent_id}'
    parts: List[str] = []
    for name, ns in stamps:
        if name == "REQUEST_START":
            parts.append(head + "}")
        elif name in ("INFER_RESPONSE_COMPLETE", "REQUEST_END"):
            parts += outputs
            outputs = []
        parts.append(f'{{"id":{trace_id},"timestamps":[{{"name":"{name}","ns":{ns}}}]}}')
        if name == "QUEUE_START":
            parts += inputs
            inputs = []
    return ",".join(parts + inputs + outputs)


def _tensor_json(trace_id: int, tensor: TensorRecord) -> str:
    """A tensor object: its values as Triton prints them, comma-separated in one string."""
    activity, name, array, datatype = tensor
    if array is None:
        array = np.zeros((0,), np.float32)
    dtype = datatype or _datatype(array)
    shape = ",".join(str(dim) for dim in array.shape)
    data = _values(array, dtype)
    return (
        f'{{"id":{trace_id},"activity":"{activity}","tensor":{{"name":{_quote(name)},"data":{_quote(data)},'
        f'"shape":"{shape}","dtype":"{dtype}"}}}}'
    )


def _values(array: np.ndarray, dtype: str) -> str:
    """The values of a tensor as Triton writes them: numbers as C++ streams print them, BYTES each in quotes.

    FP16 and BF16 tensors have no values written, as in Triton.
    """
    flat = array.reshape(-1)
    if dtype in ("FP16", "BF16"):
        return ""
    if dtype == "BOOL":
        return ",".join("1" if value else "0" for value in flat.tolist())
    if dtype == "BYTES":
        items = [value if isinstance(value, bytes) else str(value).encode() for value in flat.tolist()]
        return ",".join('"' + item.decode("utf-8", "replace") + '"' for item in items)
    if dtype in ("FP32", "FP64"):
        return ",".join(_float_text(value) for value in flat.tolist())
    return ",".join(str(int(value)) for value in flat.tolist())


def _float_text(value: float) -> str:
    """A float as a C++ stream prints it by default (6 significant digits, %g)."""
    if math.isnan(value):
        return "nan" if math.copysign(1.0, value) > 0 else "-nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return format(value, "g")


_DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}


def _datatype(array: np.ndarray) -> str:
    """An input array's Triton datatype."""
    return _DATATYPES.get(array.dtype.name, "BYTES")


def _quote(text: str) -> str:
    """A JSON string (Triton writes names and BYTES values unescaped; escaped here, the file stays valid JSON)."""
    return json.dumps(text, ensure_ascii=False)
