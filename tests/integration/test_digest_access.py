"""GetClusterStatus's state digest (skip_digest = false) reads the whole store: it takes an admin
key, and a node computes one at a time, off its event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import admin_pb2 as apb
from tests.cli.conftest import Ctl

from .conftest import Node
from .rpc_helpers import rich_error
from .test_admin_api import HEX64, InProcess, in_process  # noqa: F401 - a fixture
from .test_security import Api, md, serving_secured


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Node, str, Api]]:
    with serving_secured(tmp_path) as served:
        yield served


def test_a_read_key_asking_for_the_digest_is_denied_naming_skip_digest(
    live: tuple[Node, str, Api],
) -> None:
    _node, admin, api = live
    for role in ("read-only", "producer", "consumer"):
        key = api.key(admin, role)
        with pytest.raises(grpc.RpcError) as info:
            api.a.GetClusterStatus(apb.GetClusterStatusRequest(), metadata=md(key), timeout=10)
        err = rich_error(info.value)
        assert err.code == grpc.StatusCode.PERMISSION_DENIED, role
        assert err.metadata["field"] == "skip_digest"
        assert err.fields == ["skip_digest"]
        # Without the digest the same key is answered.
        status = api.a.GetClusterStatus(
            apb.GetClusterStatusRequest(skip_digest=True), metadata=md(key), timeout=10
        )
        assert status.shards and status.shards[0].digest == ""
    status = api.a.GetClusterStatus(apb.GetClusterStatusRequest(), metadata=md(admin), timeout=10)
    assert HEX64.match(status.shards[0].digest)


async def test_concurrent_digests_compute_once_while_cheap_calls_are_answered(
    in_process: InProcess,  # noqa: F811 - the fixture imported above
) -> None:
    state = in_process.broker.state
    real_digest = state.digest
    entered, release = threading.Event(), threading.Event()
    calls = 0

    def held_digest() -> str:
        nonlocal calls
        calls += 1
        entered.set()
        assert release.wait(10)
        return real_digest()

    state.digest = held_digest  # type: ignore[method-assign]
    full = apb.GetClusterStatusRequest()
    first = asyncio.create_task(in_process.call(lambda a: a.GetClusterStatus(full, timeout=20)))
    await asyncio.to_thread(entered.wait, 10)
    second = asyncio.create_task(in_process.call(lambda a: a.GetClusterStatus(full, timeout=20)))
    # The node answers a cheap call while the digest is being read.
    cheap = await in_process.call(
        lambda a: a.GetClusterStatus(apb.GetClusterStatusRequest(skip_digest=True), timeout=10)
    )
    assert cheap.shards[0].digest == "" and not first.done()
    release.set()
    one, two = await first, await second
    assert calls == 1
    assert one.shards[0].digest == two.shards[0].digest
    assert HEX64.match(one.shards[0].digest)


def test_cluster_status_with_a_read_key_reports_without_digests(
    live: tuple[Node, str, Api], tmp_path: Path
) -> None:
    node, admin, api = live
    reader = Ctl(node.address, tmp_path / "home", api_key=api.key(admin, "read-only"))
    doc = reader.json("cluster", "status")
    assert doc["healthy"] is True, doc["problems"]
    (shard,) = doc["shards"]
    assert shard["replicas"][0]["digest"] == ""
    full = Ctl(node.address, tmp_path / "home", api_key=admin).json("cluster", "status")
    assert len(full["shards"][0]["replicas"][0]["digest"]) == 64
