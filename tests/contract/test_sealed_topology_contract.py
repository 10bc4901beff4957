"""The records placement acts on (nodes, groups, placements, leaders, node states, preferred
leaders) are sealed with the cluster secret in both stores: a record written without it reads
as absent, so a write to etcd without the secret moves nothing. The stores under test are the
api key contract's ``sealed`` ones (etcd, LMDB, memory)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fluxmq.metadata import EtcdMetadataStore, NodeInfo, Placement, ShardRecord
from fluxmq.metadata import metadata as md
from fluxmq.metadata.metadata import MetadataCorrupt
from fluxmq.metadata.sealed_records import RecordSeal, TopologyCodec, is_sealed
from tests.contract.test_api_key_store_contract import SECRET, sealed, stored_bytes
from tests.contract.test_metadata_contract import Harness, _prefix, etcd
from tests.etcd_server import EtcdServer
from tests.integration.conftest import free_port

__all__ = ["etcd", "sealed"]  # fixtures, imported for pytest

NODE = NodeInfo("n1", "127.0.0.1:7070", "127.0.0.1", 7100, 5)
GROUP = ShardRecord("g2", ("n1", "n2", "n3"), {"n1": 7101, "n2": 7101, "n3": 7101}, 3, 9)
PLACEMENT = Placement("orders", "g2", 11)


def _plain() -> dict[tuple[str, str], bytes]:
    """Well-formed records as someone without the secret writes them (a plain etcdctl put)."""
    return {
        ("node", "n1"): md.encode_node(NODE),
        ("group", "g2"): md.encode_shard(GROUP),
        ("placement", "orders"): md.encode_placement(PLACEMENT),
        ("leader", "g2"): md.encode_leader("n2", 2**40),
        ("setting", "node_state.n1"): md.encode_setting("draining"),
        ("setting", "preferred_leader.g2"): md.encode_setting("n3@99999999999999"),
    }


async def _read_all(h: Harness) -> dict[str, object]:
    s = h.store
    return {
        "nodes": await s.list_nodes(),
        "group": await s.get_shard("g2"),
        "groups": await s.list_shards(),
        "placement": await s.get_placement("orders"),
        "placements": await s.list_placements(),
        "leaders": await s.get_shard_leaders(),
        "node_state": await s.get_setting("node_state.n1"),
        "preferred_leader": await s.get_setting("preferred_leader.g2"),
    }


async def test_sealed_topology_records_round_trip_and_carry_a_mac(sealed: Harness) -> None:
    s = sealed.store
    await s.register_node(NODE, 10_000)
    await s.create_shard(GROUP)
    await s.create_placement(PLACEMENT)
    await s.set_shard_leader("g2", "n2", 3)
    await s.put_setting("node_state.n1", "draining")
    await s.put_setting("cluster_name", "plain")
    got = await _read_all(sealed)
    assert got["nodes"] == [NODE]
    assert [v.value for v in got["groups"]] == [GROUP]  # type: ignore[attr-defined]
    assert got["placement"] == PLACEMENT and got["placements"] == [PLACEMENT]
    assert got["leaders"] == {"g2": ("n2", 3)} and got["node_state"] == "draining"
    stored = await stored_bytes(sealed)
    group_bytes = [b for b in stored if b'"group_id":"g2"' in b and b'"members"' in b]
    assert group_bytes and all(b'"mac":"' in b for b in group_bytes)
    # An operator's own setting stays plain: etcdctl put keeps working for it.
    assert await s.get_setting("cluster_name") == "plain"
    assert any(b.endswith(md.encode_setting("plain")) for b in stored)  # no mac


async def test_topology_records_written_without_the_secret_read_as_absent(
    sealed: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    for (kind, name), raw in _plain().items():
        await sealed.write_raw(kind, name, raw)
    await sealed.write_raw("setting", "cluster_name", b"written-by-an-operator")
    with caplog.at_level(logging.WARNING, logger="fluxmq.cluster.metadata"):
        got = await _read_all(sealed)
        again = await _read_all(sealed)
    assert (
        got
        == again
        == {
            "nodes": [],
            "group": None,
            "groups": [],
            "placement": None,
            "placements": [],
            "leaders": {},
            "node_state": None,
            "preferred_leader": None,
        }
    )
    warnings = [r.getMessage() for r in caplog.records]
    assert any("ignored group record 'g2'" in w and "cluster secret" in w for w in warnings)
    assert len(warnings) == len(_plain())  # each key logged once, not once per read
    assert await sealed.store.get_setting("cluster_name") == "written-by-an-operator"


async def test_a_sealed_record_copied_under_another_name_is_forged(sealed: Harness) -> None:
    """A sealed ``draining`` of one node put under another node's key drains nothing."""
    await sealed.store.put_setting("node_state.n1", "draining")
    raw = [b for b in await stored_bytes(sealed) if b'"value":"draining"' in b and b"mac" in b]
    assert raw
    await sealed.write_raw("setting", "node_state.n2", raw[0])
    assert await sealed.store.get_setting("node_state.n2") is None
    assert await sealed.store.get_setting("node_state.n1") == "draining"


async def test_a_forged_leader_record_gives_way_to_the_real_leader(sealed: Harness) -> None:
    """A forged record with a huge term must not pin the leader: the real one overwrites it."""
    await sealed.write_raw("leader", "g2", md.encode_leader("n9", 2**40))
    await sealed.store.set_shard_leader("g2", "n2", 3)
    assert await sealed.store.get_shard_leaders() == {"g2": ("n2", 3)}


async def test_an_update_over_a_forged_group_record_claims_its_ports(sealed: Harness) -> None:
    await sealed.store.create_shard(GROUP)
    versioned = await sealed.store.get_shard("g2")
    assert versioned is not None
    moved = ShardRecord("g2", ("n1", "n2", "n4"), {"n1": 7101, "n2": 7101, "n4": 7102}, 3, 9)
    await sealed.store.update_shard(moved, versioned.revision)
    assert [v.value for v in await sealed.store.list_shards()] == [moved]
    claims = await sealed.store.list_raft_ports()
    assert claims["n4"] == {7102: "g2"} and "n3" not in claims


def test_the_seal_binds_kind_name_and_content() -> None:
    seal = RecordSeal(SECRET)
    data = md.encode_setting("draining")
    sealed_bytes = seal.seal("setting", "node_state.a", data)
    assert seal.open("setting", "node_state.a", sealed_bytes) == data
    assert seal.open("setting", "node_state.b", sealed_bytes) is None
    assert seal.open("leader", "node_state.a", sealed_bytes) is None
    edited = json.loads(sealed_bytes)
    edited["value"] = "decommissioned"
    assert seal.open("setting", "node_state.a", json.dumps(edited).encode()) is None
    assert RecordSeal("another-secret-01234").open("setting", "node_state.a", sealed_bytes) is None
    with pytest.raises(ValueError):
        RecordSeal("")
    assert is_sealed("setting", "preferred_leader.g1") and not is_sealed("setting", "x")


def test_reseal_seals_plain_records_and_refuses_foreign_or_broken_ones() -> None:
    codec = TopologyCodec(RecordSeal(SECRET))
    plain = md.encode_shard(GROUP)
    resealed = codec.reseal("group", "g2", plain)
    assert resealed is not None and codec.decode_shard(resealed, "g2") == GROUP
    assert codec.reseal("group", "g2", resealed) is None  # already sealed: nothing to do
    foreign = TopologyCodec(RecordSeal("another-secret-01234")).encode_shard(GROUP)
    with pytest.raises(MetadataCorrupt, match="another secret"):
        codec.reseal("group", "g2", foreign)
    with pytest.raises(MetadataCorrupt):
        codec.reseal("group", "g3", plain)  # the record names another group
    assert codec.reseal("setting", "cluster_name", md.encode_setting("x")) is None


async def test_seal_records_seals_what_an_older_version_wrote_and_refuses_foreign_seals(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """The upgrade step, as an operator runs it (``fluxmq seal-records`` with a node's
    settings): plain records become readable, a record sealed with another secret is reported
    and left as it was, and a second run has nothing to do."""
    prefix = _prefix()
    plain = EtcdMetadataStore(etcd.endpoint, prefix=prefix)
    foreign = EtcdMetadataStore(etcd.endpoint, prefix=prefix, record_secret="another-secret-0123")
    store = EtcdMetadataStore(etcd.endpoint, prefix=prefix, record_secret=SECRET)
    try:
        await plain.register_node(NODE, 60_000)
        await plain.create_shard(GROUP)
        await plain.create_placement(PLACEMENT)
        await plain.set_shard_leader("g2", "n2", 3)
        await plain.put_setting("node_state.n1", "draining")
        await plain.put_setting("groups_per_size", "2")
        await foreign.create_placement(Placement("other", "g2", 12))
        assert (await _read_all_of(store))["groups"] == []

        def seal_records() -> subprocess.CompletedProcess[str]:
            raft = f"127.0.0.1:{free_port()}"
            return subprocess.run(
                [sys.executable, "-m", "fluxmq", "seal-records", "--data-dir", str(tmp_path),
                 "--raft-listen", raft, "--peers", "127.0.0.1:1", "--etcd", etcd.endpoint,
                 "--etcd-prefix", prefix, "--auth", "off"],
                capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                env={**os.environ, "FLUXMQ_CLUSTER_SECRET": SECRET},
            )  # fmt: skip

        first = await asyncio.to_thread(seal_records)
        assert first.returncode == 1, first.stderr
        assert "sealed 5 record(s); 1 needed nothing" in first.stdout
        assert "placement 'other': sealed with another secret" in first.stderr
        got = await _read_all_of(store)
        assert got["nodes"] == [NODE] and got["leaders"] == {"g2": ("n2", 3)}
        assert [v.value for v in got["groups"]] == [GROUP]  # type: ignore[attr-defined]
        assert got["placements"] == [PLACEMENT] and got["node_state"] == "draining"
        assert await store.get_setting("groups_per_size") == "2"
        # The node record keeps its lease: it still lapses when its node stops refreshing.
        kv = await store.client.get(store._key("node", "n1"))
        assert kv is not None and int(kv.lease) == plain._leases["n1"]
        second = await asyncio.to_thread(seal_records)
        assert "sealed 0 record(s)" in second.stdout
    finally:
        for s in (plain, foreign, store):
            await s.close()


async def _read_all_of(store: EtcdMetadataStore) -> dict[str, object]:
    return await _read_all(Harness(store, "etcd"))
