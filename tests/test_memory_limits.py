"""A server at its memory limit (RLIMIT_AS, a cgroup's): a request that needs more fails clearly; it serves on."""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import queue
import struct
import subprocess
import textwrap
from typing import Any, Iterator, List, Tuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from tests.h2_wire import H2Client, grpc_message, request_headers
from tests.server_process import start_script, stop_script

# `/squeeze?mib=N` lets the server's process map only N MiB more from then on; `/release` undoes it. Both are async
# routes, run on the loop.
SQUEEZABLE_SERVER = textwrap.dedent(
    """
    import os, resource
    import numpy as np
    from pytriton.instances import ProcessInstances
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    LIMIT = resource.getrlimit(resource.RLIMIT_AS)

    def mapped():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))

    async def squeeze(request):
        resource.setrlimit(resource.RLIMIT_AS, (mapped() + (int(request.query["mib"]) << 20), LIMIT[1]))
        return "squeezed"

    async def release(request):
        resource.setrlimit(resource.RLIMIT_AS, LIMIT)
        return "released"

    def ones(requests):
        return [{"ones": np.ones(int(request["x"][0]), np.float32)} for request in requests]

    def total(requests):
        return [{"total": np.array([request["x"].sum()], np.float64)} for request in requests]

    async def pid(request):
        return str(os.getpid())

    YIELDED = [0]  # the steps the last stream yielded before its generator ended (the model's state)

    def steps(requests):
        (request,) = requests
        previous, YIELDED[0] = YIELDED[0], 0
        try:
            for size in (4, int(request["x"][0]), *[4] * 100):
                yield [{
                    "ones": np.ones(size, np.float32),
                    "pid": np.array([os.getpid()]),
                    "previous": np.array([previous]),
                }]
                YIELDED[0] += 1
        finally:
            YIELDED[0] = -YIELDED[0]  # negative: it ended

    if __name__ == "__main__":
        config = TritonConfig(http_port=0, grpc_port=0, allow_metrics=False)
        with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
            triton.bind(
                "total",
                total,
                inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
                outputs=[Tensor(name="total", dtype=np.float64, shape=(1,))],
                config=ModelConfig(batching=False),
            )
            triton.bind(
                "ones",
                ones,
                inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
                outputs=[Tensor(name="ones", dtype=np.float32, shape=(-1,))],
                config=ModelConfig(batching=False),
            )
            for name, budget in (("process_ones", None), ("process_ones_in_body", 0)):  # in_body: no arena
                triton.bind(
                    name,
                    ProcessInstances(ones) if budget is None else ProcessInstances(ones, shm_budget_bytes=budget),
                    inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
                    outputs=[Tensor(name="ones", dtype=np.float32, shape=(-1,))],
                    config=ModelConfig(batching=False),
                )
            triton.bind(
                "process_steps",
                ProcessInstances(steps),
                inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
                outputs=[
                    Tensor(name="ones", dtype=np.float32, shape=(-1,)),
                    Tensor(name="pid", dtype=np.int64, shape=(1,)),
                    Tensor(name="previous", dtype=np.int64, shape=(1,)),
                ],
                config=ModelConfig(batching=False, decoupled=True),
            )
            triton.add_route("/pid", pid)
            triton.add_route("/squeeze", squeeze)
            triton.add_route("/release", release)
            triton.run()
            print(triton.http_port, triton.grpc_port, flush=True)
            triton.serve()
    """
)


@pytest.fixture
def squeezable(tmp_path: pathlib.Path) -> Iterator[Tuple[int, int]]:
    """The squeezable server's HTTP and gRPC ports."""
    server: subprocess.Popen[str] = start_script(tmp_path, SQUEEZABLE_SERVER)
    try:
        assert server.stdout is not None
        http_port, grpc_port = map(int, server.stdout.readline().split())
        yield http_port, grpc_port
    finally:
        stop_script(server)


def _post(port: int, path: str, body: bytes = b"{}") -> Tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _total(port: int, values: np.ndarray, model: str = "total") -> Tuple[int, bytes]:
    """POST `values` (FP32) to `model` in the binary tensor extension."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [values.size],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ]
        }
    ).encode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(
            "POST",
            f"/v2/models/{model}/infer",
            header + values.tobytes(),
            {"Inference-Header-Content-Length": str(len(header))},
        )
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_a_body_the_server_has_no_memory_for_is_refused_503_and_the_server_serves_on(squeezable: int) -> None:
    """A large body is read into one buffer of its declared length, made when its head arrives: the MemoryError of
    a server at its memory limit was raised through the HTTP parser, and the connection ended with no answer. Now the
    request is refused 503, saying why, and the connection closes after it (its body is not read)."""
    port, _ = squeezable
    assert _post(port, "/squeeze?mib=256") == (200, b"squeezed")
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest("POST", "/v2/models/total/infer")
        connection.putheader("Content-Length", str(1 << 30))  # 1 GiB: never sent, the answer comes at its head
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 503
        assert json.loads(response.read()) == {
            "error": f"the server is out of memory: no room for a request body of {1 << 30} bytes now"
        }
        assert response.getheader("Connection") == "close"
    finally:
        connection.close()
    status, body = _total(port, np.ones(4, np.float32))  # a small request, as the server still has room for it
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [4.0], body
    assert _post(port, "/release") == (200, b"released")
    status, body = _total(port, np.ones(1 << 25, np.float32))  # 128 MiB: there is memory for it again
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [float(1 << 25)], body[:200]


def _grpc_total(values: np.ndarray) -> bytes:
    """A ModelInfer message of model `total` for FP32 `values`."""
    request = service_pb2.ModelInferRequest(model_name="total")
    request.inputs.add(name="x", datatype="FP32", shape=[values.size])
    request.raw_input_contents.append(values.astype(np.float32).tobytes())
    return request.SerializeToString()  # type: ignore[no-any-return]


def test_a_message_the_server_has_no_memory_for_fails_its_call_alone(squeezable: Tuple[int, int]) -> None:
    """A message sent in pieces is read into one buffer of the size its prefix declares: the MemoryError of a server
    at its memory limit was raised through the HTTP/2 framing, and ended the connection with every call on it (a
    client process's calls share one). Now that call alone ends, RESOURCE_EXHAUSTED saying why."""
    http_port, grpc_port = squeezable
    assert _post(http_port, "/squeeze?mib=256") == (200, b"squeezed")
    client = H2Client(grpc_port)
    try:
        client.handshake()
        waiting = client.new_stream()  # a call under way on the same connection, its message not all sent yet
        message = grpc_message(_grpc_total(np.ones(3, np.float32)))
        client.send_headers(waiting, request_headers())
        client.send_data(waiting, message[:10], end_stream=False)
        big = client.new_stream()
        client.send_headers(big, request_headers())
        client.send_data(big, struct.pack(">BI", 0, 1 << 30) + bytes(1000), end_stream=False)
        refused = client.response(big)
        assert refused.trailers["grpc-status"] == "8", refused.trailers  # RESOURCE_EXHAUSTED
        assert (
            refused.trailers["grpc-message"]
            == f"the server is out of memory: no room for a message of {1 << 30} bytes now"
        )
        client.send_data(waiting, message[10:])
        answer = client.response(waiting)
        assert answer.trailers["grpc-status"] == "0", answer.trailers
        response = service_pb2.ModelInferResponse.FromString(answer.data[5:])
        assert np.frombuffer(response.raw_output_contents[0], np.float64).tolist() == [3.0]
    finally:
        client.close()
    assert _post(http_port, "/release") == (200, b"released")


def test_a_response_the_server_has_no_memory_to_encode_is_a_500_that_says_so(squeezable: Tuple[int, int]) -> None:
    """Binary outputs are joined into the body once. A MemoryError there, which says nothing, was answered
    "internal server error: " and nothing more; its type is named now. The server serves on."""
    port, _ = squeezable
    count = 40 << 20  # 160 MiB of FP32 ones: the callable has room for them, the body not for a copy as well
    header = json.dumps(
        {
            "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [count]}],
            "outputs": [{"name": "ones", "parameters": {"binary_data": True}}],
        }
    ).encode()
    assert _post(port, "/squeeze?mib=256") == (200, b"squeezed")
    status, body = _post(port, "/v2/models/ones/infer", header)
    assert (status, json.loads(body)) == (500, {"error": "internal server error: MemoryError"})
    status, body = _total(port, np.ones(4, np.float32))
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [4.0], body
    assert _post(port, "/release") == (200, b"released")
    status, body = _post(port, "/v2/models/ones/infer", header)
    assert status == 200 and len(body) > count * 4, body[:200]


# A process instance that limits its own memory when asked (`x` = [-N]: N MiB more from then on; [0]: no limit).
SELF_SQUEEZING_SERVER = textwrap.dedent(
    """
    import os, resource
    import numpy as np
    from pytriton.instances import ProcessInstances
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    LIMIT = resource.getrlimit(resource.RLIMIT_AS)

    def mapped():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))

    def total(requests):
        for request in requests:
            x = request["x"]
            if x.size == 1 and x[0] < 0:
                resource.setrlimit(resource.RLIMIT_AS, (mapped() + (int(-x[0]) << 20), LIMIT[1]))
            elif x.size == 1 and x[0] == 0:
                resource.setrlimit(resource.RLIMIT_AS, LIMIT)
        return [{"total": np.array([r["x"].sum()], np.float64), "pid": np.array([os.getpid()])} for r in requests]

    if __name__ == "__main__":
        with Triton(config=TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)) as triton:
            for name, budget in (("total", None), ("in_body", 0)):  # in_body: every input travels in the message
                triton.bind(
                    name,
                    ProcessInstances(total) if budget is None else ProcessInstances(total, shm_budget_bytes=budget),
                    inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
                    outputs=[
                        Tensor(name="total", dtype=np.float64, shape=(1,)),
                        Tensor(name="pid", dtype=np.int64, shape=(1,)),
                    ],
                    config=ModelConfig(batching=False),
                )
            triton.run()
            print(triton.http_port, flush=True)
            triton.serve()
    """
)


@pytest.mark.parametrize(
    ("model", "why"),
    [("total", "Cannot allocate memory"), ("in_body", f"no memory for its {1 << 26} bytes")],
    ids=["new arena", "in the message"],
)
def test_an_instance_process_with_no_memory_for_a_batch_fails_that_batch_and_lives(
    tmp_path: pathlib.Path, model: str, why: str
) -> None:
    """A batch larger than the instance process's input arena comes with a new one, which the process maps, or, past
    the arena's budget, in its message, which the process reads into a buffer of its size. At its memory limit
    either failed, and the process exited (status 1): the model was started again, its state lost. Now that batch
    fails alone, saying why, and the next one brings a new arena."""
    server: subprocess.Popen[str] = start_script(tmp_path, SELF_SQUEEZING_SERVER)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())

        def total(values: np.ndarray) -> Tuple[int, Any]:
            status, body = _total(port, values, model)
            return status, json.loads(body)

        status, first = total(np.array([-32], np.float32))  # 32 MiB more for the process from now on
        assert status == 200, first
        pid = first["outputs"][1]["data"]
        status, refused = total(np.ones(1 << 24, np.float32))  # 64 MiB: a new arena, more than the process may map
        assert status == 500, refused
        assert refused["error"].startswith(
            f"BatchNotSent: model '{model}' instance 0 could not take the batch's inputs: "
        )
        assert why in refused["error"], refused
        status, answer = total(np.array([0], np.float32))  # no limit any more
        assert status == 200 and answer["outputs"][1]["data"] == pid, answer
        status, answer = total(np.ones(1 << 24, np.float32))
        assert status == 200 and answer["outputs"][0]["data"] == [float(1 << 24)], answer
        assert answer["outputs"][1]["data"] == pid, answer  # the same process throughout
    finally:
        stop_script(server)


def _ones(port: int, model: str, count: int) -> Tuple[int, bytes]:
    """`count` FP32 ones from `model`, in the binary tensor extension."""
    header = json.dumps(
        {
            "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [count]}],
            "outputs": [{"name": "ones", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return _post(port, f"/v2/models/{model}/infer", header)


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ("process_ones", "the server could not map its outputs: [Errno 12] cannot map shared memory"),
        ("process_ones_in_body", f"the server had no memory for its {1 << 26} bytes of outputs"),
    ],
    ids=["new arena", "in the message"],
)
def test_outputs_of_a_process_instance_the_server_has_no_memory_for_fail_their_batch_alone(
    squeezable: Tuple[int, int], model: str, why: str
) -> None:
    """A result larger than the instance process's result arena comes in a new one, which the server maps, or, past
    the arena's budget, in its message, read into a buffer of its size. At the server's memory limit either failed:
    the mapping's error, an OSError, was taken for the channel's, which closed without a word; the MemoryError closed
    it too. The process exited and was started again, its model's state lost. Now that batch fails alone, saying
    why, and the process makes a new arena for its next result."""
    port, _ = squeezable
    status, body = _ones(port, model, 4)
    assert status == 200, body
    assert _post(port, "/squeeze?mib=32") == (200, b"squeezed")
    status, body = _ones(port, model, 1 << 24)  # 64 MiB of outputs: more than the server has room for
    assert status == 500, body
    error = json.loads(body)["error"]
    assert error.startswith(f"OutputsNotTaken: model '{model}' instance 0: {why}"), error
    assert _post(port, "/release") == (200, b"released")
    status, body = _ones(port, model, 1 << 24)
    assert status == 200 and body.endswith(np.ones(1 << 24, np.float32).tobytes()), body[:200]


def _memfds(pid: int) -> Tuple[int, int, List[str]]:
    """How many descriptors of pytriton's segments (memfds) process `pid` holds, how many mappings of them, and the
    named segments it made (where memfd is missing: in /dev/shm, named after its pid)."""
    named = sorted(name for name in os.listdir("/dev/shm") if str(pid) in name)
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            held += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:pytriton")
        except OSError:
            continue
    with open(f"/proc/{pid}/maps") as maps:
        return held, sum("/memfd:pytriton" in line for line in maps), named


def _streams(grpc_port: int, sizes: List[int]) -> List[Tuple[str, Any]]:
    """Stream requests for steps of `sizes` ones, one after the other's end, on one stream: what came, in order.

    Each is ("<id>", outputs) for a step, ("<id>", "final") for an empty final response, ("error", its text).
    """
    came: queue.Queue[Tuple[Any, Any]] = queue.Queue()
    seen: List[Tuple[str, Any]] = []
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        client.start_stream(callback=lambda result, error: came.put((result, error)))
        try:
            for index, size in enumerate(sizes):
                tensor = grpcclient.InferInput("x", [1], "FP32")
                tensor.set_data_from_numpy(np.array([size], np.float32))
                client.async_stream_infer(
                    "process_steps", [tensor], request_id=str(index), enable_empty_final_response=True
                )
                while True:
                    result, error = came.get(timeout=60)
                    if error is not None:
                        seen.append(("error", str(error)))
                        break
                    response = result.get_response()
                    if response.parameters["triton_final_response"].bool_param:
                        seen.append((response.id, "final"))
                        break
                    outputs = {name: result.as_numpy(name) for name in ("ones", "pid", "previous")}
                    seen.append((response.id, outputs))
        finally:
            client.stop_stream()
    return seen


def test_a_step_of_a_process_instance_the_server_has_no_memory_for_fails_its_stream_alone(
    tmp_path: pathlib.Path,
) -> None:
    """A decoupled model's step travels in its message, read into a buffer of its size. At the server's memory limit
    that raised MemoryError through the channel, which closed: the process was taken for dead and started again (its
    model's state lost, its stream failed saying it died). Now that stream fails alone, saying why as a plain batch
    does; the generator is stopped, its later steps dropped; the same process serves the next stream, and nothing
    of the failed one stays mapped."""
    server: subprocess.Popen[str] = start_script(tmp_path, SQUEEZABLE_SERVER)
    try:
        assert server.stdout is not None
        http_port, grpc_port = map(int, server.stdout.readline().split())
        status, server_pid = _post(http_port, "/pid")
        assert status == 200, server_pid
        first = _streams(grpc_port, [4])
        assert [id_ for id_, _ in first] == ["0"] * 103, first[:3]
        pid = int(first[0][1]["pid"][0])
        held = _memfds(int(server_pid)), _memfds(pid)
        assert _post(http_port, "/squeeze?mib=32") == (200, b"squeezed")
        seen = _streams(grpc_port, [1 << 24, 4])  # 64 MiB in the second step: more than the server has room for
        assert seen[0][0] == "0" and seen[0][1]["ones"].tolist() == [1.0] * 4, seen[:3]
        assert seen[1][0] == "error", seen[:3]  # no later step of the failed stream came
        assert seen[1][1] == (  # 64 MiB of ones, 16 bytes of pid and previous
            "OutputsNotTaken: model 'process_steps' instance 0: "
            f"the server had no memory for its {(1 << 26) + 16} bytes of outputs"
        ), seen[1]
        assert [id_ for id_, _ in seen[2:]] == ["1"] * 103, seen[2:5]
        assert int(seen[2][1]["pid"][0]) == pid  # the same process: not taken for dead
        stopped = -int(seen[2][1]["previous"][0])
        assert 0 < stopped < 102, stopped  # the failed stream's generator was stopped (102: it ran to its end)
        assert _post(http_port, "/release") == (200, b"released")
        seen = _streams(grpc_port, [1 << 24])
        assert [id_ for id_, _ in seen] == ["0"] * 103 and int(seen[0][1]["pid"][0]) == pid, seen[:3]
        assert seen[1][1]["ones"].tolist() == [1.0] * (1 << 24)
        assert seen[1][1]["previous"].tolist() == [-102]  # the stream before ran to its end
        assert (_memfds(int(server_pid)), _memfds(pid)) == held
    finally:
        stop_script(server)
