"""The gRPC frontend: Triton's GRPCInferenceService, the listener, the traffic service and
restricted protocols."""
