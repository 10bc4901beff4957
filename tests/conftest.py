"""Options of the whole suite."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--seed",
        type=int,
        default=None,
        help="tests/chaos: run the fault schedule of this seed only (a failing schedule prints it)",
    )
