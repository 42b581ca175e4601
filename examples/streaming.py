"""The streaming examples: a decoupled Python model that emits one token per response, and a
BLS model that calls it.

Usage::

    from examples.streaming import build_streaming
    build_streaming(repo)          # writes token_stream/ and token_join/

===============  ==========================================================================
``token_stream`` Python, decoupled. text_input BYTES [1] (and optional max_tokens INT32 [1])
                 -> one response per word of the text: text_output BYTES [1] (the word) and
                 index INT32 [1]; then a flag-only final response. The words are sent from a
                 thread after `execute` returned; a request parameter `delay_ms` paces them,
                 and a cancelled request stops early.
``token_join``   Python, BLS. text_input BYTES [1] -> text_output BYTES [1] (the words it got
                 back from `token_stream` through `exec(decoupled=True)`, joined by spaces)
                 and count INT32 [1].
===============  ==========================================================================

Both are written against Triton's python backend API as documented, so they also run in Triton.
"""

from __future__ import annotations

from pathlib import Path

STREAMING_MODELS = ("token_stream", "token_join")

TOKEN_STREAM_MODEL = '''"""Streams its input's words back, one response each (a mock tokenizer)."""
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("token_stream must be decoupled")
        self.threads = []

    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            limit = pb_utils.get_input_tensor_by_name(request, "max_tokens")
            words = text.reshape(-1)[0].decode("utf-8").split()
            if limit is not None:
                words = words[:max(0, int(limit.as_numpy().reshape(-1)[0]))]
            delay = float(json.loads(request.parameters()).get("delay_ms", 0)) / 1000.0
            thread = threading.Thread(target=self.stream,
                                      args=(request, request.get_response_sender(), words,
                                            delay), daemon=True)
            thread.start()
            self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        return None  # decoupled: the answers go through the response senders

    def stream(self, request, sender, words, delay):
        for index, word in enumerate(words):
            if request.is_cancelled():
                break
            if delay:
                time.sleep(delay)
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", np.array([word.encode("utf-8")], dtype=object)),
                pb_utils.Tensor("index", np.array([index], dtype=np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join(timeout=5)
'''

TOKEN_JOIN_MODEL = '''"""Calls token_stream (BLS, decoupled) and joins the words it streams back."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input")
            call = pb_utils.InferenceRequest(model_name="token_stream", inputs=[text],
                                             requested_output_names=["text_output"])
            words = []
            error = None
            for answer in call.exec(decoupled=True):
                if answer.has_error():
                    error = answer.error()
                    break
                token = pb_utils.get_output_tensor_by_name(answer, "text_output")
                if token is not None:  # the last answer is empty: it only says "final"
                    words.append(token.as_numpy().reshape(-1)[0].decode("utf-8"))
            if error is not None:
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", np.array([" ".join(words).encode("utf-8")],
                                                        dtype=object)),
                pb_utils.Tensor("count", np.array([len(words)], dtype=np.int32))]))
        return responses
'''

TOKEN_STREAM_CONFIG = """name: "token_stream"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "index" data_type: TYPE_INT32 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

TOKEN_JOIN_CONFIG = """name: "token_join"
backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "count" data_type: TYPE_INT32 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)


def build_streaming(repo: Path) -> list[Path]:
    """Write both models into `repo`; returns their directories."""
    written = []
    for name, source, config in (
        ("token_stream", TOKEN_STREAM_MODEL, TOKEN_STREAM_CONFIG),
        ("token_join", TOKEN_JOIN_MODEL, TOKEN_JOIN_CONFIG),
    ):
        _write(repo / name / "1" / "model.py", source)
        _write(repo / name / "config.pbtxt", config)
        written.append(repo / name)
    return written
