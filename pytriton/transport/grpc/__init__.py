"""The gRPC frontend (inference.GRPCInferenceService on grpc.aio)."""
