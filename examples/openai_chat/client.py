"""Talk to the example's models with the `openai` SDK: a chat answer, the same streamed, an embedding."""

import argparse

from openai import OpenAI


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://localhost:8000", help="the server's HTTP URL")
    args = parser.parse_args()
    client = OpenAI(base_url=f"{args.url}/v1", api_key="unused", max_retries=0)

    print("models:", [model.id for model in client.models.list()])
    messages = [{"role": "user", "content": "Say something."}]
    answer = client.chat.completions.create(model="toy", messages=messages, max_tokens=8)
    text = answer.choices[0].message.content
    print("answer:", repr(text), answer.usage)

    pieces = []
    stream = client.chat.completions.create(
        model="toy", messages=messages, max_tokens=8, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        elif chunk.usage is not None:
            print("streamed usage:", chunk.usage)
    print("streamed:", repr("".join(pieces)))
    if "".join(pieces) != text:
        raise SystemExit("the streamed answer differs from the whole one")

    embedding = client.embeddings.create(model="toy-embed", input=["hello", "world"], dimensions=4)
    print("embeddings:", [len(item.embedding) for item in embedding.data])
    print("OK")


if __name__ == "__main__":
    main()
