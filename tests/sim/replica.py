"""One simulated replica: a HardenedSyncObj on a MemoryJournal, ticked by hand, with a small
state machine (the ordered list of applied commands and a sha256 chain over it).

The state machine lives in memory and is lost in a crash, like any process state; a restarted
replica rebuilds it from its snapshot file (if any) and by re-applying its journal, as
pysyncobj does (it starts with raftLastApplied = 1). Snapshot files are real files in the run's
directory and survive crashes: raft/ fsyncs them before the journal prefix they replace goes
(the simulation does not model losing them)."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import struct
from collections.abc import Callable, Sequence
from typing import Any, cast

from pysyncobj import SyncObj

from raft import snapshot_file
from raft._pysyncobj import HardenedSyncObj, SyncObjConf
from raft.journal import Item
from raft.journal_memory import DurableJournalState, MemoryJournal
from tests.sim.checker import SafetyChecker
from tests.sim.writer import SimWriter

_U64 = struct.Struct(">Q")


class ObservedJournal(MemoryJournal):
    """A MemoryJournal that shows every appended entry to the checker (log matching is checked
    as entries are written)."""

    def __init__(self, durable: DurableJournalState | None = None) -> None:
        super().__init__(durable)
        self.on_entry: Callable[[Item, Item | None], None] | None = None
        self.truncated_from: int | None = None  # lowest index deleted since the last check

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        if entryFrom < len(self):
            index = self[entryFrom][1]
            if self.truncated_from is None or index < self.truncated_from:
                self.truncated_from = index
        super().deleteEntriesFrom(entryFrom)

    def clear(self) -> None:
        if len(self):
            self.truncated_from = self[0][1]
        super().clear()

    def add(self, command: bytes, idx: int, term: int) -> None:
        prev = self[-1] if len(self) else None
        super().add(command, idx, term)
        if self.on_entry is not None:
            self.on_entry(self[-1], prev)


class StateMachine:
    """Applied commands in log order and a digest chained over them."""

    def __init__(self) -> None:
        self.applied: list[tuple[int, bytes]] = []
        self.digest = b"\0" * 32
        self.covered_index = 0  # last log index reflected (commands, no-ops, a snapshot)

    def apply(self, index: int, command: bytes) -> bytes:
        self.applied.append((index, command))
        self.digest = hashlib.sha256(self.digest + _U64.pack(index) + command).digest()
        self.covered_index = index
        return self.digest

    def dump(self, covered_index: int) -> bytes:
        return json.dumps(
            {"covered": covered_index, "applied": [[i, c.hex()] for i, c in self.applied]}
        ).encode()

    def restore(self, data: bytes) -> None:
        doc = json.loads(data)
        fresh = StateMachine()
        for i, c in doc["applied"]:
            fresh.apply(int(i), bytes.fromhex(c))
        self.applied, self.digest = fresh.applied, fresh.digest
        self.covered_index = int(doc["covered"])


class _SimSyncObj(HardenedSyncObj):
    """HardenedSyncObj as raft/ runs it."""


class _StockAppendSyncObj(HardenedSyncObj):
    """HardenedSyncObj with hook 3 removed: append-entries go to pysyncobj's stock handler
    (it truncates matching suffixes; shared/notes/RAFT.md problem 1). Used to show the checker
    catches what hook 3 prevents."""

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        if isinstance(message, dict) and self._fx_probation_message(node, message):
            return  # hook 10 stays: new replicas start on probation and leave it by probes
        SyncObj._SyncObj__onMessageReceived(self, node, message)


class _DummyPoller:
    """pysyncobj polls once per tick; simulated nodes have no sockets to wait on."""

    def subscribe(self, descr: Any, callback: Any, eventMask: Any) -> None:
        raise AssertionError("a simulated node opened a file descriptor to poll")

    def unsubscribe(self, descr: Any) -> None:
        pass

    def poll(self, timeout: float) -> None:
        pass


def sim_conf(dump_path: str, serializer: Any, deserializer: Any, snapshots: bool) -> SyncObjConf:
    """Timings as a LAN deployment scaled down (a tick is 10 ms of simulated time)."""
    return SyncObjConf(
        autoTick=False,
        appendEntriesUseBatch=False,
        appendEntriesPeriod=0.05,
        raftMinTimeout=0.2,
        raftMaxTimeout=0.4,
        leaderFallbackTimeout=0.4,
        connectionTimeout=0.4,
        commandsQueueSize=1000,
        # Frames stay far below this: pysyncobj's chunked entries (RAFT.md problem 4) stay off.
        appendEntriesBatchSizeBytes=1 << 16,
        logCompactionMinEntries=40 if snapshots else 1 << 30,
        logCompactionMinTime=1.5 if snapshots else 1e9,
        logCompactionBatchSize=512,  # several chunks per snapshot transfer
        fullDumpFile=dump_path,
        serializer=serializer,
        deserializer=deserializer,
        useFork=False,
        dynamicMembershipChange=True,
    )


class Replica:
    """One incarnation of a node: ``crash()`` ends it; a new Replica with ``crashed_journal``
    is the restart."""

    def __init__(
        self,
        node_id: str,
        peers: Sequence[str],
        root: str,
        journal: ObservedJournal,
        checker: SafetyChecker,
        transport_class: type,
        *,
        stock_append: bool = False,
        snapshots: bool = True,
        probation: bool = False,
        on_whole: Callable[[], None] | None = None,
    ) -> None:
        """``probation``: the replica starts on probation (hook 10), as raft/ starts one whose
        Raft state did not exist; ``on_whole`` is called when it leaves."""
        self.id = node_id
        self.journal = journal
        self.checker = checker
        self.sm = StateMachine()
        self.root = root
        self.dump_path = os.path.join(root, "snapshot")
        self.acks: list[tuple[bytes, int]] = []  # (command, index) acknowledged SUCCESS
        checker.on_restart(node_id)
        journal.on_entry = lambda item, prev: checker.on_append(node_id, item, prev)
        cls = _StockAppendSyncObj if stock_append else _SimSyncObj
        conf = sim_conf(self.dump_path, self._write_snapshot, self._read_snapshot, snapshots)
        extra: dict[str, Any] = {"transport_class": transport_class}
        if "wire_secret" in inspect.signature(HardenedSyncObj.__init__).parameters:
            extra["wire_secret"] = "sim-secret"  # unused: the simulated transport has no wire
        if probation:
            extra["probation"] = True
            extra["on_whole"] = on_whole
        self.so = cls(
            node_id,
            [p for p in peers if p != node_id],
            conf,
            cast(Any, journal),  # typed LmdbJournal; MemoryJournal is its twin, not a subclass
            _DummyPoller(),
            self._apply,
            self._load_snapshot,
            **extra,
        )
        self.commit_seen = 0
        self.writer = SimWriter()

    @property
    def transport(self) -> Any:
        return self.so.transport

    def tick(self) -> None:
        """One round, with the journal handled as PySyncObjShard.step handles it: the leader's
        flush goes to its writer (run later, or at once when waited for), anyone else's is
        synchronous."""
        self.journal.poll_flushed()
        self.so.doTick(0.0)
        if self.so._isLeader():
            self.journal.flush_async(self.writer, lambda: None)
        elif self.transport.flush_before_send:
            self.journal.flush()
        # else: the negative control. Messages here reach their peer only at a later step, after
        # this end-of-round flush; in a real node they may arrive first. Without it, the answers
        # sent unflushed stay undurable until a flush the protocol forces (commit, term).

    def propose(self, command: bytes) -> None:
        self.so.fx_apply(command, callback=lambda res, err: self._on_result(command, res, err))

    def _on_result(self, command: bytes, res: Any, err: int) -> None:
        if err == 0:  # FAIL_REASON.SUCCESS
            self.acks.append((command, int(res)))

    def _apply(self, index: int, frame: bytes) -> int:
        if index <= self.sm.covered_index:
            # Applied already (pysyncobj re-applies after a restart, and after a snapshot older
            # than the state: hook 4 sets raftLastApplied back to it). The broker's apply is
            # idempotent; this one is too, but the entry must still be the one applied there.
            self.checker.on_reapply(self.id, index, frame)
            return index
        digest = self.sm.apply(index, frame)
        self.checker.on_apply(self.id, index, frame, digest)
        return index

    # -- snapshots (hook 4 runs when they are loaded) -------------------------------------------

    def _write_snapshot(self, path: str, data: Sequence[Any]) -> None:
        last, prev, cluster = data
        assert self.so.raftLastApplied == last[1], (self.so.raftLastApplied, last[1])
        self.checker.snapshots_written += 1
        state_path = path + ".state"
        with open(state_path, "wb") as f:
            f.write(self.sm.dump(last[1]))
        members = [n.id if hasattr(n, "id") else str(n) for n in cluster]
        try:
            snapshot_file.write(path, tuple(last), tuple(prev), members, state_path)
        finally:
            os.unlink(state_path)

    def _read_snapshot(self, path: str) -> tuple[Any, Any, Any]:
        info = snapshot_file.read_info(path)
        return info.last, info.prev, list(info.members)

    def _load_snapshot(self, path: str, info: snapshot_file.SnapshotInfo) -> None:
        if self.sm.covered_index >= info.index:
            return  # our state is as new already
        with open(path, "rb") as f:
            f.seek(info.state_offset)
            data = f.read(info.state_bytes)
        self.sm.restore(data)
        assert self.sm.covered_index == info.index, (self.sm.covered_index, info.index)
        last_command = self.sm.applied[-1] if self.sm.applied else None
        self.checker.on_snapshot_installed(self.id, info.index, last_command, self.sm.digest)
