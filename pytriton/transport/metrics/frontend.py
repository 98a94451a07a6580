"""The metrics frontend: GET /metrics on its own port, served by the HTTP server on the engine's loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Dict, List, Optional, Tuple

from pytriton.core.engine import Engine
from pytriton.core.model import ServedModel
from pytriton.core.stats import StatsObserver
from pytriton.options.limits import METRICS_MAX_CONNECTIONS, ServerLimits
from pytriton.options.routes import CustomRoutes
from pytriton.options.server import MetricsSettings, ServerOptions
from pytriton.transport.http.responses import Receive, Scope, Send, send_body
from pytriton.transport.http.server import AsgiServer
from pytriton.transport.metrics.collector import collect
from pytriton.transport.metrics.exposition import CONTENT_TYPE, render
from pytriton.transport.metrics.gpu import GpuMonitor
from pytriton.transport.metrics.host import HostMonitor
from pytriton.transport.metrics.latency import ModelLatencies
from pytriton.transport.sockets import bind_socket, bound_port

LOGGER = logging.getLogger(__name__)

_TEXT = (b"content-type", CONTENT_TYPE.encode())
_PLAIN = (b"content-type", b"text/plain; charset=utf-8")
_BARE = (b"content-type", b"text/plain")


class MetricsFrontend:
    """Prometheus metrics of one server: counters read at scrape time, CPU and GPUs polled every interval."""

    def __init__(self, engine: Engine, options: ServerOptions, routes: Optional[CustomRoutes] = None) -> None:
        """Prepare the endpoint (bound at `start`); `routes`: the custom routes whose requests it counts."""
        self._engine = engine
        self._routes = routes
        self._settings: MetricsSettings = options.metrics_settings
        self._address = options.metrics_address
        self._requested_port = options.metrics_port
        self.port: Optional[int] = None
        self._server: Optional[AsgiServer] = None
        self._host: Optional[HostMonitor] = None
        self._gpu: Optional[GpuMonitor] = None
        self._poller: Optional[asyncio.Task[None]] = None
        self._latencies: Dict[ServedModel, ModelLatencies] = {}
        self._observed: List[Tuple[List[StatsObserver], ModelLatencies]] = []
        self._renderer: Optional[concurrent.futures.ThreadPoolExecutor] = None

    async def start(self) -> None:
        """Bind the port, start observing models and polling CPU and GPU metrics, and serve."""
        sock = bind_socket(self._address, self._requested_port)
        loop = asyncio.get_running_loop()
        self._renderer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pytriton-metrics")
        for model in self._engine.models():
            self._observe(model)
        self._engine.model_made.append(self._observe)
        if self._settings.cpu_metrics:
            host = HostMonitor()
            if host.start():
                self._host = host
        if self._settings.gpu_metrics:
            gpu = GpuMonitor()
            if await loop.run_in_executor(self._renderer, gpu.start):
                self._gpu = gpu
        if self._host is not None or self._gpu is not None:
            self._poller = loop.create_task(self._poll())
        self._server = AsgiServer(self._serve, sock, limits=ServerLimits(max_connections=METRICS_MAX_CONNECTIONS))
        try:
            await self._server.start()
        except BaseException:
            self._server = None
            sock.close()
            await self.stop()
            raise
        self.port = bound_port(sock)

    async def stop(self, sending_s: float = 0.0) -> None:
        """Stop serving and polling (scrapes still leaving get up to `sending_s`); stop observing the models."""
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        if self._server is not None:
            await self._server.stop(sending_s)
            self._server = None
        if self._observe in self._engine.model_made:
            self._engine.model_made.remove(self._observe)
        for observers, latencies in self._observed:
            observers.remove(latencies)
        self._observed.clear()
        if self._renderer is not None:
            if self._gpu is not None:
                self._renderer.submit(self._gpu.stop)  # after a poll still running in that thread
                self._gpu = None
            self._renderer.shutdown(wait=False)
            self._renderer = None

    def hurry(self) -> None:
        """Stop waiting for scrapes still leaving (a second signal)."""
        if self._server is not None:
            self._server.hurry()

    async def steer(self) -> None:
        """Scrapes go on as usual while the server is a lame duck."""

    async def leave(self) -> None:
        """Scrapes go on as usual while the server is a lame duck."""

    async def scrape(self) -> bytes:
        """The exposition text: numbers are copied on the loop, formatted (and quantiles sorted) off it."""
        families = collect(self._engine, self._settings, self._latencies, self._host, self._gpu, self._routes)
        return await asyncio.get_running_loop().run_in_executor(self._renderer, render, families)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app, answering as tritonserver 2.51's metrics port (prometheus-cpp's civetweb) does.

        GET /metrics (or /metrics/): the exposition; GET of any other path: 200 with no body; any other method,
        HEAD included, on any path: 405 `{"error":"Method Not Allowed"}` (measured).
        """
        if scope["type"] != "http":
            return
        if scope["method"] != "GET":
            await send_body(send, 405, b'{"error":"Method Not Allowed"}', (_BARE, (b"allow", b"GET")))
            return
        if scope["path"] not in ("/metrics", "/metrics/"):
            await send_body(send, 200, b"", (_PLAIN,))
            return
        try:
            body = await self.scrape()
        except Exception:  # a failed scrape must still be answered
            LOGGER.exception("metrics scrape failed")
            await send_body(send, 500, b"metrics scrape failed", (_PLAIN,))
            return
        headers = [_TEXT, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _poll(self) -> None:
        """Refresh CPU and GPU readings every metrics_interval_ms (NVML's blocking calls off the loop)."""
        interval_s = self._settings.interval_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval_s)
            if self._host is not None:
                self._host.poll()
            if self._gpu is not None:
                await loop.run_in_executor(self._renderer, self._gpu.poll)

    def _observe(self, model: ServedModel) -> None:
        """Give a model its histogram and summaries (when metrics_config asks for them), before its first request.

        Models bound before the start are observed then; those bound or bound again later, as they are made.
        """
        settings = self._settings
        if not (settings.summary_latencies or settings.histogram_latencies) or model in self._latencies:
            return
        observers = model.stats.observers
        latencies = ModelLatencies(
            summaries=settings.summary_latencies,
            first_response_histogram=settings.histogram_latencies and model.spec.decoupled,
            cache=model.cache is not None,
        )
        self._latencies[model] = latencies
        if latencies.summaries or latencies.first_response_ms is not None:
            observers.append(latencies)
            self._observed.append((observers, latencies))
