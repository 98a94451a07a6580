"""Data types handed to inference callables."""
