"""Triton's sequence batcher: a stateful model's sequences, their slots, control inputs and per-sequence state."""
