"""The HTTP/REST frontend."""
