"""Differential wire fuzzer: generated requests to tritonserver 2.51 (through nvidia-pytriton 0.7) and to this server.

Both run the same models (bench/wire_diff_models.py) with the access token `dfztoken`:

    BENCH_ACCESS_TOKEN=dfztoken /tmp/nvidia-pytriton/run python bench/wire_diff_models.py 23110 23111 23112 &
    BENCH_ACCESS_TOKEN=dfztoken python bench/wire_diff_models.py 18200 18201 18202 &
    python bench/wire_diff_fuzz.py --theirs 23110:23111 --ours 18200:18201 --seed 1 --count 5000 --out diffs.jsonl
    python bench/wire_diff_fuzz.py --clusters diffs.jsonl           # differences grouped, known ones counted apart
    python bench/wire_diff_fuzz.py --show 1:1234                     # one case's requests

Two servers of this project (frontends=1 against PYTRITON_FRONTENDS=3, say) compare with --both-ours: every case,
those that crash tritonserver too, goes to both.

Case i of seed s comes from random.Random(f"{s}:{i}") alone: valid requests to the models (HTTP infer JSON and
binary, gRPC ModelInfer / ModelStreamInfer with raw or typed contents), mutated 0-3 times (fields dropped or of
another type, shapes against data, datatypes, nested and ragged data, parameters of every type at every level,
binary_data_size and Inference-Header-Content-Length edges, outputs, classification, ids, Content-Type,
Content-Encoding, Accept-Encoding, URL variants, methods), and requests to the other endpoints (metadata, config,
ready, statistics, repository, shared memory, logging, trace, generate) with bad arguments. Each answer is
normalised (timing fields dropped, compressed bodies inflated, binary outputs split off) and the pairs that differ
are written to --out. Requests known to crash tritonserver 2.51 (shapes of 2**31 elements or more, classes of a
BYTES output or, over HTTP, of an output of 0 elements, a gRPC output named twice, a stream with an error after a
decoupled model's responses) go to this server alone. When tritonserver dies anyway the fuzzer exits 3 naming the
case (start it again, then go on with --start CASE+1); when this server dies, 4.
"""

from __future__ import annotations

import argparse
import base64
import copy
import gzip
import http.client
import json
import random
import re
import socket
import struct
import sys
import time
import zlib
from typing import Any, Dict, List, Optional, Tuple

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2, service_pb2_grpc

# ----------------------------------------------------------------------------------------------- models

MODELS: Dict[str, Dict[str, Any]] = {
    "identity": {"mbs": 8, "inputs": [("INPUT_1", "FP32", [-1])], "outputs": ["OUTPUT_1"], "optional": set()},
    "mixed": {
        "mbs": 0,
        "inputs": [("a", "INT32", [2]), ("b", "BYTES", [-1]), ("c", "BOOL", [-1])],
        "outputs": ["a_out", "b_out", "c_out"],
        "optional": {"b", "c"},
    },
    "half": {
        "mbs": 4,
        "inputs": [("X", "FP16", [2, -1]), ("Y", "UINT8", [3])],
        "outputs": ["XO", "YO", "S"],
        "optional": set(),
    },
    "text": {"mbs": 2, "inputs": [("T", "BYTES", [1])], "outputs": ["TO"], "optional": set()},
    "triple": {
        "mbs": 0,
        "inputs": [("k", "FP32", [-1]), ("a", "FP32", [-1]), ("b", "FP32", [-1])],
        "outputs": ["o"],
        "optional": set(),
    },
    "stream": {"mbs": 0, "inputs": [("INPUT_1", "FP32", [-1])], "outputs": ["OUTPUT_1"], "optional": set()},
}
NP = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": np.float32,
}
DATATYPES = [*list(NP), "BYTES"]


def concrete_shape(rng: random.Random, model: str, dims: List[int]) -> List[int]:
    shape = [d if d >= 0 else rng.randint(1, 3) for d in dims]
    if MODELS[model]["mbs"]:
        shape = [rng.randint(1, MODELS[model]["mbs"]), *shape]
    return shape


def values(rng: random.Random, datatype: str, count: int) -> List[Any]:
    if datatype == "BYTES":
        return [rng.choice(["", "ab", "héllo", "x" * rng.randint(0, 9), "\x00z"]) for _ in range(count)]
    if datatype == "BOOL":
        return [rng.random() < 0.5 for _ in range(count)]
    if datatype.startswith("FP") or datatype == "BF16":
        return [rng.choice([0.5, -1.25, 3.0, 100.0]) for _ in range(count)]
    if datatype.startswith("UINT"):
        return [rng.randint(0, 200) for _ in range(count)]
    return [rng.randint(-100, 100) for _ in range(count)]


def to_bytes(datatype: str, data: List[Any]) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in data)
    if datatype == "BF16":
        return b"".join(
            np.array(data, np.float32).view(np.uint32).__rshift__(16).astype(np.uint16).tobytes() for _ in [0]
        )
    return np.array(data, NP[datatype]).tobytes()


def nest(flat: List[Any], shape: List[int]) -> Any:
    if len(shape) <= 1:
        return list(flat)
    step = len(flat) // shape[0] if shape[0] else 0
    return [nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def base_tensors(rng: random.Random, model: str) -> List[Dict[str, Any]]:
    spec = MODELS[model]
    tensors = []
    for name, datatype, dims in spec["inputs"]:
        if name in spec["optional"] and rng.random() < 0.4:
            continue
        shape = concrete_shape(rng, model, dims)
        count = int(np.prod(shape)) if shape else 1
        tensors.append({"name": name, "datatype": datatype, "shape": shape, "data": values(rng, datatype, count)})
    return tensors


# ----------------------------------------------------------------------------------------------- values for mutation

WEIRD = [None, True, False, 0, -1, 1, 2**63, 1.5, "", "x", "1", [], [1], {}, {"a": 1}, "INPUT_1", -0.0]
PARAM_VALUES = [True, False, 0, 1, -5, 2**40, 2**64, 1.5, -0.5, "", "s", "true", None, [], {}, [1, 2], {"k": "v"}]
PARAM_KEYS = [
    "priority",
    "timeout",
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "binary_data_output",
    "binary_data",
    "binary_data_size",
    "classification",
    "headers",
    "triton_x",
    "triton_enable_empty_final_response",
    "shared_memory_region",
    "shared_memory_byte_size",
    "shared_memory_offset",
    "custom",
    "max_tokens",
    "",
]


def rand_param(rng: random.Random) -> Tuple[str, Any]:
    return rng.choice(PARAM_KEYS), rng.choice(PARAM_VALUES)


# ----------------------------------------------------------------------------------------------- HTTP infer


def http_infer_case(rng: random.Random) -> List[Dict[str, Any]]:
    model = rng.choice(list(MODELS))
    tensors = base_tensors(rng, model)
    doc: Dict[str, Any] = {"inputs": []}
    if rng.random() < 0.3:
        doc["id"] = rng.choice(["r1", "", 7, "ü" * 3])
    binary_parts: List[bytes] = []
    use_binary = rng.random() < 0.5
    for t in tensors:
        entry: Dict[str, Any] = {"name": t["name"], "shape": t["shape"], "datatype": t["datatype"]}
        if t["datatype"] == "FP16" or (use_binary and rng.random() < 0.7):
            raw = to_bytes(t["datatype"], t["data"])
            entry["parameters"] = {"binary_data_size": len(raw)}
            binary_parts.append(raw)
        else:
            entry["data"] = t["data"] if rng.random() < 0.6 else nest(t["data"], t["shape"])
        doc["inputs"].append(entry)
    if rng.random() < 0.4:
        outs = rng.sample(MODELS[model]["outputs"], rng.randint(1, len(MODELS[model]["outputs"])))
        doc["outputs"] = [{"name": o} for o in outs]
        for o in doc["outputs"]:
            if rng.random() < 0.4:
                o["parameters"] = {"binary_data": rng.random() < 0.5}
    if rng.random() < 0.2:
        doc["parameters"] = {"binary_data_output": rng.random() < 0.5}
    headers: Dict[str, str] = {}
    path = f"/v2/models/{model}/infer"
    method = "POST"
    raw_doc: Optional[bytes] = None
    n_mut = rng.choice([0, 1, 1, 1, 2, 2, 3])
    hdr_len_mut: Optional[str] = None
    encoding: Optional[str] = None
    for _ in range(n_mut):
        m = rng.randrange(33)
        inputs = doc.get("inputs") if isinstance(doc.get("inputs"), list) else []
        dicts = [x for x in inputs if isinstance(x, dict)]
        tgt = rng.choice(dicts) if dicts else None
        if m == 15 and not dicts:
            continue
        if m == 0 and tgt is not None:  # drop an input field
            tgt.pop(rng.choice(["name", "shape", "datatype", "data", "parameters"]), None)
        elif m == 1 and tgt is not None:  # field type change
            tgt[rng.choice(["name", "shape", "datatype", "data", "parameters"])] = rng.choice(WEIRD)
        elif m == 2 and tgt is not None and isinstance(tgt.get("shape"), list) and tgt["shape"]:
            i = rng.randrange(len(tgt["shape"]))
            tgt["shape"][i] = rng.choice(
                [
                    0,
                    -1,
                    -2,
                    (tgt["shape"][i] + 1 if type(tgt["shape"][i]) is int else 1),
                    2**31,
                    2**63 - 1,
                    1.0,
                    "2",
                    None,
                ]
            )
        elif m == 3 and tgt is not None and isinstance(tgt.get("shape"), list):
            rng.choice(
                [lambda s: s.append(1), lambda s: s.pop() if s else None, lambda s: s.insert(0, 1), lambda s: s.clear()]
            )(tgt["shape"])
        elif m == 4 and tgt is not None and isinstance(tgt.get("data"), list):
            d = tgt["data"]
            action = rng.randrange(3)
            if action == 0:
                d.append(d[0] if d else 1)
            elif action == 1 and d:
                d.pop()
            elif action == 2:
                d.clear()
        elif m == 5 and tgt is not None:
            tgt["datatype"] = rng.choice([*DATATYPES, "fp32", "TYPE_FP32", "STRING", "FP8", ""])
        elif m == 6 and tgt is not None and "data" in tgt:  # element type changes
            flat = tgt["data"] if isinstance(tgt["data"], list) else []
            if flat:
                flat[rng.randrange(len(flat))] = rng.choice(
                    [None, "s", 1.5, True, [1], {"a": 1}, 2**70, -1, 1e300, "NaN"]
                )
        elif m == 7 and tgt is not None and isinstance(tgt.get("data"), list):  # ragged nesting
            tgt["data"] = [tgt["data"][:1], tgt["data"][1:]]
        elif m == 8:  # parameters
            where = rng.choice(["req", "input", "output"])
            k, v = rand_param(rng)
            if where == "req":
                if not isinstance(doc.get("parameters"), dict):
                    doc["parameters"] = {}
                doc["parameters"][k] = v
            elif where == "input" and tgt is not None:
                if not isinstance(tgt.get("parameters"), dict):
                    tgt["parameters"] = {}
                tgt["parameters"][k] = v
            elif isinstance(doc.get("outputs"), list) and doc["outputs"] and isinstance(doc["outputs"][0], dict):
                doc["outputs"][0].setdefault("parameters", {})
                if isinstance(doc["outputs"][0]["parameters"], dict):
                    doc["outputs"][0]["parameters"][k] = v
        elif m == 9 and tgt is not None:  # binary_data_size games
            if not isinstance(tgt.get("parameters"), dict):
                tgt["parameters"] = {}
            tgt["parameters"]["binary_data_size"] = rng.choice([0, 1, -1, 3, 2**40, "4", 4.0, None, True])
        elif m == 10:  # outputs list
            doc["outputs"] = rng.choice(
                [
                    [],
                    [{"name": "nope"}],
                    [{"name": MODELS[model]["outputs"][0]}] * 2,
                    [{}],
                    [{"name": 5}],
                    "OUTPUT_1",
                    [MODELS[model]["outputs"][0]],
                    None,
                    [{"name": MODELS[model]["outputs"][0], "extra": 1}],
                ]
            )
        elif m == 11:  # classification
            o = MODELS[model]["outputs"][0]
            doc["outputs"] = [
                {"name": o, "parameters": {"classification": rng.choice([1, 2, 0, -1, 100, "2", True, 1.5])}}
            ]
            if rng.random() < 0.5:
                doc["outputs"][0]["parameters"]["binary_data"] = rng.random() < 0.5
        elif m == 12:
            doc["id"] = rng.choice([*WEIRD, "a" * 300])
        elif m == 13:
            doc[rng.choice(["extra", "model_name", "model_version", "outputs", "parameters", "inputs"])] = rng.choice(
                WEIRD
            )
        elif m == 14 and tgt is not None:
            tgt[rng.choice(["extra", "contents", "data_type"])] = rng.choice(WEIRD)
        elif m == 15 and inputs:  # duplicate / unknown / missing input
            act = rng.randrange(3)
            if act == 0:
                inputs.append(copy.deepcopy(dicts[0]))
            elif act == 1:
                dicts[0]["name"] = rng.choice(["nope", "input_1", "OUTPUT_1", "a_out"])
            else:
                inputs.pop(0)
        elif m == 16:
            hdr_len_mut = rng.choice(["+1", "-1", "0", "-5", "abc", "huge", "absent", " 12", "1e2", "present"])
        elif m == 17:
            headers["Content-Type"] = rng.choice(
                [
                    "text/plain",
                    "application/octet-stream",
                    "application/json; charset=utf-8",
                    "multipart/form-data",
                    "",
                    "application/x-www-form-urlencoded",
                ]
            )
        elif m == 18:
            encoding = rng.choice(
                ["gzip", "deflate", "br", "identity", "gzip, deflate", "GZIP", "bogus-gzip", "bogus-deflate"]
            )
        elif m == 19:
            headers["Accept-Encoding"] = rng.choice(
                ["gzip", "deflate", "br", "identity", "*", "gzip;q=0", "deflate, gzip", "GZIP", "x"]
            )
        elif m == 20:
            path = rng.choice(
                [
                    f"/v2/models/{model}/versions/1/infer",
                    f"/v2/models/{model}/versions/2/infer",
                    f"/v2/models/{model}/versions/abc/infer",
                    f"/v2/models/{model}/versions//infer",
                    f"/v2/models/{model}/infer/",
                    f"/v2/models/{model}/infer?x=1",
                    f"/v2/models/{model}//infer",
                    "/v2/models/%69dentity/infer",
                    f"/v2/models/{model}%2Finfer",
                    f"/v2//models/{model}/infer",
                    f"/v2/models/{model}/versions/-1/infer",
                    f"/v2/models/{model}/versions/01/infer",
                    f"/v2/models/{model.upper()}/infer",
                    "/v2/models//infer",
                    f"/v2/models/{model}/infer#f",
                    f"/v2/models/{model}/versions/0/infer",
                    f"/v2/models/{model}/versions/1/infer?",
                ]
            )
        elif m == 21:
            method = rng.choice(["GET", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
        elif m == 22:  # raw body damage
            raw_doc = rng.choice(
                [
                    b"",
                    b"{",
                    b"null",
                    b"[]",
                    b"{}",
                    b'"x"',
                    b"1",
                    json.dumps(doc).encode()[:-1],
                    json.dumps(doc).encode() + b"x",
                    b"\xff\xfe",
                    json.dumps(doc).encode() + b"  ",
                    b'{"inputs":[],"inputs":[]}',
                    json.dumps(doc, indent=2).encode(),
                ]
            )
        elif m == 23 and binary_parts:
            i = rng.randrange(len(binary_parts))
            binary_parts[i] = rng.choice([binary_parts[i][:-1], binary_parts[i] + b"\0", b"", binary_parts[i] * 2])
        elif (
            m == 24
            and tgt is not None
            and tgt.get("datatype") == "BYTES"
            and isinstance(tgt.get("data"), list)
            and tgt["data"]
        ):
            tgt["data"][0] = rng.choice([1, True, None, {"b64": "eA=="}, ["x"], "\ud800" if False else "\u2603"])
        elif m == 25:  # binary_data_output with listed outputs
            doc.setdefault("parameters", {})
            if isinstance(doc["parameters"], dict):
                doc["parameters"]["binary_data_output"] = rng.choice([True, False, 1, "true"])
        elif m == 26 and tgt is not None:  # BF16 / FP16 in JSON
            tgt["datatype"] = rng.choice(["BF16", "FP16"])
            if "data" not in tgt:
                dims = [s for s in tgt.get("shape", [1]) if isinstance(s, int) and s > 0]
                count = int(np.prod(dims, dtype=object)) if dims else 1
                tgt["data"] = [1.0] * min(count, 4096)  # a huge shape (mutated) gets a short list, not gigabytes
                if isinstance(tgt.get("parameters"), dict):
                    tgt["parameters"].pop("binary_data_size", None)
        elif m == 27 and tgt is not None:  # BOOL variants
            if isinstance(tgt.get("data"), list) and tgt["data"]:
                tgt["data"] = [rng.choice([0, 1, "true", True, False, 2]) for _ in tgt["data"]]
        elif m == 28:
            doc["inputs"] = rng.choice([[], None, {}, "x", [None], [1]])
        elif m == 29:
            doc.pop(rng.choice(["inputs", "outputs", "id", "parameters"]), None)
        elif m == 30 and tgt is not None and isinstance(tgt.get("data"), list) and tgt["data"]:
            tgt["data"][0] = rng.choice(
                [
                    300,
                    -129,
                    70000,
                    2**31,
                    2**32,
                    -(2**63) - 1,
                    2**64,
                    1e39,
                    -1e39,
                    1.5,
                    "1",
                    0.0,
                    "NaN",
                    "Infinity",
                    "-inf",
                    1e-46,
                    True,
                ]
            )
        elif m == 31:
            doc.setdefault("parameters", {})
            if isinstance(doc["parameters"], dict):
                doc["parameters"][
                    rng.choice(["sequence_id", "sequence_start", "sequence_end", "priority", "timeout"])
                ] = rng.choice([0, 1, 5, 2**40, "abc", True, -3, 1.0])
        elif m == 32:
            o = rng.choice(MODELS[model]["outputs"])
            if o not in ("TO", "b_out", "S"):
                doc["outputs"] = [
                    {
                        "name": o,
                        "parameters": {"classification": rng.choice([1, 2, 3, 10]), "binary_data": rng.random() < 0.5},
                    }
                ]
    body_json = raw_doc if raw_doc is not None else json.dumps(doc).encode()
    body = body_json + b"".join(binary_parts)
    if binary_parts or hdr_len_mut == "present":
        n = len(body_json)
        hl = {
            None: n,
            "present": n,
            "+1": n + 1,
            "-1": n - 1,
            "0": 0,
            "-5": -5,
            "abc": "abc",
            "huge": 2**40,
            "absent": None,
            " 12": f" {n}",
            "1e2": "1e2",
        }[hdr_len_mut]
        if hl is not None:
            headers["Inference-Header-Content-Length"] = str(hl)
    elif hdr_len_mut and hdr_len_mut != "absent":
        headers["Inference-Header-Content-Length"] = {
            "+1": str(len(body) + 1),
            "-1": str(len(body) - 1),
            "0": "0",
            "-5": "-5",
            "abc": "abc",
            "huge": str(2**40),
            " 12": " 12",
            "1e2": "1e2",
        }[hdr_len_mut]
    if encoding:
        if encoding in ("gzip", "GZIP"):
            body = gzip.compress(body)
        elif encoding == "deflate":
            body = zlib.compress(body)
        elif encoding == "gzip, deflate":
            body = gzip.compress(zlib.compress(body))
        headers["Content-Encoding"] = {"bogus-gzip": "gzip", "bogus-deflate": "deflate"}.get(encoding, encoding)
    return [{"proto": "http", "method": method, "path": path, "headers": headers, "body": body}]


# ----------------------------------------------------------------------------------------------- HTTP other endpoints

SHM_KEYS = ["/dfz_missing", "dfz_nokey", "", "/dfz_seg"]  # /dfz_seg: 64 bytes the fuzzer creates


def http_other_case(rng: random.Random) -> List[Dict[str, Any]]:
    model = rng.choice([*list(MODELS), "nope", "IDENTITY", "%69dentity", ""])
    version = rng.choice(["", "/versions/1", "/versions/2", "/versions/x", "/versions/", "/versions/-1"])
    kind = rng.randrange(12)
    reqs: List[Dict[str, Any]] = []

    def req(method: str, path: str, body: Any = None, headers: Optional[Dict[str, str]] = None) -> None:
        if isinstance(body, (dict, list)) or (body is None and method == "POST" and rng.random() < 0.5):
            body = json.dumps(body if body is not None else {}).encode()
        reqs.append({"proto": "http", "method": method, "path": path, "headers": headers or {}, "body": body or b""})

    suffix = rng.choice(["", "/", "?q=1"])
    if kind == 0:
        req(rng.choice(["GET", "GET", "POST", "PUT"]), f"/v2/models/{model}{version}{suffix}")
    elif kind == 1:
        req(rng.choice(["GET", "GET", "POST"]), f"/v2/models/{model}{version}/config{suffix}")
    elif kind == 2:
        req(rng.choice(["GET", "GET", "POST"]), f"/v2/models/{model}{version}/ready{suffix}")
    elif kind == 3:
        req(
            rng.choice(["GET", "GET", "POST"]),
            rng.choice([f"/v2/models/{model}{version}/stats{suffix}", "/v2/models/stats", "/v2/models//stats"]),
        )
    elif kind == 4:
        body = rng.choice([None, {}, {"ready": True}, {"ready": "x"}, {"ready": False}, [], b"{", b"", {"x": 1}])
        req("POST", rng.choice(["/v2/repository/index", "/v2/repository/index/", "/v2/repository/index?x"]), body)
    elif kind == 5:
        name = rng.choice(["nope", "", "a/b", "%20"])
        op = rng.choice(["load", "unload"])
        body = rng.choice(
            [
                None,
                {},
                {"parameters": {}},
                {"parameters": {"config": "{"}},
                {"parameters": {"unload_dependents": "x"}},
                {"parameters": {"config": 5}},
                b"{",
                {"parameters": []},
                {"parameters": {"file:1/model.py": "eA=="}},
            ]
        )
        req("POST", f"/v2/repository/models/{name}/{op}", body)
    elif kind in (6, 7):
        region = rng.choice(["r1", "", "r/x", "dfz"])
        kind_ = rng.choice(["systemsharedmemory", "cudasharedmemory"])
        op = rng.randrange(4)
        if op == 0:
            body = {
                "key": rng.choice(SHM_KEYS),
                "offset": rng.choice([0, -1, 10, "0", None, 2**64]),
                "byte_size": rng.choice([0, 16, -1, 2**40, "16", None, 1.5]),
            }
            if kind_ == "cudasharedmemory":
                body = {
                    "raw_handle": {"b64": rng.choice(["", "eA==", "!!"])},
                    "device_id": rng.choice([0, -1, 9, "0"]),
                    "byte_size": body["byte_size"],
                }
            for k in list(body):
                if rng.random() < 0.15:
                    body.pop(k)
            req("POST", f"/v2/{kind_}/region/{region}/register", rng.choice([body, body, b"{", b"", [], {"x": 1}]))
        elif op == 1:
            req(rng.choice(["GET", "POST"]), rng.choice([f"/v2/{kind_}/status", f"/v2/{kind_}/region/{region}/status"]))
        elif op == 2:
            req("POST", rng.choice([f"/v2/{kind_}/unregister", f"/v2/{kind_}/region/{region}/unregister"]))
        else:  # valid system register -> status -> infer from shm -> unregister
            req("POST", "/v2/systemsharedmemory/region/dfz/register", {"key": "/dfz_seg", "offset": 0, "byte_size": 64})
            req("GET", "/v2/systemsharedmemory/region/dfz/status")
            inp = {
                "name": "INPUT_1",
                "shape": [1, rng.choice([2, 4, 20])],
                "datatype": "FP32",
                "parameters": {
                    "shared_memory_region": rng.choice(["dfz", "nope"]),
                    "shared_memory_byte_size": rng.choice([16, 8, 100, -1, "16"]),
                    "shared_memory_offset": rng.choice([0, 4, 64, -4]),
                },
            }
            for k in list(inp["parameters"]):
                if rng.random() < 0.1:
                    inp["parameters"].pop(k)
            out: Dict[str, Any] = {"name": "OUTPUT_1"}
            if rng.random() < 0.5:
                out["parameters"] = {
                    "shared_memory_region": "dfz",
                    "shared_memory_byte_size": rng.choice([16, 4, 64]),
                    "shared_memory_offset": rng.choice([0, 32, 60]),
                }
            req("POST", "/v2/models/identity/infer", {"inputs": [inp], "outputs": [out]})
            req("POST", "/v2/systemsharedmemory/region/dfz/unregister")
    elif kind == 8:
        req(
            rng.choice(["GET", "POST", "DELETE"]),
            rng.choice(
                [
                    "/v2",
                    "/v2/",
                    "/v2/health/live",
                    "/v2/health/ready",
                    "/v2/health",
                    "/v2/health/live/",
                    "/v2/models",
                    "/v2/models/",
                    "/",
                    "/v1/models/identity",
                    "/v2/health/ready?x=1",
                ]
            ),
        )
    elif kind == 9:
        req("GET", rng.choice(["/v2/logging", "/v2/trace/setting", f"/v2/models/{model}/trace/setting"]))
    elif kind == 10:
        req(
            "POST",
            rng.choice(["/v2/logging", "/v2/trace/setting"]),
            rng.choice(
                [
                    b"{",
                    [],
                    {"log_verbose_level": "x"},
                    {"trace_level": 5},
                    {"log_info": "yes"},
                    {"nope": 1},
                    {"trace_rate": "x"},
                    {"log_format": "bogus"},
                    {"trace_level": ["BOGUS"]},
                ]
            ),
        )
    else:
        req(
            rng.choice(["POST", "GET"]),
            f"/v2/models/{model}{version}/{rng.choice(['generate', 'generate_stream'])}",
            rng.choice(
                [
                    {"INPUT_1": [1.0]},
                    {"a": [1, 2]},
                    {},
                    b"{",
                    {"INPUT_1": "x"},
                    {"T": "hi"},
                    {"X": [1.0]},
                    {"parameters": {"x": 1}},
                    {"a": [1, 2], "b": ["x"], "c": [True]},
                ]
            ),
        )
    return reqs


# ----------------------------------------------------------------------------------------------- gRPC


def set_param(p: Any, value: Any, rng: random.Random) -> None:
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        if value >= 0 and rng.random() < 0.3 and "uint64_param" in p.DESCRIPTOR.fields_by_name:
            p.uint64_param = min(value, 2**64 - 1)
        else:
            p.int64_param = max(min(value, 2**63 - 1), -(2**63))
    elif isinstance(value, float):
        if "double_param" in p.DESCRIPTOR.fields_by_name:
            p.double_param = value
    elif isinstance(value, str):
        p.string_param = value
    # else: leave empty oneof


CONTENT_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def grpc_infer_case(rng: random.Random) -> List[Dict[str, Any]]:
    model = rng.choice(list(MODELS))
    tensors = base_tensors(rng, model)
    msg = service_pb2.ModelInferRequest(model_name=model)
    use_contents = rng.random() < 0.3
    for t in tensors:
        inp = msg.inputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        if use_contents and t["datatype"] in CONTENT_FIELD:
            vals = [s.encode() for s in t["data"]] if t["datatype"] == "BYTES" else t["data"]
            getattr(inp.contents, CONTENT_FIELD[t["datatype"]]).extend(vals)
        else:
            msg.raw_input_contents.append(to_bytes(t["datatype"], t["data"]))
    if rng.random() < 0.4:
        for o in rng.sample(MODELS[model]["outputs"], rng.randint(1, len(MODELS[model]["outputs"]))):
            msg.outputs.add(name=o)
    if rng.random() < 0.3:
        msg.id = rng.choice(["r1", "", "ü", "x" * 200])
    rpc = "ModelInfer" if model != "stream" or rng.random() < 0.3 else "ModelStreamInfer"
    if rng.random() < 0.1:
        rpc = "ModelStreamInfer"
    for _ in range(rng.choice([0, 1, 1, 1, 2, 2, 3])):
        m = rng.randrange(16)
        tgt = rng.choice(msg.inputs) if msg.inputs else None
        if m == 0:  # raw count mismatch
            if msg.raw_input_contents and rng.random() < 0.5:
                msg.raw_input_contents.pop()
            else:
                msg.raw_input_contents.append(rng.choice([b"", b"\0\0\0\0", b"\0" * 8]))
        elif m == 1 and tgt is not None:  # both raw and contents
            tgt.contents.int_contents.append(1)
        elif m == 2 and tgt is not None:  # wrong typed contents
            getattr(tgt.contents, rng.choice(list(set(CONTENT_FIELD.values())))).extend(
                [b"x"] if rng.random() < 0 else []
            )
            field = rng.choice(list(set(CONTENT_FIELD.values())))
            vals = {
                "bool_contents": [True],
                "bytes_contents": [b"x"],
                "fp32_contents": [1.0],
                "fp64_contents": [1.0],
            }.get(field, [1])
            getattr(tgt.contents, field).extend(vals)
        elif m == 3:  # parameters of each oneof kind
            k, v = rand_param(rng)
            where = rng.choice(["req", "input", "output"])
            if where == "req":
                set_param(msg.parameters[k], v, rng)
            elif where == "input" and tgt is not None:
                set_param(tgt.parameters[k], v, rng)
            elif msg.outputs:
                set_param(msg.outputs[0].parameters[k], v, rng)
        elif m == 4 and tgt is not None:
            del tgt.shape[:]
            tgt.shape.extend(rng.choice([[], [0], [1], [-1], [1, 2, 3], [2**62], [9, 2], [1, 0], [-5, 2]]))
        elif m == 5 and tgt is not None:
            tgt.datatype = rng.choice([*DATATYPES, "", "fp32", "TYPE_FP32"])
        elif m == 6:
            msg.outputs.add(name=rng.choice(["nope", "", MODELS[model]["outputs"][0]]))
        elif m == 7:
            o = msg.outputs.add(name=MODELS[model]["outputs"][0])
            set_param(o.parameters["classification"], rng.choice([1, 2, 0, -1, "2", True, 1.5]), rng)
        elif m == 8:
            msg.model_version = rng.choice(["1", "2", "x", "-1", "01", "0"])
        elif m == 9:
            msg.model_name = rng.choice(["nope", "", "IDENTITY", model + " "])
        elif m == 10 and tgt is not None:
            tgt.name = rng.choice(["nope", "", "OUTPUT_1"])
        elif m == 11 and len(msg.inputs):
            n = msg.inputs.add()
            n.CopyFrom(msg.inputs[0])
        elif m == 12 and len(msg.inputs):
            del msg.inputs[0]
        elif m == 13 and msg.raw_input_contents:
            i = rng.randrange(len(msg.raw_input_contents))
            msg.raw_input_contents[i] = rng.choice(
                [msg.raw_input_contents[i][:-1], msg.raw_input_contents[i] + b"\0", b""]
            )
        elif m == 14:
            set_param(msg.parameters["binary_data_output"], True, rng)
        elif m == 15 and tgt is not None:
            set_param(tgt.parameters["shared_memory_region"], rng.choice(["nope", "dfz"]), rng)
            if rng.random() < 0.5:
                set_param(tgt.parameters["shared_memory_byte_size"], rng.choice([4, 16, -1]), rng)
    if rpc == "ModelStreamInfer" and rng.random() < 0.5:
        set_param(msg.parameters["triton_enable_empty_final_response"], True, rng)
    case = [{"proto": "grpc", "rpc": rpc, "msg": msg}]
    if rpc == "ModelStreamInfer" and rng.random() < 0.4:  # a second, valid request on the same stream
        other = service_pb2.ModelInferRequest(model_name=rng.choice(list(MODELS)), id="second")
        for t in base_tensors(rng, other.model_name):
            other.inputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
            other.raw_input_contents.append(to_bytes(t["datatype"], t["data"]))
        case[0]["more"] = [other]
    return case


def grpc_other_case(rng: random.Random) -> List[Dict[str, Any]]:
    name = rng.choice([*list(MODELS), "nope", "", "IDENTITY"])
    version = rng.choice(["", "1", "2", "x", "-1"])
    k = rng.randrange(10)
    sp = service_pb2
    if k == 0:
        return [{"proto": "grpc", "rpc": "ModelMetadata", "msg": sp.ModelMetadataRequest(name=name, version=version)}]
    if k == 1:
        return [{"proto": "grpc", "rpc": "ModelConfig", "msg": sp.ModelConfigRequest(name=name, version=version)}]
    if k == 2:
        return [{"proto": "grpc", "rpc": "ModelReady", "msg": sp.ModelReadyRequest(name=name, version=version)}]
    if k == 3:
        return [
            {
                "proto": "grpc",
                "rpc": "ModelStatistics",
                "msg": sp.ModelStatisticsRequest(name=rng.choice([name, ""]), version=version),
            }
        ]
    if k == 4:
        return [
            {
                "proto": "grpc",
                "rpc": "RepositoryIndex",
                "msg": sp.RepositoryIndexRequest(repository_name=rng.choice(["", "x"]), ready=rng.random() < 0.5),
            }
        ]
    if k == 5:
        rpc = rng.choice(["RepositoryModelLoad", "RepositoryModelUnload"])
        m = getattr(sp, rpc + "Request")(
            model_name=rng.choice(["nope", "", "a/b"]), repository_name=rng.choice(["", "x"])
        )
        if rng.random() < 0.5:
            set_param(
                m.parameters[rng.choice(["config", "unload_dependents", "file:1/model.py", "x"])],
                rng.choice(["{", 1, True, "", "e30="]),
                rng,
            )
        return [{"proto": "grpc", "rpc": rpc, "msg": m}]
    if k in (6, 7):
        op = rng.randrange(4)
        if op == 0:
            m = sp.SystemSharedMemoryRegisterRequest(
                name=rng.choice(["r1", "", "dfz"]),
                key=rng.choice(SHM_KEYS),
                offset=rng.choice([0, 10, 2**63]),
                byte_size=rng.choice([0, 16, 2**40]),
            )
            return [{"proto": "grpc", "rpc": "SystemSharedMemoryRegister", "msg": m}]
        if op == 1:
            return [
                {
                    "proto": "grpc",
                    "rpc": "SystemSharedMemoryStatus",
                    "msg": sp.SystemSharedMemoryStatusRequest(name=rng.choice(["", "r1", "dfz"])),
                }
            ]
        if op == 2:
            return [
                {
                    "proto": "grpc",
                    "rpc": "SystemSharedMemoryUnregister",
                    "msg": sp.SystemSharedMemoryUnregisterRequest(name=rng.choice(["", "r1", "dfz"])),
                }
            ]
        rpc = rng.choice(["CudaSharedMemoryRegister", "CudaSharedMemoryStatus", "CudaSharedMemoryUnregister"])
        m = getattr(sp, rpc + "Request")(name=rng.choice(["", "r1"]))
        if rpc == "CudaSharedMemoryRegister":
            m.raw_handle = rng.choice([b"", b"x" * 64])
            m.device_id = rng.choice([0, 3, -1])
            m.byte_size = rng.choice([0, 16])
        return [{"proto": "grpc", "rpc": rpc, "msg": m}]
    if k == 8:
        return [
            {
                "proto": "grpc",
                "rpc": rng.choice(["ServerLive", "ServerReady", "ServerMetadata"]),
                "msg": getattr(sp, rng.choice(["ServerLive", "ServerReady", "ServerMetadata"]) + "Request")(),
            }
        ]
    return [
        {
            "proto": "grpc",
            "rpc": rng.choice(["LogSettings", "TraceSetting"]),
            "msg": (sp.LogSettingsRequest() if rng.random() < 0.5 else sp.TraceSettingRequest(model_name=name)),
        }
    ]


def make_case(seed: int, i: int) -> List[Dict[str, Any]]:
    rng = random.Random(f"{seed}:{i}")
    r = rng.random()
    auth = rng.random() < 0.95
    if r < 0.45:
        case = http_infer_case(rng)
    elif r < 0.6:
        case = http_other_case(rng)
    elif r < 0.9:
        case = grpc_infer_case(rng)
    else:
        case = grpc_other_case(rng)
    for req in case:
        req["auth"] = auth
    return case


# ----------------------------------------------------------------------------------------------- sending

TIMING_KEYS = {
    "ns",
    "last_inference",
    "timestamp",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "success",
    "fail",
    "execution_count",
    "inference_count",
    "batch_stats",
    "cache_hit",
    "cache_miss",
    "memory_usage",
    "response_stats",
    "lastInference",
    "inferenceCount",
    "executionCount",
    "batchStats",
    "inferenceStats",
    "inference_stats",
    "responseStats",
}


def strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: strip(v) for k, v in obj.items() if k not in TIMING_KEYS}
    if isinstance(obj, list):
        return [strip(v) for v in obj]
    return obj


class Http:
    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: Optional[http.client.HTTPConnection] = None

    def send(self, r: Dict[str, Any]) -> Dict[str, Any]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
            try:
                self.conn.putrequest(r["method"], r["path"], skip_accept_encoding=True)
                body = r["body"] or b""
                if r.get("auth"):
                    self.conn.putheader("triton-access-token", "dfztoken")
                for k, v in r["headers"].items():
                    self.conn.putheader(k, v)
                if body or r["method"] in ("POST", "PUT", "PATCH"):
                    self.conn.putheader("Content-Length", str(len(body)))
                self.conn.endheaders(body)
                resp = self.conn.getresponse()
                data = resp.read() if r["method"] != "HEAD" else b""
                hdrs = {k.lower(): v for k, v in resp.getheaders()}
                if resp.will_close:
                    self.conn.close()
                    self.conn = None
                return normalize_http(resp.status, hdrs, data)
            except socket.timeout:
                self.conn.close()
                self.conn = None
                return {"status": "TIMEOUT"}
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                self.conn.close()
                self.conn = None
                if attempt:
                    return {"status": "CONNERR", "err": type(e).__name__}
        return {"status": "CONNERR"}


def normalize_http(status: int, hdrs: Dict[str, str], data: bytes) -> Dict[str, Any]:
    out: Dict[str, Any] = {"status": status}
    enc = hdrs.get("content-encoding")
    out["enc"] = enc
    try:
        if enc == "gzip":
            data = gzip.decompress(data)
        elif enc == "deflate":
            data = zlib.decompress(data)
    except (OSError, EOFError, zlib.error):
        out["enc_err"] = True
    hl = hdrs.get("inference-header-content-length")
    tail = b""
    if hl is not None and hl.isdigit():
        data, tail = data[: int(hl)], data[int(hl) :]
        out["binary_tail"] = base64.b64encode(tail).decode()
    out["ctype"] = (hdrs.get("content-type") or "").split(";")[0]
    try:
        doc = json.loads(data) if data else None
        out["json"] = strip(doc)
    except ValueError:
        out["text"] = data[:300].decode("latin-1")
    return out


class Grpc:
    def __init__(self, port: int) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", -1)])
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    def send(self, r: Dict[str, Any]) -> Dict[str, Any]:
        md = [("triton-grpc-protocol-triton-access-token", "dfztoken")] if r.get("auth") else None
        try:
            if r["rpc"] == "ModelStreamInfer":
                responses = list(
                    getattr(self.stub, r["rpc"])(iter([r["msg"], *r.get("more", [])]), timeout=15, metadata=md)
                )
                return {"status": "OK", "stream": [strip(json_format.MessageToDict(x)) for x in responses]}
            resp = getattr(self.stub, r["rpc"])(r["msg"], timeout=15, metadata=md)
            return {"status": "OK", "msg": strip(json_format.MessageToDict(resp))}
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return {"status": "TIMEOUT"}
            return {"status": code.name, "details": e.details()}


# ----------------------------------------------------------------------------------------------- comparison


def pattern(text: Optional[str]) -> str:
    if not text:
        return ""
    t = re.sub(r"\[request id: [^\]]*\] ", "", text)
    t = re.sub(r"'[^']*'", "'*'", t)
    t = re.sub(r"\"[^\"]*\"", "'*'", t)
    t = re.sub(r"-?\d+", "N", t)
    t = re.sub(r"\[[N, ]*\]", "[..]", t)
    return t[:140]


def error_text(r: Dict[str, Any]) -> str:
    if "details" in r:
        return r["details"] or ""
    j = r.get("json")
    if isinstance(j, dict) and "error" in j:
        return str(j["error"])
    if r.get("stream"):
        errs = [s.get("errorMessage") for s in r["stream"] if s.get("errorMessage")]
        return "; ".join(errs)
    return r.get("text", "") if isinstance(r.get("status"), int) and r["status"] >= 400 else ""


def comparable(r: Dict[str, Any]) -> Dict[str, Any]:
    r = dict(r)
    return r


def describe(req: Dict[str, Any]) -> str:
    if req["proto"] == "http":
        return f"HTTP {req['method']} {re.sub(r'/models/[^/]+', '/models/M', req['path'].split('?')[0])}"
    return f"gRPC {req['rpc']}"


def _big(shape: Any) -> bool:
    try:
        return any(int(d) >= 2**31 for d in shape) or int(np.prod([abs(int(d)) for d in shape], dtype=object)) >= 2**31
    except (TypeError, ValueError, OverflowError):
        return False


def nv_unsafe(req: Dict[str, Any]) -> bool:
    """Requests known to crash tritonserver 2.51 (huge shapes; gRPC duplicate outputs): sent only to ours."""
    if req["proto"] == "grpc":
        msg = req["msg"]
        if req.get("more") and msg.model_name == "stream":  # decoupled responses, then an error: grpc asserts
            return True
        if hasattr(msg, "inputs"):
            if any(_big(i.shape) for i in msg.inputs):
                return True
            names = [o.name for o in msg.outputs]
            if any(o.name in ("TO", "b_out", "S") and "classification" in o.parameters for o in msg.outputs):
                return True
            return len(names) != len(set(names))
        return False
    try:
        doc = json.loads(req["body"].split(b"\x00")[0]) if req["body"][:1] == b"{" else None
    except ValueError:
        doc = None
    text = req["body"][:4000]
    if b"classification" in text and re.search(rb'"(TO|b_out|S)"', text):
        return True
    if re.search(rb"\d{10,}", text) and b"shape" in text:
        return True
    if b"classification" in text and isinstance(doc, dict) and isinstance(doc.get("inputs"), list):
        # an output of 0 elements (an input's) asked for classes over HTTP: SIGSEGV (seed 119, case 1567)
        if any(isinstance(t, dict) and isinstance(t.get("shape"), list) and 0 in t["shape"] for t in doc["inputs"]):
            return True
    if isinstance(doc, dict) and isinstance(doc.get("outputs"), list):
        names = [o.get("name") for o in doc["outputs"] if isinstance(o, dict)]
        return len(names) != len(set(map(str, names)))
    return False


def alive(port: int) -> bool:
    time.sleep(0.5)
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/v2/health/live")
        return c.getresponse().status == 200
    except OSError:
        return False


def show(seed: int, i: int) -> None:
    """Print the requests of one case."""
    for req in make_case(seed, i):
        print({k: (str(v)[:1500] if k in ("msg", "body") else v) for k, v in req.items()})


KNOWN = {  # differences docs/migration.md describes (status pairs; same words unless said)
    "500 -> 400, Triton's words": lambda k: (
        k[1] == 500 and k[2] == 400 and (k[3] == k[4] or "parse the request JSON" in k[3])
    ),
    "INTERNAL -> INVALID_ARGUMENT, Triton's words": lambda k: (
        k[1] == "INTERNAL" and k[2] == "INVALID_ARGUMENT" and k[3] == k[4]
    ),
    "repository index lists the bound models": lambda k: (
        "RepositoryIndex" in k[0] or ("repository/index" in k[0] and k[1] == k[2])
    ),
    "config parameters (workspace-path)": lambda k: (
        ("ModelConfig" in k[0] or "config" in k[0]) and k[1] == k[2] and k[1] in (200, "OK")
    ),
}


def clusters(paths: List[str]) -> None:
    """Print the differences of the files grouped by (request, statuses, error patterns), largest first."""
    groups: Dict[Tuple[str, ...], List[Dict[str, Any]]] = {}
    known: Dict[str, int] = {}
    for path in paths:
        for line in open(path):
            record = json.loads(line)
            if "CRASH" in record:
                print("CRASH of", record["CRASH"], "at case", record["seed"], record["case"])
                continue
            key = record["key"]
            if key[1] == "NV_SKIPPED" and key[2] not in ("INTERNAL", "UNKNOWN", "TIMEOUT", "CONNERR", 500):
                known["sent to this server alone, answered 4xx"] = (
                    known.get("sent to this server alone, answered 4xx", 0) + 1
                )
                continue
            label = next((name for name, test in KNOWN.items() if test(key)), None)
            if label is not None:
                known[label] = known.get(label, 0) + 1
                continue
            groups.setdefault(tuple(map(str, key)), []).append(record)
    print("known:", known)
    for key, records in sorted(groups.items(), key=lambda item: -len(item[1])):
        print(len(records), " | ".join(key)[:400], "  e.g.", f"{records[0]['seed']}:{records[0]['case']}")


def run(
    theirs: Tuple[int, int],
    ours: Tuple[int, int],
    seed: int,
    start: int,
    count: int,
    out_path: str,
    both_ours: bool = False,
) -> int:
    """Send cases start..start+count to both; write the differences; return the exit status (3, 4: a crash).

    With both_ours, --theirs is this server too (e.g. with frontends=1 against frontends=3): every case goes to both.
    """
    with open("/dev/shm/dfz_seg", "wb") as segment:
        segment.write(np.arange(16, dtype=np.float32).tobytes())
    nv = {"http": Http(theirs[0]), "grpc": Grpc(theirs[1])}
    us = {"http": Http(ours[0]), "grpc": Grpc(ours[1])}
    t0 = time.time()
    n_diff = 0
    with open(out_path, "a") as f:
        for i in range(start, start + count):
            case = make_case(seed, i)
            for j, req in enumerate(case):
                a = nv[req["proto"]].send(req) if both_ours or not nv_unsafe(req) else {"status": "NV_SKIPPED"}
                b = us[req["proto"]].send(req)
                for who, port, res in (("nv", theirs[0], a), ("us", ours[0], b)):
                    if res.get("status") in ("CONNERR", "TIMEOUT", "UNAVAILABLE") and not alive(port):
                        f.write(json.dumps({"seed": seed, "case": i, "step": j, "CRASH": who, "res": res}) + "\n")
                        print(f"CRASH {who} case {i}", flush=True)
                        return 3 if who == "nv" else 4
                if a != b:
                    n_diff += 1
                    key = [
                        describe(req),
                        a.get("status"),
                        b.get("status"),
                        pattern(error_text(a)),
                        pattern(error_text(b)),
                    ]
                    rec = {"seed": seed, "case": i, "step": j, "where": describe(req), "nv": a, "us": b, "key": key}
                    if req["proto"] == "http":
                        rec["req"] = {
                            "method": req["method"],
                            "path": req["path"],
                            "headers": req["headers"],
                            "body": req["body"][:2000].decode("latin-1"),
                        }
                    else:
                        rec["req"] = {"rpc": req["rpc"], "msg": str(req["msg"])[:2000]}
                    f.write(json.dumps(rec, default=str) + "\n")
            if i % 500 == 0:
                print(f"case {i} diffs {n_diff} {time.time() - t0:.0f}s", flush=True)
    print(f"done {count} cases, {n_diff} differing requests, {time.time() - t0:.0f}s")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--theirs", help="HTTP:GRPC ports of nvidia-pytriton's server")
    parser.add_argument("--ours", help="HTTP:GRPC ports of this project's server")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--out", default="wire_diff.jsonl")
    parser.add_argument("--clusters", nargs="+", metavar="JSONL")
    parser.add_argument("--show", metavar="SEED:CASE")
    parser.add_argument(
        "--both-ours", action="store_true", help="--theirs is this server too: send it what crashes tritonserver"
    )
    args = parser.parse_args()
    if args.clusters:
        clusters(args.clusters)
    elif args.show:
        seed, case = args.show.split(":")
        show(int(seed), int(case))
    else:
        ports = [tuple(int(p) for p in value.split(":")) for value in (args.theirs, args.ours)]
        sys.exit(run(ports[0], ports[1], args.seed, args.start, args.count, args.out, args.both_ours))


if __name__ == "__main__":
    main()
