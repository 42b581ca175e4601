"""protocol/text.py: client text is escaped and cut before an error or a log line shows it."""

from __future__ import annotations

import pytest

from protocol import errors, text


def test_a_normal_name_is_shown_as_it_is() -> None:
    assert text.shown("simple") == "simple"
    assert text.escape_controls("simple_1.onnx") == "simple_1.onnx"


@pytest.mark.parametrize(
    "raw, seen",
    [
        ("sim\nple", "sim\\nple"),
        ("a\rb\tc", "a\\rb\\tc"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("\x85next\u2028line\u2029", "\\x85next\\u2028line\\u2029"),
        ("abc\u202edcba", "abc\\u202edcba"),
        ("it's", "it\\'s"),
    ],
)
def test_controls_and_quotes_are_escaped(raw: str, seen: str) -> None:
    assert text.shown(raw) == seen


def test_a_long_text_is_cut_at_the_echo_limit() -> None:
    shown = text.shown("m" * 100_000)
    assert shown == "m" * text.DEFAULT_ECHO_CHARS + "...(99800 more characters)"
    text.set_echo_limit(20)
    try:
        assert text.shown("m" * 30) == "m" * 20 + "...(10 more characters)"
    finally:
        text.set_echo_limit(text.DEFAULT_ECHO_CHARS)
    with pytest.raises(ValueError):
        text.set_echo_limit(3)


@pytest.mark.parametrize("char", ["m", "\u00e9", "\U0001f600", "\n"])
def test_every_error_message_is_bounded_in_utf8_bytes(char: str) -> None:
    error = errors.InvalidArgument("model '" + char * 100_000 + "'")
    assert len(error.message.encode()) <= text.MAX_ERROR_BYTES
    assert "\n" not in error.message
    assert error.message.endswith("characters in all)")
    assert str(error) == error.message


def test_a_short_error_message_is_unchanged() -> None:
    message = "Request for unknown model: 'simple' is not found"
    assert errors.NotFound(message).message == message


def test_the_flags_and_their_defaults() -> None:
    from server.cli import settings_from_args

    settings = settings_from_args(["--model-repository", "/nonexistent"])
    assert settings.max_echo_chars == text.DEFAULT_ECHO_CHARS
    assert (
        settings.custom_metric_max_families,
        settings.custom_metric_max_series,
        settings.custom_metric_max_labels,
        settings.custom_metric_max_buckets,
        settings.custom_metric_max_text,
    ) == (100, 1000, 16, 64, 1024)
    assert (
        settings_from_args(["--model-repository", "x", "--max-echo-chars", "64"]).max_echo_chars
        == 64
    )
    for bad in ("8", "5000", "many"):
        with pytest.raises(SystemExit):
            settings_from_args(["--model-repository", "x", "--max-echo-chars", bad])
