"""Real broker processes for the SDK tests (the Node of tests/integration, built the same way)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Node


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """One single node shared by the tests of a module (each test uses its own queues)."""
    n = Node(tmp_path_factory.mktemp("sdk") / "node1")
    n.start()
    yield n
    n.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """A node of its own, for tests that kill and restart it."""
    n = Node(tmp_path / "node1")
    n.start()
    yield n
    n.stop()
