"""Ray Serve on a local two-node Ray cluster: replicas on both nodes, scaling 1 -> 2 -> 1 under load.

The cluster (ray.cluster_utils), Serve and the load generator run in `ray_cluster_driver.py` inside a
network namespace that has only loopback (`unshare --net`), because Ray's processes bind and advertise
the machine's non-loopback address when there is one, and test traffic must stay on loopback.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fleet import ROOT
from tests.server_process import namespaces

DRIVER = Path(__file__).parent / "ray_cluster_driver.py"
# Seconds of load for each throughput figure (through Ray's proxy, and direct); printed, never asserted.
MEASURE_S = 2


def _namespace_command() -> list:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("unshare and ip are needed to run Ray on loopback only: apt-get install -y util-linux iproute2")
    return namespaces("unshare", "--net")


@pytest.mark.timeout(300)
def test_ray_serve_spreads_over_two_nodes_and_scales_out_and_back(tmp_path: Path) -> None:
    if sys.version_info < (3, 10):
        pytest.skip("Ray supports Python >= 3.10 only")
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        pytest.fail("Ray Serve is not installed: pip install -e '.[ray]' (as .ci/run does)")
    script = f"ip link set lo up && exec {sys.executable} {DRIVER} {tmp_path} {MEASURE_S}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    run = subprocess.run(
        [*_namespace_command(), "sh", "-c", script], capture_output=True, text=True, env=env, timeout=280
    )
    assert run.returncode == 0, f"driver failed ({run.returncode}):\n{run.stderr[-6000:]}"
    results = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"Ray Serve run: {json.dumps(results)}")

    assert results["nodes"] == 2 and results["addresses"] == ["127.0.0.1"]
    assert results["replicas_at_start"] == 1
    assert set(results["load_counts"]) == {"200"}, results["load_counts"]
    assert results["replicas_under_load"] == 2
    by_node = results["answers_by_node"]
    assert len(by_node) == 2 and min(by_node.values()) >= 20, by_node  # replicas on both nodes answered
    assert results["replicas_after_load"] == 1
    # Batching inside a replica: the replicas' dynamic batcher put concurrent requests into one batch.
    by_rows = {int(rows): count for rows, count in results["answers_by_batch_rows"].items()}
    assert max(by_rows) > 1, by_rows
    assert results["ray_proxy_req_s"] > 0 and results["direct_req_s"] > 0
    assert results["direct_exit"] == 0
