"""Fixtures shared by tests/raft."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.raft.test_pysyncobj_hardening import Harness


@pytest.fixture
def harness(tmp_path: Any) -> Iterator[Any]:
    """Makes hand-ticked followers (``Harness``) with a given log; closes them after."""
    made: list[Harness] = []

    def make(terms: list[int], current_term: int = 1) -> Harness:
        h = Harness(str(tmp_path / f"h{len(made)}"), terms, current_term)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()
