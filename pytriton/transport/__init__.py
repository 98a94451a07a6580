"""Transports: HTTP (ASGI on an httptools server) and gRPC (an HTTP/2 server), thin translators to the engine."""
