"""Every touch of pysyncobj's internals, in one place.

Why this module exists: pysyncobj 0.3.17 is a usable Raft engine but not a durable or fully safe
one (shared/notes/RAFT.md has the measurements). Fixing it needs a few hooks that its public API
does not offer. Each is listed here with its reason; ``check_assumptions()`` verifies at import
time that they still exist, and tests/unit/test_pysyncobj_hardening.py pins their behaviour, so a
pysyncobj upgrade that moves them fails loudly instead of silently losing data.

1. The journal. ``SyncObj.__init__`` creates it by calling ``createJournal`` from the
   ``pysyncobj.syncobj`` namespace and reads term, vote and commit index from it before it
   returns, so it cannot be swapped afterwards: we rebind that name while constructing. Same for
   ``createPoller``, so that every shard of a process shares one poller and one driver thread.
2. The wire. pysyncobj's ``transportClass=`` hook builds ``raft/wire_transport.WireTransport``:
   FluxMQ's own frames (raft/wire.py: peers authenticated with the cluster secret, an HMAC on
   every frame, no zlib and no Fernet), bounded connections (raft/wire_guard.py), a log line
   for every refused peer, and the journal made durable before any message leaves:
   append-entries, their acknowledgements, votes. With the flush before the commit index moves
   (``JournalCore.setRaftCommitIndex``), nothing is acknowledged before it is fsync'd.
3. Append-entries without a term conflict (RAFT.md problem 1). Stock pysyncobj truncates a
   follower's log after ``prevLogIdx`` whenever it has later entries, even matching ones, which
   deletes acknowledged entries. ``_SyncObj__onMessageReceived`` is wrapped to apply Raft's rule:
   entries already present with the same term are skipped; the log is truncated only at a real
   conflict; and a follower never takes a commit index beyond what this message proved it shares
   with the leader (the unproven suffix is hidden from the stock handler while it runs).
4. Loading a snapshot (RAFT.md problem 3). Stock ``__loadDumpFile`` wipes the journal at start
   whenever its first entries differ from the dump's, losing acknowledged entries written after
   the dump. The override keeps the journal when it holds the snapshot's last entry with the same
   term, installs the state copy only when the state is older than the snapshot, and sets the
   applied index.
5. Failover after a crash. A follower whose connection to the leader closes (the leader's
   process died: kill -9, OOM, a machine reset) campaigns within ``FAST_ELECTION_WINDOW_S``
   instead of waiting out a whole election timeout since the last heartbeat; a leader that is
   merely slow or cut off keeps its connections open, so the usual timeout still applies.
   ``_SyncObj__onNodeDisconnected`` is wrapped to move ``_SyncObj__raftElectionDeadline``
   earlier (never later).
6. Asynchronous replication needs to know that a command handed to ``_applyCommand`` is in the
   leader's log: ``queued_commands`` reads the length of pysyncobj's command queue.
7. A leader's own fsync is off the commit path. pysyncobj's leader counts its whole log toward
   a majority, and its fsync runs on the journal writer meanwhile (``flush_async``). The journal
   asks ``_fx_bound_commit`` before the commit index moves: the leader counts itself only up to
   its durable index, followers by their match index (they acknowledge only what they fsync'd),
   so an entry on the disks of a majority commits without waiting for the leader's disk, and
   nothing commits that a majority does not hold durably. pysyncobj's
   ``_SyncObj__raftCommitIndex`` is set to the bounded index; the next tick proposes again.
8. No self-wake per command. With ``appendEntriesUseBatch`` off, every ``_applyCommand`` writes
   a byte to pysyncobj's own pipe to wake its tick thread. Here every command is handed over on
   the driver thread right before the tick that takes it (``PySyncObjShard._hand_over``), so
   the byte only costs a write, a read and an extra driver round: ``_SyncObj__pipeNotifier`` is
   replaced by one that does nothing, and its pipe is closed.
9. Commit notices ride with the next append. After a leader applies, stock pysyncobj sends an
   append-entries at once whose only news is the commit index; at one message per round that
   doubles the messages, journal checks and driver rounds of every follower. The override of
   ``_SyncObj__applyLogEntries`` instead moves the leader's next append-entries time to at most
   ``fx_commit_notice_s`` away: a new entry in the meantime carries the index (the next round
   of a steady load), else that append does. Only followers' apply waits; what is committed
   and when the leader answers do not change.
10. A replica that lost its disk is not a voter until it is whole again (raft/probation.py has
   the rule and why). A replica started ``probation=True`` drops request-vote and timeout-now
   messages, never campaigns (its election deadline is pushed on every tick), and asks the
   other members (``fx_probe``, on every new connection and every ``PROBE_INTERVAL_S``)
   whether they hold any entry; every member answers probes.
   It leaves probation when a leader's append-entries proves it holds the leader's commit
   index (of the leader's term) and its journal has that on disk, or when a majority holds
   nothing and no member holds anything; then it records the leader as its vote in the
   current term, flushes, and calls ``on_whole``.
11. Catching a follower up without resend storms (raft/catch_up.py): the transport does not
   queue append-entries behind a follower that has not read 16 MiB, so a new or refilled
   replica far behind a loaded leader is not sent its backlog again for every message it
   could not use. (In the transport, not in pysyncobj: listed here because it answers a
   pysyncobj behaviour.)
12. Append-entries answers carry their term. pysyncobj's answer (``next_node_idx``) says how
   far the follower's log matches but not for which term's append-entries, and a leader
   counts every success answer toward its match index. A node that leads again after other
   leaders (whose entries replaced the ones it had sent) could take an answer to its earlier
   term's append-entries, delayed on a slow but unbroken connection, as proof that the
   follower holds the entries now at those indexes, and commit an entry only it holds
   (tests/sim/stale_answer.py has the schedule). ``_SyncObj__sendNextNodeIdx`` is replaced
   by one that adds the follower's current term (the term of the append-entries it answers),
   and an answer of another term than the receiver's current one is dropped before the
   stock handler sees it (Raft's rule for stale responses). Answers from a node without this
   hook carry no term and are taken as before.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable
from typing import Any

import pysyncobj.syncobj as _so
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.poller import createPoller
from pysyncobj.version import VERSION

from raft import snapshot_file
from raft.journal_core import JournalCore
from raft.probation import PROBE_REPLY_TYPE, PROBE_TYPE, Probation, holds_nothing
from raft.wire_guard import WireLimits, wire_frame_bytes_max
from raft.wire_transport import WireTls, WireTransport

log = logging.getLogger("raft.pysyncobj")

PYSYNCOBJ_VERSION = "0.3.17"
# How soon a follower campaigns once its leader's connection closed (hook 5): random in the
# window, so that two followers rarely split the vote.
FAST_ELECTION_WINDOW_S = (0.05, 0.25)
PROBATION_LOG_INTERVAL_S = 10.0  # how often a replica on probation says what it waits for
_CONSTRUCT_LOCK = threading.Lock()

__all__ = [
    "FAIL_REASON",
    "HardenedSyncObj",
    "PipeNotifier",
    "SyncObjConf",
    "check_assumptions",
    "create_poller",
]


def check_assumptions() -> list[str]:
    """What this module relies on and pysyncobj no longer provides (empty: all there)."""
    missing = []
    if VERSION != PYSYNCOBJ_VERSION:
        missing.append(f"pysyncobj version {VERSION} (hardened against {PYSYNCOBJ_VERSION})")
    for name in ("createJournal", "createPoller"):
        if not hasattr(_so, name):
            missing.append(f"pysyncobj.syncobj.{name}")
    if not hasattr(_so.FastQueue(1), "_FastQueue__queue"):
        missing.append("FastQueue._FastQueue__queue")
    if not {"_PipeNotifier__pipeR", "_PipeNotifier__pipeW"} <= set(
        PipeNotifier.__init__.__code__.co_names
    ):
        missing.append("PipeNotifier._PipeNotifier__pipeR/__pipeW (hook 8)")
    for name in (
        "_SyncObj__onMessageReceived",
        "_SyncObj__onNodeDisconnected",
        "_SyncObj__onNodeConnected",
        "_SyncObj__loadDumpFile",
        "_SyncObj__updateClusterConfiguration",
        "_SyncObj__onSetCodeVersion",
        "_SyncObj__applyLogEntries",
        "_SyncObj__sendAppendEntries",
        "_SyncObj__setCurrentTerm",
        "_SyncObj__sendNextNodeIdx",
        "_SyncObj__getCurrentLogIndex",
        "_onTick",
        "_applyCommand",
        "_checkCommandsToApply",
        "doTick",
        "raftLastApplied",
        "transferLeadership",
        "addNodeToCluster",
        "removeNodeFromCluster",
    ):
        if not hasattr(SyncObj, name):
            missing.append(f"SyncObj.{name}")
    return missing


_missing = check_assumptions()
if _missing:  # pragma: no cover - only with another pysyncobj
    raise ImportError("raft/ cannot harden this pysyncobj: missing " + ", ".join(_missing))


class _SilentNotifier:
    """Hook 8's stand-in for pysyncobj's PipeNotifier."""

    def notify(self) -> None:
        return None


def majority_index(durable: list[int]) -> int:
    """The highest log index that a majority of ``durable`` (each replica's last durable index,
    the leader's own included) have reached. pysyncobj's rule: more than half of the members.

    >>> majority_index([7, 5, 3])  # 3 replicas: 2 have index 5
    5
    >>> majority_index([9, 9, 2, 1])  # 4 replicas: 3 are needed, only 2 have more than 2
    2
    """
    ranked = sorted(durable, reverse=True)
    return ranked[len(ranked) // 2]


def create_poller() -> Any:
    return createPoller("auto")


def default_wire_limits(conf: SyncObjConf) -> WireLimits:
    """Limits for a SyncObj built from ``conf`` alone, whose entries stay under its batch size
    (the shard passes its own, from its frame limit)."""
    batch_bytes = int(conf.appendEntriesBatchSizeBytes)
    return WireLimits(
        frame_bytes_max=wire_frame_bytes_max(
            batch_bytes=batch_bytes,
            entry_bytes_max=batch_bytes,
            snapshot_chunk_bytes=int(conf.logCompactionBatchSize),
        ),
        connect_timeout_ms=max(1, round(conf.connectionTimeout * 1000)),
    )


class HardenedSyncObj(SyncObj):  # type: ignore[misc]
    """A SyncObj whose single replicated method hands each committed frame to ``apply``."""

    def __init__(
        self,
        self_address: str,
        peers: list[str],
        conf: SyncObjConf,
        journal: JournalCore,
        poller: Any,
        apply: Callable[[int, bytes], int],
        load_snapshot: Callable[[str, snapshot_file.SnapshotInfo], None],
        wire_secret: str,
        wire_limits: WireLimits | None = None,
        transport_class: type | None = None,
        wire_tls: WireTls | None = None,
        probation: bool = False,
        on_whole: Callable[[], None] | None = None,
    ) -> None:
        """``probation``: this replica started without Raft state it should have (hook 10);
        ``on_whole`` is called once it has left probation, on disk."""
        if conf.password is not None:
            raise ValueError("raft peers authenticate through raft/wire.py: leave password unset")
        self._fx_journal = journal
        # Read by the transport while super() builds it.
        self._fx_wire_secret = wire_secret
        self._fx_wire_limits = wire_limits or default_wire_limits(conf)
        self._fx_wire_tls = wire_tls  # None: the links stay plaintext (raft_tls off)
        # While set on a leader, commands (local or forwarded by followers) stay queued instead
        # of growing the log: a leadership transfer needs the target's log to match ours when
        # it campaigns (Raft thesis 3.10). Afterwards they go to the new leader, or followers'
        # ones are refused NOT_LEADER (never applied) and retried by their senders.
        self.fx_holding = False
        # Hook 9: how long a commit index may wait for an append to ride with (0: send at once).
        self.fx_commit_notice_s = 0.0
        self._fx_installing = False  # a snapshot chunk's handler is running (hooks 3 and 4)
        # Observer of every message received, before it is handled (the latency budget).
        self.fx_on_message: Callable[[Any, Any], None] | None = None
        self._fx_apply_frame = apply
        self._fx_load_snapshot = load_snapshot
        # Hook 10: None when this replica never was on probation (or was built before it).
        self.fx_probation: Probation | None = None
        self._fx_on_whole = on_whole
        self._fx_probation_logged_s = 0.0
        self._fx_probation_left = False  # _fx_left_probation ran
        with _CONSTRUCT_LOCK:
            saved = _so.createJournal, _so.createPoller
            _so.createJournal = lambda _path: journal
            _so.createPoller = lambda _kind: poller
            try:
                super().__init__(
                    self_address,
                    peers,
                    conf=conf,
                    transportClass=transport_class or WireTransport,
                )
            finally:
                _so.createJournal, _so.createPoller = saved
        journal.commit_bound = self._fx_bound_commit  # hook 7
        self._fx_silence_pipe_notifier(poller)  # hook 8
        if probation:
            self._fx_start_probation()

    # -- hook 8: no self-wake per command ------------------------------------------------------

    def _fx_silence_pipe_notifier(self, poller: Any) -> None:
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is None:
            return  # batch mode: pysyncobj made none
        self._SyncObj__pipeNotifier = _SilentNotifier()
        for name in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
            fd = getattr(notifier, name)
            if name.endswith("pipeR"):
                poller.unsubscribe(fd)
            os.close(fd)

    # -- hook 9: commit notices ride with the next append --------------------------------------

    def _SyncObj__applyLogEntries(self) -> bool:
        send_now = bool(SyncObj._SyncObj__applyLogEntries(self))
        delay_s = self.fx_commit_notice_s
        if not send_now or delay_s <= 0 or not self._isLeader():
            return send_now
        due = float(_so.monotonicTime()) + delay_s
        if due < float(getattr(self, "_SyncObj__newAppendEntriesTime")):  # noqa: B009
            self._SyncObj__newAppendEntriesTime = due
        return False

    # -- hook 7: a leader counts itself toward a commit as far as its log is durable -----------

    def _fx_bound_commit(self, previous: int, proposed: int) -> int | None:
        """On a leader, the commit index to take instead of ``proposed`` (pysyncobj's, which
        counted the leader's whole log), the commit index being ``previous``; None elsewhere."""
        if not self._isLeader():
            return None
        if self._fx_journal.durable_index >= proposed:
            return proposed
        candidate = min(proposed, self.fx_durable_on_majority())
        bounded = previous
        # Raft commits by counting replicas only entries of the leader's term (thesis 3.6.2);
        # terms never decrease along the log, so below the first such entry none is.
        if candidate > previous and self._fx_term_at(candidate) == self.raftCurrentTerm:
            bounded = candidate
        self._SyncObj__raftCommitIndex = bounded
        return bounded

    def fx_durable_on_majority(self) -> int:
        """A leader's view of the last log index on the disks of a majority: its journal's
        durable index and its followers' match indexes (they acknowledge only what they
        fsync'd, raft/outbox.py)."""
        match = self._SyncObj__raftMatchIndex
        others = [match.get(n, 0) for n in self._SyncObj__otherNodes]
        return majority_index([self._fx_journal.durable_index, *others])

    def _fx_term_at(self, index: int) -> int | None:
        journal = self._fx_journal
        if len(journal) == 0:
            return None
        pos = index - journal[0][1]
        return int(journal[pos][2]) if 0 <= pos < len(journal) else None

    def _checkCommandsToApply(self) -> None:
        if self.fx_holding and self._isLeader():
            return
        super()._checkCommandsToApply()

    @replicated  # type: ignore[misc, untyped-decorator]
    def fx_apply(self, frame: bytes) -> int:
        # pysyncobj does not pass the log index to apply; it increments raftLastApplied right
        # after this returns, so the entry being applied is the next one.
        return self._fx_apply_frame(self.raftLastApplied + 1, frame)

    # -- read-only views of internal state ---------------------------------------------------

    def fx_next_timer_s(self) -> float:
        """Seconds until pysyncobj's next timed action: a leader's heartbeat, or a follower's
        (or candidate's) election deadline. Commits, applies and answers are driven by
        messages, which wake the poller themselves. (pysyncobj's clock is its own: RAW
        monotonic, not ``time.monotonic``.)"""
        now_s = float(_so.monotonicTime())
        if self._isLeader():
            due = float(getattr(self, "_SyncObj__newAppendEntriesTime"))  # noqa: B009
        else:
            due = float(getattr(self, "_SyncObj__raftElectionDeadline"))  # noqa: B009
        if self.on_probation:
            assert self.fx_probation is not None
            due = min(due, self.fx_probation.next_probe_s)
        return max(0.0, due - now_s)

    @property
    def transport(self) -> Any:
        """The transport pysyncobj built from ``transport_class`` (a WireTransport unless a
        test passed another)."""
        return self._SyncObj__transport

    # A method, not a property: SyncObj.__init__ calls getattr on every name of the class
    # before the queue exists.
    def queued_commands(self) -> int:
        """Commands handed to ``_applyCommand`` and not yet appended or forwarded."""
        return len(self._SyncObj__commandsQueue._FastQueue__queue)

    @property
    def match_index(self) -> dict[str, int]:
        return {n.id: i for n, i in dict(self._SyncObj__raftMatchIndex).items()}

    # -- hook 5: failover after a crash --------------------------------------------------------

    def _SyncObj__onNodeDisconnected(self, node: Any) -> None:
        SyncObj._SyncObj__onNodeDisconnected(self, node)
        leader = self._SyncObj__raftLeader
        if leader is None or leader != node or self._isLeader():
            return
        soon = _so.monotonicTime() + random.uniform(*FAST_ELECTION_WINDOW_S)
        deadline = float(getattr(self, "_SyncObj__raftElectionDeadline"))  # noqa: B009
        if soon < deadline:
            self._SyncObj__raftElectionDeadline = soon

    # -- hook 10: a replica that lost its disk is not a voter until it is whole again ----------

    @property
    def on_probation(self) -> bool:
        return self.fx_probation is not None and not self.fx_probation.whole

    def _fx_start_probation(self) -> None:
        others = frozenset(str(n.id) for n in self._SyncObj__otherNodes)
        self.fx_probation = Probation(others)
        # The first "waiting" line after a full interval: a new shard leaves at once.
        self._fx_probation_logged_s = float(_so.monotonicTime())
        log.info(
            "raft %s: started without its Raft state (a new replica, or a lost disk): on "
            "probation (no vote, no campaign) until it holds what the leader committed%s",
            self.selfNode.id,
            "" if others else " (no other member: leaves at once)",
        )
        if not others:
            self.fx_probation.whole = True
            self.fx_probation.reason = "the only member"
            self._fx_left_probation()

    def _fx_probation_message(self, node: Any, message: dict[str, Any]) -> bool:
        """Handle what hook 10 owns (-> True: the stock handler must not see ``message``)."""
        kind = message.get("type")
        if kind == PROBE_TYPE:
            reply = {"type": PROBE_REPLY_TYPE, "holds_nothing": self._fx_holds_nothing()}
            self._SyncObj__transport.send(node, reply)
            return True
        if kind == PROBE_REPLY_TYPE:
            if self.on_probation:
                assert self.fx_probation is not None
                self.fx_probation.on_probe_reply(str(node.id), message.get("holds_nothing") is True)
                self._fx_maybe_whole()
            return True
        # No vote, no campaign while on probation: see raft/probation.py.
        return kind in ("request_vote", "timeout_now") and self.on_probation

    def _SyncObj__onNodeConnected(self, node: Any) -> None:
        SyncObj._SyncObj__onNodeConnected(self, node)
        if self.on_probation:  # ask at once, not at the next probe round
            self._SyncObj__transport.send(node, {"type": PROBE_TYPE})

    def _fx_holds_nothing(self) -> bool:
        journal = self._fx_journal
        return len(journal) == 0 or holds_nothing(int(journal.last_index))

    def _onTick(self, timeToWait: float = 0.0) -> None:
        if self.on_probation:
            self._fx_probation_tick()
        super()._onTick(timeToWait)

    def _fx_probation_tick(self) -> None:
        probation = self.fx_probation
        assert probation is not None
        now_s = float(_so.monotonicTime())
        # Never campaign: the deadline stays ahead of the clock while on probation.
        self._SyncObj__raftElectionDeadline = now_s + float(self.conf.raftMaxTimeout)
        ask = probation.probe_due(now_s)
        for node in list(self._SyncObj__otherNodes):
            if str(node.id) in ask:
                self._SyncObj__transport.send(node, {"type": PROBE_TYPE})
        if now_s - self._fx_probation_logged_s >= PROBATION_LOG_INTERVAL_S:
            self._fx_probation_logged_s = now_s
            log.info(
                "raft %s: on probation: %s",
                self.selfNode.id,
                "waiting for a leader to refill it"
                if probation.has_history()
                else "waiting for a leader, or for a majority to say it holds nothing "
                f"(not heard: {', '.join(probation.waiting_for())})",
            )
        self._fx_maybe_whole()

    def _fx_maybe_whole(self) -> None:
        probation = self.fx_probation
        if probation is None or self._fx_probation_left:
            return
        if not probation.whole:
            probation.on_durable(int(self._fx_journal.durable_index))
        if probation.whole:
            self._fx_left_probation()

    def _fx_left_probation(self) -> None:
        assert self.fx_probation is not None and self.fx_probation.whole
        self._fx_probation_left = True
        leader = self._SyncObj__raftLeader
        if leader is not None and self._SyncObj__votedForNodeId is None:
            # What this replica may have promised before its disk was lost includes a vote in
            # this term: take the leader's side of it, so no second vote is given in it.
            self._SyncObj__setCurrentTerm(self.raftCurrentTerm, leader.id)
        self._fx_journal.flush()
        log.log(
            logging.INFO if self.fx_probation.whole_at_index is None else logging.WARNING,
            "raft %s: left probation (%s): votes and campaigns again",
            self.selfNode.id,
            self.fx_probation.reason,
        )
        if self._fx_on_whole is not None:
            self._fx_on_whole()

    # -- hook 3: append-entries without a term conflict --------------------------------------

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        if self.fx_on_message is not None:
            self.fx_on_message(node, message)
        if isinstance(message, dict) and self._fx_probation_message(node, message):
            return
        if _is_stale_answer(message, self.raftCurrentTerm):
            return  # hook 12: an answer to an append-entries of another term
        hide: int | None = None
        if (
            isinstance(message, dict)
            and message.get("type") == "append_entries"
            and "prevLogIdx" in message
            and "transmission" not in message
            and message["term"] >= self.raftCurrentTerm
        ):
            message, hide = self._fx_reconcile(message)
        elif self._fx_is_snapshot_chunk(message):
            hide = self._fx_proven_index()
            self._fx_installing = True
        if hide is not None:
            self._fx_journal.hide_after(hide)
        try:
            SyncObj._SyncObj__onMessageReceived(self, node, message)
        finally:
            self._fx_installing = False
            if hide is not None:
                self._fx_journal.hide_after(None)
        if self.on_probation and _is_leader_append(message, self.raftCurrentTerm):
            assert self.fx_probation is not None
            commit = int(message["commit_index"])
            self.fx_probation.on_leader_append(
                commit, int(self.raftCommitIndex), self._fx_term_at(commit), int(message["term"])
            )
            self._fx_maybe_whole()

    # -- hook 12: append-entries answers carry their term ------------------------------------

    def _SyncObj__sendNextNodeIdx(
        self,
        node: Any,
        reset: bool = False,
        nextNodeIdx: int | None = None,
        success: bool = False,
    ) -> None:
        # Stock, plus the term. Every caller runs inside the handling of an append-entries
        # whose term was at least ours and became ours: the term answered is the current one.
        if nextNodeIdx is None:
            nextNodeIdx = self._SyncObj__getCurrentLogIndex() + 1
        self._SyncObj__transport.send(
            node,
            {
                "type": "next_node_idx",
                "next_node_idx": nextNodeIdx,
                "reset": reset,
                "success": success,
                "term": self.raftCurrentTerm,
            },
        )

    def _fx_is_snapshot_chunk(self, message: Any) -> bool:
        return (
            isinstance(message, dict)
            and message.get("type") == "append_entries"
            and "serialized" in message
            and "prevLogIdx" not in message
            and message["term"] >= self.raftCurrentTerm
        )

    def _fx_proven_index(self) -> int | None:
        """The end of the log known to match the leader's: the commit index. A snapshot chunk
        proves nothing about the entries after it, yet the stock handler takes the leader's
        commit index up to our log end on every chunk (applying entries that may never have
        been committed) and, once the snapshot is installed, answers with our log end (the
        leader then counts entries we may not share). The log is shown to it up to here only;
        hook 4 moves that to the snapshot's last entry when the snapshot is installed."""
        journal = self._fx_journal
        if len(journal) == 0:
            return None
        return max(int(self.raftCommitIndex), int(journal[0][1]))

    def _fx_reconcile(self, message: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        """Rewrite an append-entries message so that the stock handler skips entries we already
        have and truncates only at a real conflict. -> (message, index to hide the log after)."""
        journal = self._fx_journal
        if len(journal) == 0:
            return message, None
        first = journal[0][1]

        def term_at(index: int) -> int | None:
            pos = index - first
            return journal[pos][2] if 0 <= pos < len(journal) else None

        prev = message["prevLogIdx"]
        if prev is None or term_at(prev) != message["prevLogTerm"]:
            return message, None  # a real mismatch: the stock handler answers it
        entries = message.get("entries", [])
        k = 0
        while k < len(entries) and term_at(entries[k][1]) == entries[k][2]:
            assert entries[k][1] == prev + k + 1, (entries[k][1], prev, k)
            k += 1
        if k == 0 and journal.last_index == prev:
            return message, None  # plain append at the end: nothing to reconcile
        out = dict(message)
        out["prevLogIdx"] = prev + k
        out["prevLogTerm"] = entries[k - 1][2] if k else message["prevLogTerm"]
        out["entries"] = entries[k:]
        if k == len(entries) and journal.last_index > prev + k:
            # Everything sent is already here and our log goes on. Those later entries are not
            # proven to match the leader's: keep them, but out of sight of the handler, so it
            # neither truncates them nor takes a commit index that covers them.
            return out, prev + k
        return out, None

    # -- hook 4: loading a snapshot ----------------------------------------------------------

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        path = self.conf.fullDumpFile
        try:
            info = snapshot_file.read_info(path)
        except snapshot_file.SnapshotFileError:
            log.exception("cannot load the snapshot %s", path)
            return
        self._fx_load_snapshot(path, info)
        journal = self._fx_journal
        if self._fx_installing:
            journal.hide_after(None)  # hidden by the chunk's handler: see _fx_proven_index
        first = journal[0][1] if len(journal) else None
        pos = None if first is None else info.index - first
        keep = (
            pos is not None
            and 1 <= pos < len(journal)
            and journal[pos][2] == info.last[2]
            and journal[pos - 1][2] == info.prev[2]
        )
        if not keep:
            journal.clear()
            journal.add(*info.prev)
            journal.add(*info.last)
            journal.flush()
        self._SyncObj__raftLastApplied = info.index
        commit = int(getattr(self, "_SyncObj__raftCommitIndex"))  # noqa: B009
        if commit > journal.last_index:
            self._SyncObj__raftCommitIndex = journal.last_index
        if self.conf.dynamicMembershipChange:
            self._SyncObj__updateClusterConfiguration(
                [m for m in info.members if m != self.selfNode.id]
            )
        self._SyncObj__onSetCodeVersion(0)
        if self._fx_installing:
            # The reply and the commit index that follow cover the snapshot, not entries kept
            # after it (unproven until an append-entries matches them).
            journal.hide_after(info.index)


def _is_stale_answer(message: Any, current_term: int) -> bool:
    """An append-entries answer (hook 12) to an append-entries of another term than ours."""
    return (
        isinstance(message, dict)
        and message.get("type") == "next_node_idx"
        and "term" in message
        and message["term"] != current_term
    )


def _is_leader_append(message: Any, current_term: int) -> bool:
    """A leader's regular append-entries of the current term (not a snapshot chunk)."""
    return (
        isinstance(message, dict)
        and message.get("type") == "append_entries"
        and "prevLogIdx" in message
        and "transmission" not in message
        and message.get("term") == current_term
    )


def fail_reason_name(code: int) -> str:
    for name, value in vars(FAIL_REASON).items():
        if value == code and not name.startswith("_"):
            return str(name)
    return str(code)
