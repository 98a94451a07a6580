"""FuturesModelClient: ModelClient calls run by worker threads, each with its own ModelClient."""

from __future__ import annotations

import logging
import os
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

import numpy as np

from pytriton.client._request import Parameters
from pytriton.client._sync import ModelClient
from pytriton.client._url import TritonUrl
from pytriton.client.exceptions import PyTritonClientClosedError
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
        max_workers: Optional[int] = None,
        init_timeout_s: Optional[float] = None,
        inference_timeout_s: Optional[float] = None,
    ) -> None:
        """Create a client for `model_name` on the server at `url`; threads start as calls come.

        Args:
            url: server url, e.g. `grpc://localhost:8001`; no scheme means http, no port the scheme's default.
            model_name: name of the model.
            model_version: version of the model; None means the latest.
            max_workers: most threads running calls at once; None means min(32, os.cpu_count() + 4).
            init_timeout_s: how long to wait for the server and the model to be ready (default 300 s).
            inference_timeout_s: how long one inference may take (default 60 s).

        Raises:
            ValueError: if max_workers is not positive.
            PyTritonClientInvalidUrlError: if the url is invalid.
        """
        if max_workers is not None and max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        self._triton_url = TritonUrl.from_url(url)
        self._url = url
        self._model_name = model_name
        self._model_version = model_version
        self._init_timeout_s = init_timeout_s
        self._inference_timeout_s = inference_timeout_s
        self._max_workers = max_workers or min(32, (os.cpu_count() or 1) + 4)
        self._tasks: queue.SimpleQueue[Optional[_Task]] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads: List[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> FuturesModelClient:
        """Use the client as a context manager."""
        return self

    def __exit__(self, *_: object) -> None:
        """Close the client, waiting for its calls, when leaving the context."""
        self.close()

    def close(self, wait: bool = True) -> None:
        """Stop accepting calls; the threads finish the calls already made, then close their connections.

        Args:
            wait: return only once every call made has finished.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._tasks.put(None)
        if wait:
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
        """A future of `ModelClient.infer_batch` with these arguments.

        Raises:
            PyTritonClientClosedError: if the client is closed.
        """
        return self._submit(
            lambda client: client.infer_batch(*inputs, parameters=parameters, headers=headers, **named_inputs)
        )

    def _submit(self, call: Callable[[ModelClient], _T]) -> Future[_T]:
        """Queue a call; start a thread unless one is idle or max_workers run already."""
        future: Future[_T] = Future()
        with self._lock:
            if self._closed:
                raise PyTritonClientClosedError("FuturesModelClient is closed")
            self._tasks.put((future, call))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max_workers:
                thread = threading.Thread(target=self._work, name="pytriton-futures-client", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

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
        return ModelClient(
            self._url,
            self._model_name,
            self._model_version,
            init_timeout_s=self._init_timeout_s,
            inference_timeout_s=self._inference_timeout_s,
        )


def _destroy_gevent_hub() -> None:
    """Free the gevent hub tritonclient.http created for this thread."""
    import gevent

    gevent.get_hub().destroy()
