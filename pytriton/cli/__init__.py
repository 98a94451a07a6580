"""The `pytriton` command: serve models from a Python file or module, show the environment, run the demo.

Exit status: 0 after a stop by SIGINT/SIGTERM, 1 when a model stopped the server (PyTritonUnrecoverableError),
`check` found a port taken or `token` found no token, 2 when the server cannot start (a bad option, a port in
use, a target that cannot be loaded or whose bind function raised...: one line on stderr names the option,
port, or file and line, and the cause, as argparse does; the user's own frames follow when they say more).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from typing import Any, Callable, Iterator, List, NoReturn, Optional, Sequence

from pytriton import __version__
from pytriton.cli.check import check
from pytriton.cli.config_options import add_config_options, unrecognized
from pytriton.cli.errors import StartupError
from pytriton.cli.target import load_target
from pytriton.cli.token import ServedTriton, print_token
from pytriton.cli.user_error import describe_failure
from pytriton.exceptions import PyTritonError
from pytriton.options.limits import ServerLimits
from pytriton.triton import Triton, TritonSecurityConfig
from pytriton.triton_config import TritonConfig, resolve_config

LOGGER = logging.getLogger("pytriton")
EXIT_STOPPED = 0
EXIT_FAILED = 1  # a model stopped the server, `check` found a port taken, `token` found none
EXIT_CANNOT_START = 2
_DEMO_TARGET = "pytriton.demo:bind"


class _Terminated(BaseException):
    """SIGTERM before serve() handles it: unwinds loading and binding the models as SIGINT's KeyboardInterrupt does.

    A BaseException, so that a user's `except Exception` in a bind function does not swallow it.
    """


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Within the block, the first SIGTERM raises _Terminated and the next one kills (the default, as before).

    Without it a SIGTERM while the models load and bind, before serve() sets its handlers, killed the process
    (status 143) without a word, where an orchestrator's stop is documented to exit 0.
    """
    previous = signal.getsignal(signal.SIGTERM)

    def unwind(_signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one while stopping stops at once
        raise _Terminated()

    signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stopped_by(stop: BaseException) -> str:
    return "SIGTERM" if isinstance(stop, _Terminated) else "SIGINT"


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line: the full usage lists some fifty options."""

    def error(self, message: str) -> NoReturn:
        """Exit with status 2 after one line naming the option and what is wrong with it."""
        self.exit(EXIT_CANNOT_START, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_security_options(parser: argparse.ArgumentParser) -> None:
    """--access-token and --restricted-endpoints: the server's TritonSecurityConfig."""
    parser.add_argument(
        "--access-token",
        # an empty variable (a secret without the key) is no token: unset, not an open server
        default=os.environ.get("PYTRITON_ACCESS_TOKEN") or None,
        help="the token the restricted APIs expect (default: $PYTRITON_ACCESS_TOKEN, else a generated one; "
        "a command line is visible to other users: prefer the variable)",
    )
    parser.add_argument(
        "--restricted-endpoints",
        metavar="APIS",
        help="comma-separated APIs that need the token (default: shared-memory,model-repository,statistics,"
        "trace,logging; empty: none)",
    )


def _security_from_args(args: argparse.Namespace) -> TritonSecurityConfig:
    """The TritonSecurityConfig the command line asks for."""
    if args.access_token == "":
        raise StartupError(
            "--access-token: an empty token would open the restricted APIs to anyone "
            "(--restricted-endpoints '' restricts none)"
        )
    endpoints = args.restricted_endpoints
    names = None if endpoints is None else [name.strip() for name in endpoints.split(",") if name.strip()]
    try:
        return TritonSecurityConfig(access_token=args.access_token, restricted_endpoints=names)
    except PyTritonError as error:
        raise StartupError(str(error)) from None


def _config_from_args(args: argparse.Namespace) -> TritonConfig:
    """A TritonConfig from the options given on the command line (the rest come from the environment)."""
    given = {field.name: getattr(args, field.name, None) for field in dataclasses.fields(TritonConfig)}
    try:
        return resolve_config(TritonConfig(**{name: value for name, value in given.items() if value is not None}))
    except PyTritonError as error:
        raise StartupError(str(error)) from None


def _add_lame_duck_option(parser: argparse.ArgumentParser) -> None:
    """--lame-duck-s: ServerLimits.lame_duck_s for this run (default: PYTRITON_LIMIT_LAME_DUCK_S, else 0)."""
    parser.add_argument(
        "--lame-duck-s",
        dest="lame_duck_s",
        type=float,
        metavar="SECONDS",
        help="on SIGTERM, stay unready but keep serving this long before draining, so that load balancers "
        "take the replica out first (ServerLimits.lame_duck_s; env PYTRITON_LIMIT_LAME_DUCK_S; default: 0)",
    )


def _add_frontends_option(parser: argparse.ArgumentParser) -> None:
    """--frontends: processes serving the HTTP and gRPC ports (default: PYTRITON_FRONTENDS, else 1)."""
    parser.add_argument(
        "--frontends",
        dest="frontends",
        type=int,
        metavar="N",
        help="processes that parse and answer the HTTP and gRPC requests, each on a core of its own, the models' "
        "own among them (it keeps one set of models and batchers for all); 1 serves them on the models' own "
        "process (env PYTRITON_FRONTENDS; default: 1)",
    )


def _add_openai_port_option(parser: argparse.ArgumentParser) -> None:
    """--openai-port: the OpenAI API on a port of its own (default: PYTRITON_OPENAI_PORT, else the HTTP port)."""
    parser.add_argument(
        "--openai-port",
        dest="openai_port",
        type=int,
        metavar="PORT",
        help="serve the OpenAI API (/v1, models bound with openai=...) on this port instead of the HTTP port "
        "(0: a free port; env PYTRITON_OPENAI_PORT; default: the HTTP port)",
    )


def _limits_from_args(args: argparse.Namespace) -> ServerLimits:
    """The limits from PYTRITON_LIMIT_* variables, with the command line's --lame-duck-s over them."""
    try:
        limits = ServerLimits.from_env()
    except PyTritonError as error:
        raise StartupError(str(error)) from None
    if getattr(args, "lame_duck_s", None) is None:
        return limits
    try:
        return dataclasses.replace(limits, lame_duck_s=args.lame_duck_s)
    except PyTritonError as error:
        raise StartupError(f"--lame-duck-s: {error}") from None


def _load(target: str) -> Callable[[Triton], Any]:
    """The target's bind function; an error in the target's code is a StartupError naming its file and line."""
    try:
        return load_target(target)
    except StartupError:
        raise
    except Exception as error:  # the user's module raised while being imported (SyntaxError included)
        raise StartupError(f"cannot load {target}: {describe_failure(error)}") from error


def _serve(
    target: str,
    binder: Callable[[Triton], Any],
    config: TritonConfig,
    limits: ServerLimits,
    security: TritonSecurityConfig,
    token_generated: bool,
    frontends: Optional[int] = None,
    openai_port: Optional[int] = None,
) -> int:
    """Bind models with `binder` (what `target` names) and serve until SIGINT/SIGTERM; the exit status."""
    try:
        triton = ServedTriton(
            config=config,
            limits=limits,
            security_config=security,
            token_generated=token_generated,
            frontends=frontends,
            openai_port=openai_port,
        )
    except PyTritonError as error:
        raise StartupError(str(error)) from None
    try:
        try:
            binder(triton)  # before the ports open: they open in serve(), with the models bound
        except Exception as error:  # a refused model (PyTritonError) or an error in the user's bind function
            raise StartupError(f"{target} failed: {describe_failure(error)}") from error
        try:
            triton.serve()  # SIGINT/SIGTERM stop the server from before its ports open
        except (PyTritonError, OSError) as error:
            raise StartupError(_reason(error)) from None
    except (KeyboardInterrupt, _Terminated) as stop:  # while the models were being bound: nothing is served yet
        LOGGER.info("received %s while binding the models, stopping", _stopped_by(stop))
    finally:
        triton.stop()
    return EXIT_FAILED if triton.failure else EXIT_STOPPED


def _reason(error: Exception) -> str:
    """An error's message without an errno prefix: "HTTP cannot listen on 0.0.0.0:8000: Address already in use"."""
    if isinstance(error, OSError) and error.strerror and error.filename is None:
        return error.strerror
    return str(error)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `pytriton` command."""
    parser = _Parser(prog="pytriton", description="Serve Python models over the Triton protocols.")
    parser.add_argument("--version", action="version", version=f"pytriton {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve the models a Python function binds",
        description="Import TARGET (module:function, file.py:function or a model directory holding model.py; default "
        "function `bind`), call it with the "
        "Triton server so it binds models, then serve until SIGINT/SIGTERM. Every TritonConfig field is an option.",
    )
    serve.add_argument(
        "target",
        help="module:function, path/to/file.py:function or a model directory (its model.py) whose function "
        "takes the Triton server",
    )
    add_config_options(serve)
    _add_lame_duck_option(serve)
    _add_frontends_option(serve)
    _add_openai_port_option(serve)
    _add_security_options(serve)
    demo = commands.add_parser("demo", help="serve the demo model add_sub", description="Serve the add_sub demo model.")
    add_config_options(demo)
    _add_lame_duck_option(demo)
    _add_frontends_option(demo)
    _add_security_options(demo)
    check_command = commands.add_parser(
        "check",
        help="print versions and what each port would serve, and whether it is free (or what serves it now)",
        description="Print versions, and for each port whether the server could listen on it; a taken port is "
        "asked what serves it (Triton's HTTP, gRPC or metrics protocol). Exit status 1 when a port is taken.",
    )
    add_config_options(check_command)
    token = commands.add_parser(
        "token",
        help="print the access token of this user's pytriton server on this host",
        description="Print the access token the restricted APIs of this user's pytriton server on this host "
        "expect (header triton-access-token), as the server keeps it for its user: e.g. the one `pytriton serve` "
        "generated, which it does not log. Exit status 1 when no such server shows one.",
    )
    token.add_argument(
        "--port",
        type=int,
        help="the server's HTTP or gRPC port (default: the HTTP port PYTRITON_TRITON_CONFIG_HTTP_PORT sets, else 8000)",
    )
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """The command line parsed; an unknown option is a usage error of its command, with the nearest known one."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = _subparser(parser, args.command)
        command.error(unrecognized(extras, command))
    return args


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of command `name`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]  # type: ignore[no-any-return]
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `pytriton` command; returns the exit status."""
    _reopen_closed_standard_fds()
    parser = build_parser()
    try:
        args = _parse(parser, argv)
        try:
            status = _command(args)
        except StartupError as error:
            print(f"pytriton {args.command}: error: {error}", file=sys.stderr)
            return EXIT_CANNOT_START
        sys.stdout.flush()  # here, where a reader gone away (`pytriton check | head`) can be handled
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to write at exit
        return EXIT_FAILED
    return status


def _reopen_closed_standard_fds() -> None:
    """Open /dev/null on a closed stdin, stdout or stderr (`pytriton serve >&-`).

    Else the server's first sockets take those numbers, and the event loop aborts the process
    (libuv's assertion `fd > STDERR_FILENO`) when it closes one.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: `fd` itself, as those below are open
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    # Python made sys.stdout/sys.stderr None for a number closed at its start; print() and flush() expect files
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)


def _command(args: argparse.Namespace) -> int:
    """Run the command `args` name; its exit status."""
    if args.command == "token":
        return print_token(args.port)
    config = _config_from_args(args)
    if args.command == "check":
        return check(config)
    limits, security = _limits_from_args(args), _security_from_args(args)
    target = args.target if args.command == "serve" else _DEMO_TARGET
    try:
        with _sigterm_unwinds():
            if args.command == "serve":
                binder = _load(target)
            else:
                from pytriton.demo import bind as binder
            generated = args.access_token is None  # then TritonSecurityConfig generates one
            return _serve(
                target, binder, config, limits, security, generated, args.frontends, getattr(args, "openai_port", None)
            )
    except (KeyboardInterrupt, _Terminated) as stop:  # while the target was imported: nothing to stop
        # logging is configured with the server, which does not exist yet
        print(
            f"pytriton {args.command}: received {_stopped_by(stop)} while loading {target}, stopping", file=sys.stderr
        )
        return EXIT_STOPPED


__all__: List[str] = ["StartupError", "build_parser", "load_target", "main"]
