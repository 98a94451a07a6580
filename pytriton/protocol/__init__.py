"""The KServe v2 / Triton wire codec shared by the HTTP and gRPC transports."""
