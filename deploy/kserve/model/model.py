"""An example model directory's bind file: `pytriton serve DIRECTORY` loads DIRECTORY/model.py and calls bind.

KServe copies an InferenceService's storageUri to /mnt/models, which the pytriton ServingRuntime
serves; the Kubernetes example mounts the same file from a ConfigMap at /models.
"""

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor


@batch
def rms_norm(x):
    """Each row of a batch divided by its root mean square."""
    return {"y": x / np.sqrt(np.mean(np.square(x), axis=1, keepdims=True) + 1e-6)}


def bind(triton):
    """Serve rms_norm: FP32 vectors in, normalized vectors out, batched up to 64 rows."""
    vector = (-1,)
    triton.bind(
        model_name="rms_norm",
        infer_func=rms_norm,
        inputs=[Tensor(name="x", dtype=np.float32, shape=vector)],
        outputs=[Tensor(name="y", dtype=np.float32, shape=vector)],
        config=ModelConfig(max_batch_size=64),
    )
