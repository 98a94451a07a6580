"""FuturesModelClient: ModelClient calls run by worker threads, each with its own ModelClient."""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

import numpy as np

from pytriton.client._base import ClientSettings
from pytriton.client._loop_guard import refuse_a_wait_for_this_loop, would_wait_for_this_loop
from pytriton.client._request import Parameters
from pytriton.client._sync import ModelClient
from pytriton.client._url import TritonUrl
from pytriton.client.exceptions import PyTritonClientClosedError, PyTritonClientQueueFullError
from pytriton.model_config.triton_model_config import TritonModelConfig

_LOGGER = logging.getLogger(__name__)
_T = TypeVar("_T")
_Task = Tuple["Future[Any]", Callable[[ModelClient], Any]]


class FuturesModelClient:
    """Client returning concurrent.futures.Future objects; calls run on a pool of threads.

    Examples:
        with FuturesModelClient("localhost", "MyModel") as client:
            future = client.infer_sample(input1=input1_data)
            print(future.result())
    """

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: Optional[str] = None,
        *,
        max_workers: Optional[int] = 128,
        max_queue_size: Optional[int] = 128,
        non_blocking: bool = False,
        init_timeout_s: Optional[float] = None,
        inference_timeout_s: Optional[float] = None,
        access_token: Optional[str] = None,
    ) -> None:
        """Create a client for `model_name` on the server at `url`; threads start as calls come.

        Args:
            url: server url, e.g. `grpc://localhost:8001`; no scheme means http, no port the scheme's default.
            model_name: name of the model.
            model_version: version of the model; None means the latest.
            max_workers: most threads running calls at once (None: no limit).
            max_queue_size: most calls waiting for a thread (None: no limit).
            non_blocking: when the queue is full, raise PyTritonClientQueueFullError at once instead of waiting
                (up to inference_timeout_s, when given) for room.
            init_timeout_s: how long to wait for the server and the model to be ready (default 300 s).
            inference_timeout_s: how long one inference may take (default 60 s).
            access_token: the server's access token, sent with every call.

        Raises:
            ValueError: if max_workers or max_queue_size is not positive.
            PyTritonClientInvalidUrlError: if the url is invalid.
        """
        if max_workers is not None and max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        if max_queue_size is not None and max_queue_size <= 0:
            raise ValueError("max_queue_size must be greater than 0")
        self._triton_url = TritonUrl.from_url(url)
        self._settings = ClientSettings(
            url, model_name, model_version, init_timeout_s, inference_timeout_s, access_token
        )
        self._inference_timeout_s = inference_timeout_s
        self._max_workers = max_workers
        self._non_blocking = non_blocking
        self._tasks: queue.Queue[Optional[_Task]] = queue.Queue(max_queue_size or 0)
        self._idle = threading.Semaphore(0)
        self._threads: List[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> FuturesModelClient:
        """Use the client as a context manager."""
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        """Close the client, waiting for its calls, when leaving the context."""
        self.close()

    def close(self, wait: bool = True) -> None:
        """Stop accepting calls; the threads finish the calls already made, then close their connections.

        Args:
            wait: return only once every call made has finished (not on the event loop of the server called, an
                async def callable's: the calls wait for that loop).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._tasks.put(None)
        if wait and not would_wait_for_this_loop(self._triton_url):
            for thread in threads:
                thread.join()

    def wait_for_model(self, timeout_s: float) -> Future[None]:
        """A future done when the server and the model are ready (or failing with PyTritonClientTimeoutError).

        Raises:
            PyTritonClientClosedError: if the client is closed.
        """
        return self._submit(lambda client: client.wait_for_model(timeout_s))

    def model_config(self) -> Future[TritonModelConfig]:
        """A future of the model's config, read after waiting up to init_timeout_s for the model.

        Raises:
            PyTritonClientClosedError: if the client is closed.
        """
        return self._submit(lambda client: client.model_config)

    def infer_sample(
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> Future[Dict[str, np.ndarray]]:
        """A future of `ModelClient.infer_sample` with these arguments.

        Raises:
            PyTritonClientClosedError: if the client is closed.
            PyTritonClientQueueFullError: if the queue is full (non_blocking, or no room within
                inference_timeout_s).
        """
        return self._submit(
            lambda client: client.infer_sample(*inputs, parameters=parameters, headers=headers, **named_inputs)
        )

    def infer_batch(
        self,
        *inputs: np.ndarray,
        parameters: Optional[Parameters] = None,
        headers: Optional[Parameters] = None,
        **named_inputs: np.ndarray,
    ) -> Future[Dict[str, np.ndarray]]:
        """A future of `ModelClient.infer_batch` with these arguments; raises as `infer_sample`."""
        return self._submit(
            lambda client: client.infer_batch(*inputs, parameters=parameters, headers=headers, **named_inputs)
        )

    def _submit(self, call: Callable[[ModelClient], _T]) -> Future[_T]:
        """Queue a call; start a thread unless one is idle or max_workers run already."""
        future: Future[_T] = _CallFuture(self._triton_url)
        with self._lock:
            if self._closed:
                raise PyTritonClientClosedError("FutureModelClient is already closed")  # 0.7's words, its typo too
            self._start_thread_unless_one_is_idle()
        try:
            self._tasks.put((future, call), block=not self._non_blocking, timeout=self._inference_timeout_s)
        except queue.Full:
            raise PyTritonClientQueueFullError("Queue is full") from None
        return future

    def _start_thread_unless_one_is_idle(self) -> None:
        """Start a thread for the next call unless one is idle or max_workers run already (under the lock)."""
        if not self._idle.acquire(blocking=False) and (
            self._max_workers is None or len(self._threads) < self._max_workers
        ):
            thread = threading.Thread(target=self._work, name="pytriton-futures-client", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _work(self) -> None:
        """Run queued calls with this thread's own ModelClient until told to stop."""
        client: Optional[ModelClient] = None
        try:
            while True:
                task = self._tasks.get()
                if task is None:
                    return
                future, call = task
                if future.set_running_or_notify_cancel():
                    try:
                        client = client or self._new_client()
                        future.set_result(call(client))
                    except Exception as error:  # noqa: BLE001 - handed to the caller through the future
                        future.set_exception(error)
                del task, future, call
                self._idle.release()
        finally:
            if client is not None:
                client.close()
            if self._triton_url.scheme == "http":
                _destroy_gevent_hub()

    def _new_client(self) -> ModelClient:
        """A ModelClient for this thread."""
        return self._settings.create(ModelClient)


def _destroy_gevent_hub() -> None:
    """Free the gevent hub tritonclient.http created for this thread."""
    import gevent

    gevent.get_hub().destroy()


class _CallFuture(Future):  # type: ignore[type-arg]
    """A call's future, whose wait on the event loop of the server it calls is refused (it would never end)."""

    def __init__(self, url: TritonUrl) -> None:
        super().__init__()
        self._url = url

    def result(self, timeout: Optional[float] = None) -> Any:
        """The call's result; see concurrent.futures.Future.

        Raises:
            PyTritonClientError: if it is not done and this is the event loop of the server it calls.
        """
        if not self.done():
            refuse_a_wait_for_this_loop("FuturesModelClient's future.result()", self._url)
        return super().result(timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The call's exception; see concurrent.futures.Future (refused as `result` is)."""
        if not self.done():
            refuse_a_wait_for_this_loop("FuturesModelClient's future.exception()", self._url)
        return super().exception(timeout)
