"""The metadata contract (fluxmq/metadata/metadata.py), checked against every implementation.

Each contract test runs on the embedded store (LMDB file and memory, both on a fake clock) and on
EtcdMetadataStore against a real etcd process (real time, a fresh key prefix per test). Timing
tests advance the fake clock for the embedded store and wait, bounded, for etcd's lease expiry.
The etcd-only tests at the end stop and restart etcd, and race two independent clients.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fluxmq.metadata import (
    AlreadyExists,
    EmbeddedMetadataStore,
    EtcdMetadataStore,
    MetadataCorrupt,
    MetadataEvent,
    MetadataStore,
    MetadataUnavailable,
    MetadataWatch,
    NodeInfo,
    NodeNotRegistered,
    NotFound,
    Placement,
    PortTaken,
    RevisionConflict,
    ShardRecord,
)
from fluxmq.metadata import metadata as md
from tests.etcd_server import EtcdServer

TTL_MS = 1000  # etcd's lease floor with tests/etcd_server.py's election timings
ETCD_EXPIRY_WAIT_S = 8.0  # TTL + etcd's 0.5 s expiry sweep + slack for a loaded machine
EVENT_WAIT_S = 5.0


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


@dataclass
class Harness:
    """A store plus what a test needs to drive time and reach under the interface."""

    store: MetadataStore
    kind: str
    clock: FakeClock | None = None

    @property
    def real_time(self) -> bool:
        return self.clock is None

    async def let_pass(self, ms: int) -> None:
        if self.clock is not None:
            self.clock.advance(ms)
        else:
            await asyncio.sleep(ms / 1000)

    async def write_raw(self, kind: str, name: str, raw: bytes) -> None:
        """Stores bytes under a record key, bypassing validation (to test corrupt data)."""
        if isinstance(self.store, EtcdMetadataStore):
            await self.store.client.put(self.store._key(kind, name), raw)  # type: ignore[arg-type]
            return
        from fluxmq.metadata import embedded

        assert isinstance(self.store, EmbeddedMetadataStore)
        with self.store._backend.write() as txn:
            txn.put(embedded._key(kind, name), embedded._HEADER.pack(1, 0, 0) + raw)


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with EtcdServer() as server:
        yield server


def _prefix() -> str:
    return f"/t-{uuid.uuid4().hex[:12]}/"


@pytest.fixture(params=["embedded-lmdb", "embedded-memory", "etcd"])
async def h(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    harness: Harness
    if request.param == "etcd":
        server: EtcdServer = request.getfixturevalue("etcd")
        harness = Harness(EtcdMetadataStore(server.endpoint, prefix=_prefix()), "etcd")
    else:
        clock = FakeClock()
        path = tmp_path / "meta" if request.param == "embedded-lmdb" else None
        store = EmbeddedMetadataStore(path, clock_ms=clock, sync=False, watch_poll_ms=20)
        harness = Harness(store, request.param, clock)
    yield harness
    await harness.store.close()


def node(node_id: str, port: int = 7100, **labels: str) -> NodeInfo:
    return NodeInfo(node_id, f"{node_id}:7070", "127.0.0.1", port, 1_000, dict(labels))


def group(
    group_id: str, *members: str, factor: int | None = None, port_base: int = 7100
) -> ShardRecord:
    members = members or ("n1",)
    ports = {m: port_base + i for i, m in enumerate(members)}
    return ShardRecord(group_id, tuple(members), ports, factor or len(members), 5_000)


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> float:
    """Polls ``check`` until true; returns the seconds it took, fails after ``timeout_s``."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def next_event(
    watch: MetadataWatch, matching: Callable[[MetadataEvent], bool]
) -> MetadataEvent:
    async with asyncio.timeout(EVENT_WAIT_S):
        async for event in watch:
            if matching(event):
                return event
    raise AssertionError("the watch ended")


async def established(watch: MetadataWatch) -> None:
    """Consumes the opening resync events: after them, every change is reported."""
    seen: set[str] = set()
    while len(seen) < len(md.EVENT_KINDS):
        event = await next_event(watch, lambda e: e.resync)
        seen.add(event.kind)


async def node_ids(store: MetadataStore) -> list[str]:
    return [n.node_id for n in await store.list_nodes()]


# --- nodes ----------------------------------------------------------------------------------------


async def test_registered_nodes_are_listed_by_id_and_deregister_removes_at_once(h: Harness) -> None:
    for node_id in ("n3", "n1", "n2"):
        await h.store.register_node(node(node_id, zone="a"), TTL_MS * 30)
    listed = await h.store.list_nodes()
    assert [n.node_id for n in listed] == ["n1", "n2", "n3"]
    assert listed[0] == node("n1", zone="a")

    await h.store.deregister_node("n2")
    assert await node_ids(h.store) == ["n1", "n3"]
    await h.store.deregister_node("n2")  # already gone: a no-op
    with pytest.raises(NodeNotRegistered):
        await h.store.refresh_node("n2")


async def test_registering_the_same_node_again_replaces_its_record(h: Harness) -> None:
    await h.store.register_node(node("n1", port=7100), TTL_MS * 30)
    await h.store.register_node(node("n1", port=7200), TTL_MS * 30)
    assert await h.store.list_nodes() == [node("n1", port=7200)]
    await h.store.refresh_node("n1")  # the replacement's lease is the live one


async def test_node_disappears_after_its_ttl_when_not_refreshed(h: Harness) -> None:
    await h.store.register_node(node("n1"), TTL_MS)
    await h.store.register_node(node("n2"), TTL_MS * 60)
    assert await node_ids(h.store) == ["n1", "n2"]
    if h.clock is not None:
        h.clock.advance(TTL_MS - 1)
        assert await node_ids(h.store) == ["n1", "n2"]
        h.clock.advance(1)
        assert await node_ids(h.store) == ["n2"]
    else:
        took_s = await eventually(
            lambda: _absent(h.store, "n1"), ETCD_EXPIRY_WAIT_S, "n1's lease expires"
        )
        assert took_s >= 0.5, "etcd expired a 1 s lease too early"
        assert await node_ids(h.store) == ["n2"]
    with pytest.raises(NodeNotRegistered):
        await h.store.refresh_node("n1")


async def _absent(store: MetadataStore, node_id: str) -> bool:
    return node_id not in await node_ids(store)


async def test_refreshing_keeps_a_node_alive_past_its_ttl(h: Harness) -> None:
    await h.store.register_node(node("n1"), TTL_MS)
    # 2.4 TTLs in all, refreshing every 0.3 TTL.
    for _ in range(8):
        await h.let_pass(TTL_MS * 3 // 10)
        await h.store.refresh_node("n1")
    assert await node_ids(h.store) == ["n1"]


async def test_refreshing_an_unknown_node_raises_node_not_registered(h: Harness) -> None:
    with pytest.raises(NodeNotRegistered) as raised:
        await h.store.refresh_node("ghost")
    assert isinstance(raised.value, KeyError) and isinstance(raised.value, NotFound)
    assert raised.value.reason == "NODE_NOT_REGISTERED" and not raised.value.retriable


# --- placements -----------------------------------------------------------------------------------


async def test_second_create_of_same_queue_gets_already_exists(h: Harness) -> None:
    await h.store.create_placement(Placement("orders", "g1", 10))
    with pytest.raises(AlreadyExists) as raised:
        await h.store.create_placement(Placement("orders", "g2", 20))
    assert raised.value.reason == "ALREADY_EXISTS"
    assert await h.store.get_placement("orders") == Placement("orders", "g1", 10)
    assert await h.store.get_placement("missing") is None


async def test_concurrent_creates_of_same_queue_have_exactly_one_winner(h: Harness) -> None:
    attempts = [Placement("contested", f"g{i}", i) for i in range(10)]
    results = await asyncio.gather(
        *(h.store.create_placement(p) for p in attempts), return_exceptions=True
    )
    winners = [p for p, r in zip(attempts, results, strict=True) if r is None]
    assert len(winners) == 1, results
    assert all(isinstance(r, AlreadyExists) for r in results if r is not None), results
    assert await h.store.get_placement("contested") == winners[0]


async def test_delete_placement_reports_whether_it_removed_one(h: Harness) -> None:
    await h.store.create_placement(Placement("q", "g1", 1))
    assert await h.store.delete_placement("q") is True
    assert await h.store.delete_placement("q") is False
    assert await h.store.get_placement("q") is None
    await h.store.create_placement(Placement("q", "g2", 2))  # the name is free again
    assert await h.store.get_placement("q") == Placement("q", "g2", 2)


async def test_list_placements_pages_in_name_order_by_prefix_after_and_limit(h: Harness) -> None:
    names = [f"q-{i:04d}" for i in range(2000)] + [f"a.{i:03d}" for i in range(500)]
    for start in range(0, len(names), 250):  # bounded batches: etcd sees 250 txns at a time
        await asyncio.gather(
            *(h.store.create_placement(Placement(n, "g1", 7)) for n in names[start : start + 250])
        )

    paged: list[str] = []
    after = ""
    while page := await h.store.list_placements(after=after, limit=1000):
        assert len(page) <= 1000
        paged.extend(p.queue for p in page)
        after = page[-1].queue
    assert paged == sorted(names)

    page = await h.store.list_placements(prefix="q-01", limit=1000)
    assert [p.queue for p in page] == [f"q-{i:04d}" for i in range(100, 200)]
    page = await h.store.list_placements(prefix="q-01", after="q-0150", limit=10)
    assert [p.queue for p in page] == [f"q-{i:04d}" for i in range(151, 161)]
    page = await h.store.list_placements(prefix="q-01", after="q-0199")
    assert page == []
    page = await h.store.list_placements(prefix="a.", after="a", limit=2)
    assert [p.queue for p in page] == ["a.000", "a.001"]  # "after" before the prefix: no effect
    assert await h.store.list_placements(prefix="zzz") == []
    assert (await h.store.list_placements(limit=1))[0] == Placement("a.000", "g1", 7)


# --- groups ---------------------------------------------------------------------------------------


async def test_group_update_with_a_stale_revision_gets_revision_conflict(h: Harness) -> None:
    await h.store.create_shard(group("g1", "n1", "n2", "n3"))
    with pytest.raises(AlreadyExists):
        await h.store.create_shard(group("g1", "n1"))
    first = await h.store.get_shard("g1")
    assert first is not None and first.value == group("g1", "n1", "n2", "n3")

    grown = group("g1", "n1", "n2", "n3", "n4", factor=3)
    second = await h.store.update_shard(grown, first.revision)
    assert second > first.revision
    with pytest.raises(RevisionConflict) as raised:
        await h.store.update_shard(group("g1", "n1"), first.revision)
    assert raised.value.retriable and raised.value.reason == "REVISION_CONFLICT"
    now = await h.store.get_shard("g1")
    assert now is not None and now.value == grown and now.revision == second

    with pytest.raises(NotFound):
        await h.store.update_shard(group("nope", "n1"), second)
    assert await h.store.get_shard("nope") is None


async def test_list_groups_returns_every_group_by_id_with_its_revision(h: Harness) -> None:
    for base, group_id in enumerate(("g2", "g1", "g3")):
        await h.store.create_shard(group(group_id, "n1", "n2", port_base=7200 + 10 * base))
    listed = await h.store.list_shards()
    assert [v.value.group_id for v in listed] == ["g1", "g2", "g3"]
    for versioned in listed:
        assert versioned == await h.store.get_shard(versioned.value.group_id)


async def test_concurrent_groups_claiming_one_raft_port_have_exactly_one_winner(
    h: Harness,
) -> None:
    # Each wants port 7300 on n1, and a port of its own on n2.
    attempts = [
        ShardRecord(f"g{i}", ("n1", "n2"), {"n1": 7300, "n2": 7400 + i}, 2, 0) for i in range(8)
    ]
    results = await asyncio.gather(
        *(h.store.create_shard(g) for g in attempts), return_exceptions=True
    )
    winners = [g for g, r in zip(attempts, results, strict=True) if r is None]
    assert len(winners) == 1, results
    losers = [r for r in results if r is not None]
    assert all(isinstance(r, PortTaken) for r in losers), results
    assert all((r.node_id, r.port, r.owner) == ("n1", 7300, winners[0].group_id) for r in losers)
    assert [v.value for v in await h.store.list_shards()] == winners
    # A loser left nothing behind: not its record, not its claim on n2.
    assert await h.store.list_raft_ports() == {
        "n1": {7300: winners[0].group_id},
        "n2": {winners[0].raft_ports["n2"]: winners[0].group_id},
    }


async def test_growing_a_group_claims_its_new_ports_and_shrinking_releases_them(
    h: Harness,
) -> None:
    await h.store.create_shard(group("g1", "n1", "n2", "n3"))
    first = await h.store.get_shard("g1")
    assert first is not None
    grown = group("g1", "n1", "n2", "n3", "n4", factor=3)  # n4 on 7103
    revision = await h.store.update_shard(grown, first.revision)
    assert (await h.store.list_raft_ports())["n4"] == {7103: "g1"}
    with pytest.raises(PortTaken) as taken:
        await h.store.create_shard(ShardRecord("g2", ("n4",), {"n4": 7103}, 1, 0))
    assert taken.value.owner == "g1" and taken.value.reason == "RAFT_PORT_TAKEN"
    assert await h.store.get_shard("g2") is None
    # The replacement of n1 by n5: n1's claim goes, n5's comes, in the same step.
    replaced = ShardRecord(
        "g1", ("n2", "n3", "n4", "n5"), {"n2": 7101, "n3": 7102, "n4": 7103, "n5": 7100}, 3, 0
    )
    await h.store.update_shard(replaced, revision)
    ports = await h.store.list_raft_ports()
    assert "n1" not in ports and ports["n5"] == {7100: "g1"}
    await h.store.create_shard(ShardRecord("g2", ("n1",), {"n1": 7100}, 1, 0))  # free again
    # A grow that would take a port another group holds changes nothing.
    now = await h.store.get_shard("g1")
    assert now is not None
    clash = ShardRecord("g1", (*replaced.members, "n1"), {**replaced.raft_ports, "n1": 7100}, 3, 0)
    with pytest.raises(PortTaken):
        await h.store.update_shard(clash, now.revision)
    after = await h.store.get_shard("g1")
    assert after == now


# --- roles (the placement controller) -------------------------------------------------------------


async def test_one_node_holds_a_role_and_another_takes_it_only_after_the_ttl(h: Harness) -> None:
    holders = await asyncio.gather(
        *(h.store.campaign("controller", f"n{i}", TTL_MS) for i in range(6))
    )
    assert len(set(holders)) == 1, holders
    holder = holders[0]
    other = "n0" if holder != "n0" else "n1"
    assert await h.store.campaign("controller", holder, TTL_MS) == holder  # kept alive
    assert await h.store.campaign("controller", other, TTL_MS) == holder
    assert await h.store.campaign("auditor", other, TTL_MS) == other  # roles are independent

    async def taken_over() -> bool:
        return await h.store.campaign("controller", other, TTL_MS) == other

    await h.let_pass(TTL_MS + 100)
    await eventually(taken_over, ETCD_EXPIRY_WAIT_S, "the role to pass on after the TTL")
    await h.store.resign("controller", holder)  # not the holder any more: changes nothing
    assert await h.store.campaign("controller", holder, TTL_MS) == other
    await h.store.resign("controller", other)
    assert await h.store.campaign("controller", holder, TTL_MS) == holder  # free at once


async def test_a_role_name_that_is_not_a_name_is_refused(h: Harness) -> None:
    with pytest.raises(ValueError, match="role"):
        await h.store.campaign("Controller/x", "n1", TTL_MS)


# --- leaders and settings -------------------------------------------------------------------------


async def test_leader_record_only_moves_forward_in_term(h: Harness) -> None:
    assert await h.store.get_shard_leaders() == {}
    await h.store.set_shard_leader("g1", "n1", 5)
    await h.store.set_shard_leader("g2", "n2", 1)
    await h.store.set_shard_leader("g1", "n2", 4)  # older term: ignored
    await h.store.set_shard_leader("g1", "n3", 5)  # same term, another node: ignored
    assert await h.store.get_shard_leaders() == {"g1": ("n1", 5), "g2": ("n2", 1)}
    await h.store.set_shard_leader("g1", "n3", 6)
    assert (await h.store.get_shard_leaders())["g1"] == ("n3", 6)


async def test_settings_read_back_what_was_last_put(h: Harness) -> None:
    assert await h.store.get_setting("retention.default") is None
    await h.store.put_setting("retention.default", "7d")
    await h.store.put_setting("retention.default", "14d ✓")
    await h.store.put_setting("empty", "")
    assert await h.store.get_setting("retention.default") == "14d ✓"
    assert await h.store.get_setting("empty") == ""


# --- watch ----------------------------------------------------------------------------------------


async def test_watch_opens_with_a_resync_then_reports_each_change(h: Harness) -> None:
    watch = h.store.watch()
    await established(watch)

    await h.store.put_setting("k", "v")
    assert await next_event(watch, lambda e: e.kind == "setting") == MetadataEvent("setting", "k")
    await h.store.create_placement(Placement("orders", "g1", 1))
    # A placement event carries the group, so a watcher needs no read to keep a table.
    assert await next_event(watch, lambda e: e.kind == "placement") == MetadataEvent(
        "placement", "orders", group_id="g1"
    )
    await h.store.delete_placement("orders")
    assert await next_event(watch, lambda e: e.kind == "placement") == MetadataEvent(
        "placement", "orders", deleted=True
    )
    await h.store.create_shard(group("g1"))
    assert await next_event(watch, lambda e: e.kind == "group") == MetadataEvent("group", "g1")
    await h.store.set_shard_leader("g1", "n1", 1)
    assert await next_event(watch, lambda e: e.kind == "leader") == MetadataEvent("leader", "g1")
    await h.store.register_node(node("n1"), TTL_MS * 30)
    assert await next_event(watch, lambda e: e.kind == "node") == MetadataEvent("node", "n1")
    await h.store.deregister_node("n1")
    assert await next_event(watch, lambda e: e.kind == "node") == MetadataEvent(
        "node", "n1", deleted=True
    )
    await watch.aclose()


async def test_watch_reports_a_lapsed_node_as_deleted(h: Harness) -> None:
    watch = h.store.watch()
    await established(watch)
    await h.store.register_node(node("n1"), TTL_MS)
    await next_event(watch, lambda e: e == MetadataEvent("node", "n1"))
    if h.clock is not None:
        h.clock.advance(TTL_MS)  # noticed by the watcher's own poll: nobody reads the nodes
    async with asyncio.timeout(ETCD_EXPIRY_WAIT_S):
        await next_event_no_deadline(watch, MetadataEvent("node", "n1", deleted=True))
    await watch.aclose()


async def next_event_no_deadline(watch: MetadataWatch, wanted: MetadataEvent) -> None:
    async for event in watch:
        if event == wanted:
            return
    raise AssertionError("the watch ended")


async def test_watch_is_cancellable_and_ends_when_the_store_closes(h: Harness) -> None:
    watch = h.store.watch()
    await established(watch)
    waiting = asyncio.ensure_future(anext(watch))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await h.store.put_setting("k", "v")  # still usable after a cancelled wait
    assert await next_event(watch, lambda e: e.kind == "setting") == MetadataEvent("setting", "k")

    waiting = asyncio.ensure_future(anext(watch))
    await asyncio.sleep(0.05)
    await h.store.close()
    async with asyncio.timeout(EVENT_WAIT_S):
        with pytest.raises(StopAsyncIteration):
            await waiting
    with pytest.raises(MetadataUnavailable):
        await h.store.list_nodes()


# --- bad input and bad data -----------------------------------------------------------------------

BAD_RECORDS: list[tuple[str, Callable[[], object]]] = [
    ("node id with a slash", lambda: node("a/b")),
    ("node id too long", lambda: node("n" * 65)),
    ("empty grpc address", lambda: NodeInfo("n1", "", "h", 7100, 0)),
    ("port 0", lambda: NodeInfo("n1", "a:1", "h", 0, 0)),
    ("port 65536", lambda: NodeInfo("n1", "a:1", "h", 65536, 0)),
    ("bool as port", lambda: NodeInfo("n1", "a:1", "h", True, 0)),
    ("negative start", lambda: NodeInfo("n1", "a:1", "h", 7100, -1)),
    ("label key bad", lambda: NodeInfo("n1", "a:1", "h", 7100, 0, {"-x": "y"})),
    (
        "too many labels",
        lambda: NodeInfo("n1", "a:1", "h", 7100, 0, {f"k{i}": "" for i in range(65)}),
    ),
    ("eight members", lambda: group("g", *(f"n{i}" for i in range(8)))),
    ("no members", lambda: ShardRecord("g", (), {}, 1, 0)),
    ("duplicate members", lambda: ShardRecord("g", ("n1", "n1"), {"n1": 1}, 1, 0)),
    ("ports for others", lambda: ShardRecord("g", ("n1",), {"n2": 1}, 1, 0)),
    ("factor 0", lambda: ShardRecord("g", ("n1",), {"n1": 1}, 0, 0)),
    ("queue with a space", lambda: Placement("my queue", "g1", 0)),
    ("queue with a newline", lambda: Placement("q\n", "g1", 0)),
    ("queue name too long", lambda: Placement("q" * 201, "g1", 0)),
]


@pytest.mark.parametrize(("case", "build"), BAD_RECORDS, ids=[c for c, _ in BAD_RECORDS])
def test_records_reject_bad_fields_with_value_error(case: str, build: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        build()


BAD_CALLS: list[tuple[str, Callable[[MetadataStore], Awaitable[object]]]] = [
    ("ttl below 1 s", lambda s: s.register_node(node("n1"), 999)),
    ("ttl above 5 min", lambda s: s.register_node(node("n1"), 300_001)),
    ("not a NodeInfo", lambda s: s.register_node("n1", TTL_MS)),  # type: ignore[arg-type]
    ("refresh bad id", lambda s: s.refresh_node("")),
    ("deregister bad id", lambda s: s.deregister_node("a b")),
    ("limit 0", lambda s: s.list_placements(limit=0)),
    ("limit 1001", lambda s: s.list_placements(limit=1001)),
    ("bad prefix", lambda s: s.list_placements(prefix="a/")),
    ("bad after", lambda s: s.list_placements(after="\x00")),
    ("revision 0", lambda s: s.update_shard(group("g1"), 0)),
    ("negative term", lambda s: s.set_shard_leader("g1", "n1", -1)),
    ("bad leader node", lambda s: s.set_shard_leader("g1", "", 1)),
    ("bad setting key", lambda s: s.put_setting("a b", "v")),
    ("setting too long", lambda s: s.put_setting("k", "x" * (64 * 1024 + 1))),
    ("lone surrogate", lambda s: s.put_setting("k", "\ud800")),
    ("get bad queue", lambda s: s.get_placement("")),
    ("get bad group", lambda s: s.get_shard("g" * 65)),
]


@pytest.mark.parametrize(("case", "call"), BAD_CALLS, ids=[c for c, _ in BAD_CALLS])
async def test_bad_input_is_rejected_with_value_error_before_any_write(
    h: Harness, case: str, call: Callable[[MetadataStore], Awaitable[object]]
) -> None:
    with pytest.raises(ValueError):
        await call(h.store)
    assert await h.store.list_nodes() == []


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"[]", b'{"v":2}', b'{"v":1,"queue":"x"}', b"\xff"],
    ids=["not-json", "array", "future-version", "missing-fields", "not-utf8"],
)
async def test_a_corrupt_record_raises_metadata_corrupt(h: Harness, raw: bytes) -> None:
    await h.write_raw("placement", "broken", raw)
    with pytest.raises(MetadataCorrupt):
        await h.store.get_placement("broken")
    with pytest.raises(MetadataCorrupt):
        await h.store.list_placements()


async def test_a_record_stored_under_the_wrong_key_is_corrupt(h: Harness) -> None:
    await h.write_raw("placement", "a", md.encode_placement(Placement("b", "g1", 0)))
    with pytest.raises(MetadataCorrupt, match="names 'b'"):
        await h.store.get_placement("a")


def test_records_encode_as_compact_json_with_sorted_keys_and_round_trip() -> None:
    raw = md.encode_placement(Placement("orders", "g1", 42))
    assert raw == b'{"created_ms":42,"group_id":"g1","queue":"orders","v":1}'
    assert md.decode_placement(raw, "orders") == Placement("orders", "g1", 42)
    n = node("n1", zone="eu", rack="r2")
    assert md.decode_node(md.encode_node(n), "n1") == n
    g = group("g1", "n2", "n1", "n3")
    assert md.decode_shard(md.encode_shard(g), "g1") == g
    assert md.decode_leader(md.encode_leader("n1", 9), "g1") == ("n1", 9)
    assert md.decode_setting(md.encode_setting("x"), "k") == "x"
    assert json.loads(md.encode_shard(g))["members"] == ["n2", "n1", "n3"]  # order is meaning


def test_records_copy_their_mutable_fields() -> None:
    labels = {"zone": "a"}
    n = NodeInfo("n1", "a:1", "h", 7100, 0, labels)
    labels["zone"] = "b"
    assert n.labels == {"zone": "a"}


# --- embedded only --------------------------------------------------------------------------------


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def test_embedded_state_survives_reopening_the_file(tmp_path: Path) -> None:
    clock = FakeClock()
    store = EmbeddedMetadataStore(tmp_path, clock_ms=clock)
    await store.create_placement(Placement("orders", "g1", 1))
    await store.create_shard(group("g1", "n1"))
    await store.register_node(node("n1"), TTL_MS * 10)
    revision = await store.update_shard(group("g1", "n1", "n2"), 2)
    await store.close()
    assert _files(tmp_path) == ["metadata.lmdb", "metadata.lmdb-lock"]

    store = EmbeddedMetadataStore(tmp_path, clock_ms=clock)
    assert await store.get_placement("orders") == Placement("orders", "g1", 1)
    assert await node_ids(store) == ["n1"]
    got = await store.get_shard("g1")
    assert got is not None and got.revision == revision
    assert await store.update_shard(group("g1", "n1"), revision) > revision  # revisions go on
    clock.advance(TTL_MS * 10)
    assert await store.list_nodes() == []  # the lease deadline was stored, not just kept in memory
    await store.close()


def test_embedded_store_refuses_a_file_that_is_not_lmdb(tmp_path: Path) -> None:
    (tmp_path / "metadata.lmdb").write_bytes(b"not an lmdb file" * 512)
    with pytest.raises(MetadataCorrupt):
        EmbeddedMetadataStore(tmp_path)


async def test_a_watch_backlog_coalesces_and_collapses_into_resync_when_too_long() -> None:
    watch = MetadataWatch()
    for _ in range(3):
        watch.push(MetadataEvent("setting", "a"))
        watch.push(MetadataEvent("setting", "b"))
    assert [await anext(watch), await anext(watch)] == [
        MetadataEvent("setting", "a"),
        MetadataEvent("setting", "b"),
    ]
    for i in range(MetadataWatch.PENDING_MAX + 1):
        watch.push(MetadataEvent("placement", f"q{i}"))
    drained = [await anext(watch) for _ in md.EVENT_KINDS]
    assert all(e.resync for e in drained) and {e.kind for e in drained} == set(md.EVENT_KINDS)
    await watch.aclose()
    with pytest.raises(StopAsyncIteration):
        await anext(watch)


# --- etcd only ------------------------------------------------------------------------------------


async def test_etcd_down_fails_fast_with_unavailable_then_recovers_with_the_data() -> None:
    timeout_ms = 1000
    with EtcdServer() as server:
        store = EtcdMetadataStore(server.endpoint, prefix=_prefix(), timeout_ms=timeout_ms)
        try:
            await store.create_placement(Placement("orders", "g1", 1))
            await store.register_node(node("n1"), TTL_MS * 30)
            watch = store.watch()
            await established(watch)

            server.stop()
            calls: list[Callable[[], Awaitable[Any]]] = [
                lambda: store.get_placement("orders"),
                lambda: store.create_placement(Placement("other", "g1", 1)),
                store.list_nodes,
                lambda: store.refresh_node("n1"),
                lambda: store.put_setting("k", "v"),
            ]
            for call in calls:
                started = time.monotonic()
                with pytest.raises(MetadataUnavailable) as raised:
                    await call()
                assert time.monotonic() - started < timeout_ms / 1000 + 0.5
                assert raised.value.retriable and raised.value.reason == "METADATA_UNAVAILABLE"

            server.start()
            await eventually(lambda: _answers(store), 15.0, "etcd answers again")
            assert await store.get_placement("orders") == Placement("orders", "g1", 1)
            assert await store.get_placement("other") is None
            # The watch re-established itself and says what it may have missed.
            await next_event(watch, lambda e: e.resync and e.kind == "placement")
            await store.put_setting("back", "yes")
            await next_event(watch, lambda e: e == MetadataEvent("setting", "back"))
        finally:
            await store.close()


async def test_hung_etcd_calls_end_with_unavailable_at_the_timeout_not_later() -> None:
    timeout_ms = 500
    with EtcdServer() as server:
        store = EtcdMetadataStore(server.endpoint, prefix=_prefix(), timeout_ms=timeout_ms)
        try:
            await store.create_placement(Placement("orders", "g1", 1))
            server.pause()
            for call in (
                lambda: store.get_placement("orders"),
                lambda: store.list_placements(),
                lambda: store.set_shard_leader("g1", "n1", 3),
            ):
                started = time.monotonic()
                with pytest.raises(MetadataUnavailable):
                    await call()
                assert time.monotonic() - started < timeout_ms / 1000 + 0.5
            server.resume()
            await eventually(lambda: _answers(store), 10.0, "etcd answers again")
            assert await store.get_placement("orders") == Placement("orders", "g1", 1)
        finally:
            server.resume()
            await store.close()


async def _answers(store: MetadataStore) -> bool:
    try:
        await store.get_setting("probe")
    except MetadataUnavailable:
        return False
    return True


async def test_two_etcd_clients_racing_to_place_queues_never_both_win(etcd: EtcdServer) -> None:
    prefix = _prefix()
    first = EtcdMetadataStore(etcd.endpoint, prefix=prefix)
    second = EtcdMetadataStore(etcd.endpoint, prefix=prefix)
    try:
        queues = [f"race-{i}" for i in range(100)]
        results = await asyncio.gather(
            *(
                store.create_placement(Placement(q, gid, 1))
                for q in queues
                for store, gid in ((first, "g-first"), (second, "g-second"))
            ),
            return_exceptions=True,
        )
        for i, q in enumerate(queues):
            pair = results[2 * i : 2 * i + 2]
            assert sum(r is None for r in pair) == 1, (q, pair)
            winner = "g-first" if pair[0] is None else "g-second"
            placed = await second.get_placement(q)
            assert placed is not None and placed.group_id == winner
    finally:
        await first.close()
        await second.close()


async def test_etcd_stores_with_different_prefixes_do_not_see_each_other(etcd: EtcdServer) -> None:
    one = EtcdMetadataStore(etcd.endpoint, prefix=_prefix())
    two = EtcdMetadataStore(etcd.endpoint, prefix=_prefix())
    try:
        await one.create_placement(Placement("orders", "g1", 1))
        await one.register_node(node("n1"), TTL_MS * 30)
        assert await two.get_placement("orders") is None
        assert await two.list_nodes() == []
        await two.create_placement(Placement("orders", "g2", 1))
    finally:
        await one.close()
        await two.close()


def test_etcd_store_rejects_a_bad_prefix_or_endpoint() -> None:
    for prefix in ("", "fluxmq/", "/fluxmq", "/a b/"):
        with pytest.raises(ValueError):
            EtcdMetadataStore("127.0.0.1:2379", prefix=prefix)
    for endpoint in ("localhost", "host:0", ":2379", "host:port"):
        with pytest.raises(ValueError):
            EtcdMetadataStore(endpoint)
