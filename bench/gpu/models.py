"""The GPU bench's models, built in plain torch with random weights (no download, no torchvision).

* resnet50: torchvision's ResNet-50 layout (bottleneck blocks 3-4-6-3); takes UINT8 images [3, H, W] as a client
  sends decoded pixels, normalises them on the device, answers FP32 logits [1000].
* encoder: a BERT-base-like transformer encoder (6 layers, d_model 512, 8 heads); takes INT64 token ids [seq],
  answers the FP32 mean-pooled embedding [d_model].

`--size tiny` shrinks both so that the bench runs on a CPU in seconds (the smoke test); `full` is the real size.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Dict, Tuple

import numpy as np
import torch
from torch import nn

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What the bench serves: a torch module and the shapes and dtypes of its one input and one output."""

    name: str
    module: nn.Module
    input_shape: Tuple[int, ...]
    input_dtype: Any  # numpy dtype
    output_shape: Tuple[int, ...]

    def sample(self, batch: int, seed: int = 0) -> np.ndarray:
        """A batch of valid random inputs."""
        rng = np.random.default_rng(seed)
        shape = (batch, *self.input_shape)
        if self.input_dtype == np.uint8:
            return rng.integers(0, 256, size=shape, dtype=np.uint8)
        return rng.integers(0, 1000, size=shape, dtype=np.int64)


class Bottleneck(nn.Module):
    """ResNet's bottleneck block: 1x1, 3x3 (strided), 1x1 convolutions and a residual connection."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int) -> None:
        super().__init__()
        out = planes * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(inplanes, planes, 1, bias=False),
            nn.BatchNorm2d(planes),
            nn.ReLU(inplace=True),
            nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(planes),
            nn.ReLU(inplace=True),
            nn.Conv2d(planes, out, 1, bias=False),
            nn.BatchNorm2d(out),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inplanes != out:
            self.shortcut = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet with bottleneck blocks over UINT8 images, normalised inside."""

    def __init__(self, layers: Tuple[int, ...] = (3, 4, 6, 3), width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(MEAN).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(STD).view(1, 3, 1, 1) * 255)
        stages = []
        inplanes = width
        for index, blocks in enumerate(layers):
            planes = width * 2**index
            for block in range(blocks):
                stages.append(Bottleneck(inplanes, planes, 2 if block == 0 and index > 0 else 1))
                inplanes = planes * Bottleneck.expansion
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
            *stages,
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = (images.to(self.mean.dtype) - self.mean) / self.std
        return self.fc(self.features(x.contiguous(memory_format=torch.channels_last)))


class Encoder(nn.Module):
    """Token embedding, a transformer encoder, mean pooling."""

    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Parameter(torch.randn(1, seq, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.tokens(ids) + self.positions).mean(dim=1)


def build(name: str, size: str) -> ModelSpec:
    """A model by name ('resnet50', 'encoder') and size ('full', 'tiny'), with fixed random weights."""
    torch.manual_seed(0)
    tiny = size == "tiny"
    if name == "resnet50":
        side = 32 if tiny else 224
        module: nn.Module = ResNet(layers=(1, 1, 1, 1), width=8) if tiny else ResNet()
        return ModelSpec(name, module, (3, side, side), np.uint8, (1000,))
    if name == "encoder":
        vocab, d_model, heads, layers, seq = (1000, 64, 4, 2, 16) if tiny else (30522, 512, 8, 6, 128)
        return ModelSpec(name, Encoder(vocab, d_model, heads, layers, seq), (seq,), np.int64, (d_model,))
    raise ValueError(f"unknown model {name!r}: resnet50 or encoder")


def batch_callable(spec: ModelSpec, device: str, half: bool) -> Callable[[np.ndarray], torch.Tensor]:
    """numpy batch -> output tensor on the device: one host-to-device copy, the model, no copy back.

    The server's `@batch` callable and the direct loop both call this; each thread gets its own CUDA stream.
    """
    module = spec.module.eval().to(device)
    if device.startswith("cuda"):
        module = module.to(memory_format=torch.channels_last)
    if half:
        module = module.half()
        if isinstance(module, ResNet):  # keep the normalisation constants in the model's dtype
            module.mean, module.std = module.mean.half(), module.std.half()
    streams: Dict[int, Any] = {}

    @torch.inference_mode()
    def run(batch: np.ndarray) -> torch.Tensor:
        if not device.startswith("cuda"):
            return module(torch.from_numpy(batch)).float()
        stream = streams.get(threading.get_ident())
        if stream is None:
            stream = streams[threading.get_ident()] = torch.cuda.Stream(device=device)
        with torch.cuda.stream(stream):
            output = module(torch.from_numpy(batch).to(device)).float()
        # the copy to the host (the server's, on the current stream) must wait for this stream's work
        current = torch.cuda.current_stream(device)
        current.wait_stream(stream)
        output.record_stream(current)
        return output

    return run
