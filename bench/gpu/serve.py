"""The GPU bench's server: one model with Triton's dynamic batcher; prints `READY {ports}` and serves until stopped.

python -m bench.gpu.serve --model resnet50 --size full --device cuda --max-batch 64 --queue-delay-us 1000
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from typing import Any, Callable, Dict

import numpy as np

from bench.gpu.models import ModelSpec, batch_callable, build
from bench.model_server import _security_kwargs
from pytriton.decorators import batch
from pytriton.instances import ProcessInstances
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--size", default="full", choices=("full", "tiny"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--half", action="store_true", help="FP16 weights and activations")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--queue-delay-us", type=int, default=1000)
    parser.add_argument("--instances", type=int, default=2, help="instances (threads), each on its own CUDA stream")
    parser.add_argument(
        "--process-instances", action="store_true", help="instances in processes of their own (each its own GIL)"
    )
    args = parser.parse_args()
    spec = build(args.model, args.size)
    if args.process_instances:
        make = functools.partial(_built_infer_callable, args.model, args.size, args.device, args.half, args.max_batch)
        infer_func: Any = ProcessInstances(factory=make, count=args.instances)
    else:
        infer_func = [_infer_callable(spec, args.device, args.half, args.max_batch)] * args.instances

    config = TritonConfig(
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        metrics_interval_ms=250,
    )
    with Triton(config=config, **_security_kwargs()) as triton:
        triton.bind(
            model_name=spec.name,
            infer_func=infer_func,
            inputs=[Tensor(name="INPUT", dtype=spec.input_dtype, shape=spec.input_shape)],
            outputs=[Tensor(name="OUTPUT", dtype=np.float32, shape=spec.output_shape)],
            config=ModelConfig(
                max_batch_size=args.max_batch,
                batcher=DynamicBatcher(max_queue_delay_microseconds=args.queue_delay_us),
            ),
        )
        triton.run()
        ports = {"http": triton.http_port, "grpc": triton.grpc_port, "metrics": triton.metrics_port}
        print("READY " + json.dumps(ports), flush=True)
        sys.stdin.read()  # serve until the bench closes our stdin


def _built_infer_callable(model: str, size: str, device: str, half: bool, max_batch: int) -> Callable[..., Any]:
    """An instance process's factory (`--process-instances`): it builds its own model."""
    return _infer_callable(build(model, size), device, half, max_batch)


def _infer_callable(spec: ModelSpec, device: str, half: bool, max_batch: int) -> Callable[..., Any]:
    """The model on the device, warmed up (cuDNN picks its algorithms), as the server's `@batch` callable."""
    run = batch_callable(spec, device, half)
    run(spec.sample(max_batch))

    @batch
    def infer(INPUT: np.ndarray) -> Dict[str, Any]:
        return {"OUTPUT": run(INPUT)}  # a device tensor: copied to the host once (by the server or the process)

    return infer


if __name__ == "__main__":
    main()
