"""The Triton server facade: bind models, then run (background) or serve (blocking)."""

from __future__ import annotations

import contextlib
import copy
import logging
import pathlib
import signal
import threading
from typing import Any, Callable, Iterator, List, Optional, Sequence, Union

from pytriton.context import TritonContext, attach_context
from pytriton.exceptions import PyTritonInvalidOperationError
from pytriton.instances import ProcessInstances
from pytriton.model_config.model_config import ModelConfig
from pytriton.model_config.tensor import Tensor
from pytriton.models import as_callables, build_model, validate_model_name
from pytriton.options.limits import ServerLimits
from pytriton.runtime.logging_setup import configure_logging
from pytriton.runtime.options import resolve_options
from pytriton.runtime.server import ServerRuntime
from pytriton.triton_config import TritonConfig, resolve_config

LOGGER = logging.getLogger("pytriton")

MONITORING_PERIOD_SEC = 5.0

__all__ = ["RemoteTriton", "Triton", "TritonConfig"]  # noqa: F822 - RemoteTriton comes from __getattr__


def __getattr__(name: str) -> Any:
    """RemoteTriton, imported when first asked for (it pulls in the client package)."""
    if name == "RemoteTriton":
        from pytriton.remote_triton import RemoteTriton

        return RemoteTriton
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Triton:
    """A Triton-protocol server for Python models, running in this process.

    Examples:
        with Triton() as triton:
            triton.bind(model_name="Identity", infer_func=fn, inputs=[...], outputs=[...])
            triton.serve()
    """

    def __init__(
        self,
        *,
        config: Optional[TritonConfig] = None,
        workspace: Union[str, pathlib.Path, None] = None,
        limits: Optional[ServerLimits] = None,
    ) -> None:
        """Create a server; options come from `config`, then PYTRITON_TRITON_CONFIG_* variables, then defaults.

        Args:
            config: server options.
            workspace: accepted for compatibility; this engine writes no model store, so nothing is created.
            limits: request size, timeout and connection limits; without it, PYTRITON_LIMIT_* variables over
                safe defaults (see `pytriton.runtime.limits`).
        """
        self._config = resolve_config(config)
        self._options = resolve_options(self._config, limits)
        configure_logging(self._config.log_verbose, self._config.log_file)
        self._workspace = workspace
        self._runtime = ServerRuntime(self._options)
        self._stopped = False
        self.triton_context = TritonContext()

    def __enter__(self) -> Triton:
        """Enter the context."""
        return self

    def __exit__(self, *_: Any) -> None:
        """Stop the server when leaving the context."""
        self.stop()

    def bind(
        self,
        model_name: str,
        infer_func: Union[Callable[..., Any], Sequence[Callable[..., Any]], ProcessInstances],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: Optional[ModelConfig] = None,
        strict: bool = False,
    ) -> None:
        """Serve an inference callable (or a list of them: one per instance) as a model.

        Args:
            model_name: name of the model; alphanumerics, dots, underscores and dashes.
            infer_func: inference callable, or a list of callables for a multi-instance model (threads of this
                process), or `pytriton.instances.ProcessInstances(...)` for instances in processes of their own.
            inputs: model inputs.
            outputs: model outputs.
            model_version: version of the model.
            config: model configuration (batching, batcher, cache, decoupled).
            strict: check the callable's outputs against the declared dtypes and shapes.
        """
        if self._stopped:
            raise PyTritonInvalidOperationError("Cannot bind a model to a stopped Triton server")
        validate_model_name(model_name)
        processes: Optional[ProcessInstances] = None
        callables: List[Callable[..., Any]] = []
        if isinstance(infer_func, ProcessInstances):
            processes = infer_func
        else:
            callables = as_callables(infer_func)
        spec, triton_model_config = build_model(
            model_name=model_name,
            model_version=model_version,
            inputs=inputs,
            outputs=outputs,
            config=config or ModelConfig(),
            instance_count=processes.count if processes is not None else len(callables),
            strict=strict,
        )
        if spec.response_cache and self._options.cache_capacity_bytes is None:
            LOGGER.warning(
                "model '%s' asks for the response cache, but no cache is configured: set "
                "TritonConfig(cache_config=['local,size=<bytes>']) to enable it",
                model_name,
            )
        try:
            if processes is not None:
                self._runtime.add_process_model(spec, processes.plan(model_name, copy.deepcopy(triton_model_config)))
            else:
                self._runtime.add_model(spec, callables)
        except ValueError as error:
            raise PyTritonInvalidOperationError(str(error)) from None
        for fn in callables:
            self.triton_context.model_configs[fn] = copy.deepcopy(triton_model_config)
            attach_context(fn, self.triton_context)

    def run(self) -> None:
        """Start serving in the background and return once every port accepts connections."""
        if self._stopped:
            raise PyTritonInvalidOperationError("Cannot run a stopped Triton server")
        if not self._runtime.running:
            self._runtime.start()
            LOGGER.info("serving on %s", ", ".join(self.urls()))

    def serve(self, monitoring_period_sec: float = MONITORING_PERIOD_SEC) -> None:
        """Serve until SIGINT/SIGTERM, stop(), or an unrecoverable model error; then stop cleanly."""
        self.run()
        with _stop_on_signals(self._runtime.stopped):
            while not self._runtime.stopped.wait(monitoring_period_sec):
                pass
        self.stop()

    def stop(self) -> None:
        """Stop serving: refuse new requests, finish in-flight ones (up to exit_timeout_secs), close ports."""
        if self._stopped:
            return
        self._stopped = True
        self._runtime.stop()

    def is_alive(self) -> bool:
        """Whether the server runs and no model failed unrecoverably."""
        return self._runtime.running and self._runtime.failure is None and not self._stopped

    def urls(self) -> List[str]:
        """The URLs the server listens on (http://..., grpc://..., metrics)."""
        runtime = self._runtime
        found: List[str] = []
        if runtime.http_port is not None:
            found.append(f"http://{self._options.http_address}:{runtime.http_port}")
        if runtime.grpc_port is not None:
            found.append(f"grpc://{self._options.grpc_address}:{runtime.grpc_port}")
        if runtime.metrics_port is not None:
            found.append(f"http://{self._options.metrics_address}:{runtime.metrics_port}/metrics")
        return found

    @property
    def http_port(self) -> Optional[int]:
        """The port HTTP listens on (useful with http_port=0), once running."""
        return self._runtime.http_port

    @property
    def grpc_port(self) -> Optional[int]:
        """The port gRPC listens on (useful with grpc_port=0), once running."""
        return self._runtime.grpc_port

    @property
    def metrics_port(self) -> Optional[int]:
        """The port metrics are served on (useful with metrics_port=0), once running."""
        return self._runtime.metrics_port


@contextlib.contextmanager
def _stop_on_signals(stopped: threading.Event) -> Iterator[None]:
    """In the main thread, make SIGINT and SIGTERM set `stopped` instead of killing the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def handler(signum: int, _frame: Any) -> None:
        LOGGER.info("received signal %d, stopping", signum)
        stopped.set()

    for sig in signals:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
