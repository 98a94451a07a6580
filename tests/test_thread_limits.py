"""A server that cannot start a thread for a while (a thread limit, no memory for a stack): errors, then serves."""

from __future__ import annotations

import http.client
import pathlib
import secrets
import textwrap

import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.server_process import start_script, stop_script

# `/squeeze` makes every thread started from then on fail (its stack cannot be mapped), `/release` undoes it; both
# are async routes, run on the loop. `/hello` is a plain route, run in one of the server's route threads.
SQUEEZABLE_SERVER = textwrap.dedent(
    """
    import resource, threading
    import numpy as np
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    LIMIT = resource.getrlimit(resource.RLIMIT_AS)

    async def squeeze(request):
        resource.setrlimit(resource.RLIMIT_AS, (1 << 39, LIMIT[1]))  # whatever the machine over-commits
        threading.stack_size(1 << 40)
        return "squeezed"

    async def release(request):
        threading.stack_size(0)
        resource.setrlimit(resource.RLIMIT_AS, LIMIT)
        return "released"

    def total(requests):
        return [{"total": np.array([request["x"].sum()], np.float64)} for request in requests]

    if __name__ == "__main__":
        config = TritonConfig(http_port=0, allow_grpc=False, allow_metrics=False)
        with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
            triton.bind(
                "total",
                total,
                inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
                outputs=[Tensor(name="total", dtype=np.float64, shape=(1,))],
                config=ModelConfig(batching=False),
            )
            triton.add_route("/squeeze", squeeze)
            triton.add_route("/release", release)
            triton.add_route("/hello", lambda request: "hello", methods=["GET"])
            triton.run()
            print(triton.http_port, flush=True)
            triton.serve()
    """
)


def _get(connection: http.client.HTTPConnection, method: str, path: str) -> tuple[int, bytes]:
    connection.request(method, path, b"{}" if method == "POST" else None)
    response = connection.getresponse()
    return response.status, response.read()


def _total_of_region(client: httpclient.InferenceServerClient, byte_size: int) -> float:
    tensor = httpclient.InferInput("x", [byte_size // 4], "FP32")
    tensor.set_shared_memory("big", byte_size)
    return float(client.infer("total", [tensor]).as_numpy("total")[0])


def test_threads_that_could_not_start_take_no_place_and_large_copies_go_on(tmp_path: pathlib.Path) -> None:
    """A route thread that failed to start (RuntimeError: can't start new thread) was counted as started: once as
    many had failed as the pool may hold, every later plain route request waited for a thread that would never
    come, after threads could be started again too. So did large shared-memory copies (after 4 failures), each
    failure a 500 that left two descriptors open. Now a plain route fails alone (500) while no thread starts and is
    served after, and a large copy with no thread to run it is done on the loop."""
    byte_size = 8 << 20  # copied in a thread from 8 MiB on
    key = f"/pytriton-test-{secrets.token_hex(6)}"
    region = shm.create_shared_memory_region(key[1:], key, byte_size)
    server = start_script(tmp_path, SQUEEZABLE_SERVER)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        shm.set_shared_memory_region(region, [np.ones(byte_size // 4, np.float32)])
        with httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30) as client:
            client.register_system_shared_memory("big", key, byte_size)
            x = httpclient.InferInput("x", [2], "FP32")
            x.set_data_from_numpy(np.ones(2, np.float32))
            assert float(client.infer("total", [x]).as_numpy("total")[0]) == 2.0  # its instance's thread is up
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                assert _get(connection, "POST", "/squeeze") == (200, b"squeezed")
                for _ in range(40):  # more than the pool's threads, which are at most 32
                    status, body = _get(connection, "GET", "/hello")
                    assert status == 500 and b"can't start new thread" in body, (status, body)
                for _ in range(6):  # more than the copiers' threads (4)
                    assert _total_of_region(client, byte_size) == float(byte_size // 4)
                assert _get(connection, "POST", "/release") == (200, b"released")
                assert _get(connection, "GET", "/hello") == (200, b"hello")
                assert _total_of_region(client, byte_size) == float(byte_size // 4)
            finally:
                connection.close()
    finally:
        stop_script(server)
        shm.destroy_shared_memory_region(region)
