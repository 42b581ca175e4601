"""`backend: "identity"`: each output is a copy of its input, as Triton's identity backend.

Why it exists: NVIDIA's qa suites (L0_batcher, L0_model_queue, L0_lifecycle) and many users'
smoke tests describe their test models with Triton's C++ identity backend. Serving the same
config.pbtxt unchanged lets those suites run against this server as they run against Triton.
Output `OUTPUT<n>` is input `INPUT<n>`; other names pair up in config order. Parameters, as the
C++ backend reads them: `execute_delay_ms` (sleep in every execute), multiplied for instance i
by `instance_wise_delay_multiplier` x i when that is set (at least x1, so instance 0 keeps the
base delay), and `creation_delay_sec` (sleep while the model loads).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from backends.base import Backend, BackendError, ParameterBound

if TYPE_CHECKING:
    from protocol.types import InferRequest


def _parameter(config, key: str, default: float = 0.0) -> float:
    if key not in config.parameters:
        return default
    text = config.parameters[key].string_value
    try:
        return float(text)
    except ValueError:
        raise BackendError(
            f"model '{config.name}': parameter '{key}' must be a number, got '{text}'"
        ) from None


class IdentityBackend(Backend):
    backend_name = "identity"
    default_model_filename = ""
    # Like the C++ backend, each request of a batch is copied on its own (one execute call per
    # batch): ragged inputs keep each request's shape, nothing is joined.
    takes_request_lists = True
    # Waits on each execute and on load: bounded so that no load or request waits for ever.
    parameter_bounds = {
        "execute_delay_ms": ParameterBound(0.0, 3_600_000.0),
        "instance_wise_delay_multiplier": ParameterBound(0.0, 1000.0),
        "creation_delay_sec": ParameterBound(0.0, 3600.0),
    }

    def load(self) -> None:
        config = self.config
        delay_ms = _parameter(config, "execute_delay_ms")
        multiplier = _parameter(config, "instance_wise_delay_multiplier")
        if multiplier > 0:
            multiplier *= self.instance.index
        self._delay_s = delay_ms * max(multiplier, 1.0) / 1000.0
        outputs = [spec.name for spec in config.output]
        inputs = [spec.name for spec in config.input]
        self._sources: dict[str, str] = {}
        for position, name in enumerate(outputs):
            source = "INPUT" + name[len("OUTPUT") :] if name.startswith("OUTPUT") else ""
            if source not in inputs:
                if position >= len(inputs):
                    raise BackendError(
                        f"model '{config.name}': output '{name}' has no input to "
                        f"copy (identity pairs OUTPUT<n> with INPUT<n>)"
                    )
                source = inputs[position]
            self._sources[name] = source
        creation = _parameter(config, "creation_delay_sec")
        if creation > 0:
            time.sleep(creation)

    def execute(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.execute_requests([inputs])[0]  # type: ignore[return-value]  # never an error

    def execute_requests(
        self,
        requests: Sequence[Mapping[str, np.ndarray]],
        details: Sequence[InferRequest] | None = None,
    ) -> list[dict[str, np.ndarray] | BaseException]:
        if self._delay_s > 0:
            time.sleep(self._delay_s)  # once per execute, as the C++ backend
        return [
            {output: inputs[source] for output, source in self._sources.items() if source in inputs}
            for inputs in requests
        ]
