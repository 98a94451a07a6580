"""A chat model and an embedding model served through the OpenAI API, runnable without downloads.

`toy` is a deterministic generator: it streams `max_tokens` words (16 when the request names none), one
response per token, chosen from the prompt; the dynamic batcher batches concurrent requests. `toy-embed` gives
each text an 8-dimensional unit vector computed from its bytes. `--hf MODEL` serves a Hugging Face causal LM
the same way instead of `toy` (needs transformers, torch and the model's weights).
"""

import argparse
import hashlib
import logging

import numpy as np

from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.openai import OpenAIChat, OpenAIEmbeddings
from pytriton.triton import Triton

DEFAULT_TOKENS = 16
VOCABULARY = "the quick brown fox jumps over a lazy dog while pytriton streams every word".split()


def toy_tokens(prompt, count):
    """`count` words, the same for the same prompt: a stand-in for a language model."""
    start = int.from_bytes(hashlib.sha256(prompt).digest()[:4], "little")
    return [VOCABULARY[(start + index) % len(VOCABULARY)] + " " for index in range(count)]


def toy_generate(requests):
    """A generator over a batch of requests: each step yields one token for every request still generating."""
    plans = []
    for request in requests:
        parameters = request.parameters or {}
        count = int(parameters.get("max_tokens", DEFAULT_TOKENS))
        plans.append(toy_tokens(request["text_input"].reshape(-1)[0], count))
    for step in range(max(len(plan) for plan in plans)):
        yield [
            {"text_output": np.array([[plan[step].encode()]], dtype=object)} if step < len(plan) else None
            for plan in plans
        ]


def toy_embed(requests):
    """One unit vector of 8 floats a text, from its hash."""
    responses = []
    for request in requests:
        digest = hashlib.sha256(request["text_input"].reshape(-1)[0]).digest()
        vector = np.frombuffer(digest, dtype=np.uint8)[:8].astype(np.float32) - 127.5
        responses.append({"embedding": (vector / np.linalg.norm(vector)).reshape(1, -1)})
    return responses


def bind_toy(triton):
    """The binding a benchmark copies: a streaming generator, batched, answering the OpenAI API."""
    triton.bind(
        model_name="toy",
        infer_func=toy_generate,
        inputs=[Tensor(name="text_input", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="text_output", dtype=bytes, shape=(1,))],
        config=ModelConfig(
            decoupled=True, max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=1000)
        ),
        openai=OpenAIChat(chat_template=None),
    )
    triton.bind(
        model_name="toy-embed",
        infer_func=toy_embed,
        inputs=[Tensor(name="text_input", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="embedding", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=1000)),
        openai=OpenAIEmbeddings(truncate_dimensions=True),
    )


def bind_hugging_face(triton, name):
    """The same binding around a Hugging Face causal LM: its tokenizer's chat template, tokens streamed."""
    import threading

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

    tokenizer = AutoTokenizer.from_pretrained(name)
    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float32)

    def generate(requests):
        for request in requests:  # one request at a time: each streams its own tokens
            prompt = request["text_input"].reshape(-1)[0].decode()
            parameters = request.parameters or {}
            streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
            inputs = tokenizer(prompt, return_tensors="pt")
            kwargs = dict(inputs, streamer=streamer, max_new_tokens=int(parameters.get("max_tokens", 64)))
            temperature = float(parameters.get("temperature", 0.0))
            if temperature > 0:
                kwargs.update(do_sample=True, temperature=temperature, top_p=float(parameters.get("top_p", 1.0)))
            threading.Thread(target=model.generate, kwargs=kwargs, daemon=True).start()
            for text in streamer:
                if text:
                    yield [{"text_output": np.array([[text.encode()]], dtype=object)}]

    triton.bind(
        model_name="toy",
        infer_func=generate,
        inputs=[Tensor(name="text_input", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="text_output", dtype=bytes, shape=(1,))],
        config=ModelConfig(decoupled=True, max_batch_size=1),
        openai=OpenAIChat(
            chat_template=tokenizer.chat_template,
            template_variables={"bos_token": tokenizer.bos_token or "", "eos_token": tokenizer.eos_token or ""},
            token_counter=lambda text: len(tokenizer.encode(text, add_special_tokens=False)),
        ),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--hf", metavar="MODEL", help="serve a Hugging Face causal LM (e.g. Qwen/Qwen2.5-0.5B-Instruct)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with Triton() as triton:
        if args.hf:
            bind_hugging_face(triton, args.hf)
        else:
            bind_toy(triton)
        triton.run()
        print(f"READY http={triton.http_port} grpc={triton.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
