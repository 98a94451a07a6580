"""The transports' own tests, run again through two frontend processes: one server to its clients either way.

Each module runs in a pytest of its own with PYTRITON_TEST_FRONTENDS=3 (tests/conftest.py), so every server its
tests start serves HTTP and gRPC from two frontend processes in front of its models (docs/architecture.md, "Frontend
processes"); a few again with 2, one frontend process and the hub serving a share of the connections. Left
out: the tests of one process's internals (its loop's tasks, its receive buffers, budgets and connection
objects), which a frontend process has and the test process does not.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

MODULES = [
    "tests/test_http_infer.py",
    "tests/test_grpc_infer.py",
    "tests/test_http_generate.py",
    "tests/test_http_generate_triton.py",
    "tests/test_grpc_stream.py",
    "tests/test_wire_fidelity.py",
    "tests/test_system_shared_memory.py",
    "tests/test_lame_duck.py",
    "tests/test_stopping.py",
    "tests/test_access_control.py",
    "tests/test_http_endpoints.py",
    "tests/test_metrics.py",
    "tests/test_remote_triton.py",
]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# Run again with PYTRITON_FRONTENDS=2 (the hub serving a quarter of the connections beside one frontend process):
# the modules whose tests change the state the frontends mirror on one connection and use it on another.
HUB_SHARE_MODULES = ["tests/test_system_shared_memory.py", "tests/test_logging_trace.py"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("module", "frontends"), [(module, "3") for module in MODULES] + [(module, "2") for module in HUB_SHARE_MODULES]
)
def test_the_module_passes_through_frontend_processes(module: str, frontends: str) -> None:
    env = dict(os.environ, PYTRITON_TEST_FRONTENDS=frontends)
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", module]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False)
    output = f"{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    assert done.returncode == 0, f"{module} with PYTRITON_FRONTENDS={frontends}:\n{output}"
