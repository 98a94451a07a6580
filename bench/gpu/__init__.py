"""The GPU bench: `python -m bench gpu` (bench/gpu/__main__.py)."""
