"""Node states as operators and the nodes themselves set them: a drain lasts until undrain, a
leave (the node's own stop, a Kubernetes preStop hook) ends when the node starts again, a
decommission is for good. Against the in-memory metadata store."""

from __future__ import annotations

import pytest

from fluxmq.core.errors import FluxError
from fluxmq.metadata import EmbeddedMetadataStore, NodeInfo, ShardRecord
from fluxmq.server.cluster_view import ClusterView
from fluxmq.server.placement import node_states, operations

NODES = [
    NodeInfo(f"n{i}", f"127.0.0.1:{7070 + i}", "127.0.0.1", 7100 + 10 * i, 1) for i in range(4)
]
UNMANAGED = frozenset({"g1"})


async def _store() -> EmbeddedMetadataStore:
    store = EmbeddedMetadataStore(None, record_secret="a-cluster-secret-0123")
    for node in NODES:
        await store.register_node(node, 60_000)
    members = ("n0", "n1", "n2")
    await store.create_shard(ShardRecord("g2", members, {m: 7200 for m in members}, 3, 0))
    return store


async def _state(store: EmbeddedMetadataStore, node_id: str) -> str:
    return (await node_states.read_states(store, [node_id])).get(node_id, "active")


async def test_a_drain_until_restart_leaves_and_never_weakens_an_operators_drain() -> None:
    store = await _store()
    summary = await operations.drain_node(store, "n1", UNMANAGED, until_restart=True)
    assert summary.state == "leaving" and summary.groups == ("g2",)
    assert await _state(store, "n1") == "leaving"
    await operations.drain_node(store, "n2", UNMANAGED)
    await operations.drain_node(store, "n2", UNMANAGED, until_restart=True)
    assert await _state(store, "n2") == "draining"  # the operator's drain stays
    summary = await operations.drain_node(store, "n3", UNMANAGED, until_restart=True)
    assert summary.state == "drained"  # nothing on it: done at once


async def test_undrain_makes_a_node_active_but_not_a_decommissioned_one() -> None:
    store = await _store()
    await operations.drain_node(store, "n1", UNMANAGED)
    summary = await operations.undrain_node(store, "n1", UNMANAGED)
    assert summary.state == "active" and await _state(store, "n1") == "active"
    await operations.drain_node(store, "n3", UNMANAGED, decommission=True)
    with pytest.raises(FluxError) as refused:
        await operations.undrain_node(store, "n3", UNMANAGED)
    assert refused.value.reason == "MOVE_REFUSED" and "decommissioned" in refused.value.message
    assert await _state(store, "n3") == "decommissioned"
    with pytest.raises(FluxError) as unknown:
        await operations.undrain_node(store, "n9", UNMANAGED)
    assert unknown.value.reason == "NODE_NOT_FOUND"


async def test_a_node_that_starts_is_no_longer_leaving_but_a_later_leave_stays() -> None:
    store = await _store()
    await node_states.set_state(store, "n1", node_states.LEAVING)
    view = ClusterView(store, NODES[1], None, "g1", node_ttl_ms=10_000, clock_ms=lambda: 1,
                       registers=True)  # fmt: skip
    await view.maybe_register()
    assert await _state(store, "n1") == "active"
    # Its own stop during this run drains it; the next refresh leaves that alone.
    await node_states.set_state(store, "n1", node_states.LEAVING)
    await view.maybe_register()
    assert await _state(store, "n1") == "leaving"
    # An operator's drain is not a leave: a restart keeps it.
    await node_states.set_state(store, "n2", node_states.DRAINING)
    other = ClusterView(store, NODES[2], None, "g1", node_ttl_ms=10_000, clock_ms=lambda: 1,
                        registers=True)  # fmt: skip
    await other.maybe_register()
    assert await _state(store, "n2") == "draining"
