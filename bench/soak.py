"""Soak test: steady load at ~80% of the measured capacity, good and bad requests mixed, for minutes.

    .venv/bin/python -m bench.soak                    # 10 minutes
    .venv/bin/python -m bench.soak --duration 180     # 3 minutes, windows of 30 s

Not part of the test suite. The server runs in its own process pinned to one CPU (`--server-cpus`), wrk
and the side load on another (`--load-cpus`), as in the benchmark. Steps:

1. capacity: wrk at 32 connections, closed loop, on the same mix of requests (after a warm-up);
2. soak: wrk paced with a per-connection delay (`delay()` in the wrk script) so that the rate is about
   `--load` x capacity, in windows of `--window` seconds; a short calibration run sets the connection
   count, which then stays fixed. Requests rotate through good ones (JSON and binary) and bad ones
   (malformed JSON, wrong shape, unknown model, a model that raises); every answer is classified by
   status and body;
3. side load, all along: gRPC calls (good, wrong shape, unknown model, a stream cancelled after its first
   response) and HTTP clients that disconnect right after sending, at `--side-rps`.

Figures: per window the rate, p50/p99 and the answers by class; the server's RSS over time. Verdicts:
zero lost responses (socket errors, timeouts, unexpected answers; requests still in flight when a window
ends are counted apart, at most one per connection), RSS growth under 10% from the end of the first window
to the end, p99 stable (the highest window p99 within 2x of the lowest). Exit status 1 when one fails.
CPU steal time per window is shown: on a shared virtual machine it explains swings the server did not cause.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

BENCH_DIR = pathlib.Path(__file__).resolve().parent
ROWS = 16
# Request kinds: name, weight in the rotation, expected status, and a text the answer's body must contain.
KINDS: List[Tuple[str, int, int, str]] = [
    ("good_json", 5, 200, '"OUTPUT_1"'),
    ("good_binary", 2, 200, '"OUTPUT_1"'),
    ("bad_json", 1, 400, "failed to parse"),
    ("bad_shape", 1, 400, "unexpected shape"),
    ("unknown_model", 1, 404, "unknown model"),
    ("model_error", 1, 500, "soak model error"),
]

WRK_SCRIPT = r"""
-- written by bench/soak.py: rotate through the request kinds, pace each connection, classify answers
local dir = os.getenv("SOAK_DIR")
local delay_ms = tonumber(os.getenv("SOAK_DELAY_MS"))
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local data = f:read("*a")
  f:close()
  return data
end

function init(args)
  requests, names, rotation, expect = {}, {}, {}, {}
  sent, got = {}, {}
  local index = 0
  for line in io.lines(dir .. "/kinds.txt") do
    local name, weight, status, marker, path, header_length = line:match(
      "^(%S+) (%d+) (%d+) (%S+) (%S+) (%S+)$")
    index = index + 1
    local headers = {["Content-Type"] = "application/json"}
    if header_length ~= "-" then
      headers["Inference-Header-Content-Length"] = header_length
    end
    requests[index] = wrk.format("POST", path, headers, read(dir .. "/" .. name .. ".body"))
    names[index] = name
    expect[#expect + 1] = {status = tonumber(status), marker = (marker:gsub("%+", " "))}
    for _ = 1, tonumber(weight) do
      rotation[#rotation + 1] = index
    end
    sent[name], got[name] = 0, 0
  end
  got["unexpected"] = 0
  position = 0
end

function request()
  position = position + 1
  local index = rotation[(position - 1) % #rotation + 1]
  sent[names[index]] = sent[names[index]] + 1
  return requests[index]
end

function delay()
  return delay_ms
end

function response(status, headers, body)
  for index, want in ipairs(expect) do
    if status == want.status and body:find(want.marker, 1, true) then
      got[names[index]] = got[names[index]] + 1  -- the good kinds answer alike: all count as the first
      return
    end
  end
  got["unexpected"] = got["unexpected"] + 1
end

local function encode(t)
  local parts = {}
  for k, v in pairs(t) do
    parts[#parts + 1] = string.format('"%s":%d', k, v)
  end
  return "{" .. table.concat(parts, ",") .. "}"
end

function done(summary, latency, requests_)
  local e = summary.errors
  local sent_all, got_all = {}, {}
  for _, thread in ipairs(threads) do
    for k, v in pairs(thread:get("sent")) do sent_all[k] = (sent_all[k] or 0) + v end
    for k, v in pairs(thread:get("got")) do got_all[k] = (got_all[k] or 0) + v end
  end
  io.write(string.format(
    'SOAK_JSON {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"timeout":%d,'
      .. '"p50_us":%d,"p99_us":%d,"max_us":%d,"sent":%s,"got":%s}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max, encode(sent_all), encode(got_all)))
end
"""


# ---------------------------------------------------------------- the server


def serve(http_port: int, grpc_port: int) -> None:
    """The soak server: `identity` (dynamic batching) and `flaky` (raises on every call)."""
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    def identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]

    def flaky(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        raise RuntimeError("soak model error")

    tensors = [Tensor(dtype=np.float32, shape=(-1,))]
    config = TritonConfig(http_port=http_port, grpc_port=grpc_port, allow_metrics=False)
    with Triton(config=config) as triton:
        batcher = DynamicBatcher(max_queue_delay_microseconds=100)
        model_config = ModelConfig(max_batch_size=64, batcher=batcher)
        triton.bind("identity", identity, inputs=tensors, outputs=tensors, config=model_config)
        triton.bind("flaky", flaky, inputs=tensors, outputs=tensors)
        triton.serve()


class Server:
    """The soak server in its own process (pinned when asked)."""

    def __init__(self, cpus: Optional[str], log_path: pathlib.Path) -> None:
        self.http_port, self.grpc_port = _free_port(), _free_port()
        argv = [sys.executable, str(pathlib.Path(__file__)), "serve", str(self.http_port), str(self.grpc_port)]
        if cpus and shutil.which("taskset"):
            argv = ["taskset", "-c", cpus, *argv]
        env = dict(os.environ, PYTHONPATH=str(BENCH_DIR.parent))
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the soak server exited ({self.proc.returncode}); see {log_path}")
            if _status(f"http://127.0.0.1:{self.http_port}/v2/health/ready") == 200:
                return
            time.sleep(0.05)
        raise RuntimeError("the soak server did not become ready")

    def rss_mib(self) -> float:
        """Resident memory of the server process."""
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> int:
        """SIGTERM, then wait; returns the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self._log.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _status(url: str) -> Optional[int]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except Exception:  # noqa: BLE001 - not up yet
        return None


# ---------------------------------------------------------------- request bodies


def write_kinds(directory: pathlib.Path) -> None:
    """The bodies of every request kind and kinds.txt (name weight status marker path header-length)."""
    values = np.arange(ROWS, dtype=np.float32)
    good = {"inputs": [{"name": "INPUT_1", "shape": [1, ROWS], "datatype": "FP32", "data": values.tolist()}]}
    header = json.dumps(
        {
            "inputs": [
                {"name": "INPUT_1", "shape": [1, ROWS], "datatype": "FP32", "parameters": {"binary_data_size": 64}}
            ],
            "outputs": [{"name": "OUTPUT_1", "parameters": {"binary_data": False}}],
        }
    ).encode()
    bad_shape = {"inputs": [{"name": "INPUT_1", "shape": [1, ROWS, 1], "datatype": "FP32", "data": values.tolist()}]}
    bodies = {
        "good_json": (json.dumps(good).encode(), "/v2/models/identity/infer", "-"),
        "good_binary": (header + values.tobytes(), "/v2/models/identity/infer", str(len(header))),
        "bad_json": (json.dumps(good).encode()[:-7], "/v2/models/identity/infer", "-"),
        "bad_shape": (json.dumps(bad_shape).encode(), "/v2/models/identity/infer", "-"),
        "unknown_model": (json.dumps(good).encode(), "/v2/models/nope/infer", "-"),
        "model_error": (json.dumps(good).encode(), "/v2/models/flaky/infer", "-"),
    }
    lines = []
    for name, weight, status, marker in KINDS:
        body, path, header_length = bodies[name]
        (directory / f"{name}.body").write_bytes(body)
        lines.append(f"{name} {weight} {status} {marker.replace(' ', '+')} {path} {header_length}")
    (directory / "kinds.txt").write_text("\n".join(lines) + "\n")
    (directory / "soak.lua").write_text(WRK_SCRIPT)


# ---------------------------------------------------------------- load


def run_wrk(
    url: str, directory: pathlib.Path, connections: int, delay_ms: int, seconds: int, cpus: Optional[str]
) -> Dict[str, Any]:
    """One paced wrk run with the soak script; its SOAK_JSON summary."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s", "-s", str(directory / "soak.lua")]
    argv.append(url)
    if cpus and shutil.which("taskset"):
        argv = ["taskset", "-c", cpus, *argv]
    env = dict(os.environ, SOAK_DIR=str(directory), SOAK_DELAY_MS=str(delay_ms))
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 60, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SOAK_JSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"[:500])
    result: Dict[str, Any] = json.loads(line.split(" ", 1)[1])
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


class SideLoad(threading.Thread):
    """gRPC calls (good, bad, unknown model, a cancelled stream) and HTTP clients that leave, at a fixed rate."""

    def __init__(self, http_port: int, grpc_port: int, rps: float) -> None:
        super().__init__(daemon=True, name="soak-side-load")
        self.http_port, self.grpc_port, self.period_s = http_port, grpc_port, 1.0 / rps
        self.stopping = threading.Event()
        self.counts: Dict[str, int] = {}

    def count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def run(self) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        def message(model: str, shape: List[int]) -> Any:
            request = service_pb2.ModelInferRequest(model_name=model)
            request.inputs.add(name="INPUT_1", datatype="FP32", shape=shape)
            request.raw_input_contents.append(np.ones(ROWS, np.float32).tobytes())
            return request

        channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        calls = [
            ("grpc_good", message("identity", [1, ROWS]), grpc.StatusCode.OK),
            ("grpc_bad_shape", message("identity", [1, ROWS, 1]), grpc.StatusCode.INVALID_ARGUMENT),
            ("grpc_unknown_model", message("nope", [1, ROWS]), grpc.StatusCode.NOT_FOUND),
        ]
        tick = 0
        next_at = time.monotonic()
        while not self.stopping.is_set():
            name, request, code = calls[tick % len(calls)]
            try:
                stub.ModelInfer(request, timeout=10)
                got = grpc.StatusCode.OK
            except grpc.RpcError as error:
                got = error.code()
            self.count(name if got == code else f"{name}_unexpected_{got.name}")
            if tick % 10 == 0:
                self.count("http_left" if self._http_leave() else "http_left_failed")
            if tick % 20 == 0:
                self._cancelled_stream(stub, message("identity", [1, ROWS]))
            tick += 1
            next_at += self.period_s
            self.stopping.wait(max(0.0, next_at - time.monotonic()))
        channel.close()

    def _http_leave(self) -> bool:
        """Send a good request and close the connection without reading the answer."""
        body = json.dumps(
            {"inputs": [{"name": "INPUT_1", "shape": [1, ROWS], "datatype": "FP32", "data": [1.0] * ROWS}]}
        ).encode()
        try:
            with socket.create_connection(("127.0.0.1", self.http_port), timeout=10) as sock:
                sock.sendall(
                    b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: soak\r\nContent-Length: %d\r\n\r\n" % len(body)
                    + body
                )
            return True
        except OSError:
            return False

    def _cancelled_stream(self, stub: Any, request: Any) -> None:
        """A ModelStreamInfer that gets its first response, then is cancelled."""
        release = threading.Event()

        def requests() -> Any:
            yield request
            release.wait(10)

        responses = stub.ModelStreamInfer(requests(), timeout=10)
        try:
            first = next(responses)
            self.count("grpc_stream" if not first.error_message else "grpc_stream_unexpected_error")
        except Exception as error:  # noqa: BLE001 - counted, not fatal to the soak
            self.count(f"grpc_stream_unexpected_{type(error).__name__}")
        finally:
            responses.cancel()
            release.set()


# ---------------------------------------------------------------- driver


def main(argv: Optional[List[str]] = None) -> int:
    """Run the soak and print its figures; exit status 1 when a verdict fails."""
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=600, help="soak seconds (default 600)")
    parser.add_argument("--window", type=int, default=30, help="seconds per measurement window (default 30)")
    parser.add_argument("--load", type=float, default=0.8, help="target rate as a fraction of capacity")
    parser.add_argument("--delay-ms", type=int, default=20, help="pause per connection between requests")
    parser.add_argument("--side-rps", type=float, default=30.0, help="gRPC / leaving-client calls per second")
    parser.add_argument("--server-cpus", default="1")
    parser.add_argument("--load-cpus", default="0")
    parser.add_argument("--json", type=pathlib.Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is missing: apt-get install -y wrk", file=sys.stderr)
        return 2
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="soak-"))
    write_kinds(workdir)
    server = Server(args.server_cpus, workdir / "server.log")
    url = f"http://127.0.0.1:{server.http_port}"
    try:
        report = soak(server, url, workdir, args)
    finally:
        exit_status = server.stop()
    report["server_exit_status"] = exit_status
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if report["verdicts_ok"] and exit_status == 0 else 1


def soak(server: Server, url: str, workdir: pathlib.Path, args: argparse.Namespace) -> Dict[str, Any]:
    """Measure capacity, then hold the load window by window."""
    run_wrk(url, workdir, 32, 0, 3, args.load_cpus)  # warm-up
    capacity = run_wrk(url, workdir, 32, 0, 5, args.load_cpus)["rps"]  # the same mix, closed loop, no pause
    target = args.load * capacity
    guess = max(1, round(target * (args.delay_ms + 1) / 1000))
    calibration = run_wrk(url, workdir, guess, args.delay_ms, max(5, args.window // 3), args.load_cpus)
    # One correction, within 2x, then the connection count stays: memory and latency compare like for like.
    connections = max(1, min(2 * guess, round(guess * target / max(calibration["rps"], 1.0))))
    print(
        f"capacity {capacity:,.0f} req/s; target {target:,.0f} req/s; {connections} connections "
        f"({calibration['rps']:,.0f} req/s at {guess} while calibrating)",
        file=sys.stderr,
    )
    side = SideLoad(server.http_port, server.grpc_port, args.side_rps)
    rss: List[Tuple[float, float]] = [(0.0, server.rss_mib())]
    stop_sampling = threading.Event()
    started = time.monotonic()

    def sample() -> None:
        while not stop_sampling.wait(1.0):
            rss.append((time.monotonic() - started, server.rss_mib()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    side.start()
    windows: List[Dict[str, Any]] = []
    try:
        for _ in range(max(1, args.duration // args.window)):
            steal_before = _cpu_times()
            result = run_wrk(url, workdir, connections, args.delay_ms, args.window, args.load_cpus)
            result["steal"] = _steal_share(steal_before, _cpu_times())
            result["connections"] = connections
            result["rss_mib"] = server.rss_mib()
            windows.append(result)
            print(
                f"  window {len(windows)}: {result['rps']:,.0f} req/s, p99 {result['p99_us'] / 1000:.2f} ms, "
                f"RSS {result['rss_mib']:.1f} MiB, CPU steal {result['steal']:.0%}",
                file=sys.stderr,
            )
    finally:
        side.stopping.set()
        side.join(30)
        stop_sampling.set()
        sampler.join(5)
    return summarize(capacity, target, windows, side.counts, rss)


def _cpu_times() -> List[int]:
    """The machine's aggregate CPU times from /proc/stat (empty where unavailable)."""
    try:
        with open("/proc/stat") as stat:
            return [int(value) for value in stat.readline().split()[1:]]
    except OSError:
        return []


def _steal_share(before: List[int], after: List[int]) -> float:
    """Share of CPU time the hypervisor took from this machine between two samples (steal time)."""
    if len(before) < 8 or len(after) < 8:
        return float("nan")
    deltas = [b - a for a, b in zip(before, after)]
    total = sum(deltas[:8])
    return deltas[7] / total if total else 0.0


def summarize(
    capacity: float,
    target: float,
    windows: List[Dict[str, Any]],
    side: Dict[str, int],
    rss: List[Tuple[float, float]],
) -> Dict[str, Any]:
    """Totals and verdicts."""
    sent = {name: sum(w["sent"].get(name, 0) for w in windows) for name, *_ in KINDS}
    got = {name: sum(w["got"].get(name, 0) for w in windows) for name, *_ in KINDS}
    unexpected = sum(w["got"].get("unexpected", 0) for w in windows)
    socket_errors = sum(w["connect"] + w["read"] + w["write"] for w in windows)
    timeouts = sum(w["timeout"] for w in windows)
    in_flight = sum(sent.values()) - sum(got.values()) - unexpected
    in_flight_allowed = sum(w["connections"] for w in windows)
    side_unexpected = sum(count for key, count in side.items() if "unexpected" in key or "failed" in key)
    lost = socket_errors + timeouts + unexpected + side_unexpected + max(0, in_flight - in_flight_allowed)
    rss_start = windows[0]["rss_mib"]
    rss_end = windows[-1]["rss_mib"]
    growth = (rss_end - rss_start) / rss_start
    p99s = [w["p99_us"] / 1000 for w in windows]
    p99_spread = max(p99s) / min(p99s) if min(p99s) else float("inf")
    verdicts = {
        "zero lost responses": lost == 0,
        "RSS growth under 10%": growth < 0.10,
        "p99 stable (highest window within 2x of lowest)": p99_spread <= 2.0,
    }
    return {
        "capacity_rps": capacity,
        "target_rps": target,
        "windows": windows,
        "sent": sent,
        "answered": got,
        "unexpected_answers": unexpected,
        "socket_errors": socket_errors,
        "timeouts": timeouts,
        "in_flight_at_window_ends": in_flight,
        "side_load": side,
        "lost": lost,
        "rss_mib_samples": rss,
        "rss_start_mib": rss_start,
        "rss_end_mib": rss_end,
        "rss_growth": growth,
        "p99_ms": p99s,
        "p99_spread": p99_spread,
        "verdicts": verdicts,
        "verdicts_ok": all(verdicts.values()),
    }


def print_report(report: Dict[str, Any]) -> None:
    """The figures, as a table."""
    print(f"capacity {report['capacity_rps']:,.0f} req/s (the same mix, 32 connections, closed loop)")
    print(f"target   {report['target_rps']:,.0f} req/s")
    print()
    print(f"connections {report['windows'][0]['connections']}")
    print("window   req/s  p50 ms  p99 ms  max ms  RSS MiB  steal  answers (good / 400 / 404 / 500)")
    for index, window in enumerate(report["windows"], 1):
        got = window["got"]
        good = got.get("good_json", 0) + got.get("good_binary", 0)
        bad = got.get("bad_json", 0) + got.get("bad_shape", 0)
        print(
            f"{index:>6}  {window['rps']:>6,.0f}  {window['p50_us'] / 1000:>6.2f}  "
            f"{window['p99_us'] / 1000:>6.2f}  {window['max_us'] / 1000:>6.1f}  {window['rss_mib']:>7.1f}  "
            f"{window['steal']:>5.0%}  "
            f"{good} / {bad} / {got.get('unknown_model', 0)} / {got.get('model_error', 0)}"
        )
    print()
    total_sent, total_got = sum(report["sent"].values()), sum(report["answered"].values())
    print(f"HTTP requests sent {total_sent:,}, answered as expected {total_got:,}, ", end="")
    print(f"unexpected answers {report['unexpected_answers']}, socket errors {report['socket_errors']}, ", end="")
    print(f"timeouts {report['timeouts']}, in flight when a window ended {report['in_flight_at_window_ends']}")
    print("side load: " + ", ".join(f"{key} {count:,}" for key, count in sorted(report["side_load"].items())))
    print(f"lost responses: {report['lost']}")
    print(
        f"RSS {report['rss_start_mib']:.1f} MiB after the first window -> {report['rss_end_mib']:.1f} MiB at the "
        f"end ({report['rss_growth']:+.1%})"
    )
    print("p99 ms per window: " + ", ".join(f"{p99:.2f}" for p99 in report["p99_ms"]), end="")
    print(f" (highest / lowest {report['p99_spread']:.2f}x)")
    for name, ok in report["verdicts"].items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print(f"server exit status after SIGTERM: {report['server_exit_status']}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(main())
