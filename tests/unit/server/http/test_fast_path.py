"""The direct infer path hooks uvicorn internals; a uvicorn without them must fail here, loudly,
rather than fall back to the slower ASGI path unnoticed."""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from server.http.fast_path import INFER_PATH, InferHttpProtocol, fast_path_supported, protocol_class


def test_the_installed_uvicorn_has_the_hooks_of_the_direct_path() -> None:
    assert fast_path_supported()


def test_protocol_class_binds_the_frontend_per_server() -> None:
    first, second = object(), object()
    one, two = protocol_class(first), protocol_class(second)
    assert issubclass(one, InferHttpProtocol) and issubclass(one, HttpToolsProtocol)
    assert (one.frontend, two.frontend) == (first, second)


def test_only_infer_paths_take_the_direct_path() -> None:
    assert INFER_PATH.fullmatch("/v2/models/simple/infer").groups() == ("simple", None)
    assert INFER_PATH.fullmatch("/v2/models/simple/versions/3/infer").groups() == ("simple", "3")
    for path in (
        "/v2/models/simple",
        "/v2/models/simple/infer/",
        "/v2/models/a/b/infer",
        "/v2/models/simple/versions/x/infer",
        "/v2/repository/models/simple/load",
    ):
        assert INFER_PATH.fullmatch(path) is None, path
