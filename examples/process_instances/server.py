"""Two instances in processes of their own: pure-Python work on two cores, and a crash that costs one batch."""

import logging
import os

import numpy as np

from pytriton.decorators import batch
from pytriton.instances import ProcessInstances
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def tokenize(text):
    """Pure-Python pre-processing holding the GIL: threads would take turns, processes run side by side."""
    counts = []
    for row in text:
        words = row[0].decode().split()
        counts.append(sum(sum(ord(char) for char in word) % 97 for word in words))
    pids = np.full((len(text), 1), os.getpid(), dtype=np.int64)
    return {"score": np.array(counts, dtype=np.int64).reshape(-1, 1), "pid": pids}


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Triton() as triton:
        triton.bind(
            model_name="Tokenize",
            infer_func=ProcessInstances(tokenize, count=2),  # two processes, each running `tokenize`
            inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="score", dtype=np.int64, shape=(1,)), Tensor(name="pid", dtype=np.int64, shape=(1,))],
            config=ModelConfig(max_batch_size=16),
        )
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
