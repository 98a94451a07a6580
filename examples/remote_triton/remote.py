"""Bind AddSub into the server running at --url from this process; it is unloaded when this process stops."""

import argparse
import logging

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import RemoteTriton


@batch
def add_sub(**inputs):
    a_batch, b_batch = inputs.values()
    return {"add": a_batch + b_batch, "sub": a_batch - b_batch}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="localhost", help="the server's url, on this host")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with RemoteTriton(url=args.url) as triton:
        triton.bind(
            model_name="AddSub",
            infer_func=add_sub,
            inputs=[Tensor(name=name, shape=(1,), dtype=np.float32) for name in ("a", "b")],
            outputs=[Tensor(name=name, shape=(1,), dtype=np.float32) for name in ("add", "sub")],
            config=ModelConfig(max_batch_size=8),
        )
        print("BOUND", flush=True)
        triton.serve()  # until Ctrl-C (then AddSub is unloaded) or until the server stops


if __name__ == "__main__":
    main()
