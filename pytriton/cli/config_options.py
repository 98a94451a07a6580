"""The command line's TritonConfig options: one per field, its help taken from the field, and "did you mean".

What an option does and its default come from the TritonConfig field's metadata, and whether it has any
effect here from `pytriton.runtime.options`, so that `--help` says what the code does.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import typing
from typing import Any, List, Optional, Sequence

from pytriton.exceptions import PyTritonError
from pytriton.runtime.options import no_effect_reason
from pytriton.triton_config import ENV_PREFIX, TritonConfig, cast_config_value

_TYPE_WORDS = {int: "an integer", bool: "true or false"}


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """One --option per TritonConfig field (lists may be repeated), with what it does and its default."""
    group = parser.add_argument_group(
        "server options", f"TritonConfig's fields; each also read from {ENV_PREFIX}<FIELD> when not given"
    )
    hints = typing.get_type_hints(TritonConfig)
    for field in dataclasses.fields(TritonConfig):
        hint = hints[field.name]
        is_list = any(getattr(arg, "__origin__", None) is list for arg in typing.get_args(hint))
        type_name = next(arg for arg in typing.get_args(hint) if arg is not type(None))
        group.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            action="append" if is_list else "store",
            type=str if is_list else functools.partial(_option_value, field.name, hint),
            metavar=getattr(type_name, "__name__", "VALUES").upper(),
            help=option_help(field, is_list),
        )


def option_help(field: dataclasses.Field[Any], is_list: bool) -> str:
    """'the HTTP port; 0 picks a free one (default: 8000)', or why the option has no effect here.

    argparse formats help with %: a literal percent sign is doubled.
    """
    doc = str(field.metadata.get("doc", f"TritonConfig.{field.name}"))
    reason = no_effect_reason(field.name)
    if reason is not None:
        text = f"{doc}: accepted, no effect here ({reason})"
    else:
        default = field.metadata.get("default")
        text = doc if default is None else f"{doc} (default: {_shown(default)})"
    if is_list:
        text += "; repeatable"
    return text.replace("%", "%%")


def _shown(value: Any) -> str:
    """A default as the command line spells it: true/false for booleans."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _option_value(name: str, hint: Any, text: str) -> Any:
    """An option's value as its TritonConfig field's type; argparse reports a bad one with the option's name."""
    try:
        return cast_config_value(name, hint, text)
    except PyTritonError:
        expected = next(arg for arg in typing.get_args(hint) if arg is not type(None))
        raise argparse.ArgumentTypeError(
            f"expected {_TYPE_WORDS.get(expected, expected.__name__)}, got {text!r}"
        ) from None


def unrecognized(extras: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """The usage error 'unrecognized arguments: ...', with the option of `parser` nearest to a misspelt one."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    known = [option for action in parser._actions for option in action.option_strings if option.startswith("--")]
    suggestions: List[str] = []
    for extra in extras:
        if not extra.startswith("--"):
            continue
        nearest = _nearest(extra.partition("=")[0], known)
        if nearest is not None and nearest not in suggestions:
            suggestions.append(nearest)
    if suggestions:
        message += f" (did you mean {' or '.join(suggestions)}?)"
    return message


def _nearest(option: str, known: Sequence[str]) -> Optional[str]:
    """The known option closest to `option` (a typo, a transposition, a missing letter), if one is close."""
    matches = difflib.get_close_matches(option, known, n=1, cutoff=0.75)
    return matches[0] if matches else None
