"""Every RPC of the generated servicer base (whose bodies raise NotImplementedError) is
overridden by our servicer, and every RPC of the service descriptor has a handler."""

from __future__ import annotations

from protocol.proto import grpc_service_pb2
from protocol.proto.grpc_service_pb2_grpc import GRPCInferenceServiceServicer
from server.grpc.services import InferenceServicer


def test_every_rpc_is_implemented_by_our_servicer() -> None:
    rpcs = [
        m.name for m in grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    ]
    assert len(rpcs) >= 20
    missing = [
        name
        for name in rpcs
        if getattr(InferenceServicer, name) is getattr(GRPCInferenceServiceServicer, name)
    ]
    assert missing == []
