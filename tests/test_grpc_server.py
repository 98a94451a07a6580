"""gRPC server settings: TLS, mutual TLS, response compression, keepalive, ports and address."""

from __future__ import annotations

import pathlib
import shutil
import socket
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.options.limits import ServerLimits
from pytriton.options.server import GrpcKeepalive
from pytriton.runtime.options import resolve_options
from pytriton.transport.grpc.settings import bind_address
from pytriton.triton import Triton, TritonConfig
from tests.conftest import grpc_url
from tests.h2_wire import H2Client

OUTPUT_FLOATS = 2**20  # a 4 MiB output of zeros: compresses to a few KiB


def _zeros(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUT": np.zeros(OUTPUT_FLOATS, dtype=np.float32) + request["IN"][0]} for request in requests]


def bind_zeros(triton: Triton) -> None:
    triton.bind(
        "zeros",
        _zeros,
        inputs=[Tensor(name="IN", dtype=np.float32, shape=(1,))],
        outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(batching=False),
    )


_ZEROS_REQUEST = service_pb2.ModelInferRequest(
    model_name="zeros",
    inputs=[service_pb2.ModelInferRequest.InferInputTensor(name="IN", datatype="FP32", shape=[1])],
    raw_input_contents=[np.array([2.0], dtype=np.float32).tobytes()],
).SerializeToString()


def _infer(client: Any) -> np.ndarray:
    infer_input = grpcclient.InferInput("IN", [1], "FP32")
    infer_input.set_data_from_numpy(np.array([2.0], dtype=np.float32))
    return client.infer("zeros", [infer_input]).as_numpy("OUT")  # type: ignore[no-any-return]


# --- TLS -------------------------------------------------------------------------------------------------------


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(name: str, cwd: pathlib.Path, extensions: str) -> None:
    """A key and a certificate signed by ca.crt, for localhost."""
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
             f"{name}.key", "-out", f"{name}.csr", "-subj", "/CN=localhost", cwd=cwd)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext", cwd=cwd)  # fmt: skip


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A throwaway CA with a server certificate (localhost, 127.0.0.1) and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("the TLS tests need the openssl command line tool to make test certificates")
    cwd = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=pytriton test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
             cwd=cwd)  # fmt: skip
    _issue("server", cwd, "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _issue("client", cwd, "extendedKeyUsage=clientAuth\n")
    return cwd


def _tls_config(certs: pathlib.Path, mutual: bool) -> Dict[str, Any]:
    return {
        "grpc_use_ssl": not mutual,
        "grpc_use_ssl_mutual": mutual,
        "grpc_server_cert": certs / "server.crt",
        "grpc_server_key": certs / "server.key",
        "grpc_root_cert": certs / "ca.crt",
    }


def _tls_client(port: int, certs: pathlib.Path, with_client_cert: bool) -> Any:
    client_files: Dict[str, Any] = {}
    if with_client_cert:
        client_files = {"private_key": str(certs / "client.key"), "certificate_chain": str(certs / "client.crt")}
    return grpcclient.InferenceServerClient(
        f"localhost:{port}", ssl=True, root_certificates=str(certs / "ca.crt"), **client_files
    )


def _refused(make_client: Callable[[], Any]) -> str:
    with make_client() as client, pytest.raises(InferenceServerException) as raised:
        client.is_server_live()
    return str(raised.value.status())


def test_tls(start_triton: Callable[..., Triton], certificates: pathlib.Path) -> None:
    triton = start_triton(bind_zeros, grpc_address="127.0.0.1", **_tls_config(certificates, mutual=False))
    with _tls_client(triton.grpc_port, certificates, with_client_cert=False) as client:
        assert client.is_server_live() is True
        assert _infer(client)[0] == 2.0
    assert _refused(lambda: grpcclient.InferenceServerClient(grpc_url(triton))) == "StatusCode.UNAVAILABLE"


def test_mutual_tls(start_triton: Callable[..., Triton], certificates: pathlib.Path) -> None:
    triton = start_triton(bind_zeros, grpc_address="127.0.0.1", **_tls_config(certificates, mutual=True))
    with _tls_client(triton.grpc_port, certificates, with_client_cert=True) as client:
        assert client.is_server_ready() is True
        assert _infer(client)[-1] == 2.0
    no_cert = _refused(lambda: _tls_client(triton.grpc_port, certificates, with_client_cert=False))
    assert no_cert == "StatusCode.UNAVAILABLE"


def test_a_tls_client_that_never_handshakes_is_closed(
    start_triton: Callable[..., Triton], certificates: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTRITON_LIMIT_GRPC_HANDSHAKE_TIMEOUT_S", "0.5")
    triton = start_triton(bind_zeros, grpc_address="127.0.0.1", **_tls_config(certificates, mutual=False))
    with socket.create_connection(("127.0.0.1", triton.grpc_port), timeout=10) as silent:
        started = time.monotonic()
        try:
            assert silent.recv(1) == b""  # closed without a byte of TLS
        except ConnectionResetError:
            pass
        assert time.monotonic() - started < 5
    with _tls_client(triton.grpc_port, certificates, with_client_cert=False) as client:
        assert client.is_server_live() is True


@pytest.mark.parametrize("frontends", [2, 3], ids=["hub-and-1-frontend", "2-frontend-processes"])
def test_failed_tls_handshakes_through_frontends_leave_the_connection_cap_free(
    start_triton: Callable[..., Triton], certificates: pathlib.Path, frontends: int
) -> None:
    """The hub counts each connection it hands over until the server that took it says it closed."""
    limits = ServerLimits(grpc_max_connections=2)
    config = _tls_config(certificates, mutual=False)
    triton = start_triton(bind_zeros, grpc_address="127.0.0.1", frontends=frontends, limits=limits, **config)
    for _ in range(4):
        with socket.create_connection(("127.0.0.1", triton.grpc_port), timeout=10) as plain:
            plain.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # no TLS ClientHello: the handshake fails
            try:
                while plain.recv(4096):
                    pass
            except ConnectionResetError:
                pass
    pool = triton._runtime._pool
    assert pool is not None
    deadline = time.monotonic() + 10
    while pool._open("grpc"):  # the frontends say so in messages of their own
        assert time.monotonic() < deadline, f"{pool._open('grpc')} failed handshakes still count as connections"
        time.sleep(0.01)
    with _tls_client(triton.grpc_port, certificates, with_client_cert=False) as client:
        assert client.is_server_live() is True


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"grpc_use_ssl": True}, "needs grpc_server_cert and grpc_server_key"),
        (
            {"grpc_use_ssl_mutual": True, "grpc_server_cert": "s.crt", "grpc_server_key": "s.key"},
            "needs grpc_root_cert",
        ),
        ({"grpc_infer_response_compression_level": "maximum"}, "must be one of none, low, medium, high"),
        ({"grpc_keepalive_time": -1}, "grpc_keepalive_time must be >= 0"),
    ],
)
def test_invalid_grpc_options_are_refused(config: Dict[str, Any], message: str) -> None:
    with pytest.raises(PyTritonValidationError, match=message):
        resolve_options(TritonConfig(**config))


def test_unreadable_certificate_fails_the_start(tmp_path: pathlib.Path) -> None:
    config = TritonConfig(
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        grpc_use_ssl=True,
        grpc_server_cert=tmp_path / "missing.crt",
        grpc_server_key=tmp_path / "missing.key",
    )
    triton = Triton(config=config)
    try:
        with pytest.raises(PyTritonValidationError, match="missing"):
            triton.run()
    finally:
        triton.stop()


# --- compression -----------------------------------------------------------------------------------------------


class CountingProxy:
    """A TCP relay to a local port that counts the bytes flowing back to the client."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.bytes_to_client = 0
        self._lock = threading.Lock()
        self._sockets: List[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._sockets += [downstream, upstream]
            for source, sink, counted in ((downstream, upstream, False), (upstream, downstream, True)):
                thread = threading.Thread(target=self._pump, args=(source, sink, counted), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        try:
            while data := source.recv(65536):
                if counted:
                    with self._lock:
                        self.bytes_to_client += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        for sock in [self.listener, *self._sockets]:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked in accept() and recv()
            except OSError:
                pass
        for thread in self._threads:
            thread.join(5)
            assert not thread.is_alive()
        for sock in [self.listener, *self._sockets]:
            sock.close()


@pytest.mark.parametrize(("level", "compressed"), [("none", False), ("low", True), ("high", True)])
def test_response_compression_level(start_triton: Callable[..., Triton], level: str, compressed: bool) -> None:
    triton = start_triton(bind_zeros, grpc_infer_response_compression_level=level)
    proxy = CountingProxy(triton.grpc_port)
    try:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{proxy.port}") as client:
            output = _infer(client)
            assert client.is_server_live() is True
            assert client.get_model_metadata("zeros").name == "zeros"
    finally:
        proxy.close()
    assert output.shape == (OUTPUT_FLOATS,) and np.all(output == 2.0)
    raw_size = OUTPUT_FLOATS * 4
    if compressed:
        assert proxy.bytes_to_client < raw_size // 10
    else:
        assert proxy.bytes_to_client > raw_size


# --- keepalive, ports, addresses -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rpc", "message", "encoding"),
    [
        ("ModelInfer", _ZEROS_REQUEST, "gzip"),
        ("ModelStreamInfer", _ZEROS_REQUEST, "gzip"),
        ("ServerLive", b"", None),
        ("ModelMetadata", service_pb2.ModelMetadataRequest(name="zeros").SerializeToString(), None),
        ("ServerMetadata", b"", None),
    ],
)
def test_the_compression_level_compresses_infer_responses_alone(
    start_triton: Callable[..., Triton], rpc: str, message: bytes, encoding: Any
) -> None:
    # tritonserver sets grpc_infer_response_compression_level on its infer handlers alone: its other RPCs
    # answer uncompressed whatever the client accepts (2.51, probed); this server compressed every answer.
    triton = start_triton(bind_zeros, grpc_infer_response_compression_level="high")
    client = H2Client(triton.grpc_port)
    try:
        client.handshake()
        stream = client.start_call(
            message, path=f"/inference.GRPCInferenceService/{rpc}", grpc_accept_encoding="identity,gzip"
        )
        response = client.response(stream)
    finally:
        client.close()
    assert response.grpc_status == "0", response.trailers
    assert response.headers.get("grpc-encoding") == encoding
    assert {flag for flag, _ in response.messages()} == {0 if encoding is None else 1}


def test_keepalive_options_reach_the_server() -> None:
    config = TritonConfig(
        grpc_keepalive_time=1000,
        grpc_keepalive_timeout=500,
        grpc_keepalive_permit_without_calls=True,
        grpc_http2_max_pings_without_data=0,
        grpc_http2_min_recv_ping_interval_without_data=100,
        grpc_http2_max_ping_strikes=5,
    )
    options = resolve_options(config)
    assert options.grpc_keepalive == GrpcKeepalive(1000, 500, True, 0, 100, 5)
    assert options.grpc_compression_level == "none"


def test_triton_keepalive_defaults() -> None:
    assert resolve_options(TritonConfig()).grpc_keepalive == GrpcKeepalive(
        time_ms=7_200_000,
        timeout_ms=20_000,
        permit_without_calls=False,
        max_pings_without_data=2,
        min_recv_ping_interval_without_data_ms=300_000,
        max_ping_strikes=2,
    )


def test_server_with_keepalive_options_serves(start_triton: Callable[..., Triton]) -> None:
    triton = start_triton(
        bind_zeros, grpc_keepalive_time=10_000, grpc_keepalive_permit_without_calls=True, grpc_http2_max_ping_strikes=0
    )
    with grpcclient.InferenceServerClient(grpc_url(triton), keepalive_options=grpcclient.KeepAliveOptions()) as client:
        assert client.is_server_live() is True


def test_port_in_use_fails_the_start(start_triton: Callable[..., Triton]) -> None:
    first = start_triton(bind_zeros, grpc_address="127.0.0.1")
    assert first.grpc_port
    with pytest.raises(OSError, match="gRPC cannot listen"):
        start_triton(bind_zeros, grpc_address="127.0.0.1", grpc_port=first.grpc_port)
    with grpcclient.InferenceServerClient(grpc_url(first)) as client:
        assert client.is_server_live() is True


def test_grpc_disabled(start_triton: Callable[..., Triton]) -> None:
    triton = start_triton(bind_zeros, allow_grpc=False)
    assert triton.grpc_port is None


@pytest.mark.parametrize(
    ("address", "port", "expected"),
    [("0.0.0.0", 8001, "0.0.0.0:8001"), ("::", 0, "[::]:0"), ("[::1]", 5, "[::1]:5"), ("localhost", 1, "localhost:1")],
)
def test_bind_address(address: str, port: int, expected: str) -> None:
    assert bind_address(address, port) == expected


def test_ipv6_loopback(start_triton: Callable[..., Triton]) -> None:
    if not socket.has_ipv6:
        pytest.skip("this host has no IPv6")
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("this host cannot bind ::1")
    triton = start_triton(bind_zeros, grpc_address="::1")
    with grpcclient.InferenceServerClient(f"[::1]:{triton.grpc_port}") as client:
        assert client.is_server_live() is True


def test_the_wildcard_address_serves_ipv6_clients_too_as_tritons_grpc_port(start_triton: Callable[..., Triton]) -> None:
    # grpc's C-core binds 0.0.0.0 as a dual-stack [::]: tritonserver 2.51's gRPC port (not its HTTP port) answered
    # grpc://[::1]:PORT, where this one refused the connection
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("this host cannot bind ::1")
    triton = start_triton(bind_zeros, grpc_address="0.0.0.0")
    for host in (f"[::1]:{triton.grpc_port}", f"127.0.0.1:{triton.grpc_port}"):
        with grpcclient.InferenceServerClient(host) as client:
            assert client.is_server_live() is True, host


# --- two servers in one process ----------------------------------------------------------------------------------


def _bind_echo(triton: Triton) -> None:
    triton.bind(
        "echo",
        lambda requests: [{"OUT": request["IN"]} for request in requests],
        inputs=[Tensor(name="IN", dtype=np.float32, shape=(1,))],
        outputs=[Tensor(name="OUT", dtype=np.float32, shape=(1,))],
        config=ModelConfig(batching=False),
    )


def test_two_servers_in_one_process_log_no_errors(
    start_triton: Callable[..., Triton], caplog: pytest.LogCaptureFixture
) -> None:
    # Each server's loop owns its own connections: nothing one serves may be reported on the other.
    servers = [start_triton(_bind_echo), start_triton(_bind_echo)]
    failures: List[BaseException] = []

    def load(triton: Triton) -> None:
        try:
            with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
                infer_input = grpcclient.InferInput("IN", [1], "FP32")
                for value in range(300):
                    infer_input.set_data_from_numpy(np.array([value], dtype=np.float32))
                    assert client.infer("echo", [infer_input]).as_numpy("OUT")[0] == value
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            failures.append(error)

    with caplog.at_level("ERROR"):
        threads = [threading.Thread(target=load, args=(triton,)) for triton in servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert not failures
    assert [record.getMessage() for record in caplog.records if record.levelname == "ERROR"] == []


def test_a_status_message_too_long_for_grpc_clients_is_cut(start_triton: Callable[..., Triton]) -> None:
    """grpc's clients refuse trailers over 16 KiB ("metadata size exceeds hard limit"); the status gets through."""
    triton = start_triton(bind_zeros)
    infer_input = grpcclient.InferInput("IN", [1], "FP32")
    infer_input.set_data_from_numpy(np.array([2.0], dtype=np.float32))
    with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.infer("m" * 20_000, [infer_input])
    assert refused.value.status() == "StatusCode.NOT_FOUND"
    message = refused.value.message()
    assert message.startswith("Request for unknown model: 'mmm") and message.endswith("mmm...")
    assert len(message) == 4096
