# Protocol code generation; included by the main Makefile (`include protocol/proto/proto.mk`),
# which sets PY to the project venv python and PROTO_TOOLS to the target that installs the
# `dev` extra (grpcio-tools, a build tool the server does not need). Regenerates
# protocol/*_pb2*.py{,i} from the .proto files; commit the result
# (tests/unit/protocol/proto/test_descriptors.py fails when stale).

PY ?= python3
PROTO_TOOLS ?=

.PHONY: proto
proto: $(PROTO_TOOLS)
	$(PY) -m protocol.proto.generate
