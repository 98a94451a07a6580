"""Whole-server soak with leak and loss accounting: every kind of model, every kind of client, for minutes.

    python -m bench.soak_all --frontends 2 --duration 720 --json /tmp/soak-f2.json
    python -m bench.soak_all --frontends 1 --duration 720 --json /tmp/soak-f1.json

Not part of the test suite (bench/leak_soak.py is the older, narrower one). The server runs in a process of its
own (this module with `--serve`) and binds:

- `batch_echo` (a @batch thread model), `proc_echo` (ProcessInstances, two), `async_echo` (`async def`),
  `stream` (decoupled generator), `seq` (sequence batcher, stateful), `composed` (sync, calls `inner` through
  pytriton.compose), `proc_composed` (ProcessInstances, calls `inner2`), `toy` (the OpenAI route, a generator),
  `cycled` (ProcessInstances, unloaded and loaded again and again through the repository API), and models that
  only abusive clients use so that the others' counts stay exact: `abuse` (echo), `abuse_stream`, `slow`.

The load comes from client processes (`--client ROLE`), each counting, per model, every request it sent and
every answer it got (ok, or the kind of error), and for streams every response by request id (a duplicate or a
missing one is counted). Every `--sample` seconds the driver notes, per server process (hub, frontends, instance
processes): RSS, open descriptors, threads, and the asyncio tasks a probe (a sitecustomize put on the server's
PYTHONPATH) writes from inside each process; and the /dev/shm entries. At the end it compares the clients' counts
with the statistics extension (HTTP and gRPC) and /metrics, and prints what grew and what did not add up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from bench.leak_soak import _children, _free_ports, _role, accumulate, echo

STEPS = 3  # responses of `stream` / `abuse_stream` per request
CLEAN = (
    "batch_echo",
    "proc_echo",
    "async_echo",
    "stream",
    "proc_stream",
    "seq",
    "proc_seq",
    "composed",
    "proc_composed",
    "toy",
)
ROLES = ("http", "grpc", "aio", "streams", "shm", "abuse", "abuse2", "control")

PROBE = r"""
import asyncio, collections, json, os, sys, threading, time

def _probe():
    path = os.environ.get("SOAK_PROBE_DIR")
    traced = bool(os.environ.get("SOAK_TRACEMALLOC")) and "--serve" in sys.argv
    if traced:
        import tracemalloc
        tracemalloc.start(8)
        started, base = time.time(), None
    while path:
        time.sleep(5)
        trigger = f"{path}/collect.{os.getpid()}"
        if os.path.exists(trigger):
            import gc
            label = open(trigger).read().strip()
            os.unlink(trigger)
            unreachable = gc.collect()
            kinds = collections.Counter(type(o).__module__ + "." + type(o).__qualname__ for o in gc.get_objects())
            with open(f"{path}/heap.{os.getpid()}.{label}.json", "w") as f:
                json.dump({"unreachable": unreachable, "kinds": kinds.most_common(60)}, f)
        if traced and base is None and time.time() - started > 120:
            base = tracemalloc.take_snapshot()
        elif traced and base is not None and int(time.time() - started) % 60 < 5:
            snap = tracemalloc.take_snapshot()
            top = snap.compare_to(base, "traceback")[:12]
            with open(f"{path}/trace.{os.getpid()}.txt", "a") as f:
                f.write(f"==== {int(time.time() - started)} s\n")
                for stat in top:
                    f.write(f"{stat.size_diff // 1024} KiB {stat.count_diff:+d} blocks\n")
                    for line in stat.traceback.format()[-16:]:
                        f.write("    " + line + "\n")
        for _ in range(5):
            try:
                tasks = list(asyncio.tasks._all_tasks)
                break
            except RuntimeError:
                continue
        else:
            tasks = []
        live = [t for t in tasks if not t.done()]
        coro = t = None
        names = collections.Counter()
        for t in live:
            coro = t.get_coro()
            names[getattr(coro, "__qualname__", type(coro).__name__)] += 1
        kinds = collections.Counter(th.name.rstrip("0123456789-_ ") for th in threading.enumerate())
        doc = {"pid": os.getpid(), "t": time.time(), "tasks": len(live), "top": names.most_common(6),
               "threads": sorted(kinds.items())}
        tmp = f"{path}/probe.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, f"{path}/probe.{os.getpid()}.json")
        del tasks, live, coro, t  # holding them would keep tasks alive that the collector should free

threading.Thread(target=_probe, name="soak-probe", daemon=True).start()
"""


# ---------------------------------------------------------------------------------------------------- the server
def _stream(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    for step in range(STEPS):
        yield [{"OUTPUT": request["INPUT"] + step} for request in requests]


def _slow(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    time.sleep(0.2)
    return [{"OUTPUT": request["INPUT"]} for request in requests]


def _composed(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    from pytriton.compose import call_model

    return [{"OUTPUT": call_model("inner", {"INPUT": r["INPUT"]})["OUTPUT"] * 2} for r in requests]


def _proc_composed(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    from pytriton.compose import call_model

    return [{"OUTPUT": call_model("inner2", {"INPUT": r["INPUT"]})["OUTPUT"] * 2} for r in requests]


async def _async_echo(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    await asyncio.sleep(0)
    return [{"OUTPUT": request["INPUT"] + 1} for request in requests]


def _slow_stream(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    for step in range(10):
        time.sleep(0.03)
        yield [{"OUTPUT": request["INPUT"] + step} for request in requests]


def _paced_stream(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    for step in range(STEPS):
        time.sleep(0.05)
        yield [{"OUTPUT": request["INPUT"] + step} for request in requests]


def _slow_gen(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    for step in range(10):
        time.sleep(0.03)
        yield [{"text_output": np.array([[f"w{step} ".encode()]], dtype=object)} for _ in requests]


def _toy(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    for step in range(4):
        yield [{"text_output": np.array([[f"word{step} ".encode()]], dtype=object)} for _ in requests]


def serve(frontends: int, ports: List[int]) -> None:
    """Run the soak's server until SIGINT / SIGTERM."""
    from pytriton.decorators import batch
    from pytriton.instances import ProcessInstances
    from pytriton.model_config import (
        DynamicBatcher,
        ModelConfig,
        SequenceBatcher,
        SequenceControlInput,
        SequenceControlKind,
        Tensor,
    )
    from pytriton.openai import OpenAIChat
    from pytriton.security import TritonSecurityConfig
    from pytriton.triton import Triton, TritonConfig

    @batch
    def batch_echo(INPUT: np.ndarray) -> Dict[str, np.ndarray]:
        return {"OUTPUT": INPUT}

    t_in = [Tensor(name="INPUT", dtype=np.float32, shape=(-1,))]
    t_out = [Tensor(name="OUTPUT", dtype=np.float32, shape=(-1,))]
    batched = ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=500))
    config = TritonConfig(http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2])
    security = TritonSecurityConfig(restricted_endpoints=[])
    with Triton(config=config, frontends=frontends, security_config=security) as t:
        t.bind("batch_echo", batch_echo, inputs=t_in, outputs=t_out, config=batched)
        t.bind("proc_echo", ProcessInstances(echo, count=2), inputs=t_in, outputs=t_out, config=batched)
        t.bind("async_echo", _async_echo, inputs=t_in, outputs=t_out, config=ModelConfig(max_batch_size=8))
        decoupled = ModelConfig(max_batch_size=8, decoupled=True)
        t.bind("stream", _stream, inputs=t_in, outputs=t_out, config=decoupled)
        t.bind("abuse_stream", _stream, inputs=t_in, outputs=t_out, config=decoupled)
        seq_config = ModelConfig(
            max_batch_size=8,
            sequence_batcher=SequenceBatcher(
                max_sequence_idle_microseconds=2_000_000,
                control_inputs=[
                    SequenceControlInput("START", SequenceControlKind.CONTROL_SEQUENCE_START, int32_false_true=[0, 1])
                ],
            ),
        )
        t.bind("seq", accumulate, inputs=t_in, outputs=t_out, config=seq_config)
        t.bind("proc_seq", ProcessInstances(accumulate), inputs=t_in, outputs=t_out, config=seq_config)
        t.bind("proc_stream", ProcessInstances(_stream), inputs=t_in, outputs=t_out, config=decoupled)
        t.bind("proc_stream_abuse", ProcessInstances(_slow_stream), inputs=t_in, outputs=t_out, config=decoupled)
        t.bind(
            "slow_gen",
            _slow_gen,
            inputs=[Tensor(name="text_input", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="text_output", dtype=bytes, shape=(1,))],
            config=ModelConfig(decoupled=True),
            openai=OpenAIChat(chat_template=None),
        )
        t.bind("inner", echo, inputs=t_in, outputs=t_out, config=batched)
        t.bind("inner2", echo, inputs=t_in, outputs=t_out, config=batched)
        t.bind("composed", _composed, inputs=t_in, outputs=t_out, config=batched)
        t.bind("proc_composed", ProcessInstances(_proc_composed), inputs=t_in, outputs=t_out, config=batched)
        t.bind("abuse", echo, inputs=t_in, outputs=t_out, config=batched)
        t.bind("slow", _slow, inputs=t_in, outputs=t_out, config=ModelConfig(max_batch_size=8))
        t.bind("cycled", ProcessInstances(echo), inputs=t_in, outputs=t_out, config=batched)
        t.bind("cycled_stream", ProcessInstances(_paced_stream), inputs=t_in, outputs=t_out, config=decoupled)
        t.bind(
            "toy",
            _toy,
            inputs=[Tensor(name="text_input", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="text_output", dtype=bytes, shape=(1,))],
            config=ModelConfig(decoupled=True),
            openai=OpenAIChat(chat_template=None),
        )
        print("SOAK SERVER READY", flush=True)
        t.serve()


# ---------------------------------------------------------------------------------------------------- clients
class Tally:
    """Per model: sent, ok, err:<kind>, and stream anomalies; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.samples: Dict[str, str] = {}

    def add(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def error(self, model: str, error: BaseException) -> None:
        text = f"{type(error).__name__}: {str(error)[:240]}"
        kind = re.sub(r"[0-9a-f]{6,}|\d+", "N", text)[:90]
        with self.lock:
            self.counts[f"{model}|err|{kind}"] += 1
            self.samples.setdefault(f"{model}|{kind}", text)


class Client:
    """One client process's role; runs until `until` (a time.time()), then writes its tally."""

    def __init__(self, role: str, ports: List[int], until: float, out: pathlib.Path) -> None:
        self.role = role
        self.http_port, self.grpc_port, self.metrics_port = ports
        self.http_url = f"127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.until = until
        self.out = out
        self.tally = Tally()
        self.local = threading.local()
        self.serial = 0

    def running(self) -> bool:
        return time.time() < self.until

    # one counted request: sent, then exactly one of ok / err
    def counted(self, model: str, call: Callable[[], None]) -> None:
        self.tally.add(f"{model}|sent")
        try:
            call()
        except Exception as error:  # noqa: BLE001 - counted by kind
            self.tally.error(model, error)
        else:
            self.tally.add(f"{model}|ok")

    def http(self) -> Any:
        import tritonclient.http as httpclient

        if not hasattr(self.local, "http"):
            self.local.http = httpclient.InferenceServerClient(self.http_url, network_timeout=60.0)
        return self.local.http

    def grpc(self) -> Any:
        import tritonclient.grpc as grpcclient

        if not hasattr(self.local, "grpc"):
            self.local.grpc = grpcclient.InferenceServerClient(self.grpc_url)
        return self.local.grpc

    @staticmethod
    def expected(model: str, data: np.ndarray) -> np.ndarray:
        if model == "async_echo":
            return data + 1
        if model in ("composed", "proc_composed"):
            return data * 2
        return data

    def http_infer(self, model: str, n: int, binary: bool, client: Any = None) -> None:
        import tritonclient.http as httpclient

        data = np.random.rand(1, n).astype(np.float32)
        inp = httpclient.InferInput("INPUT", [1, n], "FP32")
        inp.set_data_from_numpy(data, binary_data=binary)
        out = httpclient.InferRequestedOutput("OUTPUT", binary_data=binary)
        result = (client or self.http()).infer(model, [inp], outputs=[out])
        if not np.allclose(result.as_numpy("OUTPUT"), self.expected(model, data)):
            raise AssertionError(f"{model}: wrong answer over HTTP")

    def grpc_infer(self, model: str, n: int, client: Any = None) -> None:
        import tritonclient.grpc as grpcclient

        data = np.random.rand(1, n).astype(np.float32)
        inp = grpcclient.InferInput("INPUT", [1, n], "FP32")
        inp.set_data_from_numpy(data)
        result = (client or self.grpc()).infer(model, [inp])
        if not np.allclose(result.as_numpy("OUTPUT"), self.expected(model, data)):
            raise AssertionError(f"{model}: wrong answer over gRPC")

    def loop(self, step: Callable[[], None], pause: float) -> None:
        while self.running():
            try:
                step()
            except Exception as error:  # noqa: BLE001 - a step's own failure outside any counted request
                self.tally.error("step:" + getattr(step, "__name__", "?"), error)
            time.sleep(pause * random.uniform(0.5, 1.5))

    def run(self) -> None:
        steps: List[Tuple[Callable[[], None], float]] = getattr(self, "role_" + self.role)()
        threads = [threading.Thread(target=self.loop, args=step, daemon=True) for step in steps]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(1.0, self.until - time.time() + 120))
        hung = sum(thread.is_alive() for thread in threads)
        self.out.write_text(
            json.dumps(
                {"role": self.role, "counts": dict(self.tally.counts), "samples": self.tally.samples, "hung": hung}
            )
        )

    # ---- roles: each returns (step, pause) pairs, one thread each
    def role_http(self) -> List[Tuple[Callable[[], None], float]]:
        def step() -> None:
            model = random.choice(("batch_echo", "proc_echo", "async_echo", "composed", "proc_composed"))
            n = random.choice((4, 64, 65536))
            self.counted(model, lambda: self.http_infer(model, n, binary=random.random() < 0.7))

        return [(step, 0.05), (step, 0.05), (step, 0.1)]

    def role_grpc(self) -> List[Tuple[Callable[[], None], float]]:
        import tritonclient.grpc as grpcclient

        def step() -> None:
            model = random.choice(("batch_echo", "proc_echo", "async_echo", "composed", "proc_composed"))
            n = random.choice((4, 64, 65536))
            self.counted(model, lambda: self.grpc_infer(model, n))

        def sequence() -> None:
            model = random.choice(("seq", "proc_seq"))
            sequence_id = random.randrange(1, 2**40)
            length = random.randint(1, 5)
            abandon = random.random() < 0.3  # never sends its end: the idle timeout must free it
            total = 0.0
            for index in range(length):
                value = float(index + 1)
                total += value

                def call(value: float = value, total: float = total, index: int = index) -> None:
                    inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
                    inp.set_data_from_numpy(np.full((1, 1), value, np.float32))
                    result = self.grpc().infer(
                        model,
                        [inp],
                        sequence_id=sequence_id,
                        sequence_start=index == 0,
                        sequence_end=index == length - 1 and not abandon,
                    )
                    if float(result.as_numpy("OUTPUT")[0, 0]) != total:
                        raise AssertionError(f"seq: {result.as_numpy('OUTPUT')} != {total}")

                self.counted(model, call)
            self.tally.add("seq_abandoned" if abandon else "seq_ended")

        def stream() -> None:
            import queue

            client = grpcclient.InferenceServerClient(self.grpc_url)
            answers: queue.Queue[Any] = queue.Queue()
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            count = random.randint(1, 4)
            model = random.choice(("stream", "proc_stream"))
            got: Counter[str] = Counter()
            finals: Counter[str] = Counter()
            try:
                for index in range(count):
                    inp = grpcclient.InferInput("INPUT", [1, 4], "FP32")
                    inp.set_data_from_numpy(np.full((1, 4), float(index), np.float32))
                    self.tally.add(f"{model}|sent")
                    client.async_stream_infer(model, [inp], request_id=f"r{index}", enable_empty_final_response=True)
                while sum(finals.values()) < count:
                    result, error = answers.get(timeout=60)
                    if error is not None:
                        self.tally.error(model, error)
                        finals["?"] += 1
                        continue
                    response = result.get_response()
                    if response.parameters["triton_final_response"].bool_param:
                        finals[response.id] += 1
                        if response.outputs:
                            got[response.id] += 1
                    else:
                        got[response.id] += 1
                        index = int(response.id[1:])
                        if not np.array_equal(result.as_numpy("OUTPUT")[0], np.full(4, index + got[response.id] - 1)):
                            self.tally.add(f"{model}|wrong_value")
            finally:
                client.stop_stream()
                client.close()
            for index in range(count):
                rid = f"r{index}"
                if finals[rid] == 1 and got[rid] == STEPS:
                    self.tally.add(f"{model}|ok")
                elif finals[rid] > 1 or got[rid] > STEPS:
                    self.tally.add(f"{model}|duplicated")
                elif finals["?"] == 0:
                    self.tally.add(f"{model}|lost")

        return [(step, 0.05), (step, 0.1), (sequence, 0.2), (stream, 0.3)]

    def role_aio(self) -> List[Tuple[Callable[[], None], float]]:
        def run_async() -> None:
            asyncio.run(self.aio_main())

        return [(run_async, 1.0)]

    async def aio_main(self) -> None:
        import tritonclient.grpc.aio as agrpc
        import tritonclient.http.aio as ahttp

        http = ahttp.InferenceServerClient(self.http_url)
        grpc = agrpc.InferenceServerClient(self.grpc_url)

        async def one(model: str) -> None:
            use_grpc = random.random() < 0.5
            module: Any = agrpc if use_grpc else ahttp
            data = np.random.rand(1, 16).astype(np.float32)
            inp = module.InferInput("INPUT", [1, 16], "FP32")
            inp.set_data_from_numpy(data)
            self.tally.add(f"{model}|sent")
            try:
                result = await (grpc if use_grpc else http).infer(model, [inp])
                if not np.allclose(result.as_numpy("OUTPUT"), self.expected(model, data)):
                    raise AssertionError(f"{model}: wrong answer (aio)")
            except Exception as error:  # noqa: BLE001
                self.tally.error(model, error)
            else:
                self.tally.add(f"{model}|ok")

        async def streamed() -> None:
            count = random.randint(1, 6)
            model = random.choice(("stream", "proc_stream"))

            async def requests() -> Any:
                for index in range(count):
                    inp = agrpc.InferInput("INPUT", [1, 2], "FP32")
                    inp.set_data_from_numpy(np.full((1, 2), float(index), np.float32))
                    self.tally.add(f"{model}|sent")
                    yield {
                        "model_name": model,
                        "inputs": [inp],
                        "request_id": f"a{index}",
                        "enable_empty_final_response": True,
                    }

            # The aio client cannot ask for the empty final response: the requests end with the request iterator and
            # the server ends the stream once each has answered. (Cancelling the call after the last data response
            # would cancel a request the server has not ended yet: it counts CANCELED, by design.)
            got: Counter[str] = Counter()
            errors = 0

            async def read() -> None:
                nonlocal errors
                async for result, error in grpc.stream_infer(requests()):
                    if error is not None:
                        self.tally.error(model, error)
                        errors += 1
                    else:
                        got[result.get_response().id] += 1

            try:
                await asyncio.wait_for(read(), 60)
            except asyncio.TimeoutError:
                self.tally.add(f"{model}|stuck")
            for index in range(count):
                rid = f"a{index}"
                if got[rid] == STEPS:
                    self.tally.add(f"{model}|ok")
                elif got[rid] > STEPS:
                    self.tally.add(f"{model}|duplicated")
                elif not errors:
                    self.tally.add(f"{model}|lost")

        try:
            while self.running():
                models = random.choices(("batch_echo", "proc_echo", "async_echo", "composed", "proc_composed"), k=6)
                await asyncio.gather(*(one(model) for model in models), streamed())
                await asyncio.sleep(random.uniform(0.1, 0.4))
        finally:
            await http.close()
            await grpc.close()

    def role_streams(self) -> List[Tuple[Callable[[], None], float]]:
        def sse() -> None:
            def call() -> None:
                body = json.dumps({"INPUT": [1.0, 2.0]}).encode()
                request = urllib.request.Request(
                    f"http://{self.http_url}/v2/models/stream/generate_stream", data=body, method="POST"
                )
                with urllib.request.urlopen(request, timeout=60) as answer:
                    events = [line for line in answer.read().decode().splitlines() if line.startswith("data:")]
                if len(events) != STEPS or any("error" in event for event in events):
                    raise AssertionError(f"generate_stream: {events!r}")

            self.counted("stream", call)

        def openai_chat() -> None:
            import openai

            if not hasattr(self.local, "openai"):
                self.local.openai = openai.OpenAI(base_url=f"http://{self.http_url}/v1", api_key="x", max_retries=0)
            client = self.local.openai

            def call() -> None:
                messages = [{"role": "user", "content": "hi"}]
                if random.random() < 0.5:
                    chunks = client.chat.completions.create(model="toy", messages=messages, stream=True)
                    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                else:
                    text = client.chat.completions.create(model="toy", messages=messages).choices[0].message.content
                if text != "word0 word1 word2 word3 ":
                    raise AssertionError(f"toy: {text!r}")

            self.counted("toy", call)

        def generate() -> None:
            def call() -> None:
                # a decoupled model: /generate would be a 400 (more than one response), as Triton answers
                body = json.dumps({"text_input": "x"}).encode()
                request = urllib.request.Request(f"http://{self.http_url}/v2/models/toy/generate_stream", data=body)
                with urllib.request.urlopen(request, timeout=60) as answer:
                    events = [line for line in answer.read().decode().splitlines() if line.startswith("data:")]
                if len(events) != 4 or "word3" not in events[-1]:
                    raise AssertionError(f"toy generate_stream: {events!r}")

            self.counted("toy", call)

        return [(sse, 0.2), (openai_chat, 0.2), (generate, 0.5)]

    def role_shm(self) -> List[Tuple[Callable[[], None], float]]:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient
        import tritonclient.utils.shared_memory as shm

        def step() -> None:
            self.serial += 1
            use_grpc = random.random() < 0.5
            client = self.grpc() if use_grpc else self.http()
            module: Any = grpcclient if use_grpc else httpclient
            model = random.choice(("batch_echo", "proc_echo"))
            n = random.choice((16, 262144))
            size = n * 4
            name = f"soakall_{os.getpid()}_{threading.get_ident() % 10000}_{self.serial}"
            handle_in = shm.create_shared_memory_region(name + "_in", "/" + name + "_in", size)
            handle_out = shm.create_shared_memory_region(name + "_out", "/" + name + "_out", size)
            try:
                data = np.random.rand(1, n).astype(np.float32)
                shm.set_shared_memory_region(handle_in, [data])
                client.register_system_shared_memory(name + "_in", "/" + name + "_in", size)
                client.register_system_shared_memory(name + "_out", "/" + name + "_out", size)

                def call() -> None:
                    inp = module.InferInput("INPUT", [1, n], "FP32")
                    inp.set_shared_memory(name + "_in", size)
                    out = module.InferRequestedOutput("OUTPUT")
                    out.set_shared_memory(name + "_out", size)
                    client.infer(model, [inp], outputs=[out])
                    got = shm.get_contents_as_numpy(handle_out, np.float32, [1, n])
                    if not np.array_equal(got, data):
                        raise AssertionError("shared memory: wrong answer")

                for _ in range(random.randint(1, 3)):
                    self.counted(model, call)
            finally:
                for suffix in ("_in", "_out"):
                    try:
                        client.unregister_system_shared_memory(name + suffix)
                    except Exception as error:  # noqa: BLE001
                        self.tally.error("shm_unregister", error)
                shm.destroy_shared_memory_region(handle_in)
                shm.destroy_shared_memory_region(handle_out)

        def status() -> None:
            # registered regions must not pile up: only this process's few in flight may show
            regions = self.http().get_system_shared_memory_status()
            mine = [r for r in regions if str(r.get("name", "")).startswith("soakall_")]
            self.tally.add("shm_status_max_regions", 0)
            with self.tally.lock:
                key = "shm_status_max_regions"
                self.tally.counts[key] = max(self.tally.counts[key], len(mine))

        return [(step, 0.3), (step, 0.5), (status, 5.0)]

    # ---- abuse: only on abuse / abuse_stream / slow
    def raw(self, rcvbuf: int = 0) -> socket.socket:
        sock = socket.socket()
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", self.http_port))
        return sock

    @staticmethod
    def big_request(model: str, n: int = 262144) -> bytes:
        header = json.dumps(
            {
                "inputs": [
                    {"name": "INPUT", "shape": [1, n], "datatype": "FP32", "parameters": {"binary_data_size": n * 4}}
                ],
                "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}],
            }
        ).encode()
        body = header + np.ones(n, np.float32).tobytes()
        return (
            f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    def role_abuse(self) -> List[Tuple[Callable[[], None], float]]:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        linger = b"\x01\x00\x00\x00\x00\x00\x00\x00"

        def drop_mid_body() -> None:
            request = self.big_request("abuse")
            with self.raw() as sock:
                sock.sendall(request[: random.randint(10, len(request) - 1)])
                if random.random() < 0.5:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            self.tally.add("abuse|drop_mid_body")

        def drop_mid_response() -> None:
            with self.raw() as sock:
                sock.sendall(self.big_request(random.choice(("abuse", "slow"))))
                if random.random() < 0.5:
                    sock.recv(100)
                if random.random() < 0.5:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            self.tally.add("abuse|drop_mid_response")

        def timeouts() -> None:
            data = np.ones((1, 16), np.float32)
            if random.random() < 0.5:
                inp = grpcclient.InferInput("INPUT", [1, 16], "FP32")
                inp.set_data_from_numpy(data)
                try:
                    self.grpc().infer("slow", [inp], client_timeout=random.choice([0.01, 0.1, 0.15]))
                    self.tally.add("slow|ok")
                except Exception as error:  # noqa: BLE001
                    self.tally.error("slow", error)
            else:
                client = httpclient.InferenceServerClient(self.http_url, network_timeout=random.choice([0.05, 0.1]))
                inp = httpclient.InferInput("INPUT", [1, 16], "FP32")
                inp.set_data_from_numpy(data)
                try:
                    client.infer("slow", [inp])
                    self.tally.add("slow|ok")
                except Exception as error:  # noqa: BLE001
                    self.tally.error("slow", error)
                finally:
                    client.close()

        def grpc_async_cancel() -> None:
            inp = grpcclient.InferInput("INPUT", [1, 16], "FP32")
            inp.set_data_from_numpy(np.ones((1, 16), np.float32))
            future = self.grpc().async_infer("slow", [inp], callback=lambda result, error: None)
            time.sleep(random.uniform(0.0, 0.1))
            future.cancel()
            self.tally.add("slow|cancelled")

        def stream_cancel() -> None:
            client = grpcclient.InferenceServerClient(self.grpc_url)
            got = threading.Event()
            client.start_stream(callback=lambda result, error: got.set())
            small = grpcclient.InferInput("INPUT", [1, 4], "FP32")
            small.set_data_from_numpy(np.ones((1, 4), np.float32))
            for _ in range(3):
                client.async_stream_infer(random.choice(("abuse_stream", "slow")), [small])
            got.wait(random.choice((0.0, 0.05, 2.0)))
            client.stop_stream(cancel_requests=True)
            client.close()
            self.tally.add("abuse|stream_cancel")

        def killed_client() -> None:
            script = (
                "import numpy as np, tritonclient.grpc as g, tritonclient.http as h\n"
                f"c = g.InferenceServerClient('{self.grpc_url}'); hc = h.InferenceServerClient('{self.http_url}')\n"
                "print('go', flush=True)\n"
                "while True:\n"
                "    d = np.ones((1, 65536), np.float32)\n"
                "    i = g.InferInput('INPUT', [1, 65536], 'FP32'); i.set_data_from_numpy(d)\n"
                "    c.async_infer('abuse', [i], callback=lambda r, e: None)\n"
                "    j = h.InferInput('INPUT', [1, 65536], 'FP32'); j.set_data_from_numpy(d)\n"
                "    hc.async_infer('slow', [j])\n"
            )
            process = subprocess.Popen(
                [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
            try:
                assert process.stdout is not None
                process.stdout.readline()
                time.sleep(random.uniform(0.3, 2.0))
            finally:
                process.kill()
                process.wait()
            self.tally.add("abuse|killed_client")

        def abandoned_shm() -> None:
            # a region registered then its client gone without unregistering; the driver unregisters all at the end
            import tritonclient.utils.shared_memory as shm

            self.serial += 1
            name = f"soakall_gone_{os.getpid()}_{self.serial}"
            handle = shm.create_shared_memory_region(name, "/" + name, 4096)
            try:
                self.http().register_system_shared_memory(name, "/" + name, 4096)
                self.http().unregister_system_shared_memory(name)
            finally:
                shm.destroy_shared_memory_region(handle)
            self.tally.add("abuse|shm_cycle")

        return [
            (drop_mid_body, 1.0),
            (drop_mid_response, 1.0),
            (timeouts, 0.3),
            (grpc_async_cancel, 0.5),
            (stream_cancel, 0.7),
            (killed_client, 10.0),
            (abandoned_shm, 2.0),
        ]

    def role_abuse2(self) -> List[Tuple[Callable[[], None], float]]:
        """Streams dropped or cancelled mid-way: OpenAI SSE, process-instance streams, aio tasks cancelled."""
        import tritonclient.grpc as grpcclient

        def openai_drop() -> None:
            import openai

            client = openai.OpenAI(base_url=f"http://{self.http_url}/v1", api_key="x", max_retries=0)
            stream = client.chat.completions.create(
                model="slow_gen", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            for index, _ in enumerate(stream):
                if index >= random.randint(0, 4):
                    break
            stream.close()
            client.close()
            self.tally.add("abuse2|openai_drop")

        def sse_drop() -> None:
            body = json.dumps({"INPUT": [1.0, 2.0]}).encode()
            with self.raw() as sock:
                sock.sendall(
                    f"POST /v2/models/proc_stream_abuse/generate_stream HTTP/1.1\r\nHost: x\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                if random.random() < 0.7:
                    sock.recv(200)
            self.tally.add("abuse2|sse_drop")

        def proc_stream_cancel() -> None:
            client = grpcclient.InferenceServerClient(self.grpc_url)
            got = threading.Event()
            client.start_stream(callback=lambda result, error: got.set())
            small = grpcclient.InferInput("INPUT", [1, 4], "FP32")
            small.set_data_from_numpy(np.ones((1, 4), np.float32))
            for _ in range(random.randint(1, 4)):
                client.async_stream_infer("proc_stream_abuse", [small])
            got.wait(random.choice((0.0, 0.05, 0.2)))
            client.stop_stream(cancel_requests=True)
            client.close()
            self.tally.add("abuse2|proc_stream_cancel")

        def aio_cancel() -> None:
            async def main() -> None:
                import tritonclient.grpc.aio as agrpc
                import tritonclient.http.aio as ahttp

                http = ahttp.InferenceServerClient(self.http_url)
                grpc = agrpc.InferenceServerClient(self.grpc_url)
                try:
                    for _ in range(5):
                        module: Any = random.choice((ahttp, agrpc))
                        inp = module.InferInput("INPUT", [1, 16], "FP32")
                        inp.set_data_from_numpy(np.ones((1, 16), np.float32))
                        client = http if module is ahttp else grpc
                        task = asyncio.ensure_future(client.infer(random.choice(("slow", "abuse")), [inp]))
                        await asyncio.sleep(random.uniform(0, 0.1))
                        task.cancel()
                        try:
                            await task
                        except BaseException:  # noqa: BLE001 - cancelled or an answer: either is fine
                            pass
                finally:
                    await http.close()
                    await grpc.close()

            asyncio.run(main())
            self.tally.add("abuse2|aio_cancel")

        return [(openai_drop, 0.7), (sse_drop, 0.7), (proc_stream_cancel, 0.7), (aio_cancel, 1.0)]

    def role_control(self) -> List[Tuple[Callable[[], None], float]]:
        loaded = threading.Event()
        loaded.set()

        def cycle() -> None:
            client = self.http() if random.random() < 0.5 else self.grpc()
            loaded.clear()
            model = random.choice(("cycled", "cycled_stream"))
            client.unload_model(model)
            time.sleep(random.uniform(0.2, 1.5))
            client.load_model(model)
            loaded.set()
            self.tally.add("cycled|cycles")

        def cycled_infer() -> None:
            was = loaded.is_set()
            try:
                self.grpc_infer("cycled", 16) if random.random() < 0.5 else self.http_infer("cycled", 16, True)
                self.tally.add("cycled|ok")
            except Exception as error:  # noqa: BLE001 - refused while cycling is expected
                if was and loaded.is_set():
                    self.tally.error("cycled", error)
                else:
                    self.tally.add("cycled|refused_while_cycling")

        def scrape() -> None:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30) as answer:
                answer.read()
            self.http().get_inference_statistics()
            self.grpc().get_inference_statistics()
            self.http().get_model_repository_index()
            self.tally.add("scrape|ok")

        def cycled_stream() -> None:
            """Each request of a stream across unloads: all its responses and the final flag, or one error."""
            import queue

            import tritonclient.grpc as grpcclient

            client = grpcclient.InferenceServerClient(self.grpc_url)
            answers: queue.Queue[Any] = queue.Queue()
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            count = random.randint(1, 3)
            got: Counter[str] = Counter()
            finals: Counter[str] = Counter()
            errors = 0
            try:
                for index in range(count):
                    inp = grpcclient.InferInput("INPUT", [1, 4], "FP32")
                    inp.set_data_from_numpy(np.full((1, 4), float(index), np.float32))
                    client.async_stream_infer(
                        "cycled_stream", [inp], request_id=f"c{index}", enable_empty_final_response=True
                    )
                while sum(finals.values()) + errors < count:
                    try:
                        result, error = answers.get(timeout=30)
                    except queue.Empty:
                        self.tally.add("cycled_stream|stuck")
                        return
                    if error is not None:
                        errors += 1
                        self.tally.error("cycled_stream", error)
                        continue
                    response = result.get_response()
                    if response.parameters["triton_final_response"].bool_param:
                        finals[response.id] += 1
                    else:
                        got[response.id] += 1
            finally:
                client.stop_stream()
                client.close()
            for index in range(count):
                rid = f"c{index}"
                if finals[rid] == 1 and got[rid] == STEPS:
                    self.tally.add("cycled_stream|ok")
                elif finals[rid] > 1 or got[rid] > STEPS or (finals[rid] and got[rid] != STEPS):
                    self.tally.add("cycled_stream|wrong")

        return [(cycle, 6.0), (cycled_infer, 0.1), (cycled_stream, 0.2), (scrape, 3.0)]


# ---------------------------------------------------------------------------------------------------- sampling
def process_sample(root: int, probe_dir: pathlib.Path) -> Dict[str, Dict[str, Any]]:
    rows: Dict[str, Dict[str, Any]] = {}
    for pid in _children(root):
        try:
            status = pathlib.Path(f"/proc/{pid}/status").read_text()
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        probe: Dict[str, Any] = {}
        try:
            probe = json.loads((probe_dir / f"probe.{pid}.json").read_text())
        except (OSError, ValueError):
            pass
        role = _role(pid, root)
        rows[role if role == "hub" else f"{role}:{pid}"] = {
            "rss_kib": int(fields.get("VmRSS", "0 kB").split()[0]),
            "fds": len(links),
            "sockets": sum(link.startswith("socket:") for link in links),
            "shm_fds": sum(link.startswith("/dev/shm/") for link in links),
            "memfds": sum(link.startswith("/memfd:") for link in links),
            "pipes": sum(link.startswith("pipe:") for link in links),
            "threads": int(fields.get("Threads", "0")),
            "tasks": probe.get("tasks", -1),
            "top_tasks": probe.get("top", []),
            "thread_names": probe.get("threads", []),
        }
    return rows


def _metrics(port: int) -> Dict[Tuple[str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found: Dict[Tuple[str, str], float] = Counter()
    for line in text.splitlines():
        match = re.match(r"^(nv_inference_[a-z_]+)\{([^}]*)\} (\S+)$", line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        if "model" in labels:
            found[(match.group(1), labels["model"])] += float(match.group(3))
    return found


def _stats_http(http_url: str) -> Dict[str, Dict[str, int]]:
    with urllib.request.urlopen(f"http://{http_url}/v2/models/stats", timeout=30) as answer:
        document = json.loads(answer.read())
    return {
        entry["name"]: {
            "success": int(entry["inference_stats"]["success"]["count"]),
            "fail": int(entry["inference_stats"]["fail"]["count"]),
            "inference_count": int(entry.get("inference_count", 0)),
            "execution_count": int(entry.get("execution_count", 0)),
        }
        for entry in document["model_stats"]
    }


def _stats_grpc(grpc_url: str) -> Dict[str, Dict[str, int]]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        document = client.get_inference_statistics(as_json=True)
    finally:
        client.close()
    return {
        entry["name"]: {
            "success": int(entry["inference_stats"].get("success", {}).get("count", 0)),
            "fail": int(entry["inference_stats"].get("fail", {}).get("count", 0)),
            "inference_count": int(entry.get("inference_count", 0)),
            "execution_count": int(entry.get("execution_count", 0)),
        }
        for entry in document["model_stats"]
    }


def compare(
    counts: Counter[str], http_stats: Dict[str, Dict[str, int]], grpc_stats: Dict[str, Dict[str, int]], metrics: Any
) -> List[str]:
    problems = []
    for model in CLEAN:
        sent, ok = counts[f"{model}|sent"], counts[f"{model}|ok"]
        errors = {k: v for k, v in counts.items() if k.startswith(model + "|err|")}
        extra = {k: counts[k] for k in (f"{model}|duplicated", f"{model}|lost", f"{model}|wrong_value") if counts[k]}
        stats = http_stats.get(model, {})
        if sent != ok + sum(errors.values()) or errors or extra:
            problems.append(f"{model}: sent {sent}, ok {ok}, errors {errors}, stream anomalies {extra}")
        if stats.get("success") != ok or stats.get("fail"):
            problems.append(f"{model}: clients ok {ok}, statistics {stats}")
    for key, value in counts.items():
        if key.rsplit("|", 1)[-1] in ("stuck", "wrong", "duplicated", "lost", "wrong_value") and value:
            problems.append(f"{key}: {value}")
    for inner, outer in (("inner", "composed"), ("inner2", "proc_composed")):
        if http_stats.get(inner, {}).get("success") != counts[f"{outer}|ok"]:
            problems.append(f"{inner}: success {http_stats.get(inner)} != {outer} ok {counts[f'{outer}|ok']}")
    for model, stats in http_stats.items():
        if grpc_stats.get(model) != stats:
            problems.append(f"{model}: HTTP statistics {stats} != gRPC {grpc_stats.get(model)}")
        pairs = (
            ("nv_inference_request_success", "success"),
            ("nv_inference_request_failure", "fail"),
            ("nv_inference_count", "inference_count"),
            ("nv_inference_exec_count", "execution_count"),
        )
        for metric, key in pairs:
            if metrics.get((metric, model), 0) != stats[key]:
                problems.append(f"{model}: {metric} {metrics.get((metric, model), 0)} != statistics {key} {stats[key]}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frontends", type=int, default=2)
    parser.add_argument("--duration", type=float, default=720.0)
    parser.add_argument("--sample", type=float, default=30.0)
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--roles", default=",".join(ROLES))
    parser.add_argument("--tracemalloc", action="store_true", help="the hub notes its allocations' growth")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--until", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=pathlib.Path, help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.frontends, [int(port) for port in args.serve.split(",")])
        return 0
    if args.client:
        Client(args.client, [int(port) for port in args.ports.split(",")], args.until, args.out).run()
        return 0
    return drive(args)


def drive(args: argparse.Namespace) -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    ports = _free_ports(3)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="soak-all-"))
    probe_dir = workdir / "probe"
    probe_dir.mkdir()
    (workdir / "site").mkdir()
    (workdir / "site" / "sitecustomize.py").write_text(PROBE)
    log_path = workdir / "server.log"
    shm_before = set(os.listdir("/dev/shm"))
    env = dict(os.environ, SOAK_PROBE_DIR=str(probe_dir))
    if args.tracemalloc:
        env["SOAK_TRACEMALLOC"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(workdir / "site"), str(root), env.get("PYTHONPATH", "")]))
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.soak_all",
                "--frontends",
                str(args.frontends),
                "--serve",
                ",".join(map(str, ports)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=str(root),
        )
    deadline = time.monotonic() + 180
    while b"SOAK SERVER READY" not in log_path.read_bytes():
        if server.poll() is not None or time.monotonic() > deadline:
            print(log_path.read_text()[-4000:])
            return 1
        time.sleep(0.5)
    time.sleep(8)  # frontends and instances come up, the probe writes once
    print(f"server pid {server.pid}, ports {ports}, workdir {workdir}", flush=True)
    samples: List[Dict[str, Any]] = []
    started = time.monotonic()

    def sample(label: str) -> None:
        rows = process_sample(server.pid, probe_dir)
        shm = sorted(os.listdir("/dev/shm"))
        entry = {"t": round(time.monotonic() - started), "label": label, "processes": rows, "shm": len(shm)}
        samples.append(entry)
        procs = " ".join(
            f"{role}={v['rss_kib'] // 1024}M/{v['fds']}fd/{v['threads']}t/{v['tasks']}tk" for role, v in rows.items()
        )
        print(f"[{entry['t']:5d}s {label}] shm={entry['shm']} {procs}", flush=True)

    def heap(label: str) -> None:
        for pid in _children(server.pid):
            if _role(pid, server.pid) in ("hub", "frontend"):
                (probe_dir / f"collect.{pid}").write_text(label)

    heap("idle")
    sample("idle")
    until = time.time() + args.duration
    client_env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH", "")]))
    )
    clients = []
    for role in args.roles.split(","):
        out = workdir / f"client.{role}.json"
        clients.append(
            (
                role,
                out,
                subprocess.Popen(
                    [
                        *(sys.executable, "-m", "bench.soak_all", "--client", role),
                        *("--until", str(until), "--out", str(out), "--ports", ",".join(map(str, ports))),
                    ],
                    env=client_env,
                    cwd=str(root),
                    stderr=(workdir / f"client.{role}.log").open("wb"),
                ),
            )
        )
    next_sample = time.monotonic() + args.sample
    while time.time() < until:
        time.sleep(1)
        if time.monotonic() >= next_sample:
            sample("load")
            next_sample += args.sample
    counts: Counter[str] = Counter()
    error_samples: Dict[str, str] = {}
    hung = {}
    for role, out, process in clients:
        try:
            process.wait(180)
        except subprocess.TimeoutExpired:
            process.kill()
            hung[role] = "killed"
        try:
            document = json.loads(out.read_text())
        except (OSError, ValueError):
            hung[role] = "no tally"
            continue
        counts.update(document["counts"])
        error_samples.update(document["samples"])
        if document["hung"]:
            hung[role] = f"{document['hung']} threads"
    time.sleep(10)  # sequences idle out, cancelled work drains
    sample("after")
    heap("after")
    time.sleep(20)
    sample("after+30s")
    http_stats = _stats_http(f"127.0.0.1:{ports[0]}")
    grpc_stats = _stats_grpc(f"127.0.0.1:{ports[1]}")
    metrics = _metrics(ports[2])
    problems = compare(counts, http_stats, grpc_stats, metrics)
    with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2/systemsharedmemory/status", timeout=30) as answer:
        regions = json.loads(answer.read())
    if regions:
        problems.append(f"shared-memory regions still registered: {[r.get('name') for r in regions][:10]}")
    pending = {k: v for k, v in metrics.items() if k[0] == "nv_inference_pending_request_count" and v}
    if pending:
        problems.append(f"pending requests after the load: {pending}")
    server.send_signal(signal.SIGINT)
    try:
        code: Optional[int] = server.wait(90)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        code = None
    time.sleep(1)
    shm_left = sorted(name for name in set(os.listdir("/dev/shm")) - shm_before if name.startswith("soakall_"))
    log_text = log_path.read_text(errors="replace")
    tracebacks = [chunk[:1500] for chunk in log_text.split("Traceback")[1:]]
    first, last = samples[0]["processes"], samples[-1]["processes"]
    growth = {
        role: {
            key: (first.get(role, {}).get(key), last[role][key])
            for key in ("rss_kib", "fds", "sockets", "memfds", "pipes", "threads", "tasks")
        }
        for role in last
    }
    report = {
        "frontends": args.frontends,
        "duration_s": args.duration,
        "counts": dict(sorted(counts.items())),
        "error_samples": error_samples,
        "problems": problems,
        "hung_clients": hung,
        "growth_first_to_last": growth,
        "stats": http_stats,
        "shm_left_after_stop": shm_left,
        "server_exit": code,
        "tracebacks": tracebacks[:20],
        "traceback_count": len(tracebacks),
        "workdir": str(workdir),
    }
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps({**report, "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
