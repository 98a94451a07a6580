"""The error that stops the `pytriton` command before it serves: its message is the line printed."""

from __future__ import annotations


class StartupError(Exception):
    """The server cannot start; the message names the option, port or file and the cause."""
