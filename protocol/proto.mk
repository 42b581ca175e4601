# Protocol code generation; included by the main Makefile (`include protocol/proto.mk`),
# which sets PY to the project venv python. Regenerates protocol/*_pb2*.py{,i} from the
# .proto files; commit the result (tests/unit/test_proto_descriptors.py fails when stale).

PY ?= python3

.PHONY: proto
proto:
	$(PY) -m protocol.generate
