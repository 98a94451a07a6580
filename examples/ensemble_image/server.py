"""An ensemble as Triton's `ensemble_image_client.py` expects one: a preprocessing step, then a classifier.

`preprocess_inception_ensemble` takes an image file's bytes (INPUT, BYTES [1]) and answers OUTPUT (FP32 scores,
one per label), which a client asks for with `class_count`. The steps are two bound models:
`image_preprocess_model` turns the file's bytes into features, `image_classifier` scores them. The classifier is a
toy: it tells the file's kind from its first bytes and how much of it is text.
"""

import logging

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import EnsembleStep, ModelConfig, Tensor
from pytriton.triton import Triton

LABELS = ["JPEG image", "PNG image", "GIF image", "text", "other"]
SIGNATURES = [b"\xff\xd8\xff", b"\x89PNG", b"GIF8"]
HEAD = 8  # leading bytes kept as features


@batch
def _preprocess(INPUT):
    features = np.zeros((len(INPUT), HEAD + 1), dtype=np.float32)
    for row, (data,) in enumerate(INPUT):
        raw = np.frombuffer(bytes(data), dtype=np.uint8)
        features[row, : min(HEAD, raw.size)] = raw[:HEAD]
        printable = np.count_nonzero(((raw >= 32) & (raw < 127)) | (raw == 9) | (raw == 10) | (raw == 13))
        features[row, HEAD] = printable / max(1, raw.size)
    return {"OUTPUT": features}


@batch
def _classify(features):
    scores = np.zeros((len(features), len(LABELS)), dtype=np.float32)
    for row, feature in enumerate(features):
        head = bytes(feature[:HEAD].astype(np.uint8))
        kind = next((index for index, magic in enumerate(SIGNATURES) if head.startswith(magic)), None)
        if kind is None:
            kind = 3 if feature[HEAD] > 0.95 else 4
        scores[row] = 0.02
        scores[row, kind] = 0.9
        scores[row, 3] = max(scores[row, 3], 0.05 + 0.04 * feature[HEAD])  # the runner-up: how textual it is
    return {"scores": scores}


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Triton() as triton:
        triton.bind(
            model_name="image_preprocess_model",
            infer_func=_preprocess,
            inputs=[Tensor(name="INPUT", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="OUTPUT", dtype=np.float32, shape=(HEAD + 1,))],
            config=ModelConfig(max_batch_size=16),
        )
        triton.bind(
            model_name="image_classifier",
            infer_func=_classify,
            inputs=[Tensor(name="features", dtype=np.float32, shape=(HEAD + 1,))],
            outputs=[Tensor(name="scores", dtype=np.float32, shape=(len(LABELS),))],
            config=ModelConfig(max_batch_size=16),
        )
        triton.bind_ensemble(
            model_name="preprocess_inception_ensemble",
            steps=[
                EnsembleStep(
                    "image_preprocess_model", input_map={"INPUT": "INPUT"}, output_map={"OUTPUT": "preprocessed"}
                ),
                EnsembleStep(
                    "image_classifier", input_map={"features": "preprocessed"}, output_map={"scores": "OUTPUT"}
                ),
            ],
            inputs=[Tensor(name="INPUT", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="OUTPUT", dtype=np.float32, shape=(len(LABELS),), labels=LABELS)],
            config=ModelConfig(max_batch_size=16),
        )
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
