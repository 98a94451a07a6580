"""How long one client's large infer request holds the server from its other clients: health latency meanwhile.

`python -m bench.json_stall [--nvidia] [--sizes ...]`: a server (this one, or with `--nvidia` NVIDIA PyTriton 0.7
run by /tmp/nvidia-pytriton/run) with identity models; one client sends each large request in turn while a
second process polls /v2/health/ready every 5 ms over its own keep-alive connection. For each request: its own
time, and the worst and p99 health latency while it was under way. The server runs in a process of its own; ours
also logs its event loop's own stalls (loop_worst_ms): the health latency counts the poller's and the client's
scheduling too, on a busy machine.

`--process`: the models run in process instances (`ProcessInstances`), and a model `made` answers as many 8-byte
strings as its one INT32 input says: a long BYTES output that only comes back from the instance's process.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

NVIDIA_RUN = "/tmp/nvidia-pytriton/run"  # runs a command in nvidia-pytriton's environment
LAG_FILE_ENV = "JSON_STALL_LAG_FILE"  # where our server logs its event loop's stalls (not with --nvidia)


def identity(requests: Any) -> Any:
    """The identity models' callable."""
    return [{"out": request["in"]} for request in requests]


_MADE: Dict[int, np.ndarray] = {}


def made(requests: Any) -> Any:
    """Model `made`: as many 8-byte strings as its input says (made once for each count)."""
    answers = []
    for request in requests:
        count = int(request["in"][0])
        if count not in _MADE:
            _MADE[count] = np.array([b"s%07d" % (index % 10_000_000) for index in range(count)], np.object_)
        answers.append({"out": _MADE[count]})
    return answers


def serve(port: int, grpc_port: int, ours: bool, process: bool = False) -> None:
    """Run a server with identity models `fp32` and `bytes` (one input `in`, shape [-1], no batching).

    `process`: in process instances, with model `made` too.
    """
    from pytriton.instances import ProcessInstances
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    config = TritonConfig(http_port=port, grpc_port=grpc_port, metrics_port=0 if ours else port + 2)
    extra: Dict[str, Any] = {}
    if ours:
        from pytriton.options.limits import ServerLimits

        extra["limits"] = ServerLimits(max_json_bytes=2**31 - 1, max_body_bytes=2**31 - 1)
    triton = Triton(config=config, **extra)
    models: List[Tuple[str, Any, Any, Any]] = [("fp32", identity, np.float32, np.float32)]
    models.append(("bytes", identity, bytes, bytes))
    if process:
        models.append(("made", made, np.int32, bytes))
    for name, function, in_dtype, out_dtype in models:
        triton.bind(
            name,
            ProcessInstances(function) if process else function,
            inputs=[Tensor(name="in", dtype=in_dtype, shape=(-1,))],
            outputs=[Tensor(name="out", dtype=out_dtype, shape=(-1,))],
            config=ModelConfig(batching=False),
        )
    triton.run()
    lag_file = os.environ.get(LAG_FILE_ENV)
    if lag_file:
        _probe_loop(lag_file)
    print("READY", flush=True)
    sys.stdin.read()
    triton.stop()


def _probe_loop(path: str) -> None:
    """Log each gap of over 2 ms between two turns of the server's event loop to `path` (monotonic end, gap).

    The health latency also counts the machine's scheduling of the poller and the client (2 cores): this is the
    loop's own stall, with no other process in it.
    """
    import threading

    thread = next(thread for thread in threading.enumerate() if thread.name == "pytriton-loop")
    loop = thread._target.__self__.loop  # type: ignore[attr-defined]  # LoopThread._main's
    out = open(path, "a", buffering=1)  # open for the server's life
    last = [time.monotonic()]

    def tick() -> None:
        now = time.monotonic()
        if now - last[0] > 0.002:
            out.write(f"{now} {now - last[0]}\n")
        last[0] = now
        loop.call_later(0.001, tick)

    loop.call_soon_threadsafe(tick)


def loop_worst_ms(path: str, begin: float, end: float) -> float:
    """The longest gap between the loop's turns logged by `_probe_loop` that ended in [begin, end + 0.1 s]."""
    worst = 0.0
    with open(path) as lines:
        for line in lines:
            at, gap = map(float, line.split())
            if begin <= at <= end + 0.1:
                worst = max(worst, gap)
    return round(worst * 1000, 1)


def _ready(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/v2/models/fp32/ready")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


@contextlib.contextmanager
def serving(command: List[str], port: int, env: Dict[str, str], cwd: Optional[str] = None) -> Iterator[int]:
    """Run a server (`command`, in a session of its own) until the block ends; yields its pid once `port` answers."""
    server = subprocess.Popen(command, stdin=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not _ready(port):
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.5)
        yield server.pid
    finally:
        try:
            os.killpg(server.pid, 15)
        except ProcessLookupError:
            pass
        server.wait(timeout=30)


def poll_health(port: int, stop: Any, out: Any) -> None:
    """Ask /v2/health/ready every 5 ms on one keep-alive connection; put (sent_at, latency) pairs on `out`."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    message = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    samples: List[Tuple[float, float]] = []
    while not stop.is_set():
        start = time.monotonic()
        sock.sendall(message)
        got = b""
        while True:
            got += sock.recv(4096)
            head, sep, rest = got.partition(b"\r\n\r\n")
            if sep:
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    key, _, value = line.partition(b":")
                    if key.strip().lower() == b"content-length":
                        length = int(value)
                if len(rest) >= length:
                    break
        samples.append((start, time.monotonic() - start))
        time.sleep(0.005)
    out.put(samples)


def fp32_json(count: int) -> bytes:
    """A JSON FP32 request of `count` values (three decimals each), binary output."""
    base = ",".join(f"{value:.3f}" for value in np.random.default_rng(0).random(1 << 16)).encode()
    data = b",".join([base] * (count >> 16))
    return (
        b'{"inputs":[{"name":"in","datatype":"FP32","shape":[%d],"data":[' % count
        + data
        + b']}],"outputs":[{"name":"out","parameters":{"binary_data":true}}]}'
    )


def fp32_binary_json_out(count: int) -> Tuple[bytes, int]:
    """A binary FP32 request of `count` values whose output is asked for as JSON."""
    head = json.dumps(
        {
            "inputs": [
                {"name": "in", "datatype": "FP32", "shape": [count], "parameters": {"binary_data_size": 4 * count}}
            ],
            "outputs": [{"name": "out", "parameters": {"binary_data": False}}],
        }
    ).encode()
    values = np.random.default_rng(0).random(count, dtype=np.float32)
    return head + values.tobytes(), len(head)


def bytes_json(count: int) -> bytes:
    """A JSON BYTES request of `count` 8-character strings, binary output."""
    data = json.dumps([f"s{index % 10_000_000:07d}" for index in range(count)]).encode()
    return (
        b'{"inputs":[{"name":"in","datatype":"BYTES","shape":[%d],"data":' % count
        + data
        + b'}],"outputs":[{"name":"out","parameters":{"binary_data":true}}]}'
    )


def bytes_binary(count: int, json_out: bool) -> Tuple[bytes, int]:
    """A binary BYTES request of `count` 8-byte strings; its output binary, or JSON when `json_out`."""
    items = np.frombuffer(b"".join(b"s%07d" % (index % 10_000_000) for index in range(count)), dtype="S8")
    raw = np.empty(count, dtype=[("length", "<u4"), ("item", "S8")])
    raw["length"] = 8
    raw["item"] = items
    head = json.dumps(
        {
            "inputs": [
                {"name": "in", "datatype": "BYTES", "shape": [count], "parameters": {"binary_data_size": raw.nbytes}}
            ],
            "outputs": [{"name": "out", "parameters": {"binary_data": not json_out}}],
        }
    ).encode()
    return head + raw.tobytes(), len(head)


def made_request(count: int) -> bytes:
    """A JSON request to model `made` for `count` strings, binary output."""
    return (
        b'{"inputs":[{"name":"in","datatype":"INT32","shape":[1],"data":[%d]}],' % count
        + b'"outputs":[{"name":"out","parameters":{"binary_data":true}}]}'
    )


def cases(sizes: List[int], strings: List[int], process: bool = False) -> List[Tuple[str, str, bytes, Any]]:
    """(label, model, body, header length or None) of each request measured."""
    out: List[Tuple[str, str, bytes, Any]] = []
    if process:
        for count in strings:
            out.append((f"BYTES {count // 1000}k out of a process", "made", made_request(count), None))
    for count in sizes:
        out.append((f"FP32 {count >> 20}M JSON in", "fp32", fp32_json(count), None))
    for count in sizes:
        body, head = fp32_binary_json_out(count)
        out.append((f"FP32 {count >> 20}M JSON out", "fp32", body, head))
    for count in strings:
        out.append((f"BYTES {count // 1000}k JSON in", "bytes", bytes_json(count), None))
        body, head = bytes_binary(count, False)
        out.append((f"BYTES {count // 1000}k binary", "bytes", body, head))
        body, head = bytes_binary(count, True)
        out.append((f"BYTES {count // 1000}k JSON out", "bytes", body, head))
    return out


def measure(
    port: int, sizes: List[int], strings: List[int], repeat: int, process: bool = False, only: str = ""
) -> List[Dict[str, Any]]:
    """Each case (whose label holds `only`) `repeat` times: the request's time and the health latencies while it ran."""
    rows = []
    for label, model, body, head in cases(sizes, strings, process):
        if only not in label:
            continue
        headers = {"Content-Type": "application/octet-stream"}
        if head is not None:
            headers["Inference-Header-Content-Length"] = str(head)
        for _ in range(repeat):
            stop = multiprocessing.Event()
            out: Any = multiprocessing.Queue()
            poller = multiprocessing.Process(target=poll_health, args=(port, stop, out))
            poller.start()
            time.sleep(0.3)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            begin = time.monotonic()
            conn.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers)
            response = conn.getresponse()
            answer = response.read()
            end = time.monotonic()
            conn.close()
            time.sleep(0.1)
            stop.set()
            samples = out.get()
            poller.join()
            during = [latency for sent, latency in samples if begin <= sent + latency and sent <= end]
            during.sort()
            worst = during[-1] if during else float("nan")
            p99 = during[int(len(during) * 0.99)] if during else float("nan")
            rows.append(
                {
                    "case": label,
                    "status": response.status,
                    "request_s": round(end - begin, 3),
                    "health_worst_ms": round(worst * 1000, 1),
                    "health_p99_ms": round(p99 * 1000, 1),
                    "health_n": len(during),
                    "loop_worst_ms": loop_worst_ms(os.environ[LAG_FILE_ENV], begin, end)
                    if LAG_FILE_ENV in os.environ
                    else None,
                    "body_mb": round(len(body) / 2**20, 1),
                    "answer_mb": round(len(answer) / 2**20, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def measure_grpc(port: int, sizes: List[int], strings: List[int]) -> None:
    """Binary FP32 and BYTES requests over gRPC (tritonclient, raw contents), health asked over HTTP meanwhile."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port + 1}")
    arrays: List[Tuple[str, str, np.ndarray, str]] = [
        (f"gRPC FP32 {count >> 20}M", "fp32", np.random.default_rng(0).random(count, dtype=np.float32), "FP32")
        for count in sizes
    ]
    arrays += [
        (f"gRPC BYTES {count // 1000}k", "bytes", np.array([b"s%07d" % i for i in range(count)], np.object_), "BYTES")
        for count in strings
    ]
    for label, model, array, datatype in arrays:
        tensor = grpcclient.InferInput("in", list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        stop = multiprocessing.Event()
        out: Any = multiprocessing.Queue()
        poller = multiprocessing.Process(target=poll_health, args=(port, stop, out))
        poller.start()
        time.sleep(0.3)
        begin = time.monotonic()
        client.infer(model, [tensor])
        end = time.monotonic()
        time.sleep(0.1)
        stop.set()
        samples = out.get()
        poller.join()
        during = sorted(latency for sent, latency in samples if begin <= sent + latency and sent <= end)
        row = {
            "case": label,
            "request_s": round(end - begin, 3),
            "health_worst_ms": round(during[-1] * 1000, 1),
            "health_p99_ms": round(during[int(len(during) * 0.99)] * 1000, 1),
            "health_n": len(during),
            "loop_worst_ms": loop_worst_ms(os.environ[LAG_FILE_ENV], begin, end)
            if LAG_FILE_ENV in os.environ
            else None,
        }
        print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nvidia", action="store_true", help="against NVIDIA PyTriton 0.7 (tritonserver 2.51)")
    parser.add_argument("--sizes", default="1,4,16,64", help="FP32 element counts, in Mi")
    parser.add_argument("--strings", default="100000,1000000", help="BYTES element counts")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--grpc", action="store_true", help="binary FP32 and BYTES requests over gRPC instead")
    parser.add_argument("--process", action="store_true", help="the models in process instances (ours only)")
    parser.add_argument("--only", default="", help="only the cases whose label holds this text")
    parser.add_argument("--port", type=int, default=18950)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.port, args.port + 1, not args.nvidia, args.process)
        return
    if args.process and args.nvidia:
        raise SystemExit("--process: ours only")
    if not args.nvidia:
        os.environ[LAG_FILE_ENV] = tempfile.mktemp(prefix="json_stall_lag_")
    env = dict(os.environ)
    command = [sys.executable, "-m", "bench.json_stall", "--serve", "--port", str(args.port)]
    if args.process:
        command.append("--process")
    cwd = None
    if args.nvidia:  # never from the repo root: NVIDIA's interpreter must not import our package
        env.pop("PYTHONPATH", None)
        command = [NVIDIA_RUN, "python", os.path.abspath(__file__), "--serve", "--nvidia", "--port", str(args.port)]
        cwd = tempfile.gettempdir()
    with serving(command, args.port, env, cwd):
        sizes = [int(size) << 20 for size in args.sizes.split(",") if size]
        strings = [int(count) for count in args.strings.split(",") if count]
        if args.grpc:
            measure_grpc(args.port, sizes, strings)
        else:
            measure(args.port, sizes, strings, args.repeat, args.process, args.only)


if __name__ == "__main__":
    main()
