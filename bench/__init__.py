"""Benchmark harness: run with `python -m bench` (see bench/README.md)."""
