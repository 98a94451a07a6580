"""A decoupled (streaming) model: sends back the words of its input one response at a time."""

import logging
import time

import numpy as np

from pytriton.decorators import sample
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@sample
def _stream_words(text):
    """A generator: each `yield` is one response sent to the client at once."""
    words = text[0].decode("utf-8").split()
    for index, word in enumerate(words):
        time.sleep(0.01)  # pretend each word takes time to generate
        yield {"word": np.array([word.encode("utf-8")], dtype=object), "index": np.array([index], dtype=np.int32)}


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Triton() as triton:
        triton.bind(
            model_name="WordStream",
            infer_func=_stream_words,
            inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="word", dtype=bytes, shape=(1,)), Tensor(name="index", dtype=np.int32, shape=(1,))],
            config=ModelConfig(batching=False, decoupled=True),
        )
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
