"""The `pytriton` command: serve models from a Python file or module, show the environment, run the demo.

Exit status: 0 after a stop by SIGINT/SIGTERM, 1 when a model stopped the server (PyTritonUnrecoverableError)
or `check` found a port taken, 2 when the server cannot start (a bad option, a port in use, a broken bind
function...: one line on stderr names the option or port and the cause, as argparse does).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import platform
import sys
import typing
from pathlib import Path
from typing import Any, Callable, List, NoReturn, Optional, Sequence

from pytriton import __version__
from pytriton.exceptions import PyTritonError
from pytriton.options.limits import ServerLimits
from pytriton.runtime.options import resolve_options
from pytriton.transport.sockets import bind_socket
from pytriton.triton import Triton, TritonSecurityConfig
from pytriton.triton_config import TritonConfig, cast_config_value, resolve_config

LOGGER = logging.getLogger("pytriton")
_PACKAGES = ("numpy", "orjson", "httptools", "uvloop", "grpcio", "protobuf", "tritonclient", "wrapt")
EXIT_STOPPED = 0
EXIT_FAILED = 1  # a model stopped the server, or `check` found a port taken
EXIT_CANNOT_START = 2


class StartupError(Exception):
    """The server cannot start; the message names the option, port or file and the cause."""


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line: the full usage lists some fifty options."""

    def error(self, message: str) -> NoReturn:
        """Exit with status 2 after one line naming the option and what is wrong with it."""
        self.exit(EXIT_CANNOT_START, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    """One --option per TritonConfig field (lists may be repeated), with the field's description."""
    hints = typing.get_type_hints(TritonConfig)
    for field in dataclasses.fields(TritonConfig):
        hint = hints[field.name]
        is_list = any(getattr(arg, "__origin__", None) is list for arg in typing.get_args(hint))
        type_name = next(arg for arg in typing.get_args(hint) if arg is not type(None))
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            action="append" if is_list else "store",
            type=str if is_list else functools.partial(_option_value, field.name, hint),
            metavar=getattr(type_name, "__name__", "VALUES").upper(),
            help=f"TritonConfig.{field.name}" + (" (repeatable)" if is_list else ""),
        )


def _add_security_options(parser: argparse.ArgumentParser) -> None:
    """--access-token and --restricted-endpoints: the server's TritonSecurityConfig."""
    parser.add_argument(
        "--access-token",
        default=os.environ.get("PYTRITON_ACCESS_TOKEN"),
        help="the token the restricted APIs expect (default: $PYTRITON_ACCESS_TOKEN, else a generated one)",
    )
    parser.add_argument(
        "--restricted-endpoints",
        metavar="APIS",
        help="comma-separated APIs that need the token (default: shared-memory,model-repository,statistics,"
        "trace,logging; empty: none)",
    )


def _security_from_args(args: argparse.Namespace) -> TritonSecurityConfig:
    """The TritonSecurityConfig the command line asks for."""
    endpoints = args.restricted_endpoints
    names = None if endpoints is None else [name.strip() for name in endpoints.split(",") if name.strip()]
    try:
        return TritonSecurityConfig(access_token=args.access_token, restricted_endpoints=names)
    except PyTritonError as error:
        raise StartupError(str(error)) from None


def _option_value(name: str, hint: Any, text: str) -> Any:
    """An option's value as its TritonConfig field's type; argparse reports a bad one with the option's name."""
    try:
        return cast_config_value(name, hint, text)
    except PyTritonError:
        expected = next(arg for arg in typing.get_args(hint) if arg is not type(None))
        words = {int: "an integer", bool: "true or false"}
        raise argparse.ArgumentTypeError(f"expected {words.get(expected, expected.__name__)}, got {text!r}") from None


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
        "take the replica out first (ServerLimits.lame_duck_s; env PYTRITON_LIMIT_LAME_DUCK_S)",
    )


def _limits_from_args(args: argparse.Namespace) -> ServerLimits:
    """The limits from PYTRITON_LIMIT_* variables, with the command line's --lame-duck-s over them."""
    try:
        limits = ServerLimits.from_env()
    except PyTritonError as error:
        raise StartupError(str(error)) from None
    if getattr(args, "lame_duck_s", None) is None:
        return limits
    return dataclasses.replace(limits, lame_duck_s=args.lame_duck_s)


def _model_file(directory: Path) -> Path:
    """The Python file a model directory (e.g. KServe's /mnt/models) holds: its model.py, or its only .py file."""
    preferred = directory / "model.py"
    if preferred.is_file():
        return preferred
    found = sorted(path for path in directory.glob("*.py") if path.is_file())
    if len(found) != 1:
        names = ", ".join(path.name for path in found) or "none"
        raise StartupError(f"{directory}: expected model.py or exactly one .py file with bind(triton), found {names}")
    return found[0]


def load_target(target: str) -> Callable[[Triton], Any]:
    """Import `module:attr`, `path/to/file.py:attr` or `path/to/directory:attr`; default attr is `bind`.

    A directory (a mounted model directory) stands for its model.py, or its only .py file; the file's
    directory goes on sys.path so that it can import modules beside it.

    Raises:
        StartupError: no such file, module or function (a module's own import errors propagate).
    """
    location, _, attr = target.partition(":")
    attr = attr or "bind"
    if Path(location).is_dir():
        location = str(_model_file(Path(location)))
    if location.endswith(".py") or Path(location).is_file():
        path = Path(location).resolve()
        if not path.is_file():
            raise StartupError(f"{location}: no such file")
        if str(path.parent) not in sys.path:
            # As `python file.py` does: its folder is importable, also by instance processes, which import the
            # file's functions by name (they get this process's sys.path).
            sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise StartupError(f"cannot load {location}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(location)
        except ModuleNotFoundError as error:
            if error.name is None or not (location == error.name or location.startswith(error.name + ".")):
                raise  # the module was found; something it imports is missing: its traceback says what
            raise StartupError(f"{target}: no module named '{error.name}' (nor a file {location})") from None
    binder = getattr(module, attr, None)
    if not callable(binder):
        raise StartupError(f"{target}: '{attr}' is not a callable taking the Triton server")
    return binder  # type: ignore[no-any-return]


def _serve(
    binder: Callable[[Triton], Any], config: TritonConfig, limits: ServerLimits, security: TritonSecurityConfig
) -> int:
    """Bind models with `binder` and serve until SIGINT/SIGTERM; the exit status."""
    try:
        triton = Triton(config=config, limits=limits, security_config=security)
    except PyTritonError as error:
        raise StartupError(str(error)) from None
    try:
        try:
            binder(triton)  # before the ports open: they open in serve(), with the models bound
        except PyTritonError as error:
            raise StartupError(str(error)) from None
        try:
            triton.serve()  # SIGINT/SIGTERM stop the server from before its ports open
        except (PyTritonError, OSError) as error:
            raise StartupError(_reason(error)) from None
    except KeyboardInterrupt:  # SIGINT while the models were being bound: nothing is served yet
        LOGGER.info("received SIGINT while binding the models, stopping")
    finally:
        triton.stop()
    return EXIT_FAILED if triton.failure else EXIT_STOPPED


def _reason(error: Exception) -> str:
    """An error's message without an errno prefix: "HTTP cannot listen on 0.0.0.0:8000: Address already in use"."""
    if isinstance(error, OSError) and error.strerror and error.filename is None:
        return error.strerror
    return str(error)


def _check(config: TritonConfig) -> int:
    """Print versions and what each port would serve, and whether it is free; the exit status."""
    print(f"pytriton {__version__} on Python {platform.python_version()} ({platform.platform()})")
    for package in _PACKAGES:
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        print(f"  {package:<13} {version}")
    try:
        options = resolve_options(config)
    except PyTritonError as error:
        raise StartupError(str(error)) from None
    rows = [
        ("HTTP/REST", options.http_enabled, options.http_address, options.http_port),
        ("gRPC", options.grpc_enabled, options.grpc_address, options.grpc_port),
        ("metrics", options.metrics_enabled, options.metrics_address, options.metrics_port),
    ]
    taken = 0
    for name, enabled, address, port in rows:
        state = _port_state(address, port) if enabled else ""
        taken += state.startswith("not free")
        print(f"  {name:<10} {f'{address}:{port}  {state}' if enabled else 'disabled'}")
    return EXIT_FAILED if taken else EXIT_STOPPED


def _port_state(address: str, port: int) -> str:
    """'free', 'any free port' or 'not free: <why>': whether the server could listen on address:port now."""
    if port == 0:
        return "any free port"
    try:
        bind_socket(address, port).close()
    except OSError as error:
        return f"not free: {error.strerror or error}"
    return "free"


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
    _add_config_options(serve)
    _add_lame_duck_option(serve)
    _add_security_options(serve)
    demo = commands.add_parser("demo", help="serve the demo model add_sub", description="Serve the add_sub demo model.")
    _add_config_options(demo)
    _add_lame_duck_option(demo)
    _add_security_options(demo)
    check = commands.add_parser("check", help="print versions and what each port serves, and whether it is free")
    _add_config_options(check)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `pytriton` command; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
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


def _command(args: argparse.Namespace) -> int:
    """Run the command `args` name; its exit status."""
    config = _config_from_args(args)
    if args.command == "serve":
        return _serve(load_target(args.target), config, _limits_from_args(args), _security_from_args(args))
    if args.command == "demo":
        from pytriton.demo import bind

        return _serve(bind, config, _limits_from_args(args), _security_from_args(args))
    return _check(config)


__all__: List[str] = ["StartupError", "build_parser", "load_target", "main"]
