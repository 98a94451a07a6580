"""An exception raised by the user's code while the command loads a target or binds its models, told briefly.

One line names where it happened in the user's code (`models.py:12: ValueError: boom`); the traceback
follows only when it says more than that line, and holds the user's frames, not the command's nor
importlib's. A SyntaxError is one line: where it is, and what.
"""

from __future__ import annotations

import importlib
import os
import sysconfig
import traceback
from pathlib import Path
from typing import List, Optional, Set

from pytriton.exceptions import PyTritonError

_CLI_DIR = str(Path(__file__).resolve().parent) + os.sep
_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent) + os.sep
_IMPORTLIB_DIR = str(Path(importlib.__file__).resolve().parent) + os.sep
# Where code that is not the user's lives: the standard library and installed packages.
_LIBRARY_DIRS = tuple(
    {str(Path(path).resolve()) + os.sep for key, path in sysconfig.get_paths().items() if "lib" in key}
)


def describe_failure(error: BaseException) -> str:
    """`<file>:<line>: <Type>: <message>`, then the user's frames when there is more than one or a chained error.

    A PyTritonError (the model binding was refused) is its message, after the user's line that made the call.
    """
    if isinstance(error, SyntaxError) and error.filename:
        return f"{_shown(error.filename)}:{error.lineno}: {type(error).__name__}: {error.msg}"
    report = traceback.TracebackException.from_exception(error)
    _trim(report, set())
    where = _user_line(report.stack, fallback=not isinstance(error, PyTritonError))
    prefix = f"{where}: " if where else ""
    if isinstance(error, PyTritonError):
        return f"{prefix}{error}"
    line = f"{prefix}{''.join(report.format_exception_only()).strip()}"
    chained = report.__cause__ is not None or (report.__context__ is not None and not report.__suppress_context__)
    if len(report.stack) <= 1 and not chained:
        return line  # its only frame is the line named
    return line + "\n" + "".join(report.format()).rstrip("\n")


def _trim(report: traceback.TracebackException, seen: Set[int]) -> None:
    """Drop the command's and importlib's frames from `report` and the exceptions chained to it."""
    if id(report) in seen:
        return
    seen.add(id(report))
    report.stack = traceback.StackSummary.from_list([frame for frame in report.stack if not _machinery(frame.filename)])
    for chained in (report.__cause__, report.__context__):
        if chained is not None:
            _trim(chained, seen)


def _machinery(filename: str) -> bool:
    """Whether a frame is the command's own or the import system's (`<frozen importlib._bootstrap>`...)."""
    if filename.startswith("<frozen importlib") or filename.startswith("<frozen runpy"):
        return True
    path = _resolved(filename)
    return path.startswith(_CLI_DIR) or path.startswith(_IMPORTLIB_DIR)


def _user_line(stack: traceback.StackSummary, fallback: bool) -> Optional[str]:
    """`file:line` of the innermost frame in the user's code; else (with `fallback`) of the innermost frame."""
    frames: List[traceback.FrameSummary] = list(stack)
    for frame in reversed(frames):
        if _users(frame.filename):
            return f"{_shown(frame.filename)}:{frame.lineno}"
    if fallback and frames:
        return f"{_shown(frames[-1].filename)}:{frames[-1].lineno}"
    return None


def _users(filename: str) -> bool:
    """Whether a frame is the user's code: a file neither pytriton's, nor the standard library's nor a package's."""
    if filename.startswith("<"):
        return False
    path = _resolved(filename)
    return not path.startswith(_PACKAGE_DIR) and not any(path.startswith(directory) for directory in _LIBRARY_DIRS)


def _resolved(filename: str) -> str:
    """A frame's file as an absolute path, links resolved (a frozen module's name as it is)."""
    if filename.startswith("<"):
        return filename
    try:
        return str(Path(filename).resolve())
    except OSError:
        return filename


def _shown(filename: str) -> str:
    """A path as the user may have typed it: relative to the working directory when it lies under it."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive (Windows)
        return filename
    return filename if relative.startswith(os.pardir) else relative
