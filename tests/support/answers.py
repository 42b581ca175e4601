"""One request's success as the metrics receive it: a batch of one (scheduler/stats.py)."""

from __future__ import annotations

from scheduler.stats import AnsweredBatch


def one_success(
    total_ns: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int
) -> AnsweredBatch:
    return AnsweredBatch(
        [(total_ns, queue_ns)], total_ns, queue_ns, input_ns, infer_ns, output_ns, False
    )
