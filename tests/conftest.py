"""Shared fixtures: real servers on ports the server picks itself."""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import socket
import warnings
import zlib
from typing import Any, Callable, Iterator, Optional, Set

# Python 3.9's subprocess forks without vfork, and so does any version's with a preexec_fn: grpcio's fork
# handlers then run in the child, and while this process has grpcio's threads busy (its clients) they can hang
# or kill the child before it execs (grpc/grpc#37259; a 3.13 CI run's served process never started, its child
# logging "epoll_wait error: Bad file descriptor"). The tests start many subprocesses beside live gRPC clients,
# and none uses gRPC in a forked child. Set before grpc is first imported: grpcio reads it once.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import pytest

from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

# The variables an operator configures servers with (frontend processes, limits, the OpenAI port, the CLI's token
# and config, the SageMaker and Vertex AI frontends) would change every server the tests start: with
# PYTRITON_FRONTENDS=2 exported, 8 tests of one process's internals failed. A test that wants one sets it itself;
# PYTRITON_TEST_FRONTENDS serves every server of a session through frontend processes (test_frontends_parity.py).
SERVER_VARIABLES = (  # names and prefixes
    "PYTRITON_FRONTENDS",
    "PYTRITON_ACCESS_TOKEN",
    "PYTRITON_LIMIT_",
    "PYTRITON_OPENAI_",
    "PYTRITON_TRITON_CONFIG_",
    "SAGEMAKER_TRITON_",
    "AIP_",
)
for _name in [name for name in os.environ if name.startswith(SERVER_VARIABLES)]:
    del os.environ[_name]
if os.environ.get("PYTRITON_TEST_FRONTENDS"):
    os.environ["PYTRITON_FRONTENDS"] = os.environ["PYTRITON_TEST_FRONTENDS"]
# Every server of the tests is on the loopback: a proxy the shell names (behind a company's, say) must not carry
# the clients' requests there (grpc, urllib, requests and httpx read these), nor those of the servers' subprocesses.
LOOPBACK = "127.0.0.1,localhost,::1"
for _name in ("no_proxy", "NO_PROXY"):
    os.environ[_name] = f"{os.environ[_name]},{LOOPBACK}" if os.environ.get(_name) else LOOPBACK

# The access token of the test servers: the restricted APIs (model repository, statistics, trace, logging,
# shared memory) stay restricted as on a default server, and tests that call them pass these headers.
ACCESS_TOKEN = "pytriton-tests-access-token"
HTTP_AUTH = {"triton-access-token": ACCESS_TOKEN}
GRPC_AUTH = {"triton-grpc-protocol-triton-access-token": ACCESS_TOKEN}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--share",
        metavar="K/N",
        help="run only the K-th of N shares of the collected tests, drawn by a hash of each test's id (CI's extra "
        "Pythons each run one share)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With --share K/N, keep the tests whose id hashes to K of N.

    Each test is drawn on its own, by a hash of its id: a module, or the `[http]` and `[grpc]` sides of its tests,
    fall into every share about alike, where cutting the order would give one share whole modules, and alternating
    it every `[http]`. Every xdist worker draws the same.
    """
    share = config.getoption("--share")
    if not share:
        return
    index, _, count = share.partition("/")
    k, n = int(index), int(count)
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--share {share}: K must be from 1 to N")
    kept, left = [], []
    for item in items:
        (kept if zlib.crc32(item.nodeid.encode()) % n == k - 1 else left).append(item)
    config.hook.pytest_deselected(items=left)
    items[:] = kept


# Triton's default ports. A test that binds one passes or fails by what else runs on the machine (a pytriton
# demo, a real Triton): in the test processes such a bind fails on every machine, saying why. Servers in
# subprocesses get port 0 from tests/server_process.free_port_env.
TRITON_DEFAULT_PORTS = (8000, 8001, 8002)


@pytest.fixture(autouse=True, scope="session")
def _no_triton_default_ports() -> Iterator[None]:
    bind = socket.socket.bind

    def guarded(sock: socket.socket, address: Any) -> None:
        if isinstance(address, tuple) and len(address) >= 2 and address[1] in TRITON_DEFAULT_PORTS:
            raise OSError(
                errno.EADDRINUSE,
                f"a test binds port {address[1]}, one of Triton's default ports, which another server on the "
                "machine may hold: bind port 0 (tests/conftest.running_triton does)",
            )
        bind(sock, address)

    socket.socket.bind = guarded  # type: ignore[method-assign]
    yield
    socket.socket.bind = bind  # type: ignore[method-assign]


# A stopped server's pipes, event loops and sockets are freed with its objects, which reference cycles keep until the
# garbage collector's full pass, and a test process starting hundreds of servers seldom makes one: a worker of the
# whole suite held 1,177 descriptors by its end (558 pipes, 93 epolls), where select() stops working
# (tests/test_grpc_attacks.py's ServedProcess: "filedescriptor out of range"). Past this many open after a test,
# the worker collects. Modules' fixtures hold 300-450 at times, and a full collection costs a worker about 0.1 s:
# past 384 (a peak of 457) a worker collected after most tests.
MOST_DESCRIPTORS_KEPT = 768


@pytest.fixture(autouse=True)
def _stopped_servers_collected() -> Iterator[None]:
    yield
    if os.path.isdir("/proc/self/fd") and len(os.listdir("/proc/self/fd")) > MOST_DESCRIPTORS_KEPT:
        with warnings.catch_warnings():
            # Earlier tests' clients left unclosed, finalized here: not this test's, nor the server's.
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


@contextlib.contextmanager
def running_triton(
    bind: Callable[[Triton], None], security_config: Optional[TritonSecurityConfig] = None, **config: Any
) -> Iterator[Triton]:
    """Start a Triton on free ports (HTTP, and gRPC/metrics unless disabled), bind models, run, stop.

    The server's restricted APIs take ACCESS_TOKEN unless `security_config` says otherwise; `frontends` and
    `limits` (not TritonConfig fields) are passed to Triton.
    """
    # A port only for an endpoint served: the port of one not served is warned of (it has no effect).
    options = {"http_port": 0}
    options.update({f"{name}_port": 0 for name in ("grpc", "metrics") if config.get(f"allow_{name}") is not False})
    options.update(config)
    frontends = options.pop("frontends", None)
    limits = options.pop("limits", None)
    security = security_config or TritonSecurityConfig(access_token=ACCESS_TOKEN)
    triton = Triton(config=TritonConfig(**options), security_config=security, frontends=frontends, limits=limits)
    try:
        bind(triton)
        triton.run()
        yield triton
    finally:
        triton.stop()


def http_url(triton: Triton) -> str:
    """host:port of a running server's HTTP endpoint (as tritonclient.http wants it)."""
    return f"127.0.0.1:{triton.http_port}"


def grpc_url(triton: Triton) -> str:
    """host:port of a running server's gRPC endpoint (as tritonclient.grpc wants it)."""
    return f"127.0.0.1:{triton.grpc_port}"


@pytest.fixture
def pytriton_logger() -> Iterator[logging.Logger]:
    """The `pytriton` logger, restored after the test (log settings change it for the process)."""
    logger = logging.getLogger("pytriton")
    level, filters = logger.level, list(logger.filters)
    yield logger
    logger.setLevel(level)
    logger.filters[:] = filters


@pytest.fixture
def start_triton() -> Iterator[Callable[..., Triton]]:
    """Start servers for a test; all are stopped at the end of the test."""
    stack = contextlib.ExitStack()

    def start(
        bind: Callable[[Triton], None], security_config: Optional[TritonSecurityConfig] = None, **config: Any
    ) -> Triton:
        return stack.enter_context(running_triton(bind, security_config, **config))

    with stack:
        yield start


def memfds_held() -> Set[int]:
    """pytriton's shared-memory segments (memfds) this (test) process holds a descriptor of, by inode.

    A test compares them with those held before its server started: what servers of earlier tests left for the
    garbage collector (a model that kept an input viewing a segment, in a reference cycle) is no concern of its.
    """
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:pytriton"):
                held.add(os.stat(f"/proc/self/fd/{fd}").st_ino)
        except OSError:
            continue
    return held
