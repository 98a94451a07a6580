"""A load generator in Python processes: N requests in flight over HTTP/1.1 (binary tensors) or gRPC.

wrk and h2load are not on a GPU machine that cannot install packages, so the GPU bench brings its own: each
process keeps its share of the in-flight requests on asyncio (one keep-alive connection, or one gRPC channel, per
request in flight), each sending one pre-built request (one sample) again and again. Only requests that start
inside the measured window count; their latencies come back to the parent for exact percentiles.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import os
import time
from typing import Any, Dict, List, Tuple

import numpy as np

GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
DATATYPES = {np.dtype(np.uint8): "UINT8", np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32"}


@dataclasses.dataclass(frozen=True)
class Load:
    """One measured point: where to send what, how many in flight, for how long."""

    protocol: str  # "http" or "grpc"
    port: int
    model: str
    sample: np.ndarray  # one request's input, batch axis included
    in_flight: int
    warmup_s: float
    duration_s: float


def http_request(model: str, sample: np.ndarray) -> bytes:
    """A whole HTTP/1.1 infer request with the input and the output as binary tensors."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT",
                    "shape": list(sample.shape),
                    "datatype": DATATYPES[sample.dtype],
                    "parameters": {"binary_data_size": sample.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + sample.tobytes()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def grpc_request(model: str, sample: np.ndarray) -> bytes:
    """A serialized ModelInferRequest with the input in raw_input_contents."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT", datatype=DATATYPES[sample.dtype], shape=list(sample.shape))
    request.outputs.add(name="OUTPUT")
    request.raw_input_contents.append(sample.tobytes())
    return bytes(request.SerializeToString())


async def _http_slot(load: Load, request: bytes, window: Tuple[float, float], out: List[float]) -> int:
    """One keep-alive connection sending requests until the window ends; the errors it saw."""
    reader, writer = await asyncio.open_connection("127.0.0.1", load.port)
    errors = 0
    try:
        while True:
            started = time.perf_counter()
            if started >= window[1]:
                return errors
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"\r\ncontent-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            ok = head.startswith(b"HTTP/1.1 200")
            errors += not ok
            if ok and started >= window[0]:
                out.append(time.perf_counter() - started)
    finally:
        writer.close()


async def _grpc_slot(load: Load, request: bytes, window: Tuple[float, float], out: List[float]) -> int:
    """One gRPC channel with one call in flight until the window ends; the errors it saw."""
    import grpc

    errors = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{load.port}") as channel:
        infer = channel.unary_unary(GRPC_INFER)  # bytes in, bytes out: no protobuf work in the timing
        while True:
            started = time.perf_counter()
            if started >= window[1]:
                return errors
            try:
                await infer(request)
            except grpc.aio.AioRpcError:
                errors += 1
                continue
            if started >= window[0]:
                out.append(time.perf_counter() - started)


async def _drive(load: Load, slots: int, start_at: float) -> Tuple[List[float], int]:
    """Run `slots` requests in flight from `start_at` (a shared wall-clock time) through the window."""
    build, slot = (http_request, _http_slot) if load.protocol == "http" else (grpc_request, _grpc_slot)
    request = build(load.model, load.sample)
    await asyncio.sleep(max(start_at - time.time(), 0.0))
    begin = time.perf_counter() + load.warmup_s
    window = (begin, begin + load.duration_s)
    latencies: List[float] = []
    errors = await asyncio.gather(*(slot(load, request, window, latencies) for _ in range(slots)))
    return latencies, sum(errors)


def _worker(load: Load, slots: int, start_at: float, results: Any) -> None:
    """A load process: its share of the requests in flight; puts (latencies, errors, CPU seconds) on `results`."""
    latencies, errors = asyncio.run(_drive(load, slots, start_at))
    results.put((latencies, errors, time.process_time()))


def run(load: Load, start_at: float, processes: int = 0) -> Dict[str, float]:
    """Measure one point: rps, p50/p99/mean latency in ms, requests, errors, the load processes' cores.

    Every process starts sending at the wall-clock time `start_at` (leave ~2 s for their interpreters to start);
    the window measured is `warmup_s` later and `duration_s` long.
    """
    processes = processes or max(1, min(load.in_flight, (os.cpu_count() or 2) // 2, 8))
    shares = [load.in_flight // processes + (index < load.in_flight % processes) for index in range(processes)]
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited grpc or torch state
    results = context.Queue()
    workers = [context.Process(target=_worker, args=(load, share, start_at, results)) for share in shares if share]
    for worker in workers:
        worker.start()
    collected = [results.get(timeout=60 + load.warmup_s + load.duration_s) for _ in workers]
    for worker in workers:
        worker.join()
    latencies = np.sort(np.concatenate([np.asarray(lat, dtype=np.float64) for lat, _, _ in collected])) * 1000
    count = int(latencies.size)
    busy_s = max(time.time() - start_at, load.warmup_s + load.duration_s)
    return {
        "in_flight": load.in_flight,
        "rps": count / load.duration_s,
        "p50_ms": float(np.percentile(latencies, 50)) if count else float("nan"),
        "p99_ms": float(np.percentile(latencies, 99)) if count else float("nan"),
        "mean_ms": float(latencies.mean()) if count else float("nan"),
        "requests": count,
        "errors": sum(errors for _, errors, _ in collected),
        "load_cpu": round(sum(cpu for _, _, cpu in collected) / busy_s, 3),  # cores, the interpreters' start included
    }
