"""Transports: HTTP (ASGI on an httptools server) and gRPC (grpc.aio), thin translators to and from the engine."""
