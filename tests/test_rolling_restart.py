"""A rolling restart under load: three `pytriton serve` replicas behind HAProxy lose no request.

HAProxy (Debian's package) checks /v2/health/ready on each replica, with no retries at all (`retries 0`,
no `retry-on`, no redispatch), as a Kubernetes Service retries nothing. It balances HTTP/1.1 in HTTP mode
and gRPC both ways a fleet meets: in TCP mode, as a Kubernetes Service (kube-proxy) does, where a client's
connection is pinned to one replica and only the replica's own GOAWAY moves it (so the test sees the
server's HTTP/2 shutdown exactly as a gRPC client sees it); and in HTTP mode with h2 to the replicas, as a
gRPC-aware proxy balances calls one by one (HAProxy is then the replicas' HTTP/2 client). While clients
send requests without pause, each replica in turn gets SIGTERM, exits, and is started again on the same
ports, and serves again through each of the three backends before the next one stops; every request must
succeed.

A replica runs with a lame duck (`--lame-duck-s`) longer than HAProxy takes to see it unready
(`inter` times `fall`), which is what makes this hold; without it, requests sent during that window fail
(in one run: 317 HTTP requests, 8 gRPC calls through TCP mode and 301 through HTTP mode). The test waits until
HAProxy shows the replica DOWN in every backend while it still runs: a request HAProxy sends to a port the replica
has closed gets HAProxy's own 503 (its log says `SC--`, a connect failure; a gRPC client reads "Received http2
header with status: 503"), which only a balancer that took longer than the lame duck to see the replica
unready sends.
"""

from __future__ import annotations

import http.client
import json
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable, List, Tuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.fleet import HAProxy, Replica, free_ports, wait_until

REPLICAS = 3
# HAProxy sees a replica unready within CHECK_INTERVAL_MS * FALL (plus a check's own time): 0.2-0.42 s from the
# SIGTERM, measured with two to ten busy loops beside the test (load average 17 on two cores). The lame duck must
# be longer, with room for HAProxy or the whole machine stalling: in a run of the suite with `-n 3` one gRPC call
# got HAProxy's 503 with a lame duck of 2 s (a stall of HAProxy as long as the lame duck does that, see
# the module's docstring); ten times the detection time leaves room for a stall of 3.5 s.
CHECK_INTERVAL_MS = 200
FALL = 2
LAME_DUCK_S = 10 * CHECK_INTERVAL_MS * FALL / 1000
CLIENTS_PER_PROTOCOL = 2

MODEL = """
import time

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor


@batch
def double(x):
    time.sleep(0.001)
    return {"y": x * 2}


def bind(triton):
    triton.bind(
        "double",
        double,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=16),
    )
"""

HAPROXY = """
global
    stats socket @SOCKET@ mode 600 level admin
    maxconn 1000

defaults
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
    retries 0
    default-server inter {inter}ms fastinter {inter}ms downinter {inter}ms fall {fall} rise 2

frontend http_in
    mode http
    bind 127.0.0.1:{http_port}
    default_backend http_replicas

backend http_replicas
    mode http
    balance roundrobin
    option httpchk GET /v2/health/ready
    http-check expect status 200
{http_servers}

frontend grpc_h2_in
    mode http
    bind 127.0.0.1:{h2_port} proto h2
    default_backend grpc_h2_replicas

backend grpc_h2_replicas
    mode http
    balance roundrobin
    option httpchk GET /v2/health/ready
    http-check expect status 200
{h2_servers}

frontend grpc_in
    mode tcp
    bind 127.0.0.1:{grpc_port}
    default_backend grpc_replicas

backend grpc_replicas
    mode tcp
    balance leastconn
    option httpchk GET /v2/health/ready
    http-check expect status 200
{grpc_servers}
"""


class Tally:
    """Successes and failures (with their reasons) of one protocol's clients."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok = 0
        self.failures: Counter[str] = Counter()

    def record(self, error: str = "") -> None:
        with self.lock:
            if error:
                self.failures[error[:200]] += 1
            else:
                self.ok += 1


def http_client(port: int, stop: threading.Event, tally: Tally) -> None:
    """Send infer requests on one keep-alive connection to the balancer until told to stop."""
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while not stop.is_set():
        try:
            connection.request("POST", "/v2/models/double/infer", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            payload = response.read()
            if response.status != 200:
                tally.record(f"HTTP {response.status}: {payload[:100]!r}")
            elif json.loads(payload)["outputs"][0]["data"] != [2, 4]:
                tally.record(f"wrong answer {payload[:100]!r}")
            else:
                tally.record()
        except Exception as error:  # noqa: BLE001 - every failure is counted, with its reason
            tally.record(f"{type(error).__name__}: {error}")
            connection.close()
    connection.close()


def grpc_client(port: int, stop: threading.Event, tally: Tally) -> None:
    """Send infer calls on one gRPC channel to the balancer until told to stop."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    inputs = [grpcclient.InferInput("x", [1, 2], "FP32")]
    inputs[0].set_data_from_numpy(np.array([[1, 2]], np.float32))
    try:
        while not stop.is_set():
            try:
                result = client.infer("double", inputs, client_timeout=10)
                if result.as_numpy("y").tolist() != [[2.0, 4.0]]:
                    tally.record(f"wrong answer {result.as_numpy('y')}")
                else:
                    tally.record()
            except Exception as error:  # noqa: BLE001 - every failure is counted, with its reason
                tally.record(f"{type(error).__name__}: {error}")
    finally:
        client.close()


def grpc_probes_until_served(proxy: HAProxy, name: str, port: int) -> List[grpcclient.InferenceServerClient]:
    """Open gRPC connections through the TCP-mode balancer, each answering one call, until one went to replica
    `name` (its sessions in `grpc_replicas` grew); they stay open, so leastconn sends the next one elsewhere."""
    key = f"grpc_replicas/{name}"
    before = int(proxy.servers()[key]["stot"])
    inputs = [grpcclient.InferInput("x", [1, 2], "FP32")]
    inputs[0].set_data_from_numpy(np.array([[1, 2]], np.float32))
    probes: List[grpcclient.InferenceServerClient] = []
    for _ in range(2 * REPLICAS + 2 * CLIENTS_PER_PROTOCOL):
        # A subchannel pool of its own: channels to one address otherwise share gRPC's global pool, and with it
        # the connection the load's clients already have.
        probe = grpcclient.InferenceServerClient(
            f"127.0.0.1:{port}", channel_args=[("grpc.use_local_subchannel_pool", 1)]
        )
        probes.append(probe)
        assert probe.infer("double", inputs, client_timeout=10).as_numpy("y").tolist() == [[2.0, 4.0]]
        if int(proxy.servers()[key]["stot"]) > before:
            return probes
    for probe in probes:
        probe.close()
    pytest.fail(f"no gRPC connection through the TCP-mode balancer went to {name} after its restart")


@pytest.mark.timeout(240)
def test_rolling_restart_under_load_fails_no_request(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text(textwrap.dedent(MODEL))
    ports = free_ports(2 * REPLICAS + 3)
    replicas = [
        Replica(
            f"r{index}",
            str(tmp_path),  # a model directory: `pytriton serve` loads its model.py
            http_port=ports[2 * index],
            grpc_port=ports[2 * index + 1],
            log_dir=tmp_path,
            options=["--lame-duck-s", str(LAME_DUCK_S), "--exit-timeout-secs", "10"],
            # Longer than HAProxy keeps an idle server connection, so that HAProxy never reuses one the replica closes.
            env={"PYTRITON_LIMIT_KEEP_ALIVE_TIMEOUT_S": "120"},
        )
        for index in range(REPLICAS)
    ]
    balancer_http, balancer_grpc, balancer_grpc_h2 = ports[-2], ports[-1], ports[-3]
    config = HAPROXY.format(
        inter=CHECK_INTERVAL_MS,
        fall=FALL,
        http_port=balancer_http,
        h2_port=balancer_grpc_h2,
        h2_servers="\n".join(
            f"    server {r.name} 127.0.0.1:{r.grpc_port} check port {r.http_port} check-proto h1 proto h2"
            for r in replicas
        ),
        grpc_port=balancer_grpc,
        http_servers="\n".join(f"    server {r.name} 127.0.0.1:{r.http_port} check" for r in replicas),
        grpc_servers="\n".join(
            f"    server {r.name} 127.0.0.1:{r.grpc_port} check port {r.http_port}" for r in replicas
        ),
    )
    stop = threading.Event()
    tallies = {"http": Tally(), "grpc": Tally(), "grpc-h2": Tally()}
    probes: List[grpcclient.InferenceServerClient] = []
    threads: List[threading.Thread] = []
    haproxy = None
    try:
        for replica in replicas:
            replica.start()
        haproxy = HAProxy(config, tmp_path)
        proxy = haproxy

        def all_up() -> bool:
            return all(row["status"] == "UP" for row in proxy.servers().values())

        wait_until(all_up, 20, "HAProxy to see every replica UP")
        paths: List[Tuple[str, Callable[[int, threading.Event, Tally], None], int]] = [
            ("http", http_client, balancer_http),
            ("grpc", grpc_client, balancer_grpc),
            ("grpc-h2", grpc_client, balancer_grpc_h2),
        ]
        for protocol, client, port in paths:
            for _ in range(CLIENTS_PER_PROTOCOL):
                thread = threading.Thread(target=client, args=(port, stop, tallies[protocol]), daemon=True)
                thread.start()
                threads.append(thread)
        wait_until(lambda: min(tally.ok for tally in tallies.values()) >= 50, 30, "the load to start")

        served_after_restart = {}
        for replica in replicas:
            replica.sigterm()

            def unready_everywhere(replica: Replica = replica) -> bool:
                if replica.exited():
                    pytest.fail(
                        f"{replica.name} exited (after its lame duck of {LAME_DUCK_S} s) before HAProxy showed it DOWN"
                        " in every backend: HAProxy (or the machine) stalled longer than that, and requests it sent"
                        " there meanwhile got its 503"
                    )
                rows = [row for key, row in proxy.servers().items() if key.endswith(f"/{replica.name}")]
                return all(row["status"].startswith("DOWN") for row in rows)

            wait_until(unready_everywhere, 10, f"HAProxy to see {replica.name} DOWN in every backend")
            assert replica.wait() == 0, replica.log.read_text()[-2000:]
            replica.start()
            wait_until(
                lambda name=replica.name: all(
                    row["status"] == "UP" for key, row in proxy.servers().items() if key.endswith(f"/{name}")
                ),
                20,
                f"HAProxy to see {replica.name} UP again",
            )
            # Served again through each backend. In HTTP mode (HTTP/1.1, and gRPC with h2 to the replicas) every
            # request is a session of the server it went to, and the load's requests reach the restarted replica.
            for backend in ("http_replicas", "grpc_h2_replicas"):
                sessions = int(proxy.servers()[f"{backend}/{replica.name}"]["stot"])
                wait_until(
                    lambda key=f"{backend}/{replica.name}", before=sessions: (
                        int(proxy.servers()[key]["stot"]) > before + 20
                    ),
                    20,
                    f"{replica.name} to serve again through {backend}",
                )
            # In TCP mode a session is a connection, and the load's connections stay where they are: new ones go
            # to the replica with the fewest (leastconn), the restarted one, within a few.
            probes.extend(grpc_probes_until_served(proxy, replica.name, balancer_grpc))
            served_after_restart[replica.name] = True
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(20)
        for probe in probes:
            probe.close()
        if haproxy is not None:
            haproxy.stop()
        for replica in replicas:
            replica.kill()

    report = {protocol: (tally.ok, dict(tally.failures)) for protocol, tally in tallies.items()}
    print(f"rolling restart of {REPLICAS} replicas: (answered, failures) by protocol: {report}")
    assert all(served_after_restart.values())
    for protocol, tally in tallies.items():
        assert not tally.failures, f"{protocol}: {sum(tally.failures.values())} failed of {tally.ok}: {report}"
        assert tally.ok >= 200, report
