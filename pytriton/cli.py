"""The `pytriton` command: serve models from a Python file or module, show the environment, run the demo."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import platform
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from pytriton import __version__
from pytriton.options.limits import ServerLimits
from pytriton.runtime.options import resolve_options
from pytriton.triton import Triton, TritonSecurityConfig
from pytriton.triton_config import TritonConfig, cast_config_value, resolve_config

_PACKAGES = ("numpy", "orjson", "httptools", "uvloop", "grpcio", "protobuf", "tritonclient", "wrapt")


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
            metavar=getattr(type_name, "__name__", "VALUES").upper(),
            help=f"TritonConfig.{field.name}" + (" (repeatable)" if is_list else ""),
        )


def _config_from_args(args: argparse.Namespace) -> TritonConfig:
    """A TritonConfig from the options given on the command line (the rest come from the environment)."""
    hints = typing.get_type_hints(TritonConfig)
    given: Dict[str, Any] = {}
    for field in dataclasses.fields(TritonConfig):
        value = getattr(args, field.name, None)
        if value is not None:
            given[field.name] = (
                value if isinstance(value, list) else cast_config_value(field.name, hints[field.name], value)
            )
    return TritonConfig(**given)


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
    limits = ServerLimits.from_env()
    if getattr(args, "lame_duck_s", None) is None:
        return limits
    return dataclasses.replace(limits, lame_duck_s=args.lame_duck_s)


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
    return TritonSecurityConfig(access_token=args.access_token, restricted_endpoints=names)


def _model_file(directory: Path) -> Path:
    """The Python file a model directory (e.g. KServe's /mnt/models) holds: its model.py, or its only .py file."""
    preferred = directory / "model.py"
    if preferred.is_file():
        return preferred
    found = sorted(path for path in directory.glob("*.py") if path.is_file())
    if len(found) != 1:
        names = ", ".join(path.name for path in found) or "none"
        raise SystemExit(f"{directory}: expected model.py or exactly one .py file with bind(triton), found {names}")
    return found[0]


def load_target(target: str) -> Callable[[Triton], Any]:
    """Import `module:attr`, `path/to/file.py:attr` or `path/to/directory:attr`; default attr is `bind`.

    A directory (a mounted model directory) stands for its model.py, or its only .py file; the file's
    directory goes on sys.path so that it can import modules beside it.
    """
    location, _, attr = target.partition(":")
    attr = attr or "bind"
    if Path(location).is_dir():
        location = str(_model_file(Path(location)))
    if location.endswith(".py") or Path(location).is_file():
        path = Path(location).resolve()
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise SystemExit(f"cannot load {location}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        # As `python file.py` does: its folder is importable, also by instance processes, which import the
        # file's functions by name (they get this process's sys.path).
        sys.path.insert(0, str(path.parent))
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(location)
    binder = getattr(module, attr, None)
    if not callable(binder):
        raise SystemExit(f"{target}: '{attr}' is not a callable taking the Triton server")
    return binder  # type: ignore[no-any-return]


def _serve(
    binder: Callable[[Triton], Any], config: TritonConfig, limits: ServerLimits, security: TritonSecurityConfig
) -> None:
    """Bind models with `binder` and serve until SIGINT/SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Triton(config=config, limits=limits, security_config=security) as triton:
        binder(triton)
        triton.run()
        try:
            print("pytriton serving on " + ", ".join(triton.urls()), flush=True)
            triton.serve()
        except KeyboardInterrupt:  # SIGINT before serve() took the signal over: leaving the block stops cleanly
            logging.getLogger("pytriton").info("received SIGINT, stopping")


def _check(config: TritonConfig) -> None:
    """Print versions and what each port would serve."""
    print(f"pytriton {__version__} on Python {platform.python_version()} ({platform.platform()})")
    for package in _PACKAGES:
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        print(f"  {package:<13} {version}")
    options = resolve_options(resolve_config(config))
    rows = [
        ("HTTP/REST", options.http_enabled, options.http_address, options.http_port),
        ("gRPC", options.grpc_enabled, options.grpc_address, options.grpc_port),
        ("metrics", options.metrics_enabled, options.metrics_address, options.metrics_port),
    ]
    for name, enabled, address, port in rows:
        print(f"  {name:<10} {f'{address}:{port}' if enabled else 'disabled'}")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `pytriton` command."""
    parser = argparse.ArgumentParser(prog="pytriton", description="Serve Python models over the Triton protocols.")
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
    check = commands.add_parser("check", help="print versions and what each port serves")
    _add_config_options(check)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Entry point of the `pytriton` command."""
    args = build_parser().parse_args(argv)
    config = _config_from_args(args)
    if args.command == "serve":
        _serve(load_target(args.target), config, _limits_from_args(args), _security_from_args(args))
    elif args.command == "demo":
        from pytriton.demo import bind

        _serve(bind, config, _limits_from_args(args), _security_from_args(args))
    else:
        _check(config)


__all__: List[str] = ["build_parser", "load_target", "main"]
