"""Framework arrays a callable returns (torch, cupy, jax, any DLPack array) as numpy arrays, copied at most once.

Triton's callables must return numpy arrays; this engine also takes arrays of the frameworks that implement DLPack.
An array already in host memory is shared with numpy, not copied; one on a device is copied to host memory once, by
its own framework (torch `Tensor.cpu`, cupy `ndarray.get`, `__array__` for jax and the others). Anything else is
returned unchanged, for the output checks to refuse as they always did.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from pytriton.core.tensors.counted_strings import count_ahead
from pytriton.core.tensors.datatypes import BF16_DTYPE

# DLPack device types whose memory numpy can read in place (DLDeviceType: kDLCPU, kDLCUDAHost).
_HOST_DEVICE_TYPES = (1, 3)
_from_dlpack: Optional[Callable[[Any], np.ndarray]] = getattr(np, "from_dlpack", None)  # numpy >= 1.22


def host_array(value: Any) -> Any:
    """`value` as a numpy array when it is a framework array or a numpy subclass's, else `value` itself.

    A subclass's array (np.matrix, a masked array, a memmap, the model's own) is viewed as a plain ndarray: what the
    codecs sent of it all along, its data (a masked array's masked values too). As itself it was pickled to another
    process (a frontend's, the server's from an instance's), whole, and a class of the model's own modules that
    process could not import ended its channel.
    """
    if isinstance(value, np.ndarray):
        return value if type(value) is np.ndarray else value.view(np.ndarray)
    if isinstance(value, np.generic) or not hasattr(value, "__dlpack__"):
        return value
    library = type(value).__module__.partition(".")[0]
    if library == "torch":
        return _torch_to_numpy(value)
    if _from_dlpack is not None and _on_host(value):
        try:
            return _from_dlpack(value)
        except (BufferError, TypeError, ValueError, RuntimeError):  # a dtype numpy's DLPack lacks (bfloat16)
            pass
    if library == "cupy":
        return value.get()
    return np.asarray(value)


def host_arrays(outputs: Dict[Any, Any], count_strings: bool = False) -> Dict[Any, Any]:
    """A response dict with its framework arrays as numpy arrays; the dict itself when it holds none.

    `count_strings` (an instance thread's call): count its long object arrays' bytes here (counted_strings.py).
    """
    converted: Optional[Dict[Any, Any]] = None
    for name, value in outputs.items():
        if type(value) is np.ndarray:
            if count_strings and value.dtype.hasobject:
                count_ahead(value)
            continue
        array = host_array(value)
        if array is not value:
            if converted is None:
                converted = dict(outputs)  # the callable's own dict is never changed
            converted[name] = array
    return outputs if converted is None else converted


def host_step(step: Any, count_strings: bool = False) -> Any:
    """A callable's result (response dicts) with framework arrays as numpy; the same object when it holds none.

    Instance threads call it, so that a device-to-host copy (and the wait for the device it implies) happens there
    and never on the event loop; with `count_strings` (a thread instance of a model with BYTES outputs) its long
    object arrays' bytes are counted there too (counted_strings.py).
    """
    if not isinstance(step, (list, tuple)):
        return step
    converted: Optional[List[Any]] = None
    for index, response in enumerate(step):
        if isinstance(response, dict):
            response_on_host = host_arrays(response, count_strings)
            if response_on_host is not response:
                if converted is None:
                    converted = list(step)
                converted[index] = response_on_host
    return step if converted is None else converted


def _on_host(value: Any) -> bool:
    """Whether a DLPack array lives in memory that numpy can read in place."""
    try:
        device_type = value.__dlpack_device__()[0]
    except (AttributeError, TypeError, ValueError):
        return False
    return int(device_type) in _HOST_DEVICE_TYPES


def _torch_to_numpy(tensor: Any) -> np.ndarray:
    """A torch tensor as numpy: shared when on the CPU, one device-to-host copy otherwise; bfloat16 kept."""
    torch = sys.modules["torch"]
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: carry the bits and view them as ml_dtypes'
        return tensor.view(torch.int16).numpy(force=True).view(BF16_DTYPE)  # type: ignore[no-any-return]
    return tensor.numpy(force=True)  # type: ignore[no-any-return]
