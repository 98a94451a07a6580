"""Request bodies for the load generators, and their one-off verification with tritonclient.

Every workload sends one fixed request over and over. Before load, the bench checks twice that the
server answers it correctly: once with tritonclient (the real client), and once by sending the very
bytes wrk/h2load will send and decoding the reply (h2load counts a gRPC error as HTTP 200).
"""

from __future__ import annotations

import dataclasses
import json
import struct
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

GRPC_PATH = "/inference.GRPCInferenceService/ModelInfer"


@dataclasses.dataclass(frozen=True)
class Payload:
    """One request: the model, its input tensor and how it is encoded."""

    model: str
    protocol: str  # "json", "binary" (HTTP) or "grpc"
    shape: Tuple[int, int]
    outputs: Tuple[str, ...] = ("OUTPUT_1",)

    @property
    def array(self) -> np.ndarray:
        """The input tensor: exact small floats, so the echo compares bit for bit."""
        count = self.shape[0] * self.shape[1]
        return ((np.arange(count, dtype=np.float32) % 1024) * 0.25).reshape(self.shape)

    @property
    def tensor_bytes(self) -> int:
        """Size of the input tensor in bytes."""
        return int(self.array.nbytes)


def http_body(payload: Payload) -> Tuple[bytes, List[Tuple[str, str]]]:
    """The HTTP request body and its extra headers."""
    array = payload.array
    tensor: Dict[str, Any] = {"name": "INPUT_1", "shape": list(array.shape), "datatype": "FP32"}
    if payload.protocol == "json":
        tensor["data"] = array.ravel().tolist()
        doc = {"inputs": [tensor], "outputs": [{"name": name} for name in payload.outputs]}
        return json.dumps(doc, separators=(",", ":")).encode(), [("Content-Type", "application/json")]
    tensor["parameters"] = {"binary_data_size": array.nbytes}
    outputs = [{"name": name, "parameters": {"binary_data": True}} for name in payload.outputs]
    head = json.dumps({"inputs": [tensor], "outputs": outputs}, separators=(",", ":")).encode()
    headers = [("Content-Type", "application/octet-stream"), ("Inference-Header-Content-Length", str(len(head)))]
    return head + array.tobytes(), headers


def grpc_message(payload: Payload) -> bytes:
    """The serialized ModelInferRequest."""
    from tritonclient.grpc import service_pb2

    array = payload.array
    request = service_pb2.ModelInferRequest(model_name=payload.model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "INPUT_1", "FP32"
    tensor.shape.extend(array.shape)
    for name in payload.outputs:
        request.outputs.add().name = name
    request.raw_input_contents.append(array.tobytes())
    message: bytes = request.SerializeToString()
    return message


def grpc_frame(message: bytes) -> bytes:
    """gRPC length-prefixed framing: flag 0 (uncompressed), 4-byte big-endian length, message."""
    return struct.pack(">BI", 0, len(message)) + message


def verify_http(base_url: str, payload: Payload, use_tritonclient: bool = True) -> Optional[str]:
    """None when the server echoes the payload correctly over HTTP; else what went wrong."""
    expected = payload.array
    if use_tritonclient:
        problem = _verify_tritonclient_http(base_url, payload)
        if problem:
            return f"tritonclient: {problem}"
    body, headers = http_body(payload)
    request = urllib.request.Request(
        f"{base_url}/v2/models/{payload.model}/infer", data=body, headers=dict(headers), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw, header_len = response.read(), response.headers.get("Inference-Header-Content-Length")
    except urllib.error.HTTPError as error:
        return f"raw body: HTTP {error.code}: {error.read()[:300]!r}"
    except OSError as error:
        return f"raw body: {error}"
    try:
        got = _decode_http_output(raw, header_len)
    except (ValueError, KeyError, IndexError) as error:
        return f"raw body: undecodable response ({error}): {raw[:200]!r}"
    if got.shape != expected.shape or not np.array_equal(got, expected):
        return f"raw body: wrong output (shape {got.shape}, expected {expected.shape})"
    return None


def _decode_http_output(raw: bytes, header_len: Optional[str]) -> np.ndarray:
    """OUTPUT_1 of a KServe JSON or binary-extension response."""
    size = int(header_len) if header_len is not None else len(raw)
    doc = json.loads(raw[:size])
    offset = size
    for output in doc["outputs"]:
        shape = tuple(output["shape"])
        n = int(output.get("parameters", {}).get("binary_data_size", -1))
        if n >= 0:
            blob, offset = raw[offset : offset + n], offset + n
            if output["name"] == "OUTPUT_1":
                return np.frombuffer(blob, dtype=np.float32).reshape(shape)
        elif output["name"] == "OUTPUT_1":
            return np.asarray(output["data"], dtype=np.float32).reshape(shape)
    raise KeyError("OUTPUT_1 missing")


def _verify_tritonclient_http(base_url: str, payload: Payload) -> Optional[str]:
    """Check the echo with tritonclient.http."""
    import tritonclient.http as httpclient

    binary = payload.protocol == "binary"
    client = httpclient.InferenceServerClient(base_url.split("//", 1)[1], connection_timeout=30, network_timeout=30)
    try:
        tensor = httpclient.InferInput("INPUT_1", list(payload.shape), "FP32")
        tensor.set_data_from_numpy(payload.array, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in payload.outputs]
        result = client.infer(payload.model, [tensor], outputs=outputs)
        got = result.as_numpy("OUTPUT_1")
    except Exception as error:  # noqa: BLE001 - reported, the workload is skipped
        return str(error)[:300]
    finally:
        client.close()
    if got is None or not np.array_equal(got, payload.array):
        return "wrong output"
    return None


def verify_grpc(port: int, payload: Payload) -> Optional[str]:
    """None when the server echoes the payload correctly over gRPC (tritonclient, then the raw message)."""
    import grpc
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2

    options = [("grpc.max_receive_message_length", 64 * 2**20), ("grpc.max_send_message_length", 64 * 2**20)]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}", channel_args=options)
    try:
        tensor = grpcclient.InferInput("INPUT_1", list(payload.shape), "FP32")
        tensor.set_data_from_numpy(payload.array)
        outputs = [grpcclient.InferRequestedOutput(name) for name in payload.outputs]
        got = client.infer(payload.model, [tensor], outputs=outputs, client_timeout=30).as_numpy("OUTPUT_1")
    except Exception as error:  # noqa: BLE001
        return f"tritonclient: {str(error)[:300]}"
    finally:
        client.close()
    if got is None or not np.array_equal(got, payload.array):
        return "tritonclient: wrong output"
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        call = channel.unary_unary(GRPC_PATH, request_serializer=None, response_deserializer=None)
        try:
            raw = call(grpc_message(payload), timeout=30)
        except grpc.RpcError as error:
            return f"raw message: {error}"
    response = service_pb2.ModelInferResponse.FromString(raw)
    names = [output.name for output in response.outputs]
    if "OUTPUT_1" not in names:
        return f"raw message: OUTPUT_1 missing from {names}"
    index = names.index("OUTPUT_1")
    got = np.frombuffer(response.raw_output_contents[index], dtype=np.float32).reshape(payload.shape)
    if not np.array_equal(got, payload.array):
        return "raw message: wrong output"
    return None


def batching_counters(base_url: str) -> Optional[Tuple[int, int]]:
    """(calls, rows) so far of the `batching` model, read from its CALLS/ROWS outputs (one extra call)."""
    payload = Payload("batching", "json", (1, 16), outputs=("OUTPUT_1", "CALLS", "ROWS"))
    body, headers = http_body(payload)
    request = urllib.request.Request(
        f"{base_url}/v2/models/batching/infer", data=body, headers=dict(headers), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            doc = json.loads(response.read())
    except (OSError, ValueError):
        return None
    values = {output["name"]: output["data"] for output in doc.get("outputs", [])}
    try:
        return int(values["CALLS"][0]), int(values["ROWS"][0])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def model_stats(base_url: str, model: str, token: str) -> Optional[Tuple[int, int]]:
    """(inference_count, execution_count) from GET /v2/models/<m>/stats, None when unavailable."""
    request = urllib.request.Request(f"{base_url}/v2/models/{model}/stats", headers={"triton-access-token": token})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            doc = json.loads(response.read())
        stats = doc["model_stats"][0]
        return int(stats["inference_count"]), int(stats["execution_count"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
