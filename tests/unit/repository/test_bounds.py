"""Every number a config.pbtxt or a load override sets that the server allocates, loops or
waits in proportion to is checked before the work (repository/bounds.py): just under its bound
loads, just over is refused with a reason naming the field and the bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from repository.bounds import ModelBounds
from repository.config import ConfigError, normalize, parse_config_text

SMALL = ModelBounds(
    max_batch_size=64,
    max_instances=8,
    max_sequence_slots=32,
    max_warmup_requests=100,
    max_config_tensor_bytes=4096,
    max_response_ring_bytes=1 << 20,
    max_delay_secs=2.0,
)
TENSORS = (
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "O" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
)


def _normalize(tmp_path: Path, text: str, backend: str = "identity") -> None:
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    config = parse_config_text(
        f'backend: "{backend}"\n' + TENSORS + text, model_dir / "config.pbtxt"
    )
    normalize(config, "m", model_dir, [], auto_complete=False, bounds=SMALL)


def _warmup(batch_size: int, count: int, dims: str = "4") -> str:
    return (
        f'model_warmup [ {{ name: "w" batch_size: {batch_size} count: {count} '
        f'inputs {{ key: "I" value {{ data_type: TYPE_FP32 dims: [ {dims} ] zero_data: true }} }} '
        f"}} ]\n"
    )


CASES = [
    # (field, text just under the bound, text just over, words the refusal must contain)
    (
        "max_batch_size",
        "max_batch_size: 64\n",
        "max_batch_size: 65\n",
        ["max_batch_size 65", "64", "--model-max-batch-size"],
    ),
    (
        "instance_group count",
        "instance_group [ { kind: KIND_CPU count: 8 } ]\n",
        "instance_group [ { kind: KIND_CPU count: 9 } ]\n",
        ["instance_group", "count", "9", "8", "--model-max-instances"],
    ),
    (
        "instances over all groups",
        "instance_group [ { kind: KIND_GPU count: 4 gpus: [ 0, 1 ] } ]\n",
        "instance_group [ { kind: KIND_GPU count: 3 gpus: [ 0, 1, 2 ] } ]\n",
        ["instances", "9", "8", "--model-max-instances"],
    ),
    (
        "sequence direct slots",
        "max_batch_size: 32\nsequence_batching { direct { } }\n",
        "max_batch_size: 33\nsequence_batching { direct { } }\n",
        ["sequence", "33", "32", "--model-max-sequence-slots"],
    ),
    (
        "sequence slots over instances",
        "max_batch_size: 16\nsequence_batching { direct { } }\n"
        "instance_group [ { kind: KIND_CPU count: 2 } ]\n",
        "max_batch_size: 16\nsequence_batching { direct { } }\n"
        "instance_group [ { kind: KIND_CPU count: 3 } ]\n",
        ["sequence", "48", "32", "--model-max-sequence-slots"],
    ),
    (
        "max_candidate_sequences",
        "max_batch_size: 4\nsequence_batching { oldest { max_candidate_sequences: 32 } }\n",
        "max_batch_size: 4\nsequence_batching { oldest { max_candidate_sequences: 33 } }\n",
        ["max_candidate_sequences 33", "32", "--model-max-sequence-slots"],
    ),
    (
        "sequence state bytes",
        'max_batch_size: 4\nsequence_batching { direct { } state [ { input_name: "SI" '
        'output_name: "SO" data_type: TYPE_FP32 dims: [ 1024 ] } ] }\n',
        'max_batch_size: 4\nsequence_batching { direct { } state [ { input_name: "SI" '
        'output_name: "SO" data_type: TYPE_FP32 dims: [ 1025 ] } ] }\n',
        ["state 'SI'", "4100", "4096", "--model-config-max-tensor-bytes"],
    ),
    (
        "warm-up batch_size",
        "max_batch_size: 64\n" + _warmup(64, 1),
        "max_batch_size: 64\n" + _warmup(65, 1),
        ["model_warmup 'w'", "batch_size 65", "max_batch_size 64"],
    ),
    (
        "warm-up count",
        "max_batch_size: 64\n" + _warmup(1, 100),
        "max_batch_size: 64\n" + _warmup(1, 101),
        ["model_warmup 'w'", "count 101", "100", "--model-warmup-max-requests"],
    ),
    (
        "warm-up batch_size x count",
        "max_batch_size: 64\n" + _warmup(50, 2),
        "max_batch_size: 64\n" + _warmup(51, 2),
        ["model_warmup", "102", "100", "--model-warmup-max-requests"],
    ),
    (
        "warm-up input bytes",
        "max_batch_size: 64\n" + _warmup(1, 1, "1024"),
        "max_batch_size: 64\n" + _warmup(1, 1, "1025"),
        ["model_warmup 'w' input 'I'", "4100", "4096", "--model-config-max-tensor-bytes"],
    ),
    (
        "dynamic_batching max_queue_delay_microseconds",
        "max_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 2000000 }\n",
        "max_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 2000001 }\n",
        ["max_queue_delay_microseconds 2000001", "2000000", "--model-max-delay-secs"],
    ),
    (
        "sequence oldest max_queue_delay_microseconds",
        "max_batch_size: 4\n"
        "sequence_batching { oldest { max_queue_delay_microseconds: 2000000 } }\n",
        "max_batch_size: 4\n"
        "sequence_batching { oldest { max_queue_delay_microseconds: 2000001 } }\n",
        ["oldest max_queue_delay_microseconds 2000001", "--model-max-delay-secs"],
    ),
    (
        "max_sequence_idle_microseconds",
        "max_batch_size: 4\nsequence_batching { max_sequence_idle_microseconds: 2000000 }\n",
        "max_batch_size: 4\nsequence_batching { max_sequence_idle_microseconds: 2000001 }\n",
        ["max_sequence_idle_microseconds 2000001", "2000000", "--model-max-delay-secs"],
    ),
    (
        "response_ring_bytes",
        'parameters { key: "response_ring_bytes" value { string_value: "1048576" } }\n',
        'parameters { key: "response_ring_bytes" value { string_value: "1048577" } }\n',
        ["response_ring_bytes", "1048577", "1048576", "--python-max-response-ring-bytes"],
    ),
]


@pytest.mark.parametrize("field, under, over, words", CASES, ids=[c[0] for c in CASES])
def test_just_under_loads_and_just_over_is_refused_naming_field_and_bound(
    tmp_path: Path, field: str, under: str, over: str, words: list[str]
) -> None:
    backend = "python" if "ring" in field else "identity"
    _normalize(tmp_path, under, backend)
    with pytest.raises(ConfigError) as info:
        _normalize(tmp_path, over, backend)
    message = str(info.value)
    assert message.startswith("model 'm': ")
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    "key, value",
    [
        ("response_ring_bytes", "1e15"),
        ("response_ring_bytes", "inf"),
        ("response_ring_bytes", "nan"),
        ("response_ring_bytes", "100"),
        ("response_buffer_size", "2147483647"),
        ("response_buffer_size", "0"),
        ("response_send_timeout_s", "inf"),
        ("response_send_timeout_s", "-1"),
        ("max_worker_crashes", "1e12"),
        ("worker_crash_window_s", "nan"),
    ],
)
def test_python_parameters_out_of_range_are_refused(tmp_path: Path, key: str, value: str) -> None:
    text = f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
    with pytest.raises(ConfigError, match=f"parameter '{key}'.*must be"):
        _normalize(tmp_path, text, "python")


@pytest.mark.parametrize("key", ["intra_op_thread_count", "inter_op_thread_count"])
def test_onnxruntime_thread_counts_are_bounded(tmp_path: Path, key: str) -> None:
    text = f'parameters {{ key: "{key}" value {{ string_value: "2147483647" }} }}\n'
    with pytest.raises(
        ConfigError, match=f"parameter '{key}' must be an integer between 0 and 1024"
    ):
        _normalize(tmp_path, text, "onnxruntime")


@pytest.mark.parametrize("key", ["execute_delay_ms", "creation_delay_sec"])
def test_identity_delays_are_bounded(tmp_path: Path, key: str) -> None:
    text = f'parameters {{ key: "{key}" value {{ string_value: "1e18" }} }}\n'
    with pytest.raises(ConfigError, match=f"parameter '{key}'"):
        _normalize(tmp_path, text, "identity")


def test_issue_values_are_refused_with_default_bounds(tmp_path: Path) -> None:
    """The issue's numbers, under the default bounds, each refused before any allocation."""
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    for text in (
        "max_batch_size: 4000000\nsequence_batching { direct { } }\n",
        "max_batch_size: 2147483647\nsequence_batching { direct { } }\n",
        "max_batch_size: 8\nsequence_batching { oldest { max_candidate_sequences: 2147483647 } }\n",
        "max_batch_size: 8\n" + _warmup(2147483647, 1),
        "max_batch_size: 8\n" + _warmup(1, 4294967295),
        "instance_group [ { kind: KIND_CPU count: 2147483647 } ]\n",
    ):
        config = parse_config_text(
            'backend: "identity"\n' + TENSORS + text, model_dir / "config.pbtxt"
        )
        with pytest.raises(ConfigError, match="exceeds|must be"):
            normalize(config, "m", model_dir, [], auto_complete=False)
