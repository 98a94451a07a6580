"""Stand-ins for the models Triton's own Python client examples ask for, so that those scripts run unchanged.

Triton's client repository (src/python/examples) talks to models of Triton's example model repository. This
server binds models of the same names, tensors and behaviour, written with the pytriton API:

- `simple`, `simple_int8`: INPUT0 and INPUT1 ([-1, 16], INT32 / INT8) -> OUTPUT0 = sum, OUTPUT1 = difference;
- `simple_string`: the same over BYTES tensors that hold decimal numbers;
- `simple_identity` (BYTES) and `custom_identity_int32` (INT32): OUTPUT0 = INPUT0;
- `simple_sequence`: a sequence batcher model, OUTPUT = INPUT + START;
- `simple_dyna_sequence`: the same, plus the correlation id (CORRID, UINT64) on a sequence's END request;
- `simple_string_dyna_sequence`: a running total per sequence, plus the correlation id (a string holding a
  number) on its END request;
- `repeat_int32`: decoupled; one response (OUT, IDX) per value of IN, the i-th after DELAY[i] milliseconds,
  the request released WAIT milliseconds after the last;
- `densenet_onnx`: an image classifier's shape (data_0 [3, 224, 224] FP32, FORMAT_NCHW -> fc6_1 [3, 1, 1] with
  labels); a toy that scores each colour channel by its mean.

The shared-memory and model-control examples call APIs a server restricts by default and cannot send an access
token: this server restricts nothing, and listens on the loopback interface only.
`--repository-size N` binds `simple` and N - 1 copies of `custom_identity_int32` only, for the model-control
examples, which count the models of Triton's repository (7 over HTTP, 8 over gRPC).
"""

import argparse
import logging
import time

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, SequenceBatcher, SequenceControlInput, SequenceControlKind, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

ROW = (16,)
COLOURS = ["red", "green", "blue"]
BATCHING = ModelConfig(max_batch_size=8)


@batch
def _add_sub(INPUT0, INPUT1):
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


def _numbers(strings):
    return np.array([int(item) for item in strings.reshape(-1)], dtype=np.int64).reshape(strings.shape)


def _strings(numbers):
    return np.array([str(item).encode() for item in numbers.reshape(-1)], dtype=object).reshape(numbers.shape)


@batch
def _add_sub_strings(INPUT0, INPUT1):
    first, second = _numbers(INPUT0), _numbers(INPUT1)
    return {"OUTPUT0": _strings(first + second), "OUTPUT1": _strings(first - second)}


@batch
def _identity(INPUT0):
    return {"OUTPUT0": INPUT0}


def _flag(request, name):
    return int(request[name].reshape(-1)[0])


def _sequence(requests):
    return [{"OUTPUT": (request["INPUT"] + request["START"]).astype(np.int32)} for request in requests]


def _dyna_sequence(requests):
    responses = []
    for request in requests:
        value = request["INPUT"].astype(np.int64) + request["START"]
        if _flag(request, "END"):
            value = value + _flag(request, "CORRID")
        responses.append({"OUTPUT": value.astype(np.int32)})
    return responses


def _string_dyna_sequence(requests):
    responses = []
    for request in requests:
        total = request.sequence_state.get("total", 0) + int(request["INPUT"].sum())
        request.sequence_state["total"] = total
        if _flag(request, "END"):
            total += _flag(request, "CORRID")  # a string id, decimal digits
        responses.append({"OUTPUT": np.full(request["INPUT"].shape, total, np.int32)})
    return responses


def _repeat(requests):
    (request,) = requests  # no batching: one request a call
    for index, value in enumerate(request["IN"]):
        time.sleep(int(request["DELAY"][index]) / 1000)
        yield [{"OUT": np.array([value], np.int32), "IDX": np.array([index], np.uint32)}]
    time.sleep(int(request["WAIT"][0]) / 1000)


def _colours(requests):
    return [{"fc6_1": request["data_0"].mean(axis=(1, 2)).reshape(3, 1, 1)} for request in requests]


def _pair(prefix, dtype, shape=ROW):
    return [Tensor(name=f"{prefix}{index}", dtype=dtype, shape=shape) for index in range(2)]


def _sequence_config(corrid_type=None):
    kind = SequenceControlKind
    controls = [
        SequenceControlInput("START", kind.CONTROL_SEQUENCE_START, int32_false_true=[0, 1]),
        SequenceControlInput("READY", kind.CONTROL_SEQUENCE_READY, int32_false_true=[0, 1]),
    ]
    if corrid_type is not None:
        controls += [
            SequenceControlInput("END", kind.CONTROL_SEQUENCE_END, int32_false_true=[0, 1]),
            SequenceControlInput("CORRID", kind.CONTROL_SEQUENCE_CORRID, data_type=corrid_type),
        ]
    return ModelConfig(max_batch_size=8, sequence_batcher=SequenceBatcher(control_inputs=controls))


def bind_simple(triton):
    triton.bind("simple", _add_sub, inputs=_pair("INPUT", np.int32), outputs=_pair("OUTPUT", np.int32), config=BATCHING)


def bind_identity(triton, name):
    triton.bind(
        name,
        _identity,
        inputs=[Tensor(name="INPUT0", dtype=np.int32, shape=(-1,))],
        outputs=[Tensor(name="OUTPUT0", dtype=np.int32, shape=(-1,))],
        config=BATCHING,
    )


def bind_all(triton):
    bind_simple(triton)
    bind_identity(triton, "custom_identity_int32")
    triton.bind(
        "simple_int8", _add_sub, inputs=_pair("INPUT", np.int8), outputs=_pair("OUTPUT", np.int8), config=BATCHING
    )
    triton.bind(
        "simple_string", _add_sub_strings, inputs=_pair("INPUT", bytes), outputs=_pair("OUTPUT", bytes), config=BATCHING
    )
    triton.bind(
        "simple_identity",
        _identity,
        inputs=[Tensor(name="INPUT0", dtype=bytes, shape=(-1,))],
        outputs=[Tensor(name="OUTPUT0", dtype=bytes, shape=(-1,))],
        config=BATCHING,
    )
    one = {
        "inputs": [Tensor(name="INPUT", dtype=np.int32, shape=(1,))],
        "outputs": [Tensor(name="OUTPUT", dtype=np.int32, shape=(1,))],
    }
    triton.bind("simple_sequence", _sequence, **one, config=_sequence_config())
    triton.bind("simple_dyna_sequence", _dyna_sequence, **one, config=_sequence_config(np.uint64))
    triton.bind("simple_string_dyna_sequence", _string_dyna_sequence, **one, config=_sequence_config(bytes))
    triton.bind(
        "repeat_int32",
        _repeat,
        inputs=[
            Tensor(name="IN", dtype=np.int32, shape=(-1,)),
            Tensor(name="DELAY", dtype=np.uint32, shape=(-1,)),
            Tensor(name="WAIT", dtype=np.uint32, shape=(1,)),
        ],
        outputs=[Tensor(name="OUT", dtype=np.int32, shape=(1,)), Tensor(name="IDX", dtype=np.uint32, shape=(1,))],
        config=ModelConfig(batching=False, decoupled=True),
    )
    triton.bind(
        "densenet_onnx",
        _colours,
        inputs=[Tensor(name="data_0", dtype=np.float32, shape=(3, 224, 224), format="FORMAT_NCHW")],
        outputs=[Tensor(name="fc6_1", dtype=np.float32, shape=(3, 1, 1), labels=COLOURS)],
        config=ModelConfig(batching=False),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository-size", type=int, help="bind `simple` and fillers only, this many models in all")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    loopback = TritonConfig(http_address="127.0.0.1", grpc_address="127.0.0.1")
    with Triton(config=loopback, security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
        if args.repository_size:
            bind_simple(triton)
            for index in range(args.repository_size - 1):
                bind_identity(triton, f"identity_{index}")
        else:
            bind_all(triton)
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
