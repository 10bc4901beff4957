"""Real broker processes for the SDK tests (the Node of tests/integration, built the same way)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Node

# Every SDK test runs against a node as it starts by default (its shards in one shard process
# behind its front end) and against one with two shard processes, whose front end routes each
# call by its queue: what a client sees must not differ. (A node in one process, the
# `shard_processes = 0` path, is what the in-process tests of tests/unit and tests/contract
# serve.)
SHARD_PROCESSES = {"shard-process": "1", "shard-processes": "2"}


@pytest.fixture(scope="module", params=sorted(SHARD_PROCESSES))
def broker(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Node]:
    """One single node shared by the tests of a module (each test uses its own queues)."""
    n = Node(
        tmp_path_factory.mktemp("sdk") / "node1",
        "--shard-processes",
        SHARD_PROCESSES[request.param],
    )
    n.start()
    yield n
    n.stop()


@pytest.fixture(params=sorted(SHARD_PROCESSES))
def node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Node]:
    """A node of its own, for tests that kill and restart it."""
    n = Node(tmp_path / "node1", "--shard-processes", SHARD_PROCESSES[request.param])
    n.start()
    yield n
    n.stop()
