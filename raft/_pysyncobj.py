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
7. Bounded connections (raft/wire_guard.py). Stock ``TcpConnection`` reads a socket until it is
   drained, appends with ``bytes +=`` (quadratic) and trusts any declared frame size, all on the
   driver thread and before authentication; stock ``TcpServer`` keeps idle connections forever
   (its timeout is checked only when data arrives). ``SyncingTransport`` turns each of its
   connections into a ``_BoundedConnection`` (its read and parse methods replaced: a bytearray
   ``FrameReader``, the declared size capped, reads bounded per event), caps connections that
   have not authenticated, and closes them at ``connect_timeout`` from its tick. Its listening
   socket (``_BoundedServer``) accepts every pending connection per event from a larger
   backlog, so a burst of connections cannot keep peers out of the accept queue.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import pysyncobj.pickle as _pickle
import pysyncobj.syncobj as _so
import pysyncobj.transport as _transport
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.monotonic import monotonic as monotonicTime
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.poller import POLL_EVENT_TYPE, createPoller
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.tcp_server import TcpServer
from pysyncobj.version import VERSION

from raft import snapshot_file
from raft.journal import LmdbJournal
from raft.wire_guard import (
    FrameReader,
    FrameTooLargeError,
    PendingHandshakes,
    WireLimits,
    wire_frame_bytes_max,
)

log = logging.getLogger("raft.pysyncobj")

PYSYNCOBJ_VERSION = "0.3.17"
_CONSTRUCT_LOCK = threading.Lock()
SECURITY_LOG_INTERVAL_S = 10.0
LOGGED_KEYS_MAX = 1024
LISTEN_BACKLOG = 128
ACCEPTS_PER_EVENT_MAX = 64

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
    for name in (
        "_TcpConnection__tryReadBuffer",
        "_TcpConnection__processParseMessage",
        "_TcpConnection__processConnection",
        "disconnect",
        "connect",
    ):
        if not hasattr(TcpConnection, name):
            missing.append(f"TcpConnection.{name}")
    if not hasattr(TcpServer, "_TcpServer__onNewConnection"):
        missing.append("TcpServer.__onNewConnection")
    server = TcpServer(None, "127.0.0.1", 0, onNewConnection=None)
    for name in (
        "_TcpServer__socket",
        "_TcpServer__fileno",
        "_TcpServer__poller",
        "_TcpServer__sendBufferSize",
        "_TcpServer__recvBufferSize",
        "_TcpServer__connectionTimeout",
        "_TcpServer__keepalive",
        "_TcpServer__onNewConnectionCallback",
    ):
        if not hasattr(server, name):
            missing.append(f"TcpServer().{name}")
    probe = TcpConnection(poller=None)
    for name in (
        "_TcpConnection__socket",
        "_TcpConnection__recvBufferSize",
        "_TcpConnection__lastReadTime",
    ):
        if not hasattr(probe, name):
            missing.append(f"TcpConnection().{name}")
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


class _BoundedConnection(TcpConnection):  # type: ignore[misc]
    """A pysyncobj connection whose reading is bounded (hook 7): frames come out of a
    ``FrameReader`` (bytearray, declared size capped before the body is buffered) and one
    readiness event reads at most ``read_bytes_per_event_max``, stopping as soon as a whole
    frame is here so that it is parsed (and the cap raised after a handshake) before more is
    read. pysyncobj constructs its connections itself, so ``_bound`` converts them in place."""

    encryptor: Any
    recvRandKey: bytes | None
    recvLastTimestamp: int
    _fx_reader: FrameReader
    _fx_read_bytes_per_event_max: int
    _fx_peer: str
    _fx_close_reason: str | None
    _fx_refused: FrameTooLargeError | None

    def _TcpConnection__tryReadBuffer(self) -> None:
        reader = self._fx_reader
        sock: socket.socket | None = self._TcpConnection__socket
        chunk_bytes = int(self._TcpConnection__recvBufferSize)
        budget_bytes = self._fx_read_bytes_per_event_max
        while budget_bytes > 0 and sock is not None:
            try:
                wanted = reader.bytes_wanted()
            except FrameTooLargeError as err:
                self._fx_refuse(err)
                return
            if wanted == 0:
                break  # parse this frame before reading on
            try:
                incoming = sock.recv(
                    min(budget_bytes, chunk_bytes, max(wanted, reader.frame_bytes_max))
                )
            except OSError as err:
                if err.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    self.disconnect()
                return
            if not incoming or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.disconnect()
                return
            reader.feed(incoming)
            budget_bytes -= len(incoming)
        # Left unread: the poller is level-triggered, so the next round comes back for it.
        self._TcpConnection__lastReadTime = monotonicTime()

    def _TcpConnection__processParseMessage(self) -> Any:
        try:
            data = self._fx_reader.next_frame()
        except FrameTooLargeError as err:
            self._fx_refuse(err)
            return None
        if data is None:
            return None
        try:  # as stock pysyncobj: any failure drops the connection
            if self.encryptor:
                timestamp = self.encryptor.extract_timestamp(data)
                if timestamp < self.recvLastTimestamp:
                    raise ValueError("a message older than the previous one")
                self.recvLastTimestamp = timestamp
                data = self.encryptor.decrypt(data)
            message = _pickle.loads(zlib.decompress(data))
            if self.recvRandKey:
                rand_key, message = message
                if rand_key != self.recvRandKey:
                    raise ValueError("a message of another session")
        except Exception:
            self.disconnect()
            return None
        return message

    def _fx_refuse(self, err: FrameTooLargeError) -> None:
        self._fx_close_reason = "oversized"
        self._fx_refused = err
        self.disconnect()

    def disconnect(self) -> None:
        self._fx_reader.clear()
        super().disconnect()

    def connect(self, host: str, port: int) -> bool:
        self._fx_reader.clear()
        return bool(super().connect(host, port))


class _BoundedServer(TcpServer):  # type: ignore[misc]
    """pysyncobj's listening socket, accepting every pending connection per readiness event (up
    to ACCEPTS_PER_EVENT_MAX) from a backlog of LISTEN_BACKLOG: stock accepts one per event from
    a backlog of 5, so a burst of connections overflows the queue and legitimate peers wait for
    SYN retransmits. An error on one accepted socket closes that socket, not the server."""

    def bind(self) -> None:
        super().bind()
        self._TcpServer__socket.listen(LISTEN_BACKLOG)

    def _TcpServer__onNewConnection(self, descr: int, event: int) -> None:
        if event & POLL_EVENT_TYPE.READ:
            for _ in range(ACCEPTS_PER_EVENT_MAX):
                listener = self._TcpServer__socket
                if listener is None or self._TcpServer__fileno is None:
                    return
                try:
                    sock, _addr = listener.accept()
                except BlockingIOError:
                    break
                except OSError:
                    self.unbind()
                    return
                self._fx_accepted(sock)
        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()

    def _fx_accepted(self, sock: socket.socket) -> None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._TcpServer__sendBufferSize)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._TcpServer__recvBufferSize)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
        except OSError:
            sock.close()  # reset before we got to it
            return
        conn = TcpConnection(
            poller=self._TcpServer__poller,
            socket=sock,
            timeout=self._TcpServer__connectionTimeout,
            sendBufferSize=self._TcpServer__sendBufferSize,
            recvBufferSize=self._TcpServer__recvBufferSize,
            keepalive=self._TcpServer__keepalive,
        )
        self._TcpServer__onNewConnectionCallback(conn)


def _bound(conn: Any, frame_bytes_max: int, limits: WireLimits, peer: str) -> None:
    """Turn a stock connection into a ``_BoundedConnection``, before it reads anything."""
    if not isinstance(conn, _BoundedConnection):
        assert type(conn) is TcpConnection, type(conn)
        conn.__class__ = _BoundedConnection
        conn._fx_reader = FrameReader(frame_bytes_max)
    conn._fx_read_bytes_per_event_max = limits.read_bytes_per_event_max
    conn._fx_peer = peer
    conn._fx_close_reason = None
    conn._fx_refused = None


def _peer_of(conn: Any) -> str:
    sock = conn._TcpConnection__socket
    try:
        host, port = sock.getpeername()[:2]
    except (OSError, AttributeError):
        return "?"
    return f"{host}:{port}"


class SyncingTransport(_transport.TCPTransport):  # type: ignore[misc]
    """TCP transport that makes the journal durable before any message leaves (hook 2), logs
    peers that fail the shared-secret handshake, or leave in the middle of it (hook 5), and
    bounds what a connection costs before and after it authenticates (hook 7)."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        limits = getattr(syncObj, "_fx_wire_limits", None) or default_wire_limits(syncObj.conf)
        self._fx_limits: WireLimits = limits
        self._fx_pending: PendingHandshakes[Any] = PendingHandshakes(
            limits.handshakes_pending_max, limits.connect_timeout_ms
        )
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

    def _createServer(self) -> None:
        super()._createServer()
        assert type(self._server) is TcpServer, type(self._server)
        self._server.__class__ = _BoundedServer  # not bound yet: that happens on a tick

    def addNode(self, node: Any) -> None:
        super().addNode(node)
        conn = self._connections.get(node)
        if conn is not None:  # our outgoing connection to a configured peer
            _bound(conn, self._fx_limits.frame_bytes_max, self._fx_limits, node.address)

    def _onNewIncomingConnection(self, conn: Any) -> None:
        super()._onNewIncomingConnection(conn)
        if getattr(conn, "encryptor", None) is not None:
            conn.encryptor = _WatchedEncryptor(conn.encryptor)
        limits = self._fx_limits
        _bound(conn, limits.handshake_frame_bytes_max, limits, _peer_of(conn))
        if not self._fx_pending.admit(conn, time.monotonic()):
            conn._fx_close_reason = "handshakes-full"
            conn.disconnect()

    def _onTick(self) -> None:
        super()._onTick()
        self.fx_expire_handshakes(time.monotonic())

    def fx_expire_handshakes(self, now_s: float) -> int:
        """Close incoming connections not authenticated within ``connect_timeout_ms``."""
        expired = self._fx_pending.expired(now_s)
        for conn in expired:
            conn._fx_close_reason = "handshake-timeout"
            conn.disconnect()
        return len(expired)

    @property
    def fx_handshakes_pending(self) -> int:
        return len(self._fx_pending)

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        if (
            conn.sendRandKey  # keys exchanged: this message names the peer
            and isinstance(message, str)
            and message != "readonly"
            and message not in self._nodeAddrToNode
        ):
            conn._fx_unknown_peer = message  # pysyncobj drops it next
        super()._onIncomingMessageReceived(conn, message)
        if conn in self._fx_pending and conn not in self._unknownConnections:
            # Authenticated (a dropped connection has left the table already): a peer's
            # messages may now be as large as legitimate appends and snapshot chunks.
            self._fx_pending.done(conn)
            conn._fx_reader.frame_bytes_max = self._fx_limits.frame_bytes_max

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
        reason = getattr(conn, "_fx_close_reason", None)
        if getattr(self, "_fx_destroying", False):
            pass
        elif reason is not None:
            self._fx_log_refused(conn, reason)
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
        if reason is not None:
            conn._fx_close_reason = None  # an outgoing connection object is reused
        self._fx_pending.done(conn)
        super()._onDisconnected(conn)

    def _fx_log_refused(self, conn: Any, reason: str) -> None:
        """One line per kind and peer host per SECURITY_LOG_INTERVAL_S: the port may be under
        attack, and the log must not become the attack's amplifier."""
        peer = str(getattr(conn, "_fx_peer", "?"))
        host = peer.rpartition(":")[0] or peer
        limits = self._fx_limits
        if reason == "oversized":
            err = conn._fx_refused
            before = " before its handshake" if conn in self._fx_pending else ""
            text = (
                f"refused a raft frame declaring {err.declared_bytes} bytes from {peer}{before} "
                f"(limit {err.limit_bytes} bytes) and closed the connection"
            )
        elif reason == "handshake-timeout":
            text = (
                f"closed an incoming raft connection from {peer} that did not complete the "
                f"handshake within connect_timeout ({limits.connect_timeout_ms} ms)"
            )
        else:
            text = (
                f"refused an incoming raft connection from {peer}: "
                f"{limits.handshakes_pending_max} connections are already in the handshake"
            )
        self._fx_log(reason, logging.WARNING, text, peer=host)

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

    def _fx_log(self, kind: str, level: int, text: str, peer: str | None = None) -> None:
        """At most one line of each ``kind`` (and ``peer``, if given) per
        SECURITY_LOG_INTERVAL_S."""
        now = time.monotonic()
        key = kind if peer is None else f"{kind}@{peer}"
        if len(self._fx_last_logged) >= LOGGED_KEYS_MAX:  # many peer hosts: forget old ones
            self._fx_last_logged = {
                k: t for k, t in self._fx_last_logged.items() if now - t < SECURITY_LOG_INTERVAL_S
            }
        last = self._fx_last_logged.get(key)
        if last is None or now - last >= SECURITY_LOG_INTERVAL_S:
            self._fx_last_logged[key] = now
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
        wire_limits: WireLimits | None = None,
    ) -> None:
        self._fx_journal = journal
        self._fx_wire_limits = wire_limits  # read by SyncingTransport while super() builds it
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
