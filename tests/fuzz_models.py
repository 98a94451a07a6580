"""What the HTTP and gRPC fuzz tests share: the models they hit, Hypothesis' settings, the datatypes, byte mutants."""

from __future__ import annotations

import os
import random
from typing import Any, Dict, Iterator, List

import numpy as np
from hypothesis import HealthCheck, settings

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton

FUZZ_SETTINGS = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=True)
# The share of each fuzz test's examples a run draws. .ci/run draws a quarter on the extra Pythons: the codec and
# the transports they fuzz are the same code there, and all of them cost about a minute of CI a Python.
FUZZ_SHARE = float(os.environ.get("PYTRITON_TEST_FUZZ_SHARE", "1"))


def examples(count: int) -> int:
    """How many of a fuzz test's `count` examples this run draws (FUZZ_SHARE of them, at least one)."""
    return max(1, round(count * FUZZ_SHARE))


DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"]
DATATYPES += ["BF16", "BYTES"]


def _identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


def _mixed(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    empty_text = np.array([b""], dtype=object)
    return [
        {
            "a_out": request["a"],
            "b_out": request.data.get("b", empty_text),
            "c_out": request.data.get("c", np.zeros(1, np.bool_)),
        }
        for request in requests
    ]


def _stream(requests: List[Any]) -> Iterator[List[Dict[str, np.ndarray]]]:
    for _ in range(2):
        yield [{"OUTPUT_1": request["INPUT_1"]} for request in requests]


def bind_fuzz_models(triton: Triton) -> None:
    """`identity` (FP32, batching), `mixed` (INT32 [2] with optional BYTES and BOOL, no batching) and `stream`
    (decoupled: two responses a request)."""
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
    triton.bind("stream", _stream, inputs=fp32, outputs=fp32, config=ModelConfig(decoupled=True))


def mutate_bytes(rng: random.Random, data: bytes, line_safe: bool = False) -> bytes:
    """Flip, insert, delete or cut bytes; `line_safe` keeps CR and LF out (the HTTP head stays framed)."""
    raw = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        position = rng.randint(0, len(raw))
        action = rng.randrange(4)
        if action == 0 and position < len(raw):
            raw[position] ^= 1 << rng.randrange(8)
        elif action == 1:
            raw[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        elif action == 2:
            del raw[position : position + rng.randint(1, 8)]
        else:
            del raw[position:]
    if line_safe:
        raw = raw.replace(b"\r", b"?").replace(b"\n", b"?")
    return bytes(raw)
