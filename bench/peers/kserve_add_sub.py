"""KServe 0.21's Python server with the add/sub work of bench/models/py_add, for the peer rows
of bench/kserve_peer.py: sum and difference of two FP32 [16] vectors, one response per request.

Runs in .venv-kserve (never imported by the project's own code or tests):

    .venv-kserve/bin/python bench/peers/kserve_add_sub.py --http_port P --grpc_port Q
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import kserve  # type: ignore[import-not-found]
import numpy as np
from kserve import InferOutput, InferRequest, InferResponse  # type: ignore[import-not-found]

MODEL = "py_add"


class AddSub(kserve.Model):  # type: ignore[misc]
    """The same numpy work as bench/models/py_add/1/model.py."""

    def __init__(self) -> None:
        super().__init__(MODEL)
        self.ready = True

    async def predict(
        self, payload: InferRequest, headers: Any = None, response_headers: Any = None
    ) -> InferResponse:
        a = payload.inputs[0].as_numpy().astype(np.float32)
        b = payload.inputs[1].as_numpy().astype(np.float32)
        outputs = []
        for name, value in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
            out = InferOutput(name=name, shape=list(value.shape), datatype="FP32")
            out.set_data_from_numpy(value, binary_data=False)
            outputs.append(out)
        return InferResponse(response_id=payload.id or "", model_name=MODEL, infer_outputs=outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http_port", type=int, required=True)
    parser.add_argument("--grpc_port", type=int, required=True)
    args = parser.parse_args()
    server = kserve.ModelServer(
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        workers=1,
        enable_latency_logging=False,
    )
    # Its gRPC interceptor logs every request at INFO; ascend-serve logs none, so neither does it.
    logging.getLogger("kserve").setLevel(logging.WARNING)
    server.start([AddSub()])


if __name__ == "__main__":
    main()
