"""Ray Serve: the models a `bind(triton)` function binds, as a Ray Serve application (the `ray` extra).

Each replica is a Ray actor running this project's engine with the models `bind` binds (Triton's
dynamic batching, instances, cache) and no ports of its own: Ray Serve's proxy hands it HTTP requests,
which the engine's KServe v2 ASGI app answers with this project's codec, so clients see the same
`/v2/...` API as from `pytriton serve`. Ray places the replicas on the cluster's nodes and scales their
number on the requests each has in progress (`autoscaling_config={"target_ongoing_requests": ...}`:
Ray's measure of queue length).

Examples:
    from ray import serve
    from pytriton.ray_serve import triton_app

    serve.run(triton_app("models.py:bind", autoscaling_config={"min_replicas": 1, "max_replicas": 4,
                                                               "target_ongoing_requests": 32}))
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional, Union

from pytriton.cli import load_target
from pytriton.options.limits import ServerLimits
from pytriton.runtime.asgi_bridge import LoopBridge
from pytriton.triton import Triton, TritonConfig

Binder = Union[str, Callable[[Triton], Any]]
# Requests Ray lets into one replica at once: enough for the dynamic batcher to form batches there.
DEFAULT_MAX_ONGOING_REQUESTS = 64


class TritonReplica:
    """One Ray Serve replica: a Triton with the models `bind` binds, serving its HTTP API through Ray's proxy."""

    def __init__(self, bind: Binder, config: Optional[TritonConfig], limits: Optional[ServerLimits]) -> None:
        """Bind the models (`bind` is a callable or a `pytriton serve` target such as "models.py:bind").

        The server is never started: its ports stay closed and Ray's proxy is the only way in.
        """
        binder = load_target(bind) if isinstance(bind, str) else bind
        self._triton = Triton(config=config, limits=limits)
        binder(self._triton)

    def __serve_build_asgi_app__(self) -> LoopBridge:
        """The KServe v2 HTTP app, run on the engine's loop for Ray's replica loop (Ray calls this after __init__)."""
        runtime = self._triton._runtime
        return LoopBridge(runtime.http_app(), runtime.loop)

    def check_health(self) -> None:
        """Ray's health check: a replica whose model failed unrecoverably is replaced."""
        if self._triton._runtime.failure is not None:
            raise RuntimeError(f"a model failed unrecoverably: {self._triton._runtime.failure}")

    async def __del__(self) -> None:
        """Ray stops the replica (its requests are done): stop the engine."""
        triton = getattr(self, "_triton", None)  # absent when __init__ failed
        if triton is not None:
            await asyncio.get_running_loop().run_in_executor(None, triton.stop)


def triton_deployment(*, name: str = "pytriton", **deployment_options: Any) -> Any:
    """A Ray Serve deployment of TritonReplica; `deployment_options` go to `serve.deployment`.

    Bind it with `.bind(bind, config, limits)`, or use `triton_app`. `max_ongoing_requests` defaults to
    DEFAULT_MAX_ONGOING_REQUESTS rather than Ray's 5, so that the dynamic batcher sees enough requests.
    """
    from ray import serve

    deployment_options.setdefault("max_ongoing_requests", DEFAULT_MAX_ONGOING_REQUESTS)
    return serve.deployment(name=name, **deployment_options)(serve.ingress()(TritonReplica))


def triton_app(
    bind: Binder,
    *,
    name: str = "pytriton",
    config: Optional[TritonConfig] = None,
    limits: Optional[ServerLimits] = None,
    **deployment_options: Any,
) -> Any:
    """A Ray Serve application serving the models `bind` binds (for `serve.run`); see `triton_deployment`."""
    return triton_deployment(name=name, **deployment_options).bind(bind, config, limits)
