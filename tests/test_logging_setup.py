"""Where the server's log goes (runtime/logging_setup.py): stderr when the application set nothing up, the
application's own setup when it did, log_file and log_verbose; each record once. Servers run as scripts."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import List

import pytest

from tests.server_process import ServerProcess, free_port_env

# argv[1]: when the application configures logging ("none", "before", "after" creating the server);
# argv[2]: the root level it chooses. Other TritonConfig options come from the environment.
SERVER = """
    import logging, signal, sys, threading, time
    import numpy as np
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton

    when, level = sys.argv[1], getattr(logging, sys.argv[2])
    if when == "before":
        logging.basicConfig(level=level, format="APP %(levelname)s %(name)s: %(message)s")
    triton = Triton()
    if when == "after":
        logging.basicConfig(level=level, format="APP %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pytriton.app").debug("a debug record")
    tensor = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    triton.bind("m", lambda requests: requests, inputs=tensor, outputs=tensor,
                config=ModelConfig(max_batch_size=4, response_cache=True))  # no cache configured: a warning

    def announce():  # once serve() handles SIGTERM: a signal before that would kill the process
        while signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            time.sleep(0.01)
        print("READY", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    triton.serve()
"""
CACHE_WARNING = "model 'm' asks for the response cache, but no cache is configured"


def _serve(tmp_path: Path, when: str, level: str = "INFO", **env: str) -> List[str]:
    """Start the server, stop it with SIGTERM; its output lines."""
    environment = {f"PYTRITON_TRITON_CONFIG_{name.upper()}": value for name, value in env.items()}

    with ServerProcess.script(tmp_path, SERVER, when, level, env=free_port_env(**environment)) as server:
        server.wait_for("^READY$")
        server.signal(signal.SIGTERM)
        assert server.wait() == 0
    return server.lines


def _count(lines: List[str], text: str) -> int:
    return sum(text in line for line in lines)


def test_without_a_setup_info_goes_to_stderr_in_the_default_format(tmp_path: Path) -> None:
    lines = _serve(tmp_path, "none")
    assert _count(lines, " serving m v1 (1 instance) on ") == 1
    assert any(
        re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING pytriton: " + CACHE_WARNING, line) for line in lines
    )
    assert any(re.match(r"^\S+ \S+ INFO pytriton: received SIGTERM: stopping gracefully", line) for line in lines)
    assert _count(lines, "a debug record") == 0
    assert not [line for line in lines if line.startswith("APP")]


@pytest.mark.parametrize("when", ["before", "after"])
def test_the_application_setup_is_used_and_nothing_is_logged_twice(tmp_path: Path, when: str) -> None:
    lines = _serve(tmp_path, when)
    assert [line for line in lines if " serving m v1 " in line] == [
        next(line for line in lines if line.startswith("APP INFO pytriton: pytriton ") and "serving m v1" in line)
    ]
    assert _count(lines, CACHE_WARNING) == 1


@pytest.mark.parametrize("when", ["before", "after"])
def test_the_application_level_is_respected(tmp_path: Path, when: str) -> None:
    # Configured after the server was created, the root's WARNING did not apply: the INFO level the server gave
    # its logger while nothing was set up stayed, and the startup line and the stop's reached the root's handlers.
    lines = _serve(tmp_path, when, "WARNING")
    assert _count(lines, " serving m v1 ") == 0  # INFO: the application chose WARNING
    assert _count(lines, "stopped (") == 0 and _count(lines, "received SIGTERM") == 0
    assert f"APP WARNING pytriton: {CACHE_WARNING}" in "\n".join(lines)


def test_log_file_gets_the_log_instead_of_stderr(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    lines = _serve(tmp_path, "none", log_file=str(log_file))
    assert not [line for line in lines if "pytriton" in line], lines
    written = log_file.read_text()
    assert _count(written.splitlines(), " INFO pytriton: pytriton ") == 1 and "serving m v1" in written
    assert CACHE_WARNING in written and "received SIGTERM" in written and "stopped (" in written


def test_the_warnings_of_triton_creation_go_where_the_log_goes(tmp_path: Path) -> None:
    # The warning for an option with no effect came before the log was set up: a bare line on stderr (Python's
    # last-resort handler), with no time nor level, and never in log_file.
    warning = "pytriton: TritonConfig.http_thread_count has no effect"
    lines = _serve(tmp_path, "none", http_thread_count="4")
    assert [line for line in lines if "http_thread_count" in line] == [
        next(line for line in lines if re.match(r"^\S+ \S+ WARNING " + warning, line))
    ]
    log_file = tmp_path / "server.log"
    lines = _serve(tmp_path, "none", log_file=str(log_file), http_thread_count="4")
    assert not [line for line in lines if "http_thread_count" in line], lines
    assert _count(log_file.read_text().splitlines(), f" WARNING {warning}") == 1


def test_log_verbose_logs_debug_records(tmp_path: Path) -> None:
    lines = _serve(tmp_path, "none", log_verbose="1")
    assert _count(lines, "WARNING pytriton: log_verbose=1: verbose logging slows inference down") == 1
    assert _count(lines, "DEBUG pytriton.app: a debug record") == 1


def test_log_format_applies_to_the_stderr_log(tmp_path: Path) -> None:
    source = SERVER.replace(
        "    triton.serve()\n",
        "    triton.run()\n"
        '    triton._runtime.settings.log.update({"log_format": "ISO8601"})  # as POST /v2/logging does\n'
        "    triton.serve()\n",
    )
    with ServerProcess.script(tmp_path, source, "none", "INFO") as server:
        server.wait_for("^READY$")
        server.signal(signal.SIGTERM)
        server.wait_for(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I pytriton: received SIGTERM: stopping gracefully")
        assert server.wait() == 0


SERVERS_ONE_AFTER_ANOTHER = """
    import logging, sys
    import numpy as np
    from pytriton.model_config import Tensor
    from pytriton.triton import Triton, TritonConfig

    tensor = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
    for name, log_file, verbose in (("first", sys.argv[1], 1), ("second", sys.argv[2], None), ("third", None, None)):
        ports = {"http_port": 0, "allow_grpc": False, "allow_metrics": False}
        config = TritonConfig(**ports, log_file=log_file, log_verbose=verbose)
        triton = Triton(config=config)
        logging.getLogger("pytriton.app").debug("a debug record of %s", name)
        triton.bind(name, lambda requests: requests, inputs=tensor, outputs=tensor)
        triton.run()
        triton.stop()
"""


def test_a_server_s_log_file_holds_its_own_log(tmp_path: Path) -> None:
    # Servers made one after another in a program (a notebook): a stopped server's log_file kept its handler, so
    # each later server's log went there too, and to stderr no more; its log_verbose's DEBUG level stayed too.
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    with ServerProcess.script(tmp_path, SERVERS_ONE_AFTER_ANOTHER, str(first), str(second), env=free_port_env()) as run:
        assert run.wait() == 0, run.output()
    for path, name in ((first, "first"), (second, "second")):
        lines = path.read_text().splitlines()
        served = [line.split(" serving ")[1].split(" on ")[0] for line in lines if " serving " in line]
        assert served == [f"{name} v1 (1 instance)"], lines
    assert _count(run.lines, " serving third v1 ") == 1 and _count(run.lines, " serving second v1 ") == 0, run.output()
    assert "a debug record of first" in first.read_text()
    assert "a debug record of second" not in second.read_text() + run.output()
    assert "a debug record of third" not in run.output()


# A server of three processes (two frontend processes, which log as the server does) turns verbose logging on
# through /v2/logging, then stops: argv[1] is the level it asks for.
VERBOSE_THROUGH_FRONTENDS = """
    import http.client, json, signal, sys, threading, time
    from pytriton.triton import Triton, TritonSecurityConfig

    triton = Triton(security_config=TritonSecurityConfig(access_token="t"), frontends=3)
    triton.run()
    connection = http.client.HTTPConnection("127.0.0.1", triton.http_port, timeout=30)
    body = json.dumps({"log_verbose_level": int(sys.argv[1])})
    connection.request("POST", "/v2/logging", body, {"triton-access-token": "t"})
    assert connection.getresponse().status == 200
    connection.close()

    def announce():  # once serve() handles SIGTERM: a signal before that would kill the process
        while signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            time.sleep(0.01)
        print("READY", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    triton.serve()
"""


@pytest.mark.parametrize(("option", "through_api"), [("1", "0"), ("0", "1")])
def test_a_server_with_frontend_processes_warns_of_verbose_logging_once(
    tmp_path: Path, option: str, through_api: str
) -> None:
    # Each frontend process said it again, as it started (log_verbose) and as the change reached it (/v2/logging):
    # three warnings from a server of three processes.
    env = free_port_env(PYTRITON_TRITON_CONFIG_LOG_VERBOSE=option)
    with ServerProcess.script(tmp_path, VERBOSE_THROUGH_FRONTENDS, through_api, env=env) as server:
        server.wait_for("^READY$")
        server.signal(signal.SIGTERM)
        assert server.wait() == 0
    assert _count(server.lines, "=1: verbose logging slows inference down") == 1, server.lines
    assert _count(server.lines, "frontend processes serve HTTP and gRPC") == 1


# The application sets up logging, then a client that speaks no HTTP/2 on the gRPC port makes the server warn (a
# record of the process that serves the connection: a frontend process with frontends 3). argv[1]: frontends;
# argv[2]: the level the application gives the logger of that warning. The server stops once the client saw its
# connection closed: a frontend's record reaches the hub before the frontend answers the stop.
APPLICATION_LOGGING = """
    import logging, socket, sys
    from pytriton.triton import Triton

    logging.basicConfig(level=logging.INFO, format="APP %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pytriton.transport.grpc.cutoffs").setLevel(getattr(logging, sys.argv[2]))
    with Triton(frontends=int(sys.argv[1])) as triton:
        triton.run()
        client = socket.create_connection(("127.0.0.1", triton.grpc_port))
        client.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        client.settimeout(30)
        while client.recv(4096):  # until the server closes it (GOAWAY PROTOCOL_ERROR)
            pass
        client.close()
"""


@pytest.mark.parametrize("frontends", ["1", "3"])
@pytest.mark.parametrize("level", ["WARNING", "ERROR"])
def test_a_frontend_process_s_records_go_through_the_application_s_logging(
    tmp_path: Path, frontends: str, level: str
) -> None:
    # A frontend process logged in pytriton's default format to stderr, past the application's format, handlers
    # and levels: the warning came as "2026-... WARNING pytriton.transport.grpc.cutoffs: ...", even with its
    # logger set to ERROR.
    with ServerProcess.script(tmp_path, APPLICATION_LOGGING, frontends, level, env=free_port_env()) as server:
        assert server.wait() == 0
    cut_off = [line for line in server.lines if "cut off: not an HTTP/2 connection preface" in line]
    if level == "ERROR":
        assert cut_off == [], server.lines
    else:
        assert len(cut_off) == 1, server.lines
        assert cut_off[0].startswith("APP WARNING pytriton.transport.grpc.cutoffs: gRPC connection from"), cut_off
