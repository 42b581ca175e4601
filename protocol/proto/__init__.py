"""The .proto files and the modules protoc makes from them (python -m protocol.proto.generate)."""
