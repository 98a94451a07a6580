"""Classification labels and input formats on Tensor: the model config shows them, class_count uses the labels.

What Triton's image_client.py reads: an input's `format` (FORMAT_NCHW / FORMAT_NHWC) to lay out the image, and
an output's top classes as "score:index:label".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.model_config_pb2 as mc
import tritonclient.http as httpclient

from pytriton.decorators import batch
from pytriton.exceptions import PyTritonModelConfigError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton
from tests.conftest import grpc_url, http_url, running_triton

LABELS = ["tench", "goldfish", "great white shark", "tiger shark"]
# Five scores over four labels: the fifth class has none, and Triton then writes "score:index" alone.
SCORES = np.array([0.1, 0.7, 0.05, 0.15, 0.9], dtype=np.float32)


@batch
def classify_nchw(data_0: np.ndarray) -> Dict[str, np.ndarray]:
    return {"fc6_1": np.tile(SCORES, (data_0.shape[0], 1))}


def classify_one(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"scores": SCORES} for _ in requests]


def classify_labelled(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"fc6_1": SCORES[:4]} for _ in requests]


def _bind_classifiers(label_file: Path) -> Callable[[Triton], None]:
    def bind(triton: Triton) -> None:
        triton.bind(
            "classifier",
            classify_nchw,
            inputs=[Tensor(name="data_0", dtype=np.float32, shape=(3, 8, 8), format="FORMAT_NCHW")],
            outputs=[Tensor(name="fc6_1", dtype=np.float32, shape=(5,), label_filename=str(label_file))],
            config=ModelConfig(max_batch_size=4),
        )
        triton.bind(
            "densenet_standin",
            classify_labelled,
            inputs=[Tensor(name="data_0", dtype=np.float32, shape=(3, 8, 8), format="FORMAT_NCHW")],
            outputs=[Tensor(name="fc6_1", dtype=np.float32, shape=(4,), labels=LABELS)],
            config=ModelConfig(batching=False),
        )
        triton.bind(
            "listed",
            classify_one,
            inputs=[Tensor(name="image", dtype=np.uint8, shape=(8, 8, 3), format="NHWC")],
            outputs=[Tensor(name="scores", dtype=np.float32, shape=(5,), labels=LABELS)],
            config=ModelConfig(batching=False),
        )

    return bind


@pytest.fixture(scope="module", params=[None, 3], ids=["one-process", "frontends"])
def triton(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    label_file = tmp_path_factory.mktemp("labels") / "densenet_labels.txt"
    label_file.write_text("\n".join(LABELS) + "\n")
    with running_triton(_bind_classifiers(label_file), frontends=request.param) as served:
        yield served


EXPECTED_TOP = [b"0.900000:4", b"0.700000:1:goldfish", b"0.150000:3:tiger shark"]


def test_http_class_count_answers_score_index_label(triton: Triton) -> None:
    with httpclient.InferenceServerClient(http_url(triton)) as client:
        image = httpclient.InferInput("data_0", [2, 3, 8, 8], "FP32")
        image.set_data_from_numpy(np.zeros((2, 3, 8, 8), dtype=np.float32))
        result = client.infer("classifier", [image], outputs=[httpclient.InferRequestedOutput("fc6_1", class_count=3)])
        assert result.as_numpy("fc6_1").tolist() == [EXPECTED_TOP, EXPECTED_TOP]
        image = httpclient.InferInput("image", [8, 8, 3], "UINT8")
        image.set_data_from_numpy(np.zeros((8, 8, 3), dtype=np.uint8))
        result = client.infer("listed", [image], outputs=[httpclient.InferRequestedOutput("scores", class_count=2)])
        assert result.as_numpy("scores").tolist() == EXPECTED_TOP[:2]


def test_grpc_class_count_answers_score_index_label(triton: Triton) -> None:
    with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
        image = grpcclient.InferInput("data_0", [1, 3, 8, 8], "FP32")
        image.set_data_from_numpy(np.zeros((1, 3, 8, 8), dtype=np.float32))
        result = client.infer("classifier", [image], outputs=[grpcclient.InferRequestedOutput("fc6_1", class_count=5)])
        assert result.as_numpy("fc6_1").tolist() == [
            [*EXPECTED_TOP, b"0.100000:0:tench", b"0.050000:2:great white shark"]
        ]
        # Without a class count the scores come back as they are.
        plain = client.infer("classifier", [image]).as_numpy("fc6_1")
        np.testing.assert_array_equal(plain, SCORES[np.newaxis])


def test_config_documents_show_format_and_label_filename(triton: Triton) -> None:
    with httpclient.InferenceServerClient(http_url(triton)) as client:
        config = client.get_model_config("classifier")
        assert config["input"][0]["format"] == "FORMAT_NCHW"
        assert config["output"][0]["label_filename"] == "densenet_labels.txt"
        listed = client.get_model_config("listed")
        assert listed["input"][0]["format"] == "FORMAT_NHWC"
        assert listed["output"][0]["label_filename"] == ""  # labels given as a list: no file to name
    with grpcclient.InferenceServerClient(grpc_url(triton)) as client:
        config = client.get_model_config("classifier").config
        assert config.input[0].format == mc.ModelInput.FORMAT_NCHW
        assert config.output[0].label_filename == "densenet_labels.txt"
        assert client.get_model_config("listed").config.input[0].format == mc.ModelInput.FORMAT_NHWC


def _bind_one(**tensors: Any) -> Callable[[Triton], None]:
    def bind(triton: Triton) -> None:
        triton.bind("bad", classify_one, config=ModelConfig(batching=False), **tensors)

    return bind


SCORES_OUT = [Tensor(name="scores", dtype=np.float32, shape=(5,))]
IMAGE_IN = [Tensor(name="image", dtype=np.float32, shape=(3, 8, 8))]


@pytest.mark.parametrize(
    "tensors, message",
    [
        (
            {"inputs": [Tensor(name="image", dtype=np.float32, shape=(8, 8), format="FORMAT_NCHW")]},
            "input 'image' has format FORMAT_NCHW, which needs 3 dims",
        ),
        (
            {"inputs": [Tensor(name="image", dtype=np.float32, shape=(3, 8, 8), format="CHW")]},
            "input 'image' has format='CHW'; expected one of FORMAT_NONE, FORMAT_NCHW, FORMAT_NHWC",
        ),
        (
            {"outputs": [Tensor(name="scores", dtype=np.float32, shape=(3, 8, 8), format="NCHW")]},
            "output 'scores' has format='NCHW': only inputs have a format",
        ),
        (
            {"inputs": [Tensor(name="image", dtype=np.float32, shape=(3, 8, 8), labels=["a"])]},
            "input 'image' has labels: only outputs have classification labels",
        ),
        (
            {"outputs": [Tensor(name="scores", dtype=np.float32, shape=(5,), labels="abc")]},
            "output 'scores' has labels='abc'; expected a list of strings",
        ),
        (
            {"outputs": [Tensor(name="scores", dtype=np.float32, shape=(5,), labels=["a"], label_filename="x")]},
            "output 'scores' has both labels and label_filename",
        ),
        (
            {"outputs": [Tensor(name="scores", dtype=np.float32, shape=(5,), label_filename="/nonexistent/l.txt")]},
            "output 'scores': label_filename '/nonexistent/l.txt' cannot be read",
        ),
    ],
)
def test_bad_format_or_labels_fail_the_binding(tensors: Dict[str, Any], message: str) -> None:
    tensors = {"inputs": IMAGE_IN, "outputs": SCORES_OUT, **tensors}
    triton = Triton()
    try:
        with pytest.raises(PyTritonModelConfigError) as raised:
            _bind_one(**tensors)(triton)
        assert message in str(raised.value)
    finally:
        triton.stop()


def _image_client_flow(metadata: Any, config: Any, infer: Callable[[np.ndarray, str, str], np.ndarray]) -> List[str]:
    """What Triton's image_client.py does with a model, in substance: its checks, its layout, its printout."""
    assert len(metadata.inputs) == 1 and len(metadata.outputs) == 1 and len(config.input) == 1
    assert metadata.outputs[0].datatype == "FP32"
    input_format = config.input[0].format
    if isinstance(input_format, str):  # the HTTP config document names the enum
        input_format = dict(mc.ModelInput.Format.items())[input_format]
    assert input_format in (mc.ModelInput.FORMAT_NCHW, mc.ModelInput.FORMAT_NHWC)
    batched = config.max_batch_size > 0
    dims = list(metadata.inputs[0].shape)[1 if batched else 0 :]
    h, w = (dims[0], dims[1]) if input_format == mc.ModelInput.FORMAT_NHWC else (dims[1], dims[2])
    image = np.zeros((h, w, 3), dtype=np.float32)
    if input_format == mc.ModelInput.FORMAT_NCHW:
        image = np.transpose(image, (2, 0, 1))
    classes = infer(image[np.newaxis] if batched else image, metadata.inputs[0].name, metadata.outputs[0].name)
    lines = []
    for row in classes:
        for result in row if batched else [row]:
            score, index, label = result.decode().split(":")  # the script prints all three parts
            lines.append(f"{score} ({index}) = {label}")
    return lines


class _Attributes(dict):  # type: ignore[type-arg]
    """A JSON document read by attribute, as image_client.py reads tritonclient.http's (with attrdict)."""

    def __getattr__(self, name: str) -> Any:
        value = self[name]
        if isinstance(value, dict):
            return _Attributes(value)
        if isinstance(value, list):
            return [_Attributes(item) if isinstance(item, dict) else item for item in value]
        return value


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_does_what_tritons_image_client_does(triton: Triton, protocol: str) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    url = http_url(triton) if protocol == "http" else grpc_url(triton)
    with module.InferenceServerClient(url) as client:

        def infer(data: np.ndarray, input_name: str, output_name: str) -> np.ndarray:
            tensor = module.InferInput(input_name, list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            wanted = [module.InferRequestedOutput(output_name, class_count=3)]
            return client.infer("densenet_standin", [tensor], outputs=wanted).as_numpy(output_name)  # type: ignore[no-any-return]

        metadata = client.get_model_metadata("densenet_standin")
        config = client.get_model_config("densenet_standin")
        if protocol == "http":
            metadata, config = _Attributes(metadata), _Attributes(config)
        else:
            config = config.config
        assert _image_client_flow(metadata, config, infer) == [
            "0.700000 (1) = goldfish",
            "0.150000 (3) = tiger shark",
            "0.100000 (0) = tench",
        ]
