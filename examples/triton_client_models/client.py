"""Ask each stand-in model what Triton's client examples ask it, and check the answers.

Triton's own scripts (triton-inference-server/client, src/python/examples) run unchanged against server.py;
this client is the short check of the same models that needs nothing but this folder.
"""

import argparse
import queue

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype


def _inputs(module, names, arrays):
    tensors = []
    for name, array in zip(names, arrays):
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def check_add_sub(module, client):
    first = np.arange(16, dtype=np.int32).reshape(1, 16)
    second = np.ones((1, 16), dtype=np.int32)
    for model, dtype in (("simple", np.int32), ("simple_int8", np.int8)):
        result = client.infer(model, _inputs(module, ["INPUT0", "INPUT1"], [first.astype(dtype), second.astype(dtype)]))
        assert (result.as_numpy("OUTPUT0") == first + second).all() and (
            result.as_numpy("OUTPUT1") == first - second
        ).all()
    strings = [
        np.array([[str(value).encode() for value in row] for row in array], dtype=object) for array in (first, second)
    ]
    result = client.infer("simple_string", _inputs(module, ["INPUT0", "INPUT1"], strings))
    assert [int(value) for value in result.as_numpy("OUTPUT0")[0]] == list(range(1, 17))
    print("simple, simple_int8, simple_string: sums and differences")


def check_identities(module, client):
    text = np.array([[b"zero\x00byte", "caf\u00e9".encode()]], dtype=object)
    assert (
        client.infer("simple_identity", _inputs(module, ["INPUT0"], [text])).as_numpy("OUTPUT0").tolist()
        == text.tolist()
    )
    numbers = np.arange(16, dtype=np.int32).reshape(1, 16)
    echoed = client.infer("custom_identity_int32", _inputs(module, ["INPUT0"], [numbers])).as_numpy("OUTPUT0")
    assert (echoed == numbers).all()
    print("simple_identity, custom_identity_int32: the inputs back")


def check_sequences(module, client):
    for model, sequence_id, expected in (
        ("simple_sequence", 41, [1 + 10, 20, 30]),  # INPUT + START
        ("simple_dyna_sequence", 42, [1 + 10, 20, 30 + 42]),  # and the correlation id on END
        ("simple_string_dyna_sequence", "43", [10, 30, 60 + 43]),  # a running total, and the id on END
    ):
        answers = []
        for index, value in enumerate([10, 20, 30]):
            tensors = _inputs(module, ["INPUT"], [np.array([[value]], dtype=np.int32)])
            result = client.infer(
                model, tensors, sequence_id=sequence_id, sequence_start=index == 0, sequence_end=index == 2
            )
            answers.append(int(result.as_numpy("OUTPUT")[0][0]))
        assert answers == expected, (model, answers)
    print("simple_sequence, simple_dyna_sequence, simple_string_dyna_sequence: one sequence each")


def check_densenet(module, client):
    red = np.zeros((3, 224, 224), dtype=np.float32)
    red[0] = 1.0
    wanted = [module.InferRequestedOutput("fc6_1", class_count=1)]
    top = client.infer("densenet_onnx", _inputs(module, ["data_0"], [red]), outputs=wanted).as_numpy("fc6_1")
    assert top.tolist() == [b"1.000000:0:red"], top
    print("densenet_onnx: a red image is red")


def check_repeat(client):
    answers = queue.Queue()
    values = np.arange(100, 105, dtype=np.int32)
    delays = np.full(5, 10, np.uint32)  # milliseconds before each response
    tensors = _inputs(grpcclient, ["IN", "DELAY", "WAIT"], [values, delays, np.array([10], np.uint32)])
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    client.async_stream_infer("repeat_int32", tensors)
    received = [answers.get(timeout=30) for _ in values]
    client.stop_stream()
    assert [int(result.as_numpy("OUT")[0]) for result in received] == values.tolist(), received
    print("repeat_int32: one response per value, in order")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://localhost:8000", help="http://host:port or grpc://host:port")
    args = parser.parse_args()
    grpc = args.url.startswith("grpc://")
    module = grpcclient if grpc else httpclient
    with module.InferenceServerClient(args.url.split("://", 1)[-1]) as client:
        check_add_sub(module, client)
        check_identities(module, client)
        check_sequences(module, client)
        check_densenet(module, client)
        if grpc:  # a decoupled model streams over gRPC
            check_repeat(client)
    print("OK")


if __name__ == "__main__":
    main()
