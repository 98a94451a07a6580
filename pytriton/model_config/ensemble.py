"""An ensemble's steps (Triton's ModelEnsembling.Step), as `Triton.bind_ensemble` takes them."""

from __future__ import annotations

import dataclasses
from typing import Dict


@dataclasses.dataclass
class EnsembleStep:
    """One step of an ensemble: a bound model run on ensemble tensors, its outputs kept as ensemble tensors.

    As in Triton's config, `input_map` maps each input name of the step's model to the ensemble tensor it reads,
    and `output_map` each output name of the step's model to the ensemble tensor it writes. `model_version` -1
    runs the model's latest version.

    Example:
        EnsembleStep("preprocess", input_map={"RAW": "IMAGE"}, output_map={"PIXELS": "pixels"})
    """

    model_name: str
    input_map: Dict[str, str]
    output_map: Dict[str, str]
    model_version: int = -1
