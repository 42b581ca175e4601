"""bench/studies/owner_wall.py: its stand-in frontend sends what each frontend hands over."""

from __future__ import annotations

import numpy as np

from bench.studies.owner_wall import MODEL, _template
from protocol.errors import GRPC_INFER_RPC, HTTP_ENDPOINT
from protocol.link_codec import pack_request, unpack_request


def test_each_protocols_request_crosses_the_link_codec_with_its_endpoint() -> None:
    for protocol, endpoint, outputs in (("grpc", GRPC_INFER_RPC, None), ("http", HTTP_ENDPOINT, 2)):
        make, sent_with = _template(protocol)
        first, second = make(), make()
        assert sent_with == endpoint
        assert first.arrival_ns <= second.arrival_ns  # a fresh request each time
        back = unpack_request(pack_request(first))
        assert back.model_name == MODEL and [t.name for t in back.inputs] == ["INPUT0", "INPUT1"]
        assert (len(back.outputs) if back.outputs is not None else None) == outputs
        np.testing.assert_array_equal(back.inputs[0].data.reshape(-1), np.arange(16))
