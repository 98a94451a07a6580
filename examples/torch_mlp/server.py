"""A small PyTorch classifier (random weights) served on CPU."""

import logging

import numpy as np
import torch

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton

torch.manual_seed(0)
MODEL = torch.nn.Sequential(
    torch.nn.Linear(16, 32),
    torch.nn.ReLU(),
    torch.nn.Linear(32, 4),
    torch.nn.Softmax(dim=-1),
).eval()


@batch
def _classify(features):
    with torch.inference_mode():
        probabilities = MODEL(torch.from_numpy(features))
    return {"probabilities": probabilities.numpy(), "label": probabilities.argmax(dim=-1, keepdim=True).numpy()}


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Triton() as triton:
        triton.bind(
            model_name="MLP",
            infer_func=_classify,
            inputs=[Tensor(name="features", dtype=np.float32, shape=(16,))],
            outputs=[
                Tensor(name="probabilities", dtype=np.float32, shape=(4,)),
                Tensor(name="label", dtype=np.int64, shape=(1,)),
            ],
            config=ModelConfig(max_batch_size=32),
            strict=True,
        )
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
