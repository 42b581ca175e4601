"""The latency floor: a server that answers from memory, over the server's own stacks.

At concurrency 1 the served p50 also holds perf_analyzer's own client work, loopback TCP and the
frontend stack (uvloop with uvicorn's httptools protocol for HTTP, grpc.aio for gRPC), which no
server code on top of them can remove. This module serves canned answers, captured from the
real server earlier in the same run, over those same stacks; driven by the same perf_analyzer
flags it measures that floor, so the report can say how much of the latency is the stack's and
how much is the server's (decode, validation, the hop to the instance thread and back, encode).
It answers for every model captured (`simple` and the Python model `py_add` in bench/run.py), each
with its own captured answers and its own statistics counter.

Run as `python -m bench.floor --canned FILE --http-port P --grpc-port Q` (bench/run.py does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import Message

from protocol.proto import grpc_service_pb2 as pb
from protocol.proto import grpc_service_pb2_grpc as service

# gRPC methods perf_analyzer calls, with their response types.
_GRPC_ANSWERS: dict[str, type[Message]] = {
    "ServerMetadata": pb.ServerMetadataResponse,
    "ServerLive": pb.ServerLiveResponse,
    "ServerReady": pb.ServerReadyResponse,
    "ModelReady": pb.ModelReadyResponse,
    "ModelMetadata": pb.ModelMetadataResponse,
    "ModelConfig": pb.ModelConfigResponse,
    "ModelStatistics": pb.ModelStatisticsResponse,
    "ModelInfer": pb.ModelInferResponse,
}


def capture(http_base: str, grpc_target: str, model: str) -> dict[str, Any]:
    """The real server's answers to what perf_analyzer asks, for both protocols: metadata,
    config, statistics, and one batch-1 inference with binary inputs and outputs."""
    canned: dict[str, Any] = {"model": model, "http": {}, "grpc": {}}
    with httpx.Client(base_url=http_base, timeout=10.0) as client:
        for key, path in (
            ("server", "/v2"),
            ("metadata", f"/v2/models/{model}"),
            ("config", f"/v2/models/{model}/config"),
            ("stats", f"/v2/models/{model}/stats"),
        ):
            canned["http"][key] = client.get(path).content
        metadata = json.loads(canned["http"]["metadata"])
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": t["name"],
                        "datatype": t["datatype"],
                        "shape": [1, *t["shape"][1:]],
                        "parameters": {"binary_data_size": _zeros(t).nbytes},
                    }
                    for t in metadata["inputs"]
                ],
                "outputs": [
                    {"name": t["name"], "parameters": {"binary_data": True}}
                    for t in metadata["outputs"]
                ],
            }
        ).encode()
        body = header + b"".join(_zeros(t).tobytes() for t in metadata["inputs"])
        reply = client.post(
            f"/v2/models/{model}/infer",
            content=body,
            headers={
                "Inference-Header-Content-Length": str(len(header)),
                "Accept-Encoding": "identity",
            },
        )
        reply.raise_for_status()
        canned["http"]["infer"] = reply.content
        canned["http"]["infer_header_length"] = reply.headers["inference-header-content-length"]
    with grpc.insecure_channel(grpc_target) as channel:
        stub = service.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name=model)
        for tensor in metadata["inputs"]:
            request.inputs.add(
                name=tensor["name"], datatype=tensor["datatype"], shape=[1, *tensor["shape"][1:]]
            )
            request.raw_input_contents.append(_zeros(tensor).tobytes())
        calls = {
            "ServerMetadata": pb.ServerMetadataRequest(),
            "ServerLive": pb.ServerLiveRequest(),
            "ServerReady": pb.ServerReadyRequest(),
            "ModelReady": pb.ModelReadyRequest(name=model),
            "ModelMetadata": pb.ModelMetadataRequest(name=model),
            "ModelConfig": pb.ModelConfigRequest(name=model),
            "ModelStatistics": pb.ModelStatisticsRequest(name=model),
            "ModelInfer": request,
        }
        for method, message in calls.items():
            canned["grpc"][method] = getattr(stub, method)(message).SerializeToString()
    return canned


def _zeros(tensor: dict[str, Any]) -> np.ndarray:
    dtypes = {"INT32": np.int32, "FP32": np.float32, "INT64": np.int64}
    return np.zeros([1, *tensor["shape"][1:]], dtype=dtypes[tensor["datatype"]])


def _models(canned: Any) -> list[dict[str, Any]]:
    """One capture (a dict) or several (a list of them)."""
    return list(canned) if isinstance(canned, (list, tuple)) else [canned]


def http_app(canned: Any) -> Any:
    """An ASGI app that answers every path from memory (the infer POST included)."""
    models = _models(canned)
    json_type = [(b"content-type", b"application/json")]
    answers = {"/v2": (models[0]["http"]["server"], json_type)}
    stats: dict[str, tuple[dict[str, Any], list[int]]] = {}  # path -> (template, served)
    counters: dict[str, list[int]] = {}  # infer path -> served
    for entry in models:
        model, http = entry["model"], entry["http"]
        served = [0]
        counters[f"/v2/models/{model}/infer"] = served
        stats[f"/v2/models/{model}/stats"] = (json.loads(http["stats"]), served)
        answers[f"/v2/models/{model}/infer"] = (
            http["infer"],
            [
                (b"content-type", b"application/octet-stream"),
                (b"inference-header-content-length", http["infer_header_length"].encode()),
            ],
        )
        for key, path in (
            ("metadata", f"/v2/models/{model}"),
            ("config", f"/v2/models/{model}/config"),
        ):
            answers[path] = (http[key], json_type)

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        path = scope["path"]
        if path in stats:
            template, served = stats[path]
            body = json.dumps(_counted(template, served[0])).encode()
            headers = json_type
        else:
            counter = counters.get(path)
            if counter is not None:
                counter[0] += 1
            body, headers = answers.get(path, (b"", []))
        status = 200 if path in answers or path in stats else 404
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


def _counted(stats: dict[str, Any], served: int) -> dict[str, Any]:
    """The captured statistics with every count set to the requests this server answered
    (perf_analyzer refuses statistics that do not move), durations scaled alike."""

    def scale(duration: dict[str, int], count: int) -> dict[str, int]:
        per_call = duration["ns"] // duration["count"] if duration["count"] else 0
        return {"count": count, "ns": per_call * count}

    models = []
    for entry in stats["model_stats"]:
        entry = dict(entry, inference_count=served, execution_count=served)
        entry["inference_stats"] = {
            key: scale(value, served if value["count"] else 0)
            for key, value in entry["inference_stats"].items()
        }
        entry["batch_stats"] = [
            {
                key: (scale(value, served) if isinstance(value, dict) else value)
                for key, value in batch.items()
            }
            for batch in entry["batch_stats"][:1]
        ]
        models.append(entry)
    return {"model_stats": models}


def grpc_servicer(canned: Any) -> service.GRPCInferenceServiceServicer:
    """A servicer whose every method perf_analyzer uses returns its captured answer for the
    model asked about (the statistics counting what this server answered for it)."""
    models = {c["model"]: c for c in _models(canned)}
    first = next(iter(models))
    methods: dict[str, Callable[..., Awaitable[Any]]] = {}
    for name, kind in _GRPC_ANSWERS.items():
        answers = {model: kind.FromString(c["grpc"][name]) for model, c in models.items()}

        async def method(self: Any, request: Any, context: Any, answers: Any = answers) -> Any:
            return answers.get(getattr(request, "name", ""), answers[first])

        methods[name] = method
    templates = {model: json.loads(c["http"]["stats"]) for model, c in models.items()}
    served = dict.fromkeys(models, 0)
    infer_answers = {
        model: pb.ModelInferResponse.FromString(c["grpc"]["ModelInfer"])
        for model, c in models.items()
    }

    async def model_infer(self: Any, request: Any, context: Any) -> Any:
        model = request.model_name if request.model_name in models else first
        served[model] += 1
        return infer_answers[model]

    async def model_statistics(self: Any, request: Any, context: Any) -> Any:
        model = request.name if request.name in models else first
        return json_format.ParseDict(
            _counted(templates[model], served[model]),
            pb.ModelStatisticsResponse(),
            ignore_unknown_fields=True,
        )

    methods.update(ModelInfer=model_infer, ModelStatistics=model_statistics)
    return type("CannedServicer", (service.GRPCInferenceServiceServicer,), methods)()


async def serve(canned: Any, host: str, http_port: int, grpc_port: int) -> None:
    import uvicorn

    server = grpc.aio.server()
    service.add_GRPCInferenceServiceServicer_to_server(grpc_servicer(canned), server)
    server.add_insecure_port(f"{host}:{grpc_port}")
    await server.start()
    config = uvicorn.Config(
        http_app(canned),
        host=host,
        port=http_port,
        loop="none",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )
    try:
        await uvicorn.Server(config).serve()
    finally:
        await server.stop(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--canned", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    args = parser.parse_args(argv)
    canned = pickle.loads(args.canned.read_bytes())
    runner: Callable[[Coroutine[Any, Any, None]], None]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(serve(canned, args.host, args.http_port, args.grpc_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
