"""server/core/api.py: the one interface both cores implement and the control calls derive from."""

from __future__ import annotations

import inspect

from server.core.api import CONTROL_METHODS, ControlAPI, CoreAPI
from server.core.inference_core import InferenceCore
from server.multiprocess.remote_core import RemoteCore


def _declared(protocol: type) -> set[str]:
    return {
        name
        for klass in protocol.__mro__
        if klass.__module__ == "server.core.api"
        for name in vars(klass)
        if not name.startswith("_")
    }


def test_the_control_calls_are_the_control_api() -> None:
    assert CONTROL_METHODS == _declared(ControlAPI)
    assert "resolve" in CONTROL_METHODS and "infer" not in CONTROL_METHODS


def test_both_cores_offer_every_call_with_the_same_parameters() -> None:
    for name in _declared(CoreAPI):
        wanted = getattr(CoreAPI, name)
        for core in (InferenceCore, RemoteCore):
            offered = getattr(core, name, None)
            if offered is None:  # a plain attribute, set in the constructor
                assert name in inspect.getsource(core.__init__), (core.__name__, name)
                continue
            if callable(wanted) and not isinstance(wanted, property):
                assert list(inspect.signature(offered).parameters) == list(
                    inspect.signature(wanted).parameters
                ), (core.__name__, name)
