"""The gRPC counterpart of /v2/models/M/traffic: ascend.traffic.v1.TrafficService.

Each RPC converts through protocol/grpc/traffic.py and calls the same core methods as the HTTP
routes, so policies, checks and error texts are one; errors map through the one error table.
"""

from __future__ import annotations

from typing import Any

from protocol.grpc.traffic import encode_policy, policy_document
from protocol.proto import traffic_service_pb2 as pb
from protocol.proto.traffic_service_pb2_grpc import TrafficServiceServicer
from protocol.traffic import decode_traffic
from server.core.api import CoreAPI
from server.grpc.services import guarded


class TrafficServicer(TrafficServiceServicer):
    def __init__(self, core: CoreAPI) -> None:
        self.core = core

    @guarded
    async def GetTraffic(self, request: pb.TrafficRequest, context: Any) -> pb.TrafficPolicy:
        return encode_policy(self.core.traffic_policy(request.model))

    @guarded
    async def SetTraffic(self, request: pb.SetTrafficRequest, context: Any) -> pb.TrafficPolicy:
        self.core.traffic_policy(request.model)  # an unknown model first, as over HTTP
        spec = decode_traffic(policy_document(request.policy))
        return encode_policy(self.core.set_traffic_policy(request.model, spec))

    @guarded
    async def DeleteTraffic(self, request: pb.TrafficRequest, context: Any) -> pb.TrafficPolicy:
        return encode_policy(self.core.delete_traffic_policy(request.model))
