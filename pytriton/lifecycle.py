"""TritonLifecyclePolicy: when a Triton starts serving, as in nvidia-pytriton 0.7."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class TritonLifecyclePolicy:
    """When the server starts and where model configs live.

    Args:
        launch_triton_on_startup: start serving when the `with` block is entered; otherwise at `run()`/`serve()`.
        local_model_store: accepted for compatibility; this engine writes no model store, so it changes nothing.
    """

    launch_triton_on_startup: bool = True
    local_model_store: bool = False


DefaultTritonLifecyclePolicy = TritonLifecyclePolicy()
# The policy a server with allow_vertex_ai gets by default: it starts at run()/serve().
VertextAILifecyclePolicy = TritonLifecyclePolicy(launch_triton_on_startup=False, local_model_store=True)
