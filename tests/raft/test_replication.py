"""PySyncObjShard replication, three replicas in this process on loopback (LocalCluster).

The guarantees: an acknowledged proposal is applied exactly once, in the same order, on every
replica; it was on the disk of a majority before it was acknowledged; it survives followers,
leaders and whole clusters restarting; replicas that fell behind catch up by log or by snapshot;
leadership and membership can be moved; misconfiguration is refused loudly.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from raft import frames
from raft.api import (
    Entry,
    NotLeaderError,
    OutcomeUnknownError,
    ProposalTimeoutError,
    ShardBusyError,
    ShardClosedError,
    ShardError,
    ShardRequestDeniedError,
)
from raft.driver import RaftDriver
from raft.pysyncobj_shard import (
    PySyncObjShard,
    RaftTimings,
    ShardConfig,
    ShardStartError,
    check_config,
)
from raft.segment_journal import SegmentFileJournal
from tests.raft.helpers import (
    FAST,
    SECRET,
    FileStateMachine,
    LocalCluster,
    encoded_frame_sizes,
    free_ports,
)

WAIT_S = 15.0  # bound on any single wait for the cluster; every test finishes well before


@asynccontextmanager
async def running(root: Path, n: int = 3, **overrides: object) -> AsyncIterator[LocalCluster]:
    c = LocalCluster(str(root), n, **overrides)
    try:
        await asyncio.wait_for(c.start_all(), WAIT_S)
        yield c
    finally:
        await asyncio.wait_for(c.stop_all(), WAIT_S)


async def wait_until(what: str, pred: Callable[[], bool], timeout_s: float = WAIT_S) -> float:
    """Poll ``pred`` until true; return the seconds it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not pred():
        if loop.time() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.02)
    return loop.time() - start


async def sole_leader(c: LocalCluster, address: str | None = None) -> PySyncObjShard:
    """Wait until exactly one running replica is leader (``address`` if given) and every other
    running replica follows it."""

    def ok() -> bool:
        leaders = [s for s in c.shards.values() if s.is_leader]
        if len(leaders) != 1 or (address is not None and leaders[0].address != address):
            return False
        return all(s.leader == leaders[0].address for s in c.shards.values())

    await wait_until(f"a single leader {address or ''}", ok)
    return next(s for s in c.shards.values() if s.is_leader)


async def propose_all(shards: Sequence[PySyncObjShard], payloads: Sequence[bytes]) -> list[object]:
    """Propose every payload at once, round robin over ``shards``."""
    coros = [shards[i % len(shards)].propose(p) for i, p in enumerate(payloads)]
    return list(await asyncio.wait_for(asyncio.gather(*coros), WAIT_S))


async def propose_each(shard: PySyncObjShard, payloads: Sequence[bytes]) -> None:
    """One proposal at a time: each becomes its own log entry."""
    for p in payloads:
        await asyncio.wait_for(shard.propose(p), WAIT_S)


def followers(c: LocalCluster, leader: PySyncObjShard) -> list[PySyncObjShard]:
    return [s for s in c.shards.values() if s is not leader]


def assert_same_history(c: LocalCluster, acked: Sequence[bytes]) -> list[bytes]:
    """Every running replica applied the same sequence; every acked payload is in it once."""
    seqs = {a: sm.payloads() for a, sm in c.sms.items()}
    ref = next(iter(seqs.values()))
    for a, seq in seqs.items():
        assert seq == ref, f"{a} diverged ({len(seq)} vs {len(ref)} applied)"
    assert len(set(ref)) == len(ref), "a payload was applied twice"
    missing = set(acked) - set(ref)
    assert not missing, f"{len(missing)} acknowledged payloads were lost"
    for a, sm in c.sms.items():
        idx = [i for i, _ in sm.applied]
        assert all(x < y for x, y in itertools.pairwise(idx)), f"{a}: indexes not increasing"
    return ref


def has_snapshot(c: LocalCluster, address: str) -> bool:
    return os.path.exists(os.path.join(c.data_dir(address), "raft", "s1", "snapshot"))


def payloads(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


# -- ordering, exactly once, durability ------------------------------------------------------


async def test_acked_proposals_apply_exactly_once_in_one_order_and_results_match_positions(
    tmp_path: Path,
) -> None:
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        f1, f2 = followers(c, leader)
        sent = payloads("p", 3000)
        results = await propose_all([leader, f1, leader, f2], sent)  # half via followers
        await c.converged(WAIT_S)
        applied = assert_same_history(c, sent)
        assert sorted(applied) == sorted(sent)
        for p, r in zip(sent, results, strict=True):
            assert isinstance(r, int), (p, r)
            assert applied[r - 1] == p, f"{p!r} got result {r}, applied at another position"
        for s in c.shards.values():
            assert s.acked_not_durable_on_majority == 0, s.address
        # Coalescing happened: far fewer log entries than proposals.
        assert sum(s.frames_proposed for s in c.shards.values()) < len(sent) // 2


def _count_durable_replicas_at_apply(
    c: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[tuple[str, int, int]], list[int]]:
    """Wrap every replica's apply_batch: for each entry, count the replicas whose journal has
    fsync'd its log index at the moment it is applied. -> (violations, [entries checked])."""
    journals: list[SegmentFileJournal] = []
    for s in c.shards.values():
        assert s.journal is not None
        journals.append(s.journal)
    violations: list[tuple[str, int, int]] = []
    checked = [0]

    for address, sm in c.sms.items():

        def apply_batch(
            entries: Sequence[Entry],
            _orig: Callable[[Sequence[Entry]], list[object]] = sm.apply_batch,
            _address: str = address,
        ) -> list[object]:
            for e in entries:
                log_index = frames.log_index_of(e.index)
                durable = sum(j.durable_index >= log_index for j in journals)
                if durable < 2:
                    violations.append((_address, log_index, durable))
            checked[0] += len(entries)
            return _orig(entries)

        monkeypatch.setattr(sm, "apply_batch", apply_batch)
    return violations, checked


async def test_no_proposal_is_applied_before_a_majority_fsynced_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        violations, checked = _count_durable_replicas_at_apply(c, monkeypatch)
        f1, _ = followers(c, leader)
        sent = payloads("d", 1500)
        await propose_all([leader, f1], sent)
        await propose_each(leader, payloads("e", 30))
        await c.converged(WAIT_S)
        assert checked[0] >= 3 * len(sent), checked
        assert violations == [], violations[:10]
        for s in c.shards.values():
            assert s.acked_not_durable_on_majority == 0, s.address


@pytest.mark.parametrize("broken", ["flush-everywhere", "flush-on-followers", "flush-before-send"])
async def test_majority_fsync_check_detects_missing_fsyncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    """Negative control: break durability and the same check reports violations, so the check
    above can fail. flush() a no-op everywhere or on the followers only; or messages sent
    before the journal is flushed (the node still fsyncs, at the end of its round)."""
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        await propose_each(leader, [b"warm-up"])
        violations, _ = _count_durable_replicas_at_apply(c, monkeypatch)
        if broken == "flush-before-send":
            for s in c.shards.values():
                assert s.syncobj is not None
                s.syncobj.transport.flush_before_send = False
        else:
            real_flush, real_flush_async = SegmentFileJournal.flush, SegmentFileJournal.flush_async
            silent = {
                id(s.journal)
                for s in c.shards.values()
                if broken == "flush-everywhere" or s is not leader
            }

            def flush(self: SegmentFileJournal) -> None:
                if id(self) not in silent:
                    real_flush(self)

            def flush_async(self: SegmentFileJournal, *args: Any) -> None:
                if id(self) not in silent:
                    real_flush_async(self, *args)

            monkeypatch.setattr(SegmentFileJournal, "flush", flush)
            monkeypatch.setattr(SegmentFileJournal, "flush_async", flush_async)
        # One entry at a time: without flush-before-send about a third of the entries are
        # applied by the leader before any follower's fsync (measured: 16 to 44 of 100).
        await propose_each(leader, payloads("m", 100))
        assert violations, "the check did not notice that no majority fsync'd"
        # Followers that acknowledge what they did not fsync fool the leader's own count (it
        # trusts their match indexes, hook 7): only this check from outside sees it, which is
        # why a follower's flush before it answers (raft/outbox.py) is the rule that matters.
        assert leader.acked_not_durable_on_majority == 0
        monkeypatch.undo()  # a working flush again before the cluster stops


# -- restarts and catch-up ------------------------------------------------------------------


async def _writer(
    shard: PySyncObjShard, acked: list[bytes], stop: asyncio.Event, tag: str, rounds_max: int
) -> None:
    for r in range(rounds_max):
        if stop.is_set():
            return
        batch = payloads(f"{tag}{r}", 20)
        await propose_all([shard], batch)
        acked.extend(batch)
        await asyncio.sleep(0.005)


async def test_stopped_follower_catches_up_by_log_after_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed: list[str] = []
    real_install = FileStateMachine.install_snapshot

    def spy(self: FileStateMachine, path: str) -> None:
        installed.append(self.path)
        real_install(self, path)

    monkeypatch.setattr(FileStateMachine, "install_snapshot", spy)
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        f = followers(c, leader)[0].address
        acked: list[bytes] = []
        stop = asyncio.Event()
        writer = asyncio.create_task(_writer(leader, acked, stop, "w", 2000))
        await wait_until("some writes", lambda: len(acked) >= 200)
        await c.stop(f)
        down_at = len(acked)
        await wait_until("writes while the follower is down", lambda: len(acked) >= down_at + 600)
        await c.start(f)
        up_at = len(acked)
        await wait_until("writes after the restart", lambda: len(acked) >= up_at + 200)
        stop.set()
        await asyncio.wait_for(writer, WAIT_S)
        await c.converged(WAIT_S)
        assert_same_history(c, acked)
        assert installed == [], "caught up by snapshot, expected by log"
        assert not has_snapshot(c, f)


async def test_follower_behind_the_compacted_log_catches_up_by_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed: list[str] = []
    real_install = FileStateMachine.install_snapshot

    def spy(self: FileStateMachine, path: str) -> None:
        installed.append(self.path)
        real_install(self, path)

    monkeypatch.setattr(FileStateMachine, "install_snapshot", spy)
    async with running(tmp_path, compaction_entries_min=50) as c:
        leader = await sole_leader(c)
        f = followers(c, leader)[0].address
        await propose_each(leader, payloads("before", 5))
        await c.stop(f)
        acked = payloads("down", 250)
        await propose_each(leader, acked)  # 250 entries: the leader compacts its log
        await wait_until("a snapshot on the leader", lambda: has_snapshot(c, leader.address))
        await c.start(f)
        await c.converged(WAIT_S)
        assert_same_history(c, payloads("before", 5) + acked)
        assert has_snapshot(c, f), "no snapshot file on the restarted follower"
        f_sm_path = os.path.join(c.data_dir(f), "applied.bin")
        assert f_sm_path in installed, "the follower did not install a snapshot"
        # And it keeps replicating by log afterwards.
        more = payloads("after", 20)
        await propose_all([leader], more)
        await c.converged(WAIT_S)
        assert_same_history(c, payloads("before", 5) + acked + more)
        # Restarted again, it starts from its own snapshot and journal: nothing re-installed.
        installed.clear()
        await c.stop(f)
        await c.start(f)
        last = payloads("last", 20)
        await propose_all([leader, c.shards[f]], last)
        await c.converged(WAIT_S)
        assert_same_history(c, payloads("before", 5) + acked + more + last)
        assert installed == []


async def test_received_snapshot_is_fsynced_before_the_journal_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj writes a received snapshot and renames it without fsync; the journal is then
    cut back to the snapshot's last entries (one fsync'd append). The file must be
    durable first, or a power loss leaves a replica with neither the log nor the snapshot."""
    events: list[tuple[str, str]] = []
    real_fsync, real_clear = os.fsync, SegmentFileJournal.clear

    def fsync(fd: int) -> None:
        real_fsync(fd)
        with contextlib.suppress(OSError):
            events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    def clear(self: SegmentFileJournal) -> None:
        events.append(("clear", self._path))
        real_clear(self)

    async with running(tmp_path, compaction_entries_min=50) as c:
        leader = await sole_leader(c)
        f = followers(c, leader)[0].address
        await c.stop(f)
        await propose_each(leader, payloads("s", 120))
        await wait_until("a snapshot on the leader", lambda: has_snapshot(c, leader.address))
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(SegmentFileJournal, "clear", clear)
        await c.start(f)
        await c.converged(WAIT_S)
        monkeypatch.undo()
    _assert_synced_before_cleared(events, c.data_dir(f))


def _assert_synced_before_cleared(events: list[tuple[str, str]], data_dir: str) -> None:
    root = os.path.join(data_dir, "raft", "s1")
    dump = os.path.realpath(os.path.join(root, "snapshot"))
    cleared_at = events.index(("clear", os.path.join(root, "wal")))
    assert ("fsync", dump) in events[:cleared_at], "journal replaced before the snapshot was synced"


async def test_restarting_every_replica_after_compaction_loses_nothing_acknowledged(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, compaction_entries_min=50) as c:
        leader = await sole_leader(c)
        acked = payloads("k", 130)
        await propose_each(leader, acked)  # 130 entries: every replica compacts twice
        await c.converged(WAIT_S)
        for a in c.addresses:
            assert has_snapshot(c, a), a
        before = assert_same_history(c, acked)
        await c.stop_all()
        await asyncio.wait_for(c.start_all(), WAIT_S)
        leader = await sole_leader(c)
        more = payloads("l", 100)
        await propose_all([leader, *followers(c, leader)], more)
        await c.converged(WAIT_S)
        after = assert_same_history(c, acked + more)
        assert after[: len(before)] == before


async def test_restarting_every_replica_loses_nothing_acknowledged(tmp_path: Path) -> None:
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        f1, f2 = followers(c, leader)
        acked = payloads("a", 1000)
        await propose_all([leader, f1, f2], acked)
        await propose_each(leader, payloads("b", 20))
        acked += payloads("b", 20)
        await c.converged(WAIT_S)
        before = assert_same_history(c, acked)

        await c.stop_all()
        await asyncio.wait_for(c.start_all(), WAIT_S)
        # The applied state came back from disk and nothing is applied twice on replay.
        leader = await sole_leader(c)
        more = payloads("c", 300)
        await propose_all([leader, *followers(c, leader)], more)
        await c.converged(WAIT_S)
        after = assert_same_history(c, acked + more)
        assert after[: len(before)] == before
        for s in c.shards.values():
            assert s.acked_not_durable_on_majority == 0


async def test_leader_stop_elects_a_new_leader_and_proposals_resume(tmp_path: Path) -> None:
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        acked = payloads("x", 300)
        await propose_all([leader], acked)
        old = leader.address
        t0 = time.perf_counter()
        await c.stop(old)
        new = await sole_leader(c)
        elected_s = time.perf_counter() - t0
        (other,) = followers(c, new)
        more = payloads("y", 300)
        await propose_all([new, other], more)
        resumed_s = time.perf_counter() - t0
        print(f"\nleader stop -> new leader {elected_s:.3f} s, proposals acked {resumed_s:.3f} s")
        assert new.address != old
        assert resumed_s < 10.0
        await c.converged(WAIT_S)
        assert_same_history(c, acked + more)
        # The old leader comes back as a follower and catches up.
        await c.start(old)
        await c.converged(WAIT_S)
        assert_same_history(c, acked + more)


async def test_leader_stop_under_load_keeps_every_acked_and_applies_no_refused_proposal(
    tmp_path: Path,
) -> None:
    """Writers on every replica while the leader stops. Acknowledged: applied exactly once.
    Refused as never written (closed, not leader, timeout): never applied. Only
    OutcomeUnknownError may go either way."""
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        acked: list[bytes] = []
        refused: dict[bytes, str] = {}
        stop = asyncio.Event()

        async def writer(shard: PySyncObjShard, tag: str) -> None:
            for r in range(2000):
                if stop.is_set():
                    return
                batch = payloads(f"{tag}{r}", 20)
                coros = [shard.propose(p) for p in batch]
                results = await asyncio.wait_for(
                    asyncio.gather(*coros, return_exceptions=True), WAIT_S
                )
                for p, res in zip(batch, results, strict=True):
                    if isinstance(res, BaseException):
                        assert isinstance(res, ShardError), repr(res)
                        refused[p] = type(res).__name__
                    else:
                        acked.append(p)
                if isinstance(results[-1], ShardClosedError):
                    return
                await asyncio.sleep(0.002)

        tasks = [asyncio.create_task(writer(s, f"w{k}-")) for k, s in enumerate(c.shards.values())]
        await wait_until("writes before the stop", lambda: len(acked) >= 600)
        await c.stop(leader.address)
        at_stop = len(acked)
        await wait_until("writes after the stop", lambda: len(acked) >= at_stop + 600)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
        await c.converged(WAIT_S)
        applied = set(assert_same_history(c, acked))
        never = {p for p, kind in refused.items() if kind != "OutcomeUnknownError"}
        assert not never & applied, sorted(never & applied)[:5]
        kinds = sorted(set(refused.values()))
        print(f"\n{len(acked)} acked, refused: {kinds}")


# -- leadership and membership --------------------------------------------------------------


async def test_transfer_leadership_moves_the_leader(tmp_path: Path) -> None:
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        await propose_each(leader, payloads("t", 5))
        target = followers(c, leader)[0]
        assert await asyncio.wait_for(leader.transfer_leadership(target.address), WAIT_S) == (
            target.address
        )
        await sole_leader(c, target.address)
        with pytest.raises(NotLeaderError):
            await leader.transfer_leadership()
        with pytest.raises(NotLeaderError):
            await leader.transfer_leadership(target.address)

        # None: the new leader picks a caught-up follower (an awaited proposal with nothing
        # else in flight leaves at least one follower matching the last index).
        await propose_each(target, payloads("u", 5))
        chosen = await asyncio.wait_for(target.transfer_leadership(None), WAIT_S)
        assert chosen != target.address and chosen in c.shards
        new = await sole_leader(c, chosen)
        await propose_all([new, leader, target], payloads("v", 90))
        await c.converged(WAIT_S)
        assert_same_history(c, payloads("t", 5) + payloads("u", 5) + payloads("v", 90))


async def test_transfer_leadership_to_a_non_member_is_denied(tmp_path: Path) -> None:
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        with pytest.raises(ShardRequestDeniedError):
            await leader.transfer_leadership(f"127.0.0.1:{free_ports(1)[0]}")
        assert await leader.transfer_leadership(leader.address) == leader.address
        assert leader.is_leader


async def test_added_member_receives_the_log_and_can_be_removed(tmp_path: Path) -> None:
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        first = payloads("m", 200)
        await propose_all([leader], first)
        new = c.add_address()
        await asyncio.wait_for(leader.add_member(new), WAIT_S)
        fourth = await c.start(new)  # configured with every replica as a peer
        await wait_until("4 members", lambda: len(leader.status().members) == 4)
        second = payloads("n", 200)
        leader = await sole_leader(c)
        await propose_all([leader, fourth], second)
        await c.converged(WAIT_S)
        assert len(c.sms) == 4
        assert_same_history(c, first + second)
        assert new in leader.status().members

        await asyncio.wait_for(leader.remove_member(new), WAIT_S)
        await wait_until("3 members", lambda: new not in leader.status().members)
        await c.stop(new)
        leader = await sole_leader(c)
        third = payloads("o", 100)
        await propose_all([leader], third)
        await c.converged(WAIT_S)
        assert_same_history(c, first + second + third)


async def test_the_leader_cannot_remove_itself(tmp_path: Path) -> None:
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        with pytest.raises(ShardRequestDeniedError, match="transfer leadership first"):
            await leader.remove_member(leader.address)
        assert len(leader.status().members) == 3 and leader.is_leader


# -- security and configuration ---------------------------------------------------------------


async def test_replica_with_another_secret_is_ignored_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="raft.wire")
    c = LocalCluster(str(tmp_path))
    try:
        stranger = c.addresses[2]
        await c.start(c.addresses[0])
        await c.start(c.addresses[1])
        await c.start(stranger, secret="not-the-" + SECRET)
        good = [c.shards[a] for a in c.addresses[:2]]
        await wait_until("a leader among the two", lambda: any(s.is_leader for s in good))
        leader = next(s for s in good if s.is_leader)
        acked = payloads("s", 200)
        await propose_all(good, acked)
        await wait_until(
            "a cluster-secret warning",
            lambda: any(
                r.name == "raft.wire" and "secret" in r.getMessage() for r in caplog.records
            ),
        )
        await wait_until(
            "both good replicas applied everything",
            lambda: all(len(c.sms[a].applied) == len(acked) for a in c.addresses[:2]),
        )
        assert c.sms[stranger].applied == [], "the stranger received replicated data"
        assert not c.shards[stranger].is_leader and c.shards[stranger].leader is None
        assert leader.is_leader
        assert c.sms[c.addresses[0]].payloads() == c.sms[c.addresses[1]].payloads()
    finally:
        await asyncio.wait_for(c.stop_all(), WAIT_S)


def _config(tmp_path: Path, address: str, peers: tuple[str, ...], **kw: object) -> ShardConfig:
    args: dict[str, object] = {"secret": SECRET, "timings": FAST, **kw}
    return ShardConfig(
        shard_id="s1",
        self_address=address,
        peers=peers,
        data_dir=str(tmp_path / "n"),
        **args,  # type: ignore[arg-type]
    )


async def test_start_on_a_port_in_use_raises_shard_start_error_naming_the_address(
    tmp_path: Path,
) -> None:
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    address = f"127.0.0.1:{blocker.getsockname()[1]}"
    peers = tuple(f"127.0.0.1:{p}" for p in free_ports(2))
    driver = RaftDriver(idle_wait_ms=2)
    shard = PySyncObjShard(
        FileStateMachine(str(tmp_path / "sm.bin")), _config(tmp_path, address, peers), driver
    )
    try:
        with pytest.raises(ShardStartError, match=re.escape(address)):
            await asyncio.wait_for(shard.start(), WAIT_S)
    finally:
        driver.stop()
        blocker.close()


@pytest.mark.parametrize(
    ("what", "peers_of", "kw", "message"),
    [
        ("empty secret", lambda a, p: p, {"secret": ""}, "secret is required"),
        ("duplicate peer", lambda a, p: (p[0], p[0]), {}, "listed twice"),
        ("self as peer", lambda a, p: (a, p[0]), {}, "listed twice"),
        ("not host:port", lambda a, p: ("localhost", p[0]), {}, "not host:port"),
        (
            "commit notice after the heartbeat",
            lambda a, p: p,
            {"timings": RaftTimings(heartbeat_ms=100, commit_notice_ms=100)},
            "commit_notice_ms 100 must be",
        ),
    ],
)
def test_bad_config_is_refused_at_construction(
    tmp_path: Path,
    what: str,
    peers_of: Callable[[str, tuple[str, ...]], tuple[str, ...]],
    kw: dict[str, object],
    message: str,
) -> None:
    address, *others = (f"127.0.0.1:{p}" for p in free_ports(3))
    cfg = _config(tmp_path, address, peers_of(address, tuple(others)), **kw)
    driver = RaftDriver(idle_wait_ms=2)
    try:
        with pytest.raises(ShardStartError, match=message):
            PySyncObjShard(FileStateMachine(str(tmp_path / "sm.bin")), cfg, driver)
    finally:
        driver.stop()


async def test_proposal_whose_deadline_passes_without_a_leader_times_out_and_is_never_applied(
    tmp_path: Path,
) -> None:
    c = LocalCluster(str(tmp_path))
    try:
        alone = await c.start(c.addresses[0])  # one of three: no majority, no leader
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(ProposalTimeoutError):
            await asyncio.wait_for(alone.propose(b"late", deadline=loop.time() + 0.3), WAIT_S)
        assert 0.25 <= loop.time() - t0 < 5
        assert alone.leader is None
        # Once a leader exists, later proposals go through and the expired one never applies.
        await c.start(c.addresses[1])
        await c.start(c.addresses[2])
        leader = await sole_leader(c)
        await propose_all([leader, alone], payloads("ok", 20))
        await c.converged(WAIT_S)
        applied = assert_same_history(c, payloads("ok", 20))
        assert b"late" not in applied
    finally:
        await asyncio.wait_for(c.stop_all(), WAIT_S)


async def test_waiting_proposals_are_bounded_and_fail_cleanly_on_close(tmp_path: Path) -> None:
    c = LocalCluster(str(tmp_path), pending_max=10)
    try:
        alone = await c.start(c.addresses[0])  # no leader: proposals wait
        waiting = [asyncio.create_task(alone.propose(b"w%d" % i)) for i in range(10)]
        await wait_until("10 waiting", lambda: alone.status().pending_proposals == 10)
        with pytest.raises(ShardBusyError):
            await alone.propose(b"one too many")
        await c.stop(alone.address)
        for t in waiting:
            with pytest.raises(ShardClosedError):
                await asyncio.wait_for(t, WAIT_S)
        with pytest.raises(ShardClosedError):
            await alone.propose(b"after close")
    finally:
        await asyncio.wait_for(c.stop_all(), WAIT_S)


async def test_frames_respect_the_byte_limit_and_larger_payloads_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = encoded_frame_sizes(monkeypatch)
    async with running(tmp_path, frame_bytes_max=4096) as c:
        leader = await sole_leader(c)
        with pytest.raises(ShardRequestDeniedError, match="frame limit"):
            await leader.propose(b"x" * 4096)
        sent = [b"%04d" % i + b"y" * 996 for i in range(200)]  # 1000 bytes: 4 per frame
        results = await propose_all([leader], sent)
        assert len(sizes) >= len(sent) // 4 and max(sizes) <= 4096, (len(sizes), max(sizes))
        await c.converged(WAIT_S)
        applied = assert_same_history(c, sent)
        assert [applied[r - 1] for r in results if isinstance(r, int)] == sent


async def test_proposal_handed_to_a_leader_without_majority_ends_outcome_unknown(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, ack_timeout_ms=1000) as c:
        leader = await sole_leader(c)
        await propose_each(leader, [b"ok"])
        for f in followers(c, leader):
            await c.stop(f.address)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(OutcomeUnknownError):
            await asyncio.wait_for(leader.propose(b"maybe"), WAIT_S)
        assert loop.time() - t0 < 5


async def test_transfer_leadership_under_load_succeeds_and_keeps_every_acked(
    tmp_path: Path,
) -> None:
    """A transfer while writers keep every replica busy: the leader stops appending until a
    follower matches its log, so the transfer is neither denied for a follower that is always a
    few entries behind nor lost to entries appended after TimeoutNow; nothing acknowledged is
    lost or applied twice."""
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        acked: list[bytes] = []
        stop = asyncio.Event()
        writers = [
            asyncio.create_task(_load(s, acked, stop, f"x{k}-"))
            for k, s in enumerate(c.shards.values())
        ]
        await wait_until("writes before the transfer", lambda: len(acked) >= 400)
        term = leader.status().term
        chosen = await asyncio.wait_for(leader.transfer_leadership(), WAIT_S)
        assert chosen != leader.address
        new = await sole_leader(c, chosen)
        # Won by the TimeoutNow campaign itself: the target's log matched, so the very next
        # term elected it (a campaign lost to a longer log would need another election).
        assert new.status().term == term + 1
        at_transfer = len(acked)
        await wait_until("writes after the transfer", lambda: len(acked) >= at_transfer + 400)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*writers), WAIT_S)
        await c.converged(WAIT_S)
        assert_same_history(c, acked)


async def _load(shard: PySyncObjShard, acked: list[bytes], stop: asyncio.Event, tag: str) -> None:
    """20 proposals in flight at a time; a proposal that fails retriably is not counted."""
    for r in range(3000):
        if stop.is_set():
            return
        batch = payloads(f"{tag}{r}", 20)
        results = await asyncio.wait_for(
            asyncio.gather(*(shard.propose(p) for p in batch), return_exceptions=True), WAIT_S
        )
        for p, res in zip(batch, results, strict=True):
            if not isinstance(res, BaseException):
                acked.append(p)
            else:
                assert isinstance(res, ShardError), repr(res)


async def test_replicas_named_by_dns_names_form_a_shard_and_bind_where_told(
    tmp_path: Path,
) -> None:
    """Raft identities may be DNS names (a StatefulSet pod's stable name); the endpoint binds
    ``bind_address`` when given."""
    c = LocalCluster(str(tmp_path), 3)
    c.addresses = [a.replace("127.0.0.1", "localhost") for a in c.addresses]
    try:
        for a in c.addresses:
            await c.start(a, bind_address=a.replace("localhost", "127.0.0.1"))
        leader = await sole_leader(c)
        assert leader.address.startswith("localhost:")
        await propose_all(list(c.shards.values()), payloads("dns", 60))
        await c.converged(WAIT_S)
        assert_same_history(c, payloads("dns", 60))
    finally:
        await asyncio.wait_for(c.stop_all(), WAIT_S)


@pytest.mark.parametrize(
    "address", ["-bad-:7100", "a..b:7100", "300.1.1.1:7100", "host:0", "host", "ho st:7100"]
)
def test_malformed_raft_addresses_are_refused(address: str) -> None:
    with pytest.raises(ShardStartError, match="raft address"):
        check_config(
            ShardConfig(
                shard_id="s", self_address=address, peers=(), data_dir="/x", secret="s" * 16
            )
        )


async def test_a_holding_leader_appends_nothing_and_forwards_held_commands_afterwards(
    tmp_path: Path,
) -> None:
    """The mechanism under the transfer: while the leader holds, neither its own nor forwarded
    commands reach its log; released, they commit."""
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        follower = followers(c, leader)[0]
        await propose_each(leader, payloads("h", 3))
        so = leader.syncobj
        journal = leader.journal
        assert so is not None and journal is not None

        def hold(on: bool) -> None:
            so.fx_holding = on

        await asyncio.wrap_future(c.drivers[leader.address].call(lambda: hold(True)))
        last = journal.last_index
        pending = [
            asyncio.ensure_future(s.propose(p))
            for s, p in zip([leader, follower] * 5, payloads("held", 10), strict=True)
        ]
        await asyncio.sleep(0.5)
        assert journal.last_index == last
        assert not any(p.done() for p in pending)
        await asyncio.wrap_future(c.drivers[leader.address].call(lambda: hold(False)))
        await asyncio.wait_for(asyncio.gather(*pending), WAIT_S)
        await c.converged(WAIT_S)
        assert_same_history(c, payloads("h", 3) + payloads("held", 10))
