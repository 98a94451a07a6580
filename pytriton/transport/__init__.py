"""Transports: HTTP (ASGI on uvicorn) and gRPC (grpc.aio), thin translators to and from the engine."""
