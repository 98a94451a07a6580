"""A Tensor's options beyond PyTriton 0.7's: an input's image format, an output's classification labels.

Checked when a model is bound, with Triton's rules: a format is FORMAT_NCHW or FORMAT_NHWC (or FORMAT_NONE)
and needs 3 dims; labels belong to outputs, given as a list or a file of one label a line (read now).
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

from pytriton.exceptions import PyTritonModelConfigError
from pytriton.model_config.tensor import Tensor

FORMATS = ("FORMAT_NONE", "FORMAT_NCHW", "FORMAT_NHWC")


def tensor_format(where: str, tensor: Tensor, dims: Tuple[int, ...], is_input: bool) -> str:
    """The Triton name of a tensor's format ("NCHW" is taken for "FORMAT_NCHW"); FORMAT_NONE when none is given.

    `where` names the tensor in errors ("model 'm': input 'x'").
    """
    given = tensor.format
    if given is None:
        return "FORMAT_NONE"
    if not is_input:
        raise PyTritonModelConfigError(f"{where} has format={given!r}: only inputs have a format")
    name = str(given).upper()
    name = name if name.startswith("FORMAT_") else f"FORMAT_{name}"
    if name not in FORMATS:
        raise PyTritonModelConfigError(f"{where} has format={given!r}; expected one of {', '.join(FORMATS)}")
    if name != "FORMAT_NONE" and len(dims) != 3:
        raise PyTritonModelConfigError(
            f"{where} has format {name}, which needs 3 dims (without the batch axis); its shape is {tuple(dims)}"
        )
    return name


def label_lines(text: str) -> Tuple[str, ...]:
    r"""The labels of a label file's text, one a line, as Triton reads them (std::getline: lines end at "\n" only).

    Unlike Triton, a line's "\r" before its "\n" ends it too (Triton keeps it in the label, so a file saved with
    Windows line ends gives "0.9:1:goldfish\r"); other characters Python's splitlines() splits at (form feeds,
    U+2028...) stay in the label, as in Triton, and shift no index.
    """
    lines = text.split("\n")
    if lines[-1] == "":  # the text ended a line, or was empty: no label after it
        lines.pop()
    return tuple(line[:-1] if line.endswith("\r") else line for line in lines)


def tensor_labels(where: str, tensor: Tensor, is_output: bool) -> Tuple[Optional[Tuple[str, ...]], str]:
    """A tensor's classification labels (None: none) and the file name Triton's config shows for them ("": none)."""
    labels, filename = tensor.labels, tensor.label_filename
    if labels is None and filename is None:
        return None, ""
    if not is_output:
        raise PyTritonModelConfigError(f"{where} has labels: only outputs have classification labels")
    if labels is not None and filename is not None:
        raise PyTritonModelConfigError(f"{where} has both labels and label_filename: give one of them")
    if filename is not None:
        try:
            with open(filename, encoding="utf-8", newline="") as file:
                text = file.read()
        except (OSError, UnicodeDecodeError) as error:
            raise PyTritonModelConfigError(f"{where}: label_filename {filename!r} cannot be read: {error}") from None
        return label_lines(text), os.path.basename(filename)
    if isinstance(labels, (str, bytes)) or not all(isinstance(label, str) for label in labels or ()):
        raise PyTritonModelConfigError(f"{where} has labels={labels!r}; expected a list of strings")
    return tuple(labels or ()), ""
