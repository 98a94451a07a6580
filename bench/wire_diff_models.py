"""The models bench/wire_diff_fuzz.py sends to: the same script serves them on this project and on nvidia-pytriton.

    BENCH_ACCESS_TOKEN=dfztoken python bench/wire_diff_models.py HTTP_PORT GRPC_PORT METRICS_PORT

Serves until stdin closes where it is a pipe (its parent's), else until SIGINT or SIGTERM: `identity` (FP32 [-1],
batching up to 8), `mixed` (INT32 [2] with optional BYTES and BOOL, no batching), `half` (FP16 [2, -1] and UINT8
[3], batching up to 4, three outputs one BYTES), `text` (BYTES [1], batching up to 2), `triple` (FP32 inputs k, a,
b, which tritonserver's hash map visits out of their order, no batching) and `stream` (decoupled, two responses a
request).
"""

import os
import stat
import sys
from typing import Any, Dict, Iterator, List

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig


@batch
def _identity(INPUT_1: np.ndarray) -> Dict[str, np.ndarray]:
    return {"OUTPUT_1": INPUT_1}


def _mixed(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [
        {
            "a_out": request["a"],
            "b_out": request.data["b"] if "b" in request.data else np.array([b""], dtype=object),
            "c_out": request.data["c"] if "c" in request.data else np.zeros(1, np.bool_),
        }
        for request in requests
    ]


@batch
def _half(X: np.ndarray, Y: np.ndarray) -> Dict[str, np.ndarray]:
    return {"XO": X, "YO": Y, "S": np.array([[b"x"]] * X.shape[0], dtype=object)}


@batch
def _text(T: np.ndarray) -> Dict[str, np.ndarray]:
    return {"TO": T}


def _triple(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"o": request["k"]} for request in requests]


def _stream(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    for _ in range(2):
        yield [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


def main() -> None:
    http, grpc, metrics = (int(port) for port in sys.argv[1:4])
    config = TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)
    security = TritonSecurityConfig(access_token=os.environ.get("BENCH_ACCESS_TOKEN", "dfztoken"))
    with Triton(config=config, security_config=security) as triton:
        fp32 = [Tensor(dtype=np.float32, shape=(-1,))]
        triton.bind("identity", _identity, inputs=fp32, outputs=fp32, config=ModelConfig(max_batch_size=8))
        triton.bind(
            "mixed",
            _mixed,
            inputs=[
                Tensor(name="a", dtype=np.int32, shape=(2,)),
                Tensor(name="b", dtype=bytes, shape=(-1,), optional=True),
                Tensor(name="c", dtype=np.bool_, shape=(-1,), optional=True),
            ],
            outputs=[
                Tensor(name="a_out", dtype=np.int32, shape=(2,)),
                Tensor(name="b_out", dtype=bytes, shape=(-1,)),
                Tensor(name="c_out", dtype=np.bool_, shape=(-1,)),
            ],
            config=ModelConfig(batching=False),
        )
        triton.bind(
            "half",
            _half,
            inputs=[Tensor(name="X", dtype=np.float16, shape=(2, -1)), Tensor(name="Y", dtype=np.uint8, shape=(3,))],
            outputs=[
                Tensor(name="XO", dtype=np.float16, shape=(2, -1)),
                Tensor(name="YO", dtype=np.uint8, shape=(3,)),
                Tensor(name="S", dtype=bytes, shape=(1,)),
            ],
            config=ModelConfig(max_batch_size=4),
        )
        text_in, text_out = Tensor(name="T", dtype=bytes, shape=(1,)), Tensor(name="TO", dtype=bytes, shape=(1,))
        triton.bind("text", _text, inputs=[text_in], outputs=[text_out], config=ModelConfig(max_batch_size=2))
        kab = [Tensor(name=name, dtype=np.float32, shape=(-1,)) for name in ("k", "a", "b")]
        output = [Tensor(name="o", dtype=np.float32, shape=(-1,))]
        triton.bind("triple", _triple, inputs=kab, outputs=output, config=ModelConfig(batching=False))
        triton.bind("stream", _stream, inputs=fp32, outputs=fp32, config=ModelConfig(decoupled=True))
        print("READY", flush=True)
        if stat.S_ISFIFO(os.fstat(sys.stdin.fileno()).st_mode):
            while sys.stdin.buffer.read1(65536):  # dropped: stdin from /dev/zero held 22 GB when read whole
                pass
        else:  # a terminal, /dev/null, /dev/zero (read, it held a core at 100 % for nothing)
            triton.serve()


if __name__ == "__main__":
    main()
