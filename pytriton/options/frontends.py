"""How many frontend processes serve the HTTP and gRPC ports: this project's own option, not TritonConfig's.

Set with `Triton(frontends=N)`, the PYTRITON_FRONTENDS environment variable, or `pytriton serve --frontends N`.
With 1 (the default) the server's loop serves both ports in its own process, as it always did. With N >= 2,
N processes of their own parse and answer the requests, each on a loop and a core of its own, while this
process keeps the models: their batchers take requests from every frontend (docs/deployment.md says when
it pays).
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from pytriton.exceptions import PyTritonValidationError

ENV_VARIABLE = "PYTRITON_FRONTENDS"
DEFAULT_FRONTENDS = 1
MAX_FRONTENDS = 256


def resolve_frontends(explicit: Optional[int], environ: Mapping[str, str] = os.environ) -> int:
    """The number of frontend processes: `explicit` when given, else PYTRITON_FRONTENDS, else 1.

    Raises:
        PyTritonValidationError: not a whole number from 1 to MAX_FRONTENDS (naming where it came from).
    """
    if explicit is not None:
        source, value = "frontends", explicit
    elif environ.get(ENV_VARIABLE, "").strip():
        source, text = ENV_VARIABLE, environ[ENV_VARIABLE].strip()
        try:
            value = int(text)
        except ValueError:
            raise PyTritonValidationError(f"{ENV_VARIABLE}={text!r} is not a number of frontend processes") from None
    else:
        return DEFAULT_FRONTENDS
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_FRONTENDS:
        raise PyTritonValidationError(
            f"{source}: {value!r} is not a number of frontend processes (1 to {MAX_FRONTENDS})"
        )
    return value
