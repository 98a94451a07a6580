"""Log and trace settings of one server, read and changed through the logging and trace extensions."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from pytriton.core.errors import InferenceError, Status, json_type_error, json_uint
from pytriton.exceptions import PyTritonValidationError

LOGGER = logging.getLogger("pytriton")

TRACE_MODES = ("triton", "opentelemetry")
TRACE_LEVELS = ("TIMESTAMPS", "TENSORS")
LOG_FORMATS = ("default", "ISO8601")
# OpenTelemetry batch span processor settings and Triton's defaults for them.
# In the order tritonserver 2.51 lists them, after the settings given (measured)
BSP_DEFAULTS = {"bsp_max_export_batch_size": 512, "bsp_schedule_delay": 5000, "bsp_max_queue_size": 2048}
_LEVEL_WORDS = {"false": (), "off": (), "true": ("TIMESTAMPS",), "on": ("TIMESTAMPS",), "min": ("TIMESTAMPS",)}
_LEVEL_WORDS.update({"max": ("TIMESTAMPS",), "timestamps": ("TIMESTAMPS",), "tensors": ("TENSORS",)})
_LOG_BOOLS = ("log_info", "log_warning", "log_error")
# "default" leaves the handlers' formats (logging_setup's, or the application's); ISO8601 puts a UTC timestamp first.
_ISO8601_LOG_FORMAT = "%(asctime)s %(levelname).1s %(name)s: %(message)s"


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    """trace_config resolved: global settings, the mode and the mode's own settings."""

    level: Tuple[str, ...] = ()
    rate: int = 1000
    count: int = -1
    mode: str = "triton"
    file: str = ""
    log_frequency: int = 0
    mode_settings: Tuple[Tuple[str, str], ...] = ()

    def setting(self, name: str, default: str = "") -> str:
        """The last value of one of the mode's settings (e.g. opentelemetry `url`)."""
        values = [value for key, value in self.mode_settings if key == name]
        return values[-1] if values else default


def parse_trace_config(entries: Optional[Sequence[str]]) -> TraceConfig:
    """Triton's `--trace-config` entries: `<setting>=<value>` (global) or `<mode>,<setting>=<value>`."""
    level: Tuple[str, ...] = ()
    explicit_off = False
    values: Dict[str, Any] = {}
    per_mode: Dict[str, List[Tuple[str, str]]] = {mode: [] for mode in TRACE_MODES}
    for entry in _joined_entries(entries or []):
        mode, comma, rest = entry.partition(",")
        if not comma:
            mode, rest = "", entry
        setting, equals, value = rest.partition("=")
        setting, value = setting.strip(), value.strip()
        if not equals or not setting or not value or (comma and not mode.strip()):
            raise PyTritonValidationError(
                f"trace_config '{entry}': expected <setting>=<value> or <mode>,<setting>=<value>"
            )
        if mode:
            per_mode[_trace_mode(mode)].append((setting, value))
        elif setting == "level":
            parsed = _LEVEL_WORDS.get(value.lower())
            if parsed is None:
                raise PyTritonValidationError(f"trace_config: invalid value for trace level option: {value}")
            explicit_off |= not parsed
            level = tuple(name for name in TRACE_LEVELS if name in level or name in parsed)
        elif setting in ("rate", "count"):
            values[setting] = _config_int(setting, value)
        elif setting == "mode":
            values["mode"] = _trace_mode(value)
        else:
            LOGGER.warning("TritonConfig.trace_config setting '%s' has no effect: it is not known here", setting)
    mode = values.get("mode", "triton")
    triton_settings = dict(per_mode["triton"])
    mode_settings = [item for item in per_mode[mode] if item[0] not in ("file", "log-frequency")]
    if mode == "opentelemetry":
        given = {key for key, _ in mode_settings}
        mode_settings += [(key, str(value)) for key, value in BSP_DEFAULTS.items() if key not in given]
    return TraceConfig(
        level=() if explicit_off else level,
        rate=values.get("rate", 1000),
        count=values.get("count", -1),
        mode=mode,
        file=triton_settings.get("file", ""),
        log_frequency=_config_int("log-frequency", triton_settings.get("log-frequency", "0")),
        mode_settings=tuple(mode_settings),
    )


def _joined_entries(entries: Sequence[str]) -> List[str]:
    """Rejoin `<mode>` and `<setting>=<value>` when a list was split at its commas (environment variables)."""
    joined: List[str] = []
    for entry in entries:
        if joined and "=" not in joined[-1]:
            joined[-1] = f"{joined[-1]},{entry}"
        else:
            joined.append(entry)
    return joined


def _trace_mode(text: str) -> str:
    """A trace mode name, validated."""
    mode = text.strip().lower()
    if mode not in TRACE_MODES:
        raise PyTritonValidationError(
            f'trace_config: invalid value for trace mode option: {text}. Available options are "triton" and '
            '"opentelemetry"'
        )
    return mode


def _config_int(name: str, value: str) -> int:
    """An integer trace_config value."""
    try:
        return int(value)
    except ValueError:
        raise PyTritonValidationError(f"trace_config {name}: invalid option value, got {value}") from None


@dataclasses.dataclass
class TraceSetting:
    """Trace settings of the server, or a model's overrides of them (None: use the server's)."""

    level: Optional[Tuple[str, ...]] = None
    rate: Optional[int] = None
    count: Optional[int] = None
    log_frequency: Optional[int] = None
    file: Optional[str] = None  # a model's own trace file (mode triton; `bind(trace_config=["triton,file=..."])`)


_TRACE_FIELDS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}
_OWN_FIELDS = (*_TRACE_FIELDS.values(), "file")


class TraceSettings:
    """Trace settings of one server: the global ones, per-model overrides, and request sampling.

    Everything runs on the engine's event loop. `listeners` are called with the model (or "" for the server)
    after every change, `before_change` with it before one is applied.
    """

    def __init__(self, config: TraceConfig) -> None:
        """Start from the resolved trace_config."""
        self.config = config
        self.server = TraceSetting(config.level, config.rate, config.count, config.log_frequency)
        self.models: Dict[str, TraceSetting] = {}
        self.listeners: List[Callable[[str], None]] = []
        self.before_change: List[Callable[[str], None]] = []
        # Whether the transports time their requests for trace files (runtime/tracing.py keeps it up to date).
        self.stamps = self.writes_files
        self._sampled: Dict[str, int] = {}
        # The trace_count of each model with settings of its own but no count: as Triton's, a copy of the server's
        # made when the model's or the server's settings last changed, which the model's requests count down.
        self._counts: Dict[str, TraceSetting] = {}
        # The server's fields set over the network and not cleared since: Triton's change of the server's settings
        # keeps them, and takes the startup value of every other (a count that ran out starts again).
        self._server_set: Set[str] = set()

    def add_model(self, model: str, setting: TraceSetting) -> None:
        """Give a model bound with trace settings of its own (`bind(trace_config=...)`) those settings."""
        self.models[model] = setting
        self._copy_count(model)

    @property
    def writes_files(self) -> bool:
        """Whether traced requests go to trace files (mode triton, and a file: the server's or a model's own)."""
        if self.config.mode != "triton":
            return False
        return bool(self.config.file) or any(setting.file for setting in self.models.values())

    def file_of(self, model: str) -> str:
        """The trace file a model's records go to: its own, else the server's."""
        override = self.models.get(model) if model else None
        return (override.file if override is not None else None) or self.config.file

    def _owner(self, model: str, field: str) -> Tuple[str, TraceSetting]:
        """The setting a field comes from for a model: its override, else the server's."""
        override = self.models.get(model)
        if model and override is not None:
            if getattr(override, field) is not None:
                return model, override
            if field == "count" and model in self._counts:
                return model, self._counts[model]
        return "", self.server

    def _copy_count(self, model: str) -> None:
        """Give a model with settings of its own but no count a copy of the server's count (see `_counts`)."""
        override = self.models.get(model)
        if self._counter(model) == model and override is not None and override.count is None:
            self._counts[model] = TraceSetting(count=self.server.count)
        else:
            self._counts.pop(model, None)

    def effective(self, model: str = "") -> TraceSetting:
        """A model's settings with the server's filling what it does not override."""
        return TraceSetting(**{field: getattr(self._owner(model, field)[1], field) for field in _TRACE_FIELDS.values()})

    def enabled(self, model: str) -> bool:
        """Whether requests of a model may be traced at all."""
        setting = self.effective(model)
        return bool(setting.level) and setting.count != 0 and (setting.rate or 0) > 0

    def sample(self, model: str) -> bool:
        """Whether to trace this request of a model: the `trace_rate`-th of each run, while `trace_count` lasts.

        As Triton's: with a rate of 3 the 3rd, 6th, ... requests are traced (not the 1st).
        """
        _, rate_setting = self._owner(model, "rate")
        owner = self._counter(model)
        seen = self._sampled.get(owner, 0) + 1
        self._sampled[owner] = seen
        if not rate_setting.rate or seen % rate_setting.rate:
            return False
        _, count_setting = self._owner(model, "count")
        if count_setting.count == 0:
            return False
        if count_setting.count is not None and count_setting.count > 0:
            count_setting.count -= 1
        return True

    def sampled(self, model: str) -> Tuple[str, int]:
        """Whose sampling counter a model's requests count on ("" for the server's), and how many it counted."""
        owner = self._counter(model)
        return owner, self._sampled.get(owner, 0)

    def _counter(self, model: str) -> str:
        """Whose counter a model's requests count on: its own once it has settings of its own (as in Triton)."""
        override = self.models.get(model)
        if model and override is not None and any(getattr(override, field) is not None for field in _OWN_FIELDS):
            return model
        return ""

    def document(self, model: str = "") -> Dict[str, Any]:
        """The trace settings document (HTTP form: trace_level a list, the rest strings)."""
        setting = self.effective(model)
        config = self.config
        document: Dict[str, Any] = {
            "trace_level": list(setting.level or ()) or ["OFF"],
            "trace_rate": str(setting.rate),
            "trace_count": str(setting.count),
        }
        if config.mode == "triton":
            document["log_frequency"] = str(setting.log_frequency)
            document["trace_file"] = self.file_of(model)
        document["trace_mode"] = config.mode
        for key, value in config.mode_settings:
            document[key] = value
        return document

    def grpc_document(self, model: str = "") -> Dict[str, List[str]]:
        """The settings as Triton's gRPC TraceSetting lists them: each a list of strings.

        A mode setting given more than once (opentelemetry `resource`) comes with all its values in order, where
        `document` (HTTP) keeps the last.
        """
        document = {key: value if isinstance(value, list) else [value] for key, value in self.document(model).items()}
        for key, _ in self.config.mode_settings:
            document[key] = [value for name, value in self.config.mode_settings if name == key]
        return document

    def update(
        self, changes: Mapping[str, Optional[Sequence[str]]], model: str = "", *, grpc_words: bool = False
    ) -> None:
        """Apply changes (each a list of strings; None or [] clears a model override back to the server's).

        `grpc_words`: refuse a value in the words of Triton's gRPC frontend, which differ from its HTTP frontend's
        by a space ("got: -2" where HTTP says "got:-2").
        """
        if "trace_file" in changes:
            raise InferenceError.unimplemented("trace file location can not be updated through network protocol")
        new: Dict[str, Any] = {}
        cleared: List[str] = []
        for key, field in _TRACE_FIELDS.items():
            if key not in changes:
                continue
            value = changes[key]
            if not value:
                cleared.append(field)
            elif key == "trace_level":
                new[field] = _trace_level(value)
            else:
                new[field] = _setting_int(key, value, grpc_words)
        if not model or self._keeps_own(model, new, cleared):  # (one left with none falls back, unchecked)
            self._check_valid(self._resulting(model, new, cleared), model)
        for hook in list(self.before_change):
            hook(model)
        if model:
            target = self.models.setdefault(model, TraceSetting())
            for field in cleared:
                setattr(target, field, None)
        else:  # every field not set over the network takes its startup value again
            target = self.server
            self._server_set = (self._server_set - set(cleared)) | set(new)
            defaults = TraceSetting(*self._defaults())
            for field in _TRACE_FIELDS.values():
                if field not in self._server_set:
                    setattr(target, field, getattr(defaults, field))
        for field, value in new.items():
            setattr(target, field, value)
        if model:
            self._sampled.pop(model, None)
            self._copy_count(model)
        else:  # Triton makes the server's setting, and each model's that falls back on it, anew: counting from 0
            self._sampled.clear()
            for name in self.models:
                self._copy_count(name)
        for listener in list(self.listeners):
            listener(model)

    def _resulting(self, model: str, new: Mapping[str, Any], cleared: Sequence[str]) -> TraceSetting:
        """The settings a model (or the server) would trace with after a change: what Triton checks before it."""
        current = self.effective(model)
        fallback = self.effective("") if model else TraceSetting(*self._defaults())
        own = self.models.get(model, TraceSetting()) if model else self.server
        result = {}
        for field in _TRACE_FIELDS.values():
            if field in new:
                result[field] = new[field]
            elif (
                field in cleared
                or (model and field == "count" and own.count is None)  # a model's is copied from the server's
                or (not model and field not in self._server_set)  # the server's startup value (`_server_set`)
            ):
                result[field] = getattr(fallback, field)
            else:
                result[field] = getattr(current, field)
        return TraceSetting(**result)

    def _keeps_own(self, model: str, new: Mapping[str, Any], cleared: Sequence[str]) -> bool:
        """Whether a model keeps a setting of its own after a change: Triton checks only such a model's result."""
        own = self.models.get(model, TraceSetting())
        if own.file is not None:
            return True
        return any(
            field in new or (field not in cleared and getattr(own, field) is not None)
            for field in _TRACE_FIELDS.values()
        )

    def _check_valid(self, result: TraceSetting, model: str = "") -> None:
        """Refuse a change that leaves tracing on with nothing to sample or nowhere to write, in Triton's words.

        Triton refuses any setting that traces (a level other than OFF) but is invalid, naming the first reason
        it finds in this order: a sample rate of 0, then (mode `triton`) no trace file; a `trace_count` of 0 (set
        so, or run out) is invalid too, and named by no reason (2.51's `TraceSetting::Valid`).
        """
        if not result.level:
            return
        if not result.rate:
            reason = "sample rate must be non-zero"
        elif self.config.mode == "triton" and not self.file_of(model):
            reason = "trace file name is not given"
        elif result.count == 0:
            reason = ""
        else:
            return
        raise InferenceError.invalid(f"Attempting to set invalid trace setting :{reason}")

    def _defaults(self) -> Tuple[Tuple[str, ...], int, int, int]:
        """The startup values a cleared server setting returns to."""
        config = self.config
        return config.level, config.rate, config.count, config.log_frequency


def _trace_level(values: Sequence[str]) -> Tuple[str, ...]:
    """trace_level values: ["OFF"] or any of TIMESTAMPS and TENSORS."""
    if "OFF" in values:
        if len(values) != 1:
            raise InferenceError.invalid("Expect only one trace level 'OFF' is specified")
        return ()
    unknown = [value for value in values if value not in TRACE_LEVELS]
    if unknown:
        raise InferenceError.invalid(f"unknown trace level '{unknown[0]}': expected OFF, TIMESTAMPS or TENSORS")
    return tuple(name for name in TRACE_LEVELS if name in values)


def _setting_int(key: str, values: Sequence[str], grpc_words: bool = False) -> int:
    """One integer trace setting (trace_count must be >= -1; the others >= 0)."""
    if len(values) != 1:
        raise InferenceError.invalid(f"expect only 1 value for '{key}'")
    try:
        value = int(values[0])
    except ValueError:
        raise InferenceError.invalid(f"Unable to parse '{key}', got: {values[0]}") from None
    minimum = -1 if key == "trace_count" else 0
    if value < minimum:  # Triton's words: its HTTP frontend puts no space after "got:", its gRPC frontend one
        gap = " " if grpc_words else ""
        raise InferenceError.invalid(f"Unable to parse '{key}'. Expecting value >= {minimum}, got:{gap}{values[0]}")
    # Triton keeps trace_count in an int32 and the others in a uint32; it refuses the uint32 maximum itself
    # (4294967295 was refused as "out of range [ 0, 4294967295 ]" by tritonserver 2.51).
    high = _UINT32_END if minimum == 0 else _INT32_MAX
    if value > high or (minimum == 0 and value == high):
        raise InferenceError.invalid(
            f"Unable to parse '{key}', value is out of range [ {minimum}, {high} ], got: {values[0]}"
        )
    return value


_UINT32_END = 2**32 - 1
_INT32_MAX = 2**31 - 1


def trace_changes_from_json(changes: Mapping[str, Any]) -> Dict[str, Optional[List[str]]]:
    """HTTP trace settings JSON -> `TraceSettings.update`'s lists, read as Triton's HTTP frontend reads them.

    Triton reads `trace_level` as an array of strings and the other settings as strings (TritonJson: a value of
    another type is `attempt to access JSON non-string as string` for `{"trace_rate": 5}`, Triton's 500 and a
    400 here), field by field
    in `_TRACE_FIELDS` order, each field's own value checks before the next is read. An empty `trace_level`
    array changes nothing, and keys it does not read are ignored. A `trace_file` key, whatever its value, is
    passed on for `update` to refuse before anything else.
    """
    if "trace_file" in changes:
        return {"trace_file": None}
    result: Dict[str, Optional[List[str]]] = {}
    for key in _TRACE_FIELDS:
        if key not in changes:
            continue
        value = changes[key]
        if value is None:
            result[key] = None
        elif key == "trace_level":
            if not isinstance(value, list):
                raise json_type_error("non-array as array")
            if not all(isinstance(item, str) for item in value):
                raise json_type_error("non-string as string")
            if value:
                _trace_level(value)
                result[key] = value
        elif isinstance(value, str):
            _setting_int(key, [value])
            result[key] = [value]
        else:
            raise json_type_error("non-string as string")
    return result


def _log_bool(key: str, value: Any, http: bool) -> bool:
    """A log_info, log_warning or log_error value, refused unless a boolean."""
    if not isinstance(value, bool):
        if http:
            raise json_type_error("non-boolean as boolean")
        raise InferenceError.invalid(f"expect boolean for '{key}'")
    return value


def _log_level(value: Any, http: bool) -> int:
    """A log_verbose_level value: HTTP's any JSON unsigned integer, gRPC's uint32 (any int not below 0 here)."""
    if http:
        return json_uint(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InferenceError.invalid("expect int32 for 'log_verbose_level'")
    return value


def _log_format(value: Any, http: bool) -> str:
    """A log_format value: a string, and one of LOG_FORMATS."""
    if not isinstance(value, str):
        if http:
            raise json_type_error("non-string as string")
        raise InferenceError.invalid("expect string for 'log_format'")
    if value not in LOG_FORMATS:
        if http:
            raise InferenceError(Status.UNAVAILABLE, f"invalid argument for --log_format, got: {value}")
        raise InferenceError.invalid(f"invalid argument for log_format, got: {value}")
    return value


@dataclasses.dataclass
class _Held:
    """What the log settings of running servers changed on one logger, and what it had before the first change."""

    level: int
    level_set: int
    formatters: Dict[logging.Handler, Tuple[Optional[logging.Formatter], Optional[logging.Formatter]]]  # before, set
    holders: List[LogSettings]  # the settings whose changes hold, the last changed last: its settings apply


# A process-wide record: several servers in one process log through the same logger.
_HELD: Dict[logging.Logger, _Held] = {}
_HELD_LOCK = threading.Lock()


class LogSettings:
    """Log settings of one server, applied to the `pytriton` logger when changed, until `restore`."""

    def __init__(
        self,
        verbose_level: int,
        log_file: Optional[str],
        logger: Optional[logging.Logger] = None,
        warn: bool = True,
    ) -> None:
        """Start from log_verbose and log_file; info, warning and error logging are on.

        `warn`: say so when a change turns verbose logging on (a frontend process's copy of the server's
        settings does not: the server's own process said it).
        """
        self.verbose_level = verbose_level
        self.log_file = log_file or ""
        self.enabled = {name: True for name in _LOG_BOOLS}
        self.format = "default"
        self.generation = 0  # moves with every update: the frontend processes' copies compare it, not the settings
        self._logger = logger or LOGGER
        self._warn = warn
        self._filter = _SeverityFilter(self)

    def document(self) -> Dict[str, Any]:
        """The log settings document."""
        return {
            "log_file": self.log_file,
            **self.enabled,
            "log_verbose_level": self.verbose_level,
            "log_format": self.format,
        }

    def update(self, changes: Mapping[str, Any], *, http: bool = False) -> None:
        """Apply changes as Triton's frontends do: one at a time, each checked when its turn comes.

        A None value leaves a setting as it is; the others go in Triton's order (info, warning, error, verbose
        level, format), and a refused one leaves those before it changed (tritonserver 2.51, probed over HTTP and
        gRPC).

        `http`: refuse in the words of Triton's HTTP frontend, which reads the values with TritonJson
        (`attempt to access JSON non-boolean as boolean`: a 500 there, 400 here as the client's mistake) and
        answers an unknown format 503; else in its gRPC frontend's (`expect boolean for 'log_info'`).
        """
        given = {key: value for key, value in changes.items() if value is not None}
        if "log_file" in given:
            raise InferenceError.unimplemented("log file location can not be updated through network protocol")
        try:
            for key in _LOG_BOOLS:
                if key in given:
                    self.enabled[key] = _log_bool(key, given[key], http)
            if "log_verbose_level" in given:
                verbose = _log_level(given["log_verbose_level"], http)
                if verbose and not self.verbose_level and self._warn:
                    self._logger.warning("log_verbose_level=%d: verbose logging slows inference down", verbose)
                self.verbose_level = verbose
            if "log_format" in given:
                self.format = _log_format(given["log_format"], http)
        finally:
            if given:
                self.generation += 1
                self._apply()

    def restore(self) -> None:
        """End this server's changes (it stopped): the logger as the other servers' changes, or as before them.

        As a tritonserver's settings end with its process (a second server starts from its own options,
        nvidia-pytriton 0.7, probed). A level or format the application set since is left as it is.
        """
        logger = self._logger
        with _HELD_LOCK:
            held = _HELD.get(logger)
            if held is None or self not in held.holders:
                return
            held.holders.remove(self)
            for member in [*_family(logger), *held.formatters, *logger.handlers]:
                member.removeFilter(self._filter)
            if held.holders:
                held.holders[-1]._set(held)
                return
            del _HELD[logger]
            if logger.level == held.level_set:
                logger.setLevel(held.level)
            for handler, (before, ours) in held.formatters.items():
                if handler.formatter is ours:
                    handler.setFormatter(before)

    def _apply(self) -> None:
        """Make these settings the logger's, over any other server's (see `restore`)."""
        logger = self._logger
        with _HELD_LOCK:
            held = _HELD.get(logger)
            if held is None:
                held = _HELD[logger] = _Held(logger.level, logger.level, {}, [])
            if self in held.holders:
                held.holders.remove(self)
            held.holders.append(self)
            self._set(held)

    def _set(self, held: _Held) -> None:
        """Set the logger's level, severity filter and handler formats ("default": the handlers' own)."""
        logger = self._logger
        held.level_set = self._lowest_level()
        logger.setLevel(held.level_set)
        # A logger's filters see only the records made on it, not those its children pass up: each gets the filter,
        # and so do the logger's handlers, for the records of loggers made later.
        members: List[logging.Filterer] = [*_family(logger), *logger.handlers]
        for member in members:
            for other in held.holders:
                if other is not self:
                    member.removeFilter(other._filter)
            member.addFilter(self._filter)  # (no-op when it has it)
        for handler in logger.handlers:
            before = held.formatters[handler][0] if handler in held.formatters else handler.formatter
            formatter = before if self.format == "default" else _iso8601_formatter()
            handler.setFormatter(formatter)
            held.formatters[handler] = (before, formatter)

    def _lowest_level(self) -> int:
        """The lowest severity still logged (above CRITICAL when everything is off)."""
        if self.verbose_level > 0:
            return logging.DEBUG
        for key, level in (("log_info", logging.INFO), ("log_warning", logging.WARNING), ("log_error", logging.ERROR)):
            if self.enabled[key]:
                return level
        return logging.CRITICAL + 1

    def allows(self, levelno: int) -> bool:
        """Whether a record of this severity is logged under the settings."""
        if levelno < logging.INFO:
            return self.verbose_level > 0
        if levelno < logging.WARNING:
            return self.enabled["log_info"]
        if levelno < logging.ERROR:
            return self.enabled["log_warning"]
        return self.enabled["log_error"]


def _family(logger: logging.Logger) -> List[logging.Logger]:
    """A logger and the loggers below it made so far (`pytriton.transport.http.connection`, ...)."""
    prefix = logger.name + "."
    children = [
        child
        for name, child in list(logging.Logger.manager.loggerDict.items())
        if name.startswith(prefix) and isinstance(child, logging.Logger)
    ]
    return [logger, *children]


class _SeverityFilter(logging.Filter):
    """Drops records whose severity is switched off (e.g. warnings off while info stays on)."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self._settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether to keep a record."""
        return self._settings.allows(record.levelno)


def _iso8601_formatter() -> logging.Formatter:
    """The ISO8601 log_format's formatter (UTC timestamps)."""
    formatter = logging.Formatter(_ISO8601_LOG_FORMAT, datefmt="%Y-%m-%dT%H:%M:%SZ")
    formatter.converter = time.gmtime
    return formatter


class ServerSettings:
    """The settings a running server changes at runtime: logging and tracing."""

    def __init__(self, *, log_verbose: int, log_file: Optional[str], trace: TraceConfig) -> None:
        """Create the settings of one server."""
        self.log = LogSettings(log_verbose, log_file)
        self.trace = TraceSettings(trace)
