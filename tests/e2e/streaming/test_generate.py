"""The HTTP generate extension against a real server: `/generate` and `/generate_stream` (SSE
read line by line with httpx and with curl), Triton's mapping of JSON fields, its errors, and
back-pressure: a client that stops reading holds the model's sender back.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from harness.procutil import wait_for
from harness.serverproc import ServerProcess, running_server
from tests.support import tools
from tests.support.streamingmodels import build_streaming_repository

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = build_streaming_repository(tmp_path_factory.mktemp("generate"))
    with running_server([repo], log_dir=tmp_path_factory.mktemp("logs")) as process:
        yield process


def _url(server: ServerProcess, model: str, route: str) -> str:
    return f"{server.base}/v2/models/{model}/{route}"


def _events(lines: Iterator[str]) -> list[dict]:
    """SSE parsed line by line: `data: <json>` lines, each event ended by a blank line."""
    events = []
    pending = None
    for line in lines:
        if line.startswith("data: "):
            assert pending is None, "two data lines in one event"
            pending = json.loads(line[len("data: ") :])
        else:
            assert line == "", f"unexpected SSE line {line!r}"
            if pending is not None:
                events.append(pending)
                pending = None
    assert pending is None, "the last event was not terminated"
    return events


def test_generate_stream_sends_one_event_per_token(server: ServerProcess) -> None:
    body = {"text_input": "hello streaming world", "parameters": {"delay_ms": 5}}
    with httpx.stream(
        "POST", _url(server, "token_stream", "generate_stream"), json=body, timeout=30
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = _events(response.iter_lines())
    assert [event["text_output"] for event in events] == ["hello", "streaming", "world"]
    assert [event["index"] for event in events] == [0, 1, 2]  # one-element outputs: scalars
    assert all(
        event["model_name"] == "token_stream" and event["model_version"] == "1" for event in events
    )


@tools.needs_curl
def test_curl_reads_the_event_stream(server: ServerProcess) -> None:
    run = subprocess.run(
        [
            "curl",
            "-sN",
            "-X",
            "POST",
            _url(server, "token_stream", "generate_stream"),
            "-d",
            '{"text_input": "one two", "id": "c1"}',
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0
    assert run.stdout == (
        'data: {"id":"c1","model_name":"token_stream","model_version":"1",'
        '"text_output":"one","index":0}\n\n'
        'data: {"id":"c1","model_name":"token_stream","model_version":"1",'
        '"text_output":"two","index":1}\n\n'
    )


def test_generate_wants_exactly_one_response(server: ServerProcess) -> None:
    one = httpx.post(_url(server, "token_stream", "generate"), json={"text_input": "solo"})
    assert one.status_code == 200 and one.json() == {
        "model_name": "token_stream",
        "model_version": "1",
        "text_output": "solo",
        "index": 0,
    }
    for text in ("two words", ""):
        many = httpx.post(_url(server, "token_stream", "generate"), json={"text_input": text})
        assert many.status_code == 400
        assert many.json() == {
            "error": "generate expects model to produce exactly 1 response, "
            "use generate stream for model that generates various "
            "number of responses"
        }


def test_inputs_parameters_and_shapes_map_as_triton_does(server: ServerProcess) -> None:
    body = {"INPUT0": list(range(16)), "INPUT1": [1] * 16, "id": "7"}
    answer = httpx.post(_url(server, "simple", "generate"), json=body)
    assert answer.status_code == 200
    assert answer.json()["OUTPUT0"] == list(range(1, 17)) and answer.json()["id"] == "7"
    stream = httpx.post(_url(server, "simple", "generate_stream"), json=body)
    assert _events(stream.text.split("\n")[:-1])[0]["OUTPUT1"] == list(range(-1, 15))
    limited = httpx.post(
        _url(server, "token_stream", "generate_stream"),
        json={"text_input": ["a b c"], "max_tokens": 2},
    )
    assert [e["text_output"] for e in _events(limited.text.split("\n")[:-1])] == ["a", "b"]


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize(
    "body, message",
    [
        (
            {"text_input": "a", "x": {"a": 1}},
            "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'.",
        ),
        (
            {"text_input": "a", "parameters": {"p": [1]}},
            "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'.",
        ),
        (
            {"text_input": {"a": 1}},
            "input 'text_input': attempt to access JSON non-string as string",
        ),
        ({"max_tokens": 3}, "missing required input(s) ['text_input']"),
        (
            {"text_input": "a", "max_tokens": [1, 2]},
            "Unable to convert the value of 'max_tokens' (2 element(s)) to the shape [1]",
        ),
    ],
)
def test_bad_requests_are_400(server: ServerProcess, route: str, body: dict, message: str) -> None:
    answer = httpx.post(_url(server, "token_stream", route), json=body)
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/json"
    assert message in answer.json()["error"]


def test_duplicate_fields_unknown_models_and_methods(server: ServerProcess) -> None:
    dup = httpx.post(
        _url(server, "token_stream", "generate"), content=b'{"text_input": "a", "text_input": "b"}'
    )
    assert dup.status_code == 400
    assert dup.json() == {"error": "input 'text_input' already exists in request"}
    unknown = httpx.post(_url(server, "nope", "generate"), json={})
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "Request for unknown model: 'nope' is not found"}
    assert httpx.get(_url(server, "token_stream", "generate")).status_code == 405
    assert httpx.get(_url(server, "token_stream", "generate_stream")).status_code == 405


def test_a_model_error_arrives_as_an_event(server: ServerProcess) -> None:
    answer = httpx.post(_url(server, "chatty", "generate_stream"), json={"COUNT": 3, "error_at": 1})
    assert answer.status_code == 200
    events = _events(answer.text.split("\n")[:-1])
    assert events[0]["OUT"] == 0 and events[2]["OUT"] == 2
    assert events[1] == {"error": "token 1 failed"}
    first = httpx.post(_url(server, "chatty", "generate_stream"), json={"COUNT": 2, "error_at": 0})
    assert first.status_code == 400  # the first event's error sets the status: the model's is 400
    assert first.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert _events(first.text.split("\n")[:-1])[0] == {"error": "token 0 failed"}


def test_a_model_error_on_generate_is_400_with_its_text(server: ServerProcess) -> None:
    answer = httpx.post(_url(server, "chatty", "generate"), json={"COUNT": 1, "error_at": 0})
    assert answer.status_code == 400
    assert answer.json() == {"error": "token 0 failed"}


def test_parameters_named_like_an_input_become_that_input(server: ServerProcess) -> None:
    body = {"text_input": "a b c", "parameters": {"max_tokens": 2, "delay_ms": 0}}
    stream = httpx.post(_url(server, "token_stream", "generate_stream"), json=body)
    assert stream.status_code == 200
    assert [e["text_output"] for e in _events(stream.text.split("\n")[:-1])] == ["a", "b"]
    both = {"text_input": "a", "max_tokens": 1, "parameters": {"max_tokens": 2}}
    twice = httpx.post(_url(server, "token_stream", "generate"), json=both)
    assert twice.status_code == 400
    assert twice.json() == {"error": "input 'max_tokens' already exists in request"}


def _sent(server: ServerProcess) -> int:
    counts = re.findall(r"flood sent (\d+)", server.log())
    return max(map(int, counts)) if counts else 0


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_a_slow_client_holds_the_model_back(server: ServerProcess) -> None:
    """2000 answers of 256 KiB (about 1 GB as JSON) for a client that reads one, then stops:
    the model's sender waits (its buffer holds 4), the server's memory does not grow by the
    stream, and closing the connection cancels the request."""
    rss_before = _rss_kib(server.pid)
    with httpx.Client(timeout=30) as client:
        with client.stream(
            "POST", _url(server, "flood", "generate_stream"), json={"COUNT": 2000}
        ) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            first = next(lines)
            assert first.startswith("data: ") and len(first) > 256 * 1024
            wait_for(lambda: _sent(server) >= 4, "the first answers")
            time.sleep(2.0)  # a client that does not read
            stalled = _sent(server)
            time.sleep(1.0)
            assert _sent(server) == stalled, "the sender kept going while nobody read"
            assert stalled < 100, f"{stalled} answers sent to a client that read one"
            assert _rss_kib(server.pid) - rss_before < 200 * 1024
    wait_for(
        lambda: "flood cancelled after" in server.log(), "the model to see the cancel", timeout=15
    )
    assert httpx.get(f"{server.base}/v2/health/live").status_code == 200


def test_generate_stops_a_model_that_keeps_answering(server: ServerProcess) -> None:
    """/generate gives up at the second answer and cancels the request: nothing piles up."""
    cancels = server.log().count("flood cancelled after")
    answer = httpx.post(_url(server, "flood", "generate"), json={"COUNT": 100_000}, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("generate expects model to produce exactly 1")
    wait_for(
        lambda: server.log().count("flood cancelled after") > cancels,
        "the model to see the cancel",
        timeout=15,
    )
