"""The OpenAI API (/v1/models, chat completions, completions, embeddings) over the engine's models."""
