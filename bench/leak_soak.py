"""Leak soak: mixed, partly abusive load for minutes, sampling what each server process holds.

    python -m bench.leak_soak --mode plain --duration 600        # one process, thread instances
    python -m bench.leak_soak --mode frontends3 --duration 600   # frontends=3 (the hub and two frontends)
    python -m bench.leak_soak --mode procs --duration 600        # ProcessInstances models, one serving process
    python -m bench.leak_soak --mode frontends3-procs            # both; abused models' processes SIGKILLed too

Not part of the test suite. The server runs in a process of its own (this module with `--serve`); the driver
runs paced clients in threads of this process, so that the whole stays near one core:

- well-behaved clients, each counted: HTTP and gRPC infer of small and 1 MiB tensors (`echo`), gRPC streams of a
  decoupled model and HTTP `generate_stream` (`stream`), sequences of three requests (`seq`), system shared-memory
  register / infer / unregister cycles (tritonclient.utils.shared_memory), `/metrics` and statistics scrapes,
  and requests to a model (`cycled`) that another client unloads and loads again through the repository API;
- abusive clients, on their own models (`echo_abuse`, `stream_abuse`) so that the counts of the others add up:
  bodies dropped half sent, answers dropped half read (some with a RST), slowloris headers, pipelined 1 MiB
  answers never read, gRPC calls cancelled by a deadline or mid-stream, and client processes killed mid-call.

Every `--sample` seconds it notes, per server process (the hub, frontends, instance processes): RSS, open
descriptors, threads; the /dev/shm entries; and the statistics' success / fail counts. At the end, after the load
stops, it compares the counts with what the clients saw, lists the segments and descriptors left, and looks for
tracebacks in the server's log. Figures go to stdout and, with `--json`, to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

MODES = ("plain", "frontends3", "procs", "frontends3-procs")
BIG = 262144  # float32 elements: 1 MiB
SEQ_LEN = 3
STREAM_STEPS = 3
SOAK_MODEL = "SOAK_MODEL"  # the model an instance process serves, in its environment


# ---------------------------------------------------------------------------------------------------- the server
def echo(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Each request's INPUT back as OUTPUT."""
    return [{"OUTPUT": request["INPUT"]} for request in requests]


def stream(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    """STREAM_STEPS responses per request: INPUT + step."""
    for step in range(STREAM_STEPS):
        yield [{"OUTPUT": request["INPUT"] + step} for request in requests]


def accumulate(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """The running sum of a sequence's inputs."""
    responses = []
    for request in requests:
        total = request.sequence_state.get("total", 0.0) + float(request["INPUT"].sum())
        request.sequence_state["total"] = total
        responses.append({"OUTPUT": np.full(request["INPUT"].shape, total, np.float32)})
    return responses


def serve(mode: str, ports: List[int]) -> None:
    """Run the soak's server until SIGINT / SIGTERM."""
    from pytriton.instances import ProcessInstances
    from pytriton.model_config import (
        ModelConfig,
        SequenceBatcher,
        SequenceControlInput,
        SequenceControlKind,
        Tensor,
    )
    from pytriton.security import TritonSecurityConfig
    from pytriton.triton import Triton, TritonConfig

    def model(fn: Any, name: str, count: int = 1) -> Any:
        if "procs" not in mode:
            return fn
        return ProcessInstances(fn, count=count, env={SOAK_MODEL: name})  # the killer finds the abused ones

    tensor_in = [Tensor(name="INPUT", dtype=np.float32, shape=(-1,))]
    tensor_out = [Tensor(name="OUTPUT", dtype=np.float32, shape=(-1,))]
    config = TritonConfig(http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2])
    frontends = 3 if mode.startswith("frontends3") else 1
    with Triton(config=config, frontends=frontends, security_config=TritonSecurityConfig(restricted_endpoints=[])) as t:
        for name, count in (("echo", 2), ("echo_abuse", 1), ("cycled", 1)):
            batched = ModelConfig(max_batch_size=8)
            t.bind(name, model(echo, name, count), inputs=tensor_in, outputs=tensor_out, config=batched)
        for name in ("stream", "stream_abuse"):
            t.bind(
                name,
                model(stream, name),
                inputs=tensor_in,
                outputs=tensor_out,
                config=ModelConfig(max_batch_size=8, decoupled=True),
            )
        seq_config = ModelConfig(
            max_batch_size=8,
            sequence_batcher=SequenceBatcher(
                max_sequence_idle_microseconds=5_000_000,
                control_inputs=[
                    SequenceControlInput("START", SequenceControlKind.CONTROL_SEQUENCE_START, int32_false_true=[0, 1])
                ],
            ),
        )
        t.bind("seq", model(accumulate, "seq"), inputs=tensor_in, outputs=tensor_out, config=seq_config)
        print("SOAK SERVER READY", flush=True)
        t.serve()


# ---------------------------------------------------------------------------------------------------- sampling
def _children(root: int) -> List[int]:
    """`root` and every process under it."""
    parents: Dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        found.extend(frontier)
    return found


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "hub"
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    for word, role in (("frontend", "frontend"), ("process_instances", "instance"), ("instance", "instance")):
        if word in cmdline:
            return role
    return "other:" + cmdline[:60]


def process_sample(root: int) -> List[Dict[str, Any]]:
    """RSS (KiB), descriptors and threads of each process of the server."""
    rows = []
    for pid in _children(root):
        try:
            status = pathlib.Path(f"/proc/{pid}/status").read_text()
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            links = []
        rows.append(
            {
                "pid": pid,
                "role": _role(pid, root),
                "rss_kib": int(fields.get("VmRSS", "0 kB").split()[0]),
                "fds": fds,
                "threads": int(fields.get("Threads", "0")),
                "sockets": sum(link.startswith("socket:") for link in links),
                "memfd": sum(link.startswith("/memfd:") for link in links),
                "shm_files": sorted({link for link in links if link.startswith("/dev/shm/")}),
            }
        )
    return rows


def shm_entries() -> List[str]:
    return sorted(os.listdir("/dev/shm"))


# ---------------------------------------------------------------------------------------------------- the load
class Tally:
    """What the clients sent and saw, by name; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.error_samples: Dict[str, str] = {}

    def ok(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    def error(self, key: str, error: BaseException) -> None:
        text = f"{type(error).__name__}: {str(error)[:300]}"
        with self._lock:
            self.errors[key] += 1
            self.error_samples.setdefault(key + " " + text[:60], text)


class Load:
    def __init__(self, ports: List[int], tally: Tally, stop: threading.Event) -> None:
        self.http_port, self.grpc_port, self.metrics_port = ports
        self.http_url = f"127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.tally = tally
        self.stop = stop
        self.shm_serial = 0
        self.clients: List[Any] = []
        self.cycled_loaded = threading.Event()
        self.cycled_loaded.set()

    def loop(self, name: str, step: Any, pause: float) -> None:
        while not self.stop.is_set():
            try:
                step()
            except Exception as error:  # noqa: BLE001 - every failure is counted and shown
                self.tally.error(name, error)
            self.stop.wait(pause * random.uniform(0.5, 1.5))

    # -- well-behaved
    def http_infer(self, model: str, n: int, binary: bool) -> np.ndarray:
        import tritonclient.http as httpclient

        client = self._http()
        data = np.random.rand(1, n).astype(np.float32)
        inp = httpclient.InferInput("INPUT", list(data.shape), "FP32")
        inp.set_data_from_numpy(data, binary_data=binary)
        out = httpclient.InferRequestedOutput("OUTPUT", binary_data=binary)
        result = client.infer(model, [inp], outputs=[out])
        if not np.array_equal(result.as_numpy("OUTPUT"), data):
            raise AssertionError(f"{model}: wrong answer over HTTP")
        return data

    def grpc_infer(self, model: str, n: int) -> None:
        import tritonclient.grpc as grpcclient

        client = self._grpc()
        data = np.random.rand(1, n).astype(np.float32)
        inp = grpcclient.InferInput("INPUT", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        result = client.infer(model, [inp])
        if not np.array_equal(result.as_numpy("OUTPUT"), data):
            raise AssertionError(f"{model}: wrong answer over gRPC")

    def _http(self) -> Any:
        import tritonclient.http as httpclient

        key = "_http_" + str(threading.get_ident())
        if key not in self.__dict__:
            self.__dict__[key] = httpclient.InferenceServerClient(self.http_url, network_timeout=60.0)
            self.clients.append(self.__dict__[key])
        return self.__dict__[key]

    def _grpc(self) -> Any:
        import tritonclient.grpc as grpcclient

        key = "_grpc_" + str(threading.get_ident())
        if key not in self.__dict__:
            self.__dict__[key] = grpcclient.InferenceServerClient(self.grpc_url)
            self.clients.append(self.__dict__[key])
        return self.__dict__[key]

    def small_http(self) -> None:
        self.http_infer("echo", 16, binary=random.random() < 0.5)
        self.tally.ok("echo")

    def small_grpc(self) -> None:
        self.grpc_infer("echo", 16)
        self.tally.ok("echo")

    def big(self) -> None:
        if random.random() < 0.5:
            self.http_infer("echo", BIG, binary=True)
        else:
            self.grpc_infer("echo", BIG)
        self.tally.ok("echo")

    def grpc_stream(self) -> None:
        import queue

        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.grpc_url)
        answers: queue.Queue[Any] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            inp = grpcclient.InferInput("INPUT", [1, 4], "FP32")
            inp.set_data_from_numpy(np.ones((1, 4), np.float32))
            client.async_stream_infer("stream", [inp])
            for step in range(STREAM_STEPS):
                result, error = answers.get(timeout=60)
                if error is not None:
                    raise error
                if not np.array_equal(result.as_numpy("OUTPUT"), np.full((1, 4), 1 + step, np.float32)):
                    raise AssertionError("stream: wrong answer")
        finally:
            client.stop_stream()
            client.close()
        self.tally.ok("stream")

    def sse(self) -> None:
        body = json.dumps({"INPUT": [1.0, 2.0]}).encode()
        request = urllib.request.Request(
            f"http://{self.http_url}/v2/models/stream/generate_stream", data=body, method="POST"
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            events = [line for line in answer.read().decode().splitlines() if line.startswith("data:")]
        if len(events) != STREAM_STEPS or any("error" in event for event in events):
            raise AssertionError(f"generate_stream: {events!r}")
        self.tally.ok("stream")

    def sequence(self) -> None:
        import tritonclient.grpc as grpcclient

        client = self._grpc()
        sequence_id = random.randrange(1, 2**40)
        total = 0.0
        for index in range(SEQ_LEN):
            value = float(index + 1)
            total += value
            inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
            inp.set_data_from_numpy(np.full((1, 1), value, np.float32))
            result = client.infer(
                "seq",
                [inp],
                sequence_id=sequence_id,
                sequence_start=index == 0,
                sequence_end=index == SEQ_LEN - 1,
            )
            if float(result.as_numpy("OUTPUT")[0, 0]) != total:
                raise AssertionError(f"seq: {result.as_numpy('OUTPUT')} != {total}")
            self.tally.ok("seq")

    def shared_memory(self) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient
        import tritonclient.utils.shared_memory as shm

        self.shm_serial += 1
        use_grpc = random.random() < 0.5
        client = self._grpc() if use_grpc else self._http()
        module: Any = grpcclient if use_grpc else httpclient
        n = random.choice([16, BIG])
        size = n * 4
        name = f"soak_{os.getpid()}_{threading.get_ident() % 10000}_{self.shm_serial}"
        handle_in = shm.create_shared_memory_region(name + "_in", "/" + name + "_in", size)
        handle_out = shm.create_shared_memory_region(name + "_out", "/" + name + "_out", size)
        try:
            data = np.random.rand(1, n).astype(np.float32)
            shm.set_shared_memory_region(handle_in, [data])
            client.register_system_shared_memory(name + "_in", "/" + name + "_in", size)
            client.register_system_shared_memory(name + "_out", "/" + name + "_out", size)
            inp = module.InferInput("INPUT", [1, n], "FP32")
            inp.set_shared_memory(name + "_in", size)
            out = module.InferRequestedOutput("OUTPUT") if use_grpc else module.InferRequestedOutput("OUTPUT", True)
            out.set_shared_memory(name + "_out", size)
            client.infer("echo", [inp], outputs=[out])
            got = shm.get_contents_as_numpy(handle_out, np.float32, [1, n])
            if not np.array_equal(got, data):
                raise AssertionError("shared memory: wrong answer")
            self.tally.ok("echo")
        finally:
            for suffix in ("_in", "_out"):
                try:
                    client.unregister_system_shared_memory(name + suffix)
                except Exception as error:  # noqa: BLE001
                    self.tally.error("shm_unregister", error)
            shm.destroy_shared_memory_region(handle_in)
            shm.destroy_shared_memory_region(handle_out)

    def scrape(self) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30) as answer:
            if b"nv_inference_request_success" not in answer.read():
                raise AssertionError("metrics without nv_inference_request_success")
        with urllib.request.urlopen(f"http://{self.http_url}/v2/models/stats", timeout=30) as answer:
            json.loads(answer.read())
        self._grpc().get_inference_statistics()
        self.tally.ok("scrape")

    def cycle(self) -> None:
        client = self._http()
        self.cycled_loaded.clear()
        client.unload_model("cycled")
        time.sleep(random.uniform(0.2, 1.0))
        client.load_model("cycled")
        self.cycled_loaded.set()
        self.tally.ok("cycle")

    def cycled_infer(self) -> None:
        loaded = self.cycled_loaded.is_set()
        try:
            self.grpc_infer("cycled", 16) if random.random() < 0.5 else self.http_infer("cycled", 16, True)
            self.tally.ok("cycled")
        except Exception as error:
            if loaded and self.cycled_loaded.is_set():
                raise
            self.tally.ok("cycled_refused_while_cycling")
            del error

    # -- abusive (models echo_abuse and stream_abuse only)
    def _raw(self, rcvbuf: int = 0) -> socket.socket:
        sock = socket.socket()
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", self.http_port))
        return sock

    def _big_request(self, model: str = "echo_abuse") -> bytes:
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT",
                        "shape": [1, BIG],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": BIG * 4},
                    }
                ],
                "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}],
            }
        ).encode()
        body = header + np.ones(BIG, np.float32).tobytes()
        return (
            f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    def drop_mid_body(self) -> None:
        request = self._big_request()
        with self._raw() as sock:
            sock.sendall(request[: len(request) // 2])
            if random.random() < 0.5:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.tally.ok("abuse_drop_mid_body")

    def drop_mid_response(self) -> None:
        with self._raw() as sock:
            sock.sendall(self._big_request())
            sock.recv(100)
            if random.random() < 0.5:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.tally.ok("abuse_drop_mid_response")

    def slowloris(self) -> None:
        with self._raw() as sock:
            sock.sendall(b"POST /v2/models/echo_abuse/infer HTTP/1.1\r\nHost: x\r\n")
            for _ in range(random.randint(5, 20)):
                if self.stop.wait(1.0):
                    break
                try:
                    sock.sendall(b"X-a: b\r\n")
                except OSError:
                    self.tally.ok("abuse_slowloris_cut")
                    return
        self.tally.ok("abuse_slowloris")

    def never_read(self) -> None:
        with self._raw(rcvbuf=4096) as sock:
            sock.settimeout(5)
            request = self._big_request()
            try:
                for _ in range(4):
                    sock.sendall(request)
            except (socket.timeout, OSError):
                pass
            self.stop.wait(random.uniform(3, 12))
        self.tally.ok("abuse_never_read")

    def grpc_cancel(self) -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        client = self._grpc()
        data = np.ones((1, BIG), np.float32)
        inp = grpcclient.InferInput("INPUT", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        if random.random() < 0.5:
            try:
                client.infer("echo_abuse", [inp], client_timeout=random.choice([0.0005, 0.002, 0.01]))
            except InferenceServerException:
                pass
            self.tally.ok("abuse_grpc_deadline")
            return
        stream_client = grpcclient.InferenceServerClient(self.grpc_url)
        got = threading.Event()
        stream_client.start_stream(callback=lambda result, error: got.set())
        small = grpcclient.InferInput("INPUT", [1, 4], "FP32")
        small.set_data_from_numpy(np.ones((1, 4), np.float32))
        for _ in range(3):
            stream_client.async_stream_infer("stream_abuse", [small])
        got.wait(10)
        stream_client.stop_stream(cancel_requests=True)
        stream_client.close()
        self.tally.ok("abuse_grpc_stream_cancel")

    def killed_client(self) -> None:
        script = (
            "import numpy as np, tritonclient.grpc as g, tritonclient.http as h\n"
            f"c = g.InferenceServerClient('{self.grpc_url}'); hc = h.InferenceServerClient('{self.http_url}')\n"
            "print('go', flush=True)\n"
            "while True:\n"
            f"    d = np.ones((1, {BIG}), np.float32)\n"
            f"    i = g.InferInput('INPUT', [1, {BIG}], 'FP32'); i.set_data_from_numpy(d)\n"
            "    c.async_infer('echo_abuse', [i], callback=lambda r, e: None)\n"
            f"    j = h.InferInput('INPUT', [1, {BIG}], 'FP32'); j.set_data_from_numpy(d)\n"
            "    hc.async_infer('echo_abuse', [j])\n"
        )
        process = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            assert process.stdout is not None
            process.stdout.readline()
            self.stop.wait(random.uniform(0.3, 2.0))
        finally:
            process.kill()
            process.wait()
        self.tally.ok("abuse_killed_client")


def abused_instances(root: int) -> List[int]:
    """The instance processes of the abused models (procs modes)."""
    found = []
    for pid in _children(root):
        try:
            environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{SOAK_MODEL}=echo_abuse".encode() in environ or f"{SOAK_MODEL}=stream_abuse".encode() in environ:
            found.append(pid)
    return found


# ---------------------------------------------------------------------------------------------------- the driver
def _free_ports(count: int) -> List[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def _stats(http_url: str) -> Dict[str, Dict[str, int]]:
    with urllib.request.urlopen(f"http://{http_url}/v2/models/stats", timeout=30) as answer:
        document = json.loads(answer.read())
    found = {}
    for entry in document["model_stats"]:
        stats = entry["inference_stats"]
        found[entry["name"]] = {
            "success": int(stats["success"]["count"]),
            "fail": int(stats["fail"]["count"]),
            "inference_count": int(entry.get("inference_count", 0)),
        }
    return found


def _summarize(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    by_role: Dict[str, Dict[str, Any]] = {}
    for row in rows:
        role = row["role"] if row["role"] in ("hub",) else f"{row['role']}:{row['pid']}"
        by_role[role] = {key: row[key] for key in ("rss_kib", "fds", "threads", "sockets", "memfd", "shm_files")}
    return by_role


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, default="plain")
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--sample", type=float, default=30.0)
    parser.add_argument("--pace", type=float, default=1.0, help="a factor on every client's pause")
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.mode, [int(port) for port in args.serve.split(",")])
        return 0

    ports = _free_ports(3)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="leak-soak-"))
    log_path = workdir / "server.log"
    shm_before = set(shm_entries())
    env = dict(os.environ)
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "bench.leak_soak", "--mode", args.mode, "--serve", ",".join(map(str, ports))],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=str(pathlib.Path(__file__).resolve().parent.parent),
        )
    deadline = time.monotonic() + 120
    while b"SOAK SERVER READY" not in log_path.read_bytes():
        if server.poll() is not None or time.monotonic() > deadline:
            print(log_path.read_text()[-4000:])
            return 1
        time.sleep(0.5)
    time.sleep(2)  # frontends come up
    tally = Tally()
    stop = threading.Event()
    load = Load(ports, tally, stop)
    loops = [
        ("small_http", load.small_http, 0.05),
        ("small_grpc", load.small_grpc, 0.05),
        ("big", load.big, 0.3),
        ("grpc_stream", load.grpc_stream, 0.3),
        ("sse", load.sse, 0.3),
        ("sequence", load.sequence, 0.2),
        ("shared_memory", load.shared_memory, 0.4),
        ("scrape", load.scrape, 2.0),
        ("cycle", load.cycle, 8.0),
        ("cycled_infer", load.cycled_infer, 0.1),
        ("drop_mid_body", load.drop_mid_body, 1.0),
        ("drop_mid_response", load.drop_mid_response, 1.0),
        ("slowloris", load.slowloris, 1.0),
        ("slowloris2", load.slowloris, 1.0),
        ("never_read", load.never_read, 2.0),
        ("grpc_cancel", load.grpc_cancel, 0.5),
        ("killed_client", load.killed_client, 10.0),
    ]
    if "procs" in args.mode:

        def kill_instance() -> None:
            victims = abused_instances(server.pid)
            if victims:
                os.kill(random.choice(victims), signal.SIGKILL)
                tally.ok("abuse_killed_instance")

        loops.append(("kill_instance", kill_instance, 20.0))
    threads = [
        threading.Thread(target=load.loop, args=(name, step, pause * args.pace), name=name, daemon=True)
        for name, step, pause in loops
    ]
    samples: List[Dict[str, Any]] = []
    started = time.monotonic()

    def sample(label: str) -> None:
        rows = process_sample(server.pid)
        entry = {
            "t": round(time.monotonic() - started),
            "label": label,
            "processes": _summarize(rows),
            "shm": len(shm_entries()),
            "soak_shm": len([n for n in shm_entries() if n.startswith("soak_")]),
        }
        samples.append(entry)
        procs = " ".join(
            f"{role}={v['rss_kib'] // 1024}M/{v['fds']}fd({v['sockets']}s,{v['memfd']}m,{len(v['shm_files'])}shm)"
            f"/{v['threads']}t"
            for role, v in entry["processes"].items()
        )
        print(f"[{entry['t']:5d}s {label}] shm={entry['shm']} soak_shm={entry['soak_shm']} {procs}", flush=True)

    sample("idle")
    for thread in threads:
        thread.start()
    next_sample = time.monotonic() + args.sample
    while time.monotonic() - started < args.duration:
        time.sleep(1)
        if time.monotonic() >= next_sample:
            sample("load")
            print(f"         counts={dict(tally.counts)} errors={dict(tally.errors)}", flush=True)
            next_sample += args.sample
    stop.set()
    hung = []
    for thread in threads:
        thread.join(90)
        if thread.is_alive():
            hung.append(thread.name)
    load.cycled_loaded.wait(30)
    time.sleep(10)
    sample("after")
    for client in load.clients:
        client.close()
    time.sleep(5)
    sample("clients closed")
    stats = _stats(load.http_url)
    expected = {"echo": tally.counts["echo"], "seq": tally.counts["seq"], "stream": tally.counts["stream"]}
    mismatches = {
        name: {"clients_ok": expected[name], **stats.get(name, {})}
        for name in expected
        if stats.get(name, {}).get("success") != expected[name] or stats.get(name, {}).get("fail")
    }
    ours = {name for row in process_sample(server.pid) for name in row["shm_files"]}
    shm_left = sorted(n for n in set(shm_entries()) - shm_before if n.startswith("soak_") or "/dev/shm/" + n in ours)
    server.send_signal(signal.SIGINT)
    try:
        code: Optional[int] = server.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        code = None
    time.sleep(1)
    shm_after_stop = sorted(n for n in set(shm_entries()) - shm_before if n.startswith("soak_") or n in shm_left)
    log_text = log_path.read_text(errors="replace")
    tracebacks = [chunk[:1500] for chunk in log_text.split("Traceback")[1:]]
    report = {
        "mode": args.mode,
        "duration_s": args.duration,
        "samples": samples,
        "counts": dict(tally.counts),
        "client_errors": dict(tally.errors),
        "client_error_samples": tally.error_samples,
        "stats": stats,
        "count_mismatches": mismatches,
        "hung_clients": hung,
        "shm_left_while_up": shm_left,
        "shm_left_after_stop": shm_after_stop,
        "server_exit": code,
        "tracebacks": tracebacks,
        "log": str(log_path),
    }
    print(json.dumps({key: value for key, value in report.items() if key != "samples"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
