"""Tensors as the engine holds them: Triton datatypes, raw bytes and BYTES, long BYTES counts, framework arrays."""
