"""`--rate-limit` and `--rate-limit-resource` as the server reads them, and the one limiter the
server builds from them."""

from __future__ import annotations

import pytest

from scheduler.rate_limiter import RateLimiter, ResourceLimit
from server.app import ServerApp
from server.cli import settings_from_args


def test_the_rate_limiter_is_off_by_default():
    settings = settings_from_args(["--model-repository", "/tmp"])
    assert settings.rate_limit == "off" and settings.rate_limit_resources == []


def test_the_mode_is_case_insensitive_and_resources_repeat():
    settings = settings_from_args(
        [
            "--model-repository=/tmp",
            "--rate-limit=EXECUTION_COUNT",
            "--rate-limit-resource=R1:10",
            "--rate-limit-resource=r2:5:1",
        ]
    )
    assert settings.rate_limit == "execution_count"
    assert settings.rate_limit_resources == [ResourceLimit("r1", 10), ResourceLimit("r2", 5, 1)]


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("--rate-limit=sometimes", "invalid choice: 'sometimes'"),
        ("--rate-limit-resource=R1", "expected <name>:<count> or <name>:<count>:<device>"),
        ("--rate-limit-resource=R1:many", "the count must be a whole number"),
    ],
)
def test_a_bad_value_stops_the_start_saying_why(flag, says, capsys):
    with pytest.raises(SystemExit):
        settings_from_args(["--model-repository=/tmp", flag])
    assert says in capsys.readouterr().err


def test_one_limiter_is_handed_to_every_scheduler_only_when_on():
    off = ServerApp(settings_from_args(["--model-repository=/tmp"]))
    assert off.rate_limiter is None
    on = ServerApp(settings_from_args(["--model-repository=/tmp", "--rate-limit=execution_count"]))
    assert isinstance(on.rate_limiter, RateLimiter)
