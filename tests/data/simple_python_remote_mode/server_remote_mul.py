#!/usr/bin/env python3
# Copied from https://github.com/triton-inference-server/pytriton (tag v0.7.0),
# examples/simple_python_remote_mode/server_remote_mul.py, unchanged but for these three lines.
# License: Apache-2.0, as the notice below says.
# Copyright (c) 2023, NVIDIA CORPORATION. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Starting PyTriton in remote mode and binding model calculating element wise multiplication."""

import logging
import os

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import RemoteTriton

logger = logging.getLogger("examples.simple_python_remote_mode.server_remote_mul")
logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(levelname)s - %(name)s: %(message)s")


@batch
def _mul(**inputs):
    a_batch, b_batch = inputs.values()
    dot_result = np.multiply(a_batch, b_batch)
    return {"mul": dot_result}


with RemoteTriton(url="localhost", access_token=os.getenv("TRITON_ACCESS_TOKEN")) as remote_triton:
    remote_triton.bind(
        model_name="Mul",
        infer_func=_mul,
        inputs=[
            Tensor(dtype=np.float32, shape=(-1,)),
            Tensor(dtype=np.float32, shape=(-1,)),
        ],
        outputs=[
            Tensor(name="mul", dtype=np.float32, shape=(-1,)),
        ],
        config=ModelConfig(max_batch_size=128),
    )

    remote_triton.serve()
