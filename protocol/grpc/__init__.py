"""The gRPC wire form: ModelInfer messages and the traffic service, to and from internal types."""
