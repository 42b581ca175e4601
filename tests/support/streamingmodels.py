"""Python test models for decoupled streaming, response senders and BLS
(tests/e2e/streaming/test_decoupled.py, tests/e2e/python_models/test_bls.py). Each is written
against Triton's python backend API as documented."""

from __future__ import annotations

from pathlib import Path

from harness.testmodels import write_python_model

# Sends COUNT responses (OUT = index), paced by the request parameter `delay_ms`; `error_at`
# makes that response an error; `return_list` makes execute wrongly return responses. After
# FINAL it tries to send once more and logs what the sender said. It logs a cancellation.
CHATTY_MODEL = """
import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily("chatty_tokens_total", "Tokens chatty sent",
                                       pb_utils.MetricFamily.COUNTER)
        self.tokens = family.Metric(labels={"model": args["model_name"]})
        pb_utils.Logger.log_info(f"chatty worker pid {os.getpid()}")

    def execute(self, requests):
        for request in requests:
            count = pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()
            count = int(count.reshape(-1)[0])
            params = json.loads(request.parameters())
            if params.get("return_list"):
                return [pb_utils.InferenceResponse([]) for _ in requests]
            sender = request.get_response_sender()
            threading.Thread(target=self.run, args=(request, sender, count, params),
                             daemon=True).start()
        return None

    def run(self, request, sender, count, params):
        delay = float(params.get("delay_ms", 0)) / 1000.0
        names = request.requested_output_names()
        for index in range(count):
            if request.is_cancelled():
                pb_utils.Logger.log_info(f"chatty cancelled at {index}")
                break
            if delay:
                time.sleep(delay)
            if index == params.get("error_at", -1):
                sender.send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"token {index} failed")))
                continue
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([index], dtype=np.int32)),
                 pb_utils.Tensor("NAMES", np.array([",".join(names).encode()], dtype=object))],
                parameters={"index": index}))
            self.tokens.increment(1)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        try:
            sender.send(pb_utils.InferenceResponse([]))
        except pb_utils.TritonModelException as exc:
            pb_utils.Logger.log_info(f"chatty after final: {exc}")
"""

CHATTY_CONFIG = """
name: "chatty"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "NAMES" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# Not decoupled, but answers through its response sender, then misuses it.
SENDER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
            try:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
            except pb_utils.TritonModelException as exc:
                pb_utils.Logger.log_info(f"sender second send: {exc}")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

SENDER_CONFIG = """
name: "sender"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# Sends COUNT responses of 256 KiB each as fast as its sender lets it (a buffer of 4).
FLOOD_MODEL = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

CHUNK = np.ones(256 * 1024, dtype=np.int8)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()
            count = int(count.reshape(-1)[0])
            threading.Thread(target=self.run, args=(request, request.get_response_sender(), count),
                             daemon=True).start()
        return None

    def run(self, request, sender, count):
        for index in range(count):
            if request.is_cancelled():
                pb_utils.Logger.log_info(f"flood cancelled after {index}")
                break
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("DATA", CHUNK)]))
            pb_utils.Logger.log_info(f"flood sent {index + 1}")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

FLOOD_CONFIG = """
name: "flood"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
parameters { key: "response_buffer_size" value { string_value: "4" } }
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "DATA" data_type: TYPE_INT8 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# BLS: calls `simple` (ONNX) with X as INPUT0 and ones as INPUT1, in the way `mode` says;
# ERR carries the error text the call got back ("" when none).
BLS_MODEL = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


def call(model, x, names=("OUTPUT0",)):
    return pb_utils.InferenceRequest(
        model_name=model, requested_output_names=list(names),
        inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", np.ones_like(x))])


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()
            mode = mode.reshape(-1)[0].decode()
            out, err = np.zeros_like(x), ""
            if mode == "exec":
                answer = call("simple", x).exec()
                out = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            elif mode == "async":
                first, second = await asyncio.gather(call("simple", x).async_exec(),
                                                     call("simple", x + 1).async_exec())
                out = (pb_utils.get_output_tensor_by_name(first, "OUTPUT0").as_numpy()
                       + pb_utils.get_output_tensor_by_name(second, "OUTPUT0").as_numpy())
            elif mode == "async_stream":  # chatty's 3 answers, then the empty final one
                stream = await pb_utils.InferenceRequest(
                    model_name="chatty", requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("COUNT", np.array([3], dtype=np.int32))],
                ).async_exec(decoupled=True)
                answers = list(stream)
                values = [int(a.output_tensors()[0].as_numpy()[0]) for a in answers[:-1]]
                out[0, :len(values)] = values
                err = f"{len(answers)} answers, last empty: {not answers[-1].output_tensors()}"
            elif mode == "stop_early":  # two answers of a long stream, then cancel the call
                stream = pb_utils.InferenceRequest(
                    model_name="chatty", requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("COUNT", np.array([100000], dtype=np.int32))],
                    parameters={"delay_ms": 5}).exec(decoupled=True)
                out[0, :2] = [int(next(stream).output_tensors()[0].as_numpy()[0])
                              for _ in range(2)]
                stream.cancel()
            else:
                target = {"unknown": "nope", "decoupled": "chatty", "bad_input": "simple"}[mode]
                request_ = call(target, x[:, :3] if mode == "bad_input" else x)
                answer = request_.exec()
                err = answer.error().message() if answer.has_error() else ""
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", out.astype(np.int32)),
                pb_utils.Tensor("ERR", np.array([err.encode()], dtype=object))],
                parameters={"mode": mode, "caller": request.request_id()}))
        return responses
"""

BLS_CONFIG = """
name: "bls"
backend: "python"
max_batch_size: 0
input [
  { name: "X" data_type: TYPE_INT32 dims: [ 1, 16 ] },
  { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1, 16 ] },
  { name: "ERR" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


# An ensemble whose one step is the decoupled example `token_stream`.
WORDS_CONFIG = """
name: "words"
platform: "ensemble"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "WORD" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling {
  step [ {
    model_name: "token_stream"
    model_version: -1
    input_map { key: "text_input" value: "TEXT" }
    output_map { key: "text_output" value: "WORD" }
  } ]
}
"""


def build_streaming_repository(repo: Path) -> Path:
    """The example `simple` and streaming models with the test models above: the repository
    the streaming, generate and BLS e2e tests serve."""
    from examples.build_repository import build_simple
    from examples.streaming import build_streaming

    build_simple(repo)
    build_streaming(repo)
    write_streaming_models(repo)
    return repo


def write_streaming_models(repo: Path) -> None:
    """chatty, sender, flood and bls (which calls the example `simple`, built separately)."""
    for name, source, config in (
        ("chatty", CHATTY_MODEL, CHATTY_CONFIG),
        ("sender", SENDER_MODEL, SENDER_CONFIG),
        ("flood", FLOOD_MODEL, FLOOD_CONFIG),
        ("bls", BLS_MODEL, BLS_CONFIG),
    ):
        write_python_model(repo, name, source, config)
    (repo / "words" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "words" / "config.pbtxt").write_text(WORDS_CONFIG)
