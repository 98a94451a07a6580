"""`ModelConfigParser`, at nvidia-pytriton's import path.

A Triton model config (a dict or a config.pbtxt) as a TritonModelConfig, read as the clients read the server's.
"""

from __future__ import annotations

import pathlib
from typing import Any, Dict

from pytriton.model_config.triton_model_config import TritonModelConfig


class ModelConfigParser:
    """Build a TritonModelConfig from a model config dictionary or file."""

    @classmethod
    def from_dict(cls, model_config_dict: Dict[str, Any]) -> TritonModelConfig:
        """A TritonModelConfig from a config in model_config.proto's JSON form (field names as in the proto)."""
        from pytriton.client._config import parse_model_config

        return parse_model_config(model_config_dict)

    @classmethod
    def from_file(cls, *, config_path: pathlib.Path) -> TritonModelConfig:
        """A TritonModelConfig from a config.pbtxt (protobuf text format)."""
        from google.protobuf import json_format, text_format
        from tritonclient.grpc import model_config_pb2

        message = text_format.Parse(pathlib.Path(config_path).read_text(), model_config_pb2.ModelConfig())
        return cls.from_dict(json_format.MessageToDict(message, preserving_proto_field_name=True))
