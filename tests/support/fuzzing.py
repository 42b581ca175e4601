"""What the fuzz tests (tests/e2e/hostile_input/test_fuzz_http.py, test_fuzz_grpc.py) share:
the Hypothesis profile, the request models they start from, and the property every case must
keep. (The HTTP fuzzer's request strategies are in tests/support/fuzzing_http.py.)

The property (issue #13, item 6): input never causes a 5xx (HTTP status below 500; 501 only
for the documented unsupported cases, 503 only for the documented unavailable ones; over gRPC
no INTERNAL / UNKNOWN), the server process stays alive, `/v2/health/live` answers 200 after
every case, and the server logs no unexpected error (a traceback means a bug even when the
answer looked fine, e.g. a stream request answered with an error_message).

The profile comes from the environment: ASCEND_FUZZ=quick (the default, a short run inside
`make test`, the same cases every run) or ASCEND_FUZZ=nightly (`make fuzz`: thousands of cases per
test, failures kept in .hypothesis/ and replayed first next time). ASCEND_FUZZ_EXAMPLES overrides
the base number of cases of either profile.
"""

from __future__ import annotations

import os
import re
from collections import Counter

import httpx
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from harness.serverproc import ROOT, ServerProcess

PROFILE_ENV = "ASCEND_FUZZ"
EXAMPLES_ENV = "ASCEND_FUZZ_EXAMPLES"

_COMMON = dict(
    deadline=None,  # a case's time is bounded by the client timeouts below, not by Hypothesis
    print_blob=True,  # a failure prints @reproduce_failure(...) to replay it exactly
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
# quick draws the same cases every run (derandomize): `make test` is CI's gate and must not fail
# on a case no one drew before; exploring new cases is nightly's job.
settings.register_profile("quick", max_examples=200, database=None, derandomize=True, **_COMMON)
settings.register_profile(
    "nightly",
    max_examples=4000,
    database=DirectoryBasedExampleDatabase(str(ROOT / ".hypothesis")),
    **_COMMON,
)


def fuzz_settings(factor: float = 1.0) -> settings:
    """The selected profile, with `factor` times its base number of cases."""
    name = os.environ.get(PROFILE_ENV, "quick")
    profile = settings.get_profile(name)
    base = int(os.environ.get(EXAMPLES_ENV) or profile.max_examples)
    return settings(profile, max_examples=max(1, int(base * factor)))


# ----- the example models the fuzzers start from (examples/build_repository.py) ------------------
# name -> [(input, datatype, shape of one valid request)]; -1 is filled in by the fuzzers.
MODELS: dict[str, list[tuple[str, str, list[int]]]] = {
    "simple": [("INPUT0", "INT32", [1, 16]), ("INPUT1", "INT32", [1, 16])],
    "simple_batching": [("INPUT0", "INT32", [2, 16]), ("INPUT1", "INT32", [2, 16])],
    "dense_compute_nobatch": [("INPUT", "FP32", [1, 256])],
    "identity_bytes": [("INPUT", "BYTES", [3])],
    "classifier": [("INPUT", "FP32", [1, 3, 32, 32])],
    "pipeline": [("IMAGE", "UINT8", [1, 32, 32, 3])],
    "postprocess": [("PROBABILITIES", "FP32", [1, 10])],
}
OUTPUTS = {
    "simple": ["OUTPUT0", "OUTPUT1"],
    "simple_batching": ["OUTPUT0", "OUTPUT1"],
    "dense_compute_nobatch": ["OUTPUT"],
    "identity_bytes": ["OUTPUT"],
    "classifier": ["PROBABILITIES"],
    "pipeline": ["LABEL", "SCORE"],
    "postprocess": ["LABEL", "SCORE"],
}
DATATYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
]
ODD_NAMES = [
    "",
    " ",
    ".",
    "..",
    "simple ",
    "SIMPLE",
    "simple\x00",
    "simple/../simple",
    "%2e%2e",
    "\u00e9\u4e2d",
    "a" * 300,
    "{model}",
    "stats",
    "versions",
    "-1",
    "\ud7ff",
]
ODD_VERSIONS = ["1", "0", "2", "-1", "01", "999999999999999999999999", "1.0", "abc", "", " 1"]

# What may answer 5xx to a client's input: the documented unavailable / unsupported cases.
ALLOWED_503 = re.compile(
    r"explicit model load / unload is not allowed|Request timeout expired|"
    r"Exceeds maximum queue size|is not at ready state|has no available versions"
)
ALLOWED_501 = re.compile(
    r"'repository_name' specification is not supported|Unsupported compression type|"
    r"trace file location|trace mode can not be updated|log file location"
)
# What the server's log must never show after a case: a bug, even where the answer was fine.
BUG_IN_LOG = re.compile(
    r"unexpected error in|Traceback \(most recent call last\)|"
    r"Exception in ASGI application|Fatal Python error|Segmentation fault"
)


class Watch:
    """Checks the property after each case against one server, reading only new log lines."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.client = httpx.Client(base_url=server.base, timeout=30.0)
        self.log_offset = server.log_path.stat().st_size if server.log_path.exists() else 0
        self.outcomes: Counter = Counter()  # answers seen (status codes, gRPC code names)

    def allowed_http(self, status: int, text: str) -> bool:
        if status < 500:
            return True
        if status == 503:
            return bool(ALLOWED_503.search(text))
        if status == 501:
            return bool(ALLOWED_501.search(text))
        return False

    def after(self, case: str, problem: str | None = None, outcome: object = None) -> None:
        """Fail with `case` (what was sent) if the answer was wrong or the server suffers;
        count `outcome` (the answer's status)."""
        self.outcomes[outcome] += 1
        assert problem is None, f"{problem}\ncase: {case}"
        assert self.server.alive(), (
            f"server died ({self.server.process.returncode})\ncase: {case}\n{self.new_log()}"
        )
        try:
            live = self.client.get("/v2/health/live", timeout=10.0)
        except httpx.HTTPError as exc:
            raise AssertionError(
                f"/v2/health/live failed after the case: {exc!r}\ncase: {case}"
            ) from exc
        assert live.status_code == 200, f"live answered {live.status_code}\ncase: {case}"
        log = self.new_log()
        found = BUG_IN_LOG.search(log)
        assert not found, f"the server logged a bug\ncase: {case}\n{log[-4000:]}"

    def check_variety(self, success: object, refusals: set) -> None:
        """The fuzzers must reach both answers, or they fuzz only one layer: some mutated
        requests still succeed (the inference path ran) and some are refused as invalid."""
        print(f"answers: {dict(self.outcomes.most_common())}")
        if sum(self.outcomes.values()) < 50:
            return  # a run of a few cases (pytest -k, a small ASCEND_FUZZ_EXAMPLES) proves nothing
        assert self.outcomes[success] > 0, self.outcomes
        assert any(self.outcomes[code] > 0 for code in refusals), self.outcomes

    def new_log(self) -> str:
        """What the server logged since the last call (read from where that one stopped)."""
        try:
            with open(self.server.log_path, "rb") as handle:
                handle.seek(self.log_offset)
                data = handle.read()
        except FileNotFoundError:
            return ""
        self.log_offset += len(data)
        return data.decode("utf-8", "replace")

    def close(self) -> None:
        self.client.close()


def describe(value: object, limit: int = 1500) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"
