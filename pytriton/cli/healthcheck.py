"""The container image's health check: whether the `pytriton serve` it runs is ready, on the port it serves.

`HEALTHCHECK CMD ["python", "-m", "pytriton.cli.healthcheck"]`. The port is resolved from the server's own
command line as `pytriton serve` resolves it: its options first, then the PYTRITON_TRITON_CONFIG_* variables.
In the image PID 1 is tini, whose arguments carry the server's after `--`. Reading the variable alone checked
the wrong port under `docker run IMAGE /models --http-port 9000`.

Exit status 0 when `/v2/health/ready` answers 200, else 1 with one line on stderr (as Docker's log keeps it).
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from typing import List, Optional, Sequence

from pytriton.cli.errors import StartupError
from pytriton.exceptions import PyTritonError
from pytriton.options.access import ACCESS_TOKEN_HEADER

EXIT_READY = 0
EXIT_UNHEALTHY = 1
_COMMANDS = ("serve", "demo")


def serve_arguments(pid: int) -> List[str]:
    """The arguments of process `pid` from its `serve` or `demo` command on; [] when it runs neither."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            argv = file.read().decode(errors="replace").split("\0")
    except OSError:
        return []
    for index, word in enumerate(argv):
        if word in _COMMANDS:
            return [word, *(arg for arg in argv[index + 1 :] if arg)]
    return []


def ready_request(arguments: Sequence[str]) -> Optional[urllib.request.Request]:
    """The readiness request for a server started with `arguments` (`serve ...`; [] for the environment's).

    None when it serves no HTTP. It carries the token the server was given (its option, else
    PYTRITON_ACCESS_TOKEN), for a server that restricts health.
    """
    from pytriton.cli import _config_from_args, build_parser
    from pytriton.runtime.options import resolve_options

    args, _ = build_parser().parse_known_args(list(arguments) or ["demo"])
    options = resolve_options(_config_from_args(args))
    if not options.http_enabled:
        return None
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(options.http_address, options.http_address)
    url = f"http://{f'[{host}]' if ':' in host else host}:{options.http_port}/v2/health/ready"
    token = getattr(args, "access_token", None)
    return urllib.request.Request(url, headers={ACCESS_TOKEN_HEADER: token} if token else {})


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Check the server that process --pid runs (default 1: the container's); the exit status."""
    parser = argparse.ArgumentParser(prog="python -m pytriton.cli.healthcheck", description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, default=1, help="the process running `pytriton serve` (default 1)")
    pid = parser.parse_args(argv).pid
    arguments = serve_arguments(pid)
    try:
        request = ready_request(arguments)
    except (StartupError, PyTritonError, SystemExit) as error:  # its command line is refused: it serves nothing
        print(f"healthcheck: cannot tell the server's port: {error}", file=sys.stderr)
        return EXIT_UNHEALTHY
    if request is None:
        print("healthcheck: the server serves no HTTP (--allow-http false): nothing to check", file=sys.stderr)
        return EXIT_UNHEALTHY
    url = request.full_url
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            if response.status == 200:
                return EXIT_READY
            print(f"healthcheck: {url} answered {response.status}", file=sys.stderr)
    except (OSError, urllib.error.URLError) as error:
        print(f"healthcheck: {url}: {error}", file=sys.stderr)
    return EXIT_UNHEALTHY


if __name__ == "__main__":
    sys.exit(main())
