"""The OpenAI API over PyTriton models: the option of `Triton.bind(..., openai=...)` (docs/openai.md).

    triton.bind(model_name="toy", infer_func=gen,
                inputs=[Tensor(name="text_input", dtype=bytes, shape=(1,))],
                outputs=[Tensor(name="text_output", dtype=bytes, shape=(1,))],
                config=ModelConfig(decoupled=True),
                openai=OpenAIChat())

serves the model at http://<host>:<http_port>/v1/chat/completions (and /v1/completions) as "model": "toy".
"""

from __future__ import annotations

from pytriton.options.openai import OpenAIChat, OpenAICompletions, OpenAIEmbeddings
from pytriton.transport.openai.templates import default_template

__all__ = ["OpenAIChat", "OpenAICompletions", "OpenAIEmbeddings", "default_template"]
