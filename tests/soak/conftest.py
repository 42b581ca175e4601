"""The soak's marker: `pytest -m "not soak"` (or `--ignore tests/soak`) leaves it out."""


def pytest_configure(config) -> None:  # type: ignore[no-untyped-def]
    config.addinivalue_line(
        "markers",
        "soak: the two-minute soak and chaos run (bench/soak/run.py) with its negative control",
    )
