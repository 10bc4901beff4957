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
2. Flush before send. ``SyncingTransport.send`` makes the journal durable before any message
   leaves: append-entries, their acknowledgements, votes. With the flush before the commit index
   moves (``LmdbJournal.setRaftCommitIndex``), nothing is acknowledged before it is fsync'd.
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
5. Security logging. A peer with the wrong secret fails decryption and stock pysyncobj drops it
   silently; ``SyncingTransport`` logs it, and only it, as a secret mismatch: each incoming
   connection's encryptor is wrapped to see whether its first message failed authentication,
   and a connection that closed before its first message (a peer stopped, paused or cut off
   mid-handshake, the common case in a failover) is logged as just that.
6. Asynchronous replication needs to know that a command handed to ``_applyCommand`` is in the
   leader's log: ``queued_commands`` reads the length of pysyncobj's command queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pysyncobj.syncobj as _so
import pysyncobj.transport as _transport
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.poller import createPoller
from pysyncobj.version import VERSION

from raft import snapshot_file
from raft.journal import LmdbJournal

log = logging.getLogger("raft.pysyncobj")

PYSYNCOBJ_VERSION = "0.3.17"
_CONSTRUCT_LOCK = threading.Lock()
SECURITY_LOG_INTERVAL_S = 10.0

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
    for name in (
        "_SyncObj__onMessageReceived",
        "_SyncObj__loadDumpFile",
        "_SyncObj__updateClusterConfiguration",
        "_SyncObj__onSetCodeVersion",
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
    for name in (
        "send",
        "destroy",
        "_onDisconnected",
        "_onNewIncomingConnection",
        "_onIncomingMessageReceived",
        "_onOutgoingConnected",
        "_onOutgoingMessageReceived",
        "_connToNode",
    ):
        if not hasattr(_transport.TCPTransport, name):
            missing.append(f"TCPTransport.{name}")
    return missing


_missing = check_assumptions()
if _missing:  # pragma: no cover - only with another pysyncobj
    raise ImportError("raft/ cannot harden this pysyncobj: missing " + ", ".join(_missing))


def create_poller() -> Any:
    return createPoller("auto")


class _WatchedEncryptor:
    """The shared encryptor as one incoming connection uses it, noting whether a complete first
    message arrived and whether it failed authentication: pysyncobj drops such a connection
    without saying why, and only this tells a wrong secret from a peer that went away."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.messages = 0  # complete messages received
        self.rejected = False  # one failed authentication (signature or decryption)

    def extract_timestamp(self, token: bytes) -> int:
        self.messages += 1
        try:
            return int(self._inner.extract_timestamp(token))
        except Exception:
            self.rejected = True
            raise

    def decrypt(self, token: bytes) -> bytes:
        try:
            return bytes(self._inner.decrypt(token))
        except Exception:
            self.rejected = True
            raise

    def __getattr__(self, name: str) -> Any:  # encrypt_at_time and the rest: as the inner one
        return getattr(self._inner, name)


class SyncingTransport(_transport.TCPTransport):  # type: ignore[misc]
    """TCP transport that makes the journal durable before any message leaves (hook 2) and logs
    peers that fail the shared-secret handshake, or leave in the middle of it (hook 5)."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self._fx_journal: LmdbJournal = syncObj._SyncObj__raftLog
        assert isinstance(self._unknownConnections, set)  # used by _onDisconnected
        assert isinstance(self._nodeAddrToNode, dict)  # used by _onIncomingMessageReceived
        self._fx_last_logged: dict[str, float] = {}  # kind of line -> when it was last logged
        self.flush_before_send = True  # tests turn it off to prove the fsync check can fail

    def send(self, node: Any, message: Any) -> bool:
        if self.flush_before_send:
            self._fx_journal.flush()
        return bool(super().send(node, message))

    def _onNewIncomingConnection(self, conn: Any) -> None:
        super()._onNewIncomingConnection(conn)
        if getattr(conn, "encryptor", None) is not None:
            conn.encryptor = _WatchedEncryptor(conn.encryptor)

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        if (
            conn.sendRandKey  # keys exchanged: this message names the peer
            and isinstance(message, str)
            and message != "readonly"
            and message not in self._nodeAddrToNode
        ):
            conn._fx_unknown_peer = message  # pysyncobj drops it next
        super()._onIncomingMessageReceived(conn, message)

    def _onOutgoingConnected(self, conn: Any) -> None:
        conn._fx_connected = True
        super()._onOutgoingConnected(conn)

    def _onOutgoingMessageReceived(self, conn: Any, message: Any) -> None:
        conn._fx_handshaken = True  # the peer's first message decrypted: same secret
        super()._onOutgoingMessageReceived(conn, message)

    def destroy(self) -> None:
        self._fx_destroying = True
        super().destroy()

    def _onDisconnected(self, conn: Any) -> None:
        encrypted = self._syncObj.encryptor is not None
        if getattr(self, "_fx_destroying", False):
            pass
        elif encrypted and conn in self._unknownConnections:
            self._fx_incoming_dropped(conn)
        elif (
            encrypted
            and getattr(conn, "_fx_connected", False)
            and not getattr(conn, "_fx_handshaken", False)
        ):
            # All we know: the peer sent nothing back. A peer with another secret drops us
            # this way too, and says so in its own log (it receives our handshake).
            node = self._connToNode(conn)
            self._fx_log(
                "outgoing-closed",
                logging.INFO,
                f"raft peer {getattr(node, 'id', '?')} closed the connection before its first "
                "message (stopped, paused or unreachable mid-handshake)",
            )
        super()._onDisconnected(conn)

    def _fx_incoming_dropped(self, conn: Any) -> None:
        """An incoming connection ended before the handshake completed: say why, if known."""
        watched = conn.encryptor if isinstance(conn.encryptor, _WatchedEncryptor) else None
        unknown_peer = getattr(conn, "_fx_unknown_peer", None)
        if watched is not None and watched.rejected:
            self._fx_log(
                "secret",
                logging.WARNING,
                "dropped an incoming raft connection whose first message failed "
                "authentication: a peer with a different cluster secret, or not a FluxMQ node",
            )
        elif unknown_peer is not None:
            self._fx_log(
                "unknown-peer",
                logging.WARNING,
                f"dropped an incoming raft connection from {unknown_peer!r}, which is not a "
                "peer of this shard (check the peer lists of both nodes)",
            )
        else:
            when = "its first message" if watched is None or not watched.messages else "the end"
            self._fx_log(
                "incoming-closed",
                logging.INFO,
                f"an incoming raft connection closed before {when} of the handshake (the peer "
                "stopped, was paused or cut off mid-handshake)",
            )

    def _fx_log(self, kind: str, level: int, text: str) -> None:
        """At most one line of each ``kind`` per SECURITY_LOG_INTERVAL_S."""
        now = time.monotonic()
        last = self._fx_last_logged.get(kind)
        if last is None or now - last >= SECURITY_LOG_INTERVAL_S:
            self._fx_last_logged[kind] = now
            log.log(level, "%s (shard %s)", text, self._selfNode.id if self._selfNode else "?")


class HardenedSyncObj(SyncObj):  # type: ignore[misc]
    """A SyncObj whose single replicated method hands each committed frame to ``apply``."""

    def __init__(
        self,
        self_address: str,
        peers: list[str],
        conf: SyncObjConf,
        journal: LmdbJournal,
        poller: Any,
        apply: Callable[[int, bytes], int],
        load_snapshot: Callable[[str, snapshot_file.SnapshotInfo], None],
    ) -> None:
        self._fx_journal = journal
        # While set on a leader, commands (local or forwarded by followers) stay queued instead
        # of growing the log: a leadership transfer needs the target's log to match ours when
        # it campaigns (Raft thesis 3.10). Afterwards they go to the new leader, or followers'
        # ones are refused NOT_LEADER (never applied) and retried by their senders.
        self.fx_holding = False
        self._fx_apply_frame = apply
        self._fx_load_snapshot = load_snapshot
        with _CONSTRUCT_LOCK:
            saved = _so.createJournal, _so.createPoller
            _so.createJournal = lambda _path: journal
            _so.createPoller = lambda _kind: poller
            try:
                super().__init__(self_address, peers, conf=conf, transportClass=SyncingTransport)
            finally:
                _so.createJournal, _so.createPoller = saved

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

    @property
    def transport(self) -> SyncingTransport:
        return self._SyncObj__transport  # type: ignore[no-any-return]

    # A method, not a property: SyncObj.__init__ calls getattr on every name of the class
    # before the queue exists.
    def queued_commands(self) -> int:
        """Commands handed to ``_applyCommand`` and not yet appended or forwarded."""
        return len(self._SyncObj__commandsQueue._FastQueue__queue)

    @property
    def match_index(self) -> dict[str, int]:
        return {n.id: i for n, i in dict(self._SyncObj__raftMatchIndex).items()}

    # -- hook 3: append-entries without a term conflict --------------------------------------

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        hide: int | None = None
        if (
            isinstance(message, dict)
            and message.get("type") == "append_entries"
            and "prevLogIdx" in message
            and "transmission" not in message
            and message["term"] >= self.raftCurrentTerm
        ):
            message, hide = self._fx_reconcile(message)
        if hide is not None:
            self._fx_journal.hide_after(hide)
        try:
            SyncObj._SyncObj__onMessageReceived(self, node, message)
        finally:
            if hide is not None:
                self._fx_journal.hide_after(None)

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


def fail_reason_name(code: int) -> str:
    for name, value in vars(FAIL_REASON).items():
        if value == code and not name.startswith("_"):
            return str(name)
    return str(code)
