"""Raft ports are allocated through the metadata store (issue 37): nodes that provision
replication groups at the same time, each from its own stale view, never give one port of a
node to two groups. Real etcd (started on loopback) and the embedded store."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from fluxmq.metadata import EmbeddedMetadataStore, EtcdMetadataStore, MetadataStore, NodeInfo
from fluxmq.server.cluster_view import ClusterView
from tests.etcd_server import EtcdServer

NODES = [
    NodeInfo(f"n{i}", f"127.0.0.1:{7070 + i}", "127.0.0.1", 7100 + 100 * i, 1) for i in (1, 2, 3)
]
RACERS = 6


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with EtcdServer() as server:
        yield server


async def _race(store: MetadataStore) -> list[tuple[str, dict[str, int]]]:
    views = []
    for i in range(RACERS):
        view = ClusterView(
            store, NODES[i % 3], None, "home", node_ttl_ms=10_000, clock_ms=lambda: 1
        )
        view.nodes = {n.node_id: n for n in NODES}  # each knows the nodes, no group yet
        views.append(view)
    made = await asyncio.gather(*(v._provision_shard(3) for v in views))
    records = {v.value.group_id: v.value for v in await store.list_shards()}
    return [(g, records[g].raft_ports) for g in made]


def _check(made: list[tuple[str, dict[str, int]]]) -> None:
    assert len({g for g, _ in made}) == RACERS, made
    for node in NODES:
        ports = [p[node.node_id] for _, p in made]
        assert len(set(ports)) == RACERS, (node.node_id, ports)
        assert all(p > node.raft_port_base for p in ports)


def test_nodes_racing_to_provision_groups_on_etcd_never_pick_the_same_port(
    etcd: EtcdServer,
) -> None:
    async def run() -> None:
        store = EtcdMetadataStore(etcd.endpoint, prefix=f"/t-{uuid.uuid4().hex[:8]}/")
        try:
            _check(await _race(store))
        finally:
            await store.close()

    asyncio.run(run())


def test_nodes_racing_to_provision_groups_on_the_embedded_store_never_pick_the_same_port() -> None:
    async def run() -> None:
        store = EmbeddedMetadataStore(None, sync=False)
        try:
            _check(await _race(store))
        finally:
            await store.close()

    asyncio.run(run())
