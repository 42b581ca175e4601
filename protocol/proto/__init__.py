"""The .proto files and the modules protoc generates from them (python -m protocol.proto.generate)."""
