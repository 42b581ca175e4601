"""A deliberately leaking Python model: the negative control of bench/soak/run.py.

Answers like bench/models/py_add (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1), and on
every request keeps `leak_bytes` of freshly written memory (so it is resident, not just
reserved) and opens `leak_fds` descriptors on /dev/null, none of them ever released, up to the
`leak_max_*` caps. Writes its pid to `worker.pid` in the model directory so the soak never kills
this worker (a restart would free the leak it is meant to show)."""

import json
import os

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})

        def number(key, default):
            return int(parameters.get(key, {}).get("string_value", default))

        self.leak_bytes = number("leak_bytes", 256 << 10)
        self.leak_fds = number("leak_fds", 1)
        self.max_bytes = number("leak_max_bytes", 256 << 20)
        self.max_fds = number("leak_max_fds", 256)
        self.kept = []
        self.kept_bytes = 0
        self.fds = []
        path = os.path.join(args["model_repository"], "worker.pid")
        with open(path + ".tmp", "w") as handle:
            handle.write(str(os.getpid()))
        os.replace(path + ".tmp", path)

    def _leak(self):
        if self.kept_bytes + self.leak_bytes <= self.max_bytes:
            self.kept.append(b"\x01" * self.leak_bytes)  # written, so resident
            self.kept_bytes += self.leak_bytes
        for _ in range(self.leak_fds):
            if len(self.fds) >= self.max_fds:
                break
            try:
                self.fds.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break

    def execute(self, requests):
        responses = []
        for request in requests:
            self._leak()
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                        pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32)),
                    ]
                )
            )
        return responses
