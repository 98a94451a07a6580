"""Ask the ensemble for the top classes of a few files, as Triton's ensemble_image_client.py does, and check them.

It reads the ensemble's metadata and config (one input, an ensemble platform), sends the files' bytes as one
batch of BYTES [1] and asks for OUTPUT's two top classes (`class_count=2`): "score:index:label" strings.
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

MODEL = "preprocess_inception_ensemble"
FILES = {
    "a.png": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "PNG image"),
    "b.gif": (b"GIF89a" + bytes(range(1, 200)), "GIF image"),
    "c.txt": (b"an ensemble of two models\n" * 4, "text"),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://localhost:8000", help="http://host:port or grpc://host:port")
    args = parser.parse_args()
    grpc = args.url.startswith("grpc://")
    address = args.url.split("://", 1)[-1]
    module = grpcclient if grpc else httpclient
    client = module.InferenceServerClient(address)

    metadata = client.get_model_metadata(MODEL)
    config = client.get_model_config(MODEL)
    if grpc:
        inputs, platform, max_batch_size = metadata.inputs, config.config.platform, config.config.max_batch_size
        input_name, output_names = inputs[0].name, [output.name for output in metadata.outputs]
    else:
        inputs, platform, max_batch_size = metadata["inputs"], config["platform"], config["max_batch_size"]
        input_name, output_names = inputs[0]["name"], [output["name"] for output in metadata["outputs"]]
    assert len(inputs) == 1 and platform == "ensemble", (inputs, platform)
    assert max_batch_size >= len(FILES)

    with tempfile.TemporaryDirectory() as folder:
        for name, (data, _) in FILES.items():
            (Path(folder) / name).write_bytes(data)
        images = np.stack([np.array([(Path(folder) / name).read_bytes()], dtype=bytes) for name in sorted(FILES)])
    infer_input = module.InferInput(input_name, list(images.shape), "BYTES")
    if grpc:
        infer_input.set_data_from_numpy(images)
        outputs = [grpcclient.InferRequestedOutput(name, class_count=2) for name in output_names]
    else:
        infer_input.set_data_from_numpy(images, binary_data=True)
        outputs = [httpclient.InferRequestedOutput(name, binary_data=True, class_count=2) for name in output_names]
    result = client.infer(MODEL, [infer_input], outputs=outputs)
    top = result.as_numpy("OUTPUT")
    for name, classes in zip(sorted(FILES), top):
        shown = [entry.decode() if isinstance(entry, bytes) else str(entry) for entry in classes]
        print(f"{name}: {shown}")
        score, _, label = shown[0].split(":", 2)
        assert label == FILES[name][1] and float(score) > 0.5, (name, shown)
    print("OK")


if __name__ == "__main__":
    main()
