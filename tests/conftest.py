"""Options of the whole suite."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--seed",
        type=int,
        default=None,
        help=(
            "tests/chaos and tests/sim: run the fault schedule (chaos) or simulated run (sim) "
            "of this seed only (a failing one prints it)"
        ),
    )
