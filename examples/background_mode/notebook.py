"""Background mode, as in a Jupyter notebook: run the server, call it from the same process, stop it.

Each `# %%` block is one notebook cell (VS Code, PyCharm and jupytext read this format).
"""

# %% Define the model.
import numpy as np

from pytriton.client import ModelClient
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def multiply(x, factor):
    return {"product": x * factor}


# %% Start serving in the background: run() returns once the ports accept connections.
triton = Triton()  # ports from PYTRITON_TRITON_CONFIG_* variables, default 8000 (HTTP), 8001 (gRPC)
triton.bind(
    model_name="Multiply",
    infer_func=multiply,
    inputs=[Tensor(name="x", dtype=np.float64, shape=(-1,)), Tensor(name="factor", dtype=np.float64, shape=(1,))],
    outputs=[Tensor(name="product", dtype=np.float64, shape=(-1,))],
    config=ModelConfig(max_batch_size=8),
)
triton.run()
print("serving on", triton.urls())

# %% Call the model while it serves; the notebook stays usable.
x = np.array([[1.0, 2.0, 3.0]])
with ModelClient(f"http://localhost:{triton.http_port}", "Multiply") as client:
    result = client.infer_batch(x=x, factor=np.array([[2.5]]))
print("product:", result["product"].tolist())
np.testing.assert_allclose(result["product"], x * 2.5)

# %% Stop the server (readiness turns false, in-flight requests finish, ports close).
triton.stop()
print("stopped; alive:", triton.is_alive())
