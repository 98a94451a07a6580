"""Triton's shared-memory extensions: the regions clients register (system: POSIX segments; CUDA: IPC handles)."""
