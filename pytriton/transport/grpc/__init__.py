"""The gRPC frontend: inference.GRPCInferenceService on an HTTP/2 server of this project's own."""
