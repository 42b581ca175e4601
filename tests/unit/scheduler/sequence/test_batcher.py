"""The sequence batcher through its public API, on a manual clock with a fake stateful model.

The fake model records, for every executed batch, each row's INPUT, START, END, READY and
CORRID, and answers OUTPUT = ACC_OUT = ACC_IN + INPUT * READY, so the implicit-state tests see
the running sum the server carried between requests.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from backends.base import Backend
from protocol.errors import InvalidArgument
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.types import InferRequest, Tensor
from scheduler.clock import ManualClock
from scheduler.factory import create_scheduler
from scheduler.interface import VersionSpec
from scheduler.sequence.batcher import SequenceBatcher
from scheduler.stats import VersionStatistics
from tests.support.batcher_harness import Observer

MS = 1_000_000
CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0.5, 1.5 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


class Rows(list):
    """One executed batch: a dict per row."""


class SequenceModel(Backend):
    backend_name = "fake_sequence"
    default_model_filename = "model.fake"
    batches: list
    gate: threading.Event

    def load(self) -> None:
        pass

    def execute(self, inputs):
        assert self.gate.wait(10)
        rows = Rows()
        for i in range(inputs["INPUT"].shape[0]):
            rows.append(
                {
                    name: inputs[name][i].reshape(-1)[0].item()
                    for name in ("INPUT", "START", "END", "READY", "CORRID", "ACC_IN")
                }
            )
        self.batches.append(rows)
        acc = inputs["ACC_IN"] + inputs["INPUT"] * inputs["READY"]
        return {"OUTPUT": acc, "ACC_OUT": acc}


def make_config(
    strategy: str = "direct { }",
    max_batch_size: int = 2,
    instances: int = 1,
    idle_us: int = 100_000,
) -> ModelConfig:
    text = f"""
        name: "seq" backend: "fake" max_batch_size: {max_batch_size}
        input [{{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }}]
        output [{{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }}]
        instance_group [{{ kind: KIND_CPU count: {instances} }}]
        sequence_batching {{ max_sequence_idle_microseconds: {idle_us} {CONTROLS} {strategy} }}
    """
    return text_format.Parse(text, ModelConfig())


class Harness:
    def __init__(self, config: ModelConfig) -> None:
        self.clock = ManualClock(start_ns=1_000 * MS)
        self.batches: list[Rows] = []
        self.gate = threading.Event()
        self.gate.set()
        self.observer = Observer()
        self.stats = VersionStatistics("seq", "1", observer=self.observer)
        backend = type("Model", (SequenceModel,), {"batches": self.batches, "gate": self.gate})
        spec = VersionSpec("seq", 1, config, Path("/none"), Path("/none/1"), backend)
        self.scheduler = create_scheduler(spec, self.stats, clock=self.clock)
        assert isinstance(self.scheduler, SequenceBatcher)

    def submit(
        self, corrid, value: int, start: bool = False, end: bool = False, rows: int = 1
    ) -> asyncio.Future:
        data = np.full((rows, 1), value, dtype=np.int32)
        parameters = {"sequence_id": corrid, "sequence_start": start, "sequence_end": end}
        request = InferRequest(
            "seq",
            parameters=parameters,
            arrival_ns=self.clock.now_ns(),
            inputs=[Tensor("INPUT", "INT32", data.shape, data)],
        )
        return self.scheduler.submit(request)

    async def settle(self) -> None:
        for _ in range(200):
            await asyncio.sleep(0.001)
            if not self.stats.pending and not self.scheduler._running:
                break
        for _ in range(5):
            await asyncio.sleep(0)

    async def advance(self, ns: int) -> None:
        self.clock.advance(ns)
        await self.settle()


async def values(*futures) -> list[int]:
    done = await asyncio.wait_for(asyncio.gather(*futures), 10)
    return [int(response.outputs[0].data.reshape(-1)[0]) for response in done]


@pytest.fixture
async def direct():
    h = Harness(make_config())
    await h.scheduler.start()
    yield h
    await h.scheduler.stop()


async def test_direct_slots_batch_sequences_together_and_carry_state(direct):
    h = direct
    direct.gate.clear()  # hold the instance so both sequences queue up together
    first = [h.submit(7, 1, start=True), h.submit(8, 10, start=True)]
    await asyncio.sleep(0.01)
    second = [h.submit(7, 2), h.submit(8, 20, end=True)]
    h.gate.set()
    assert await values(*first) == [1, 10]
    assert await values(*second) == [3, 30]
    assert await values(h.submit(7, 3, end=True)) == [6]
    await h.settle()
    # Row i of each batch is slot i: sequence 7 in slot 0, 8 in slot 1 (0 = a padding row).
    assert [[row["CORRID"] for row in batch] for batch in h.batches] == [[7], [7, 8], [0, 8], [7]]
    start_row = h.batches[0][0]
    assert (start_row["START"], start_row["END"], start_row["READY"]) == (1.5, 0, 1)
    last = h.batches[-1][0]
    assert (last["START"], last["END"], last["READY"], last["ACC_IN"]) == (0.5, 1, 1, 3)


async def test_empty_slots_are_padded_with_not_ready_requests(direct):
    h = direct
    await values(h.submit(1, 5, start=True), h.submit(2, 6, start=True))
    await h.settle()
    h.batches.clear()
    assert await values(h.submit(2, 1)) == [7]  # only slot 1 has work: slot 0 is padding
    await h.settle()
    assert len(h.batches) == 1
    pad, real = h.batches[0]
    assert (pad["READY"], pad["START"], pad["END"], pad["CORRID"], pad["INPUT"]) == (
        0,
        0.5,
        0,
        0,
        0,
    )
    assert (real["READY"], real["CORRID"], real["ACC_IN"]) == (1, 2, 6)
    snapshot = h.stats.snapshot()
    assert snapshot.inference_count == 3  # padding rows are not inferences
    assert 2 in [b.batch_size for b in snapshot.batch_stats]


async def test_new_sequence_waits_for_a_free_slot(direct):
    h = direct
    await values(h.submit(1, 1, start=True), h.submit(2, 1, start=True))
    waiting = h.submit(3, 100, start=True)  # both slots are held: backlog
    await h.settle()
    assert not waiting.done() and h.stats.pending == 1
    assert h.observer.sequences_active == 3
    assert await values(h.submit(1, 1, end=True)) == [2]
    assert await values(waiting) == [100]  # slot 0 went to sequence 3
    assert await values(h.submit(3, 1, end=True)) == [101]
    assert h.observer.sequences_active == 1


async def test_idle_sequence_is_released_and_its_next_request_needs_start(direct):
    h = direct
    await values(h.submit(1, 1, start=True), h.submit(2, 1, start=True))
    backlog = h.submit(3, 5, start=True)
    await h.settle()
    await h.advance(50 * MS)
    assert await values(h.submit(2, 1)) == [2]  # sequence 2 stays alive
    await h.advance(60 * MS)  # sequence 1 idle for 110 ms > 100 ms: released
    assert h.observer.idle_released == 1
    assert await values(backlog) == [5]  # its slot went to the waiting sequence
    with pytest.raises(InvalidArgument) as error:
        h.submit(1, 1)
    assert error.value.message == (
        "inference request for sequence 1 to model 'seq' must "
        "specify the START flag on the first request of the sequence"
    )
    assert await values(h.submit(3, 1, end=True)) == [6]  # frees slot 0 again
    assert await values(h.submit(1, 4, start=True, end=True)) == [4]


async def test_requests_triton_refuses(direct):
    h = direct
    cases = [
        (
            {"sequence_id": 0},
            "inference request to model 'seq' must specify a non-zero or non-empty correlation ID",
        ),
        (
            {},
            "inference request to model 'seq' must specify a non-zero or non-empty correlation ID",
        ),
        (
            {"sequence_id": 4, "sequence_end": True},
            "inference request for sequence 4 to "
            "model 'seq' must specify the START flag on the first request of the sequence",
        ),
    ]
    for parameters, text in cases:
        data = np.ones((1, 1), dtype=np.int32)
        request = InferRequest(
            "seq", parameters=parameters, inputs=[Tensor("INPUT", "INT32", (1, 1), data)]
        )
        with pytest.raises(InvalidArgument) as error:
            h.scheduler.submit(request)
        assert error.value.message == text
    with pytest.raises(InvalidArgument) as error:
        h.submit(5, 1, start=True, rows=2)
    assert error.value.message == (
        "inference request to model 'seq' must specify batch-size 1 "
        "due to requirements of sequence batcher"
    )
    assert h.stats.snapshot().fail.count == 4


async def test_start_on_a_live_sequence_restarts_it(direct, caplog):
    h = direct
    await values(h.submit(9, 5, start=True), h.submit(9, 5))
    assert await values(h.submit(9, 1, start=True)) == [1]  # state starts again
    assert "sequence 9 for model 'seq' has a conflict" in caplog.text


async def test_oldest_strategy_batches_oldest_sequences_one_request_each():
    h = Harness(
        make_config(
            "oldest { max_candidate_sequences: 3 preferred_batch_size: [ 2 ] "
            "max_queue_delay_microseconds: 5000 }"
        )
    )
    await h.scheduler.start()
    try:
        lone = h.submit(1, 1, start=True)
        await h.settle()
        assert not lone.done()  # waits for the queue delay or a preferred batch
        pair = h.submit(2, 10, start=True)
        assert await values(lone, pair) == [1, 10]
        assert [[row["CORRID"] for row in batch] for batch in h.batches] == [[1, 2]]
        # Two requests of one sequence never share a batch: one runs, the next waits for it.
        futures = [h.submit(1, 2), h.submit(1, 3), h.submit(2, 20)]
        await h.advance(5 * MS)
        await h.advance(5 * MS)
        assert await values(*futures) == [3, 6, 30]
        for batch in h.batches:
            corrids = [row["CORRID"] for row in batch]
            assert len(corrids) == len(set(corrids))
    finally:
        await h.scheduler.stop()


@pytest.mark.parametrize(
    "block, text",
    [
        (
            'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
            "int32_false_true: [0, 1] }, { kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] } "
            "] } ]",
            "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for seq",
        ),
        (
            'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
            'int32_false_true: [0, 1] } ] }, { name: "S" control [ { kind: CONTROL_SEQUENCE_END '
            "int32_false_true: [0, 1] } ] } ]",
            "sequence batching control tensor 'S' is specified for multiple control kinds for seq",
        ),
        (
            'control_input [ { name: "R" control [ { kind: CONTROL_SEQUENCE_READY } ] } ]',
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            "'bool_false_true' for CONTROL_SEQUENCE_READY for seq",
        ),
        (
            'control_input [ { name: "R" control [ { kind: CONTROL_SEQUENCE_READY '
            "int32_false_true: [ 1 ] } ] } ]",
            "sequence batching control 'int32_false_true' must have exactly 2 entries for "
            "CONTROL_SEQUENCE_READY for seq",
        ),
        (
            'control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
            "data_type: TYPE_FP32 } ] } ]",
            "unexpected control data type, expected TYPE_UINT64, TYPE_INT64, TYPE_UINT32, "
            "TYPE_INT32, or TYPE_STRING for CONTROL_SEQUENCE_CORRID for seq",
        ),
        (
            "iterative_sequence: true",
            "sequence batching 'iterative_sequence' is not supported by ascend-serve (model seq)",
        ),
    ],
)
def test_config_errors_are_tritons(block, text):
    from repository.config import ConfigError, validate

    config = text_format.Parse(
        f"""
        name: "seq" backend: "fake" max_batch_size: 2
        input [{{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }}]
        output [{{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }}]
        sequence_batching {{ {block} }}""",
        ModelConfig(),
    )
    with pytest.raises(ConfigError) as error:
        validate(config)
    assert str(error.value) == text


async def test_drain_lets_live_sequences_finish_and_refuses_new_ones(direct):
    h = direct
    assert await values(h.submit(1, 2, start=True)) == [2]
    draining = asyncio.ensure_future(h.scheduler.drain(30))
    await h.settle()
    assert not draining.done()  # sequence 1 is live
    assert h.scheduler.live_sequences() == 1
    with pytest.raises(Exception) as error:
        h.submit(2, 1, start=True)
    assert "is not at ready state" in str(error.value)
    assert await values(h.submit(1, 3)) == [5]
    assert await values(h.submit(1, 4, end=True)) == [9]
    await asyncio.wait_for(draining, 10)
    assert h.scheduler.live_sequences() == 0


async def test_drain_timeout_fails_what_is_left(direct):
    h = direct
    await values(h.submit(1, 2, start=True))
    await h.scheduler.drain(0)
    with pytest.raises(Exception) as error:
        h.submit(1, 1)
    assert "is not at ready state" in str(error.value)
    assert h.scheduler.live_sequences() == 0


def test_dynamic_and_sequence_batching_together_do_not_parse(tmp_path):
    from repository.config import ConfigError, parse_config_text

    with pytest.raises(ConfigError) as error:
        parse_config_text(
            'name: "m" sequence_batching { } dynamic_batching { }', tmp_path / "config.pbtxt"
        )
    assert (
        'Field "dynamic_batching" is specified along with field "sequence_batching", '
        'another member of oneof "scheduling_choice"' in str(error.value)
    )


def test_defaults_are_tritons():
    from repository.config import normalize_common

    config = make_config("oldest { max_candidate_sequences: 2 }", idle_us=0)
    normalize_common(config, "seq")
    assert config.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(config.sequence_batching.oldest.preferred_batch_size) == [2]


async def test_delay_scheduler_hook_holds_the_first_batch():
    h = Harness(make_config())
    h.scheduler._hold = 2  # what TRITONSERVER_DELAY_SCHEDULER=2 sets at startup
    await h.scheduler.start()
    try:
        first = h.submit(1, 1, start=True)
        await h.settle()
        assert not first.done() and not h.batches
        assert await values(first, h.submit(2, 2, start=True)) == [1, 2]
        assert [[row["CORRID"] for row in batch] for batch in h.batches] == [[1, 2]]
    finally:
        await h.scheduler.stop()


async def test_request_timeout_expires_a_backlogged_sequence(direct):
    from protocol.errors import Unavailable

    h = direct
    await values(h.submit(1, 1, start=True), h.submit(2, 1, start=True))
    data = np.ones((1, 1), dtype=np.int32)
    request = InferRequest(
        "seq",
        parameters={"sequence_id": 3, "sequence_start": True, "timeout": 5000},
        arrival_ns=h.clock.now_ns(),
        inputs=[Tensor("INPUT", "INT32", (1, 1), data)],
    )
    waiting = h.scheduler.submit(request)
    await h.advance(6 * MS)
    with pytest.raises(Unavailable) as error:
        await asyncio.wait_for(waiting, 5)
    assert error.value.message == "timeout of the corresponding sequence has been expired"
    assert h.stats.pending == 0
    with pytest.raises(InvalidArgument):  # the expired sequence is unknown
        h.submit(3, 1)
