"""PySyncObjShard: a replication group on pysyncobj, made durable and fast.

- Durable: the log lives in a ``SegmentFileJournal`` (one append + fdatasync per flush) that is
  fsync'd before any message that promises what it holds leaves the node and before the commit
  index moves, so an acknowledged proposal is on the disk of a majority.
- Fast: proposals that arrive together become one log entry (a frame, see ``frames``), bounded in
  bytes and count, with a few frames in flight at once; one driver thread ticks every shard of the
  process without waiting for timers (``RaftDriver``).
- Applied in batches: committed frames are collected during a tick and applied afterwards in one
  ``apply_batch`` (one state transaction), each proposal under its own sub-index.
- Snapshots: the state machine writes a consistent copy (``write_snapshot``); pysyncobj streams
  the file in chunks to replicas that fell behind the compacted log.

Threads: ``propose`` runs on the event loop; everything that touches pysyncobj runs on the driver
thread; results come back through a LoopMailbox (raft/loop_mailbox.py): one wake-up of the loop
per applied round, whatever it carries.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import functools
import itertools
import logging
import os
import queue
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from raft import frames, snapshot_file, stages
from raft._pysyncobj import FAIL_REASON, HardenedSyncObj, SyncObjConf, fail_reason_name
from raft.api import (
    Appended,
    Entry,
    NotLeaderError,
    OutcomeUnknownError,
    ProposalTimeoutError,
    ShardBusyError,
    ShardClosedError,
    ShardError,
    ShardRequestDeniedError,
    ShardStatus,
    StateMachine,
)
from raft.driver import RaftDriver
from raft.loop_mailbox import LoopMailbox
from raft.os_thread import set_os_thread_name
from raft.segment_journal import SEGMENT_BYTES_DEFAULT, SegmentFileJournal, open_shard_journal
from raft.wire_guard import HANDSHAKES_PENDING_MAX, WireLimits, wire_frame_bytes_max
from raft.wire_transport import WireTls

log = logging.getLogger("raft.shard")
APPLY_BATCHES_QUEUED_MAX = 64  # the driver waits when the apply thread is this far behind
APPLY_RETRY_S = 0.5
STATUS_INTERVAL_S = 0.02  # indexes and in-sync counts; role, term and leader at once
APPLY_BATCHES_COALESCED_MAX = 16  # queued batches applied in one state transaction, at most
# A committed batch is applied on the driver thread itself when it holds at most this many
# entries and applies cost at most this lately (else: the apply thread).
INLINE_APPLY_ENTRIES_MAX = 64
INLINE_APPLY_COST_S_MAX = 0.001
APPLY_COST_WEIGHT = 8  # the moving average of apply cost weighs the newest 1/8


PROBATION_FILE = "probation"  # present while the replica is not a voter (raft/probation.py)
_RAFT_STATE_NAMES = ("wal", "journal", "snapshot", "wal.migrating")


def enter_probation(root: str) -> bool:
    """Whether the replica whose Raft directory is ``root`` starts on probation. A replica
    without any Raft state (a new one, or one whose disk was lost: it cannot tell which) is put
    on probation, on disk before its journal exists, so that a restart before it is whole again
    keeps it there."""
    marker = os.path.join(root, PROBATION_FILE)
    if os.path.exists(marker):
        return True
    if any(os.path.exists(os.path.join(root, name)) for name in _RAFT_STATE_NAMES):
        return False
    with open(marker, "wb") as f:
        os.fsync(f.fileno())
    snapshot_file.fsync_dir(root)
    return True


def leave_probation(root: str) -> None:
    """The replica whose Raft directory is ``root`` is whole again (its journal is flushed)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(root, PROBATION_FILE))
    snapshot_file.fsync_dir(root)


class ShardStartError(ShardError):
    """The shard cannot start (address in use, bad peer list, missing secret)."""

    retriable = False


TRANSFER_TIMEOUT_S = 5.0


class _NotCaughtUpError(ShardRequestDeniedError):
    """The transfer target's log does not match the leader's yet (retried until the deadline)."""


@dataclass(frozen=True, slots=True)
class RaftTimings:
    heartbeat_ms: int = 150  # a quarter of the shortest election timeout
    election_min_ms: int = 600
    election_max_ms: int = 1200
    leader_fallback_ms: int = 3000  # a leader that hears from no majority this long steps down
    reconnect_ms: int = 250
    connect_timeout_ms: int = 1500
    # A leader's new commit index waits at most this long for an append to ride with before it
    # goes out alone (raft/_pysyncobj.py hook 9): followers apply that much later at worst.
    commit_notice_ms: int = 5


@dataclass(frozen=True, slots=True)
class ShardConfig:
    shard_id: str
    self_address: str  # host:port of this replica's raft endpoint
    peers: tuple[str, ...]  # the other replicas' raft endpoints
    data_dir: str
    secret: str
    timings: RaftTimings = field(default_factory=RaftTimings)
    frame_bytes_max: int = 1 << 20
    # The largest single command (0: frame_bytes_max). One above frame_bytes_max travels alone
    # in its frame, so a node can replicate every request its gRPC port accepts.
    entry_bytes_max: int = 0
    frames_in_flight_max: int = 4
    pending_max: int = 20_000
    ack_timeout_ms: int = 10_000
    compaction_entries_min: int = 20_000
    compaction_interval_s: int = 3600
    snapshot_chunk_bytes: int = 1 << 20
    journal_segment_bytes: int = SEGMENT_BYTES_DEFAULT
    in_sync_lag_entries: int = 64
    bind_address: str = ""  # host:port the endpoint binds; "" = self_address
    # Peers named by DNS: how long a resolved address is trusted, and a failed lookup remembered.
    # Short, because a restarted pod keeps its name but not its IP.
    dns_cache_s: float = 5.0
    dns_fail_cache_s: float = 1.0
    # The Raft port's defences (raft/wire_guard.py): the largest frame a peer may send
    # (0: derived from frame_bytes_max and snapshot_chunk_bytes), and how many connections may
    # be in the handshake at once (each has timings.connect_timeout_ms to complete it).
    wire_frame_bytes_max: int = 0
    handshakes_pending_max: int = HANDSHAKES_PENDING_MAX
    # Mutual TLS on the links to the peers (raft_tls); None: plaintext, authenticated by the
    # secret and a MAC per frame as always (they stay inside TLS too).
    tls: WireTls | None = None

    @property
    def entry_limit(self) -> int:
        return max(self.entry_bytes_max, self.frame_bytes_max)

    @property
    def append_batch_bytes(self) -> int:
        # Above the largest entry: pysyncobj chunks an entry of this size or more (RAFT.md
        # problem 4). Catch-up messages grow with it (entries are packed up to this size).
        return max(4 * self.frame_bytes_max, self.entry_limit + self.frame_bytes_max)

    @property
    def wire_limits(self) -> WireLimits:
        derived = wire_frame_bytes_max(
            batch_bytes=self.append_batch_bytes,
            entry_bytes_max=self.entry_limit,
            snapshot_chunk_bytes=self.snapshot_chunk_bytes,
        )
        return WireLimits(
            frame_bytes_max=self.wire_frame_bytes_max or derived,
            connect_timeout_ms=self.timings.connect_timeout_ms,
            handshakes_pending_max=self.handshakes_pending_max,
        )

    @property
    def bind(self) -> str:
        return self.bind_address or self.self_address


_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def parse_address(value: str, what: str) -> tuple[str, int]:
    """host:port where host is an IPv4 address or a DNS name (a StatefulSet pod's stable name:
    the address is the replica's identity in the Raft membership, so it must not change when
    the pod's IP does)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ShardStartError(f"{what}: {value!r} is not host:port")
    try:
        socket.inet_aton(host)
    except OSError:
        if host.replace(".", "").isdigit() or not _HOSTNAME.fullmatch(host):
            raise ShardStartError(
                f"{what}: {value!r} must be an IPv4 address or a DNS name"
            ) from None
    return host, int(port)


def check_config(cfg: ShardConfig) -> None:
    if not cfg.secret:
        raise ShardStartError(
            "a cluster secret is required: raft peers authenticate with it, and only an "
            "authenticated peer's messages are decoded (set FLUXMQ_CLUSTER_SECRET)"
        )
    parse_address(cfg.self_address, "raft address")
    parse_address(cfg.bind, "raft bind address")
    if not 0 <= cfg.timings.commit_notice_ms < cfg.timings.heartbeat_ms:
        raise ShardStartError(
            f"commit_notice_ms {cfg.timings.commit_notice_ms} must be at least 0 and below "
            f"heartbeat_ms {cfg.timings.heartbeat_ms}"
        )
    seen = {cfg.self_address}
    for peer in cfg.peers:
        parse_address(peer, "peer")
        if peer in seen:
            raise ShardStartError(f"peer {peer!r} is listed twice (or is this node itself)")
        seen.add(peer)
    if len(cfg.peers) % 2 == 1:
        log.warning(
            "shard %s has %d replicas: an even count tolerates no more failures than one less",
            cfg.shard_id,
            len(cfg.peers) + 1,
        )
    assert cfg.frame_bytes_max >= 1024 and cfg.frames_in_flight_max >= 1


def check_address_free(address: str) -> None:
    host, port = parse_address(address, "raft address")
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    except OSError as e:
        raise ShardStartError(f"raft address {address} is not available: {e.strerror}") from e
    finally:
        probe.close()


class _State(enum.Enum):
    WAITING = 1  # not yet handed to the log: may still be dropped
    HANDED = 2  # in the log (or on its way to the leader): outcome decided by Raft
    DONE = 3


@dataclass(slots=True, eq=False)
class _Proposal:
    payload: bytes
    future: asyncio.Future[object]
    state: _State = _State.WAITING
    timer: asyncio.TimerHandle | None = None
    on_append: bool = False
    queued_s: float = 0.0  # time.perf_counter() at propose (the latency budget)
    call: stages.CallTrace | None = None


class PySyncObjShard:
    def __init__(self, state_machine: StateMachine, config: ShardConfig, driver: RaftDriver):
        check_config(config)
        self._sm = state_machine
        self._cfg = config
        self._driver = driver
        self._loop: asyncio.AbstractEventLoop | None = None
        self._mailbox: LoopMailbox | None = None  # set with _loop
        self._so: HardenedSyncObj | None = None
        self._journal: SegmentFileJournal | None = None
        self._lock = threading.Lock()  # hand-off between the loop and the driver thread
        self._incoming: deque[_Proposal] = deque()
        self._closed = False
        self._transferring = False  # set by the loop, read by the driver thread
        # Driver-thread state.
        self._frame_ids = itertools.count(1)
        self._frames: dict[int, list[_Proposal]] = {}
        self._awaiting: dict[int, list[_Proposal]] = {}  # log index -> proposals of its frame
        self._pending_applies: list[tuple[int, bytes]] = []
        # (last log index, term, frame ids) of on_append frames waiting for the leader's fsync.
        self._appends_to_ack: deque[tuple[int, int, list[int]]] = deque()
        self._received_at_tick = 0  # transport.messages_received when the last tick began
        self._journal_writer = concurrent.futures.ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix=f"journal-{config.shard_id}",
            initializer=lambda: set_os_thread_name(f"journal-{config.shard_id}"),
        )
        self._apply_queue: queue.Queue[Any] = queue.Queue(maxsize=APPLY_BATCHES_QUEUED_MAX)
        # Seconds per applied batch, a moving average; starts high: the thread until measured.
        self._apply_cost_s = 1.0
        self._apply_thread = threading.Thread(
            target=self._apply_routine, name=f"apply-{config.shard_id}", daemon=True
        )
        self._status = ShardStatus(
            shard_id=config.shard_id,
            role="follower",
            term=0,
            commit_index=0,
            applied_index=0,
            members=(config.self_address, *sorted(config.peers)),
            leader=None,
            pending_proposals=0,
        )
        self._status_at = 0.0
        self._leaderless_since = time.monotonic()
        self._last_leaderless_warning = 0.0
        self.frames_proposed = 0
        self.proposals_applied = 0
        self.batches_applied = 0
        self.batches_applied_inline = 0  # of batches_applied: on the driver thread
        self.entries_applied = 0
        self.acked_not_durable_on_majority = 0  # must stay 0: see _flush_applies
        # Observers for metrics, set before start(): journal flush (fsync) seconds, and
        # (kind "write" | "install", snapshot file bytes, seconds) per snapshot.
        self.on_journal_flush: Callable[[float], None] | None = None
        self.on_snapshot: Callable[[str, int, float], None] | None = None
        # The latency budget (raft/stages.py): observer of (stage, seconds) for sampled frames;
        # None turns tracing off. Entries are stamped on the driver thread while leading.
        self.on_stage: stages.StageObserver | None = None
        self._leading = False
        self._timeline = stages.EntryTimeline()
        self._sampler = stages.Sampler()
        self._frame_traces: dict[int, stages.FrameTrace] = {}  # frame id -> trace
        self._index_traces: dict[int, stages.FrameTrace] = {}  # log index -> trace

    # -- Shard -----------------------------------------------------------------------------

    @property
    def shard_id(self) -> str:
        return self._cfg.shard_id

    @property
    def is_leader(self) -> bool:
        return self._status.role == "leader" and not self._closed

    @property
    def leader(self) -> str | None:
        return self._status.leader

    @property
    def address(self) -> str:
        return self._cfg.self_address

    def status(self) -> ShardStatus:
        return self._status

    @property
    def driver(self) -> RaftDriver:
        return self._driver

    @property
    def journal(self) -> SegmentFileJournal | None:
        return self._journal

    @property
    def syncobj(self) -> HardenedSyncObj | None:
        return self._so

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._mailbox = LoopMailbox(self._loop)
        await asyncio.wrap_future(self._driver.call(self._construct))

    def post_to_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        mailbox = self._mailbox
        if mailbox is not None:
            mailbox.post(fn, *args)

    @property
    def loop_wakeups(self) -> int:
        """Wake-ups of the event loop the shard has sent (one per round at most, by design)."""
        return 0 if self._mailbox is None else self._mailbox.wakeups

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._so is not None:
            await asyncio.wrap_future(self._driver.call(self._teardown))
        with self._lock:
            left = list(self._incoming)
            self._incoming.clear()
        for p in left:
            self._finish(p, error=ShardClosedError("shard closed before the proposal was written"))
        for props in [*self._frames.values(), *self._awaiting.values()]:
            for p in props:
                self._finish(p, error=OutcomeUnknownError("shard closed while replicating"))
        self._frames.clear()
        self._awaiting.clear()

    async def propose(
        self, payload: bytes, deadline: float | None = None, *, on_append: bool = False
    ) -> object:
        if self._closed:
            raise ShardClosedError("shard is closed")
        if frames.encoded_size(len(payload), 1) > self._cfg.entry_limit:
            raise ShardRequestDeniedError(
                f"a command of {len(payload)} bytes exceeds the replication frame limit of "
                f"{self._cfg.entry_limit} bytes (the largest replicated entry)"
            )
        loop = asyncio.get_running_loop()
        p = _Proposal(
            payload,
            loop.create_future(),
            on_append=on_append,
            queued_s=time.perf_counter(),
            call=stages.CURRENT_CALL.get(),
        )
        ack_deadline = loop.time() + self._cfg.ack_timeout_ms / 1000
        when = ack_deadline if deadline is None else min(deadline, ack_deadline)
        p.timer = loop.call_at(when, self._expire, p)
        with self._lock:
            if len(self._incoming) >= self._cfg.pending_max:
                p.timer.cancel()
                raise ShardBusyError(f"{self._cfg.pending_max} proposals already waiting")
            self._incoming.append(p)
        self._driver.wake()
        return await p.future

    async def barrier(self) -> None:
        """Return once this replica applied everything committed before the call: an empty
        proposal goes through the log and comes back applied here (read-your-writes on a
        follower that was behind)."""
        await self.propose(b"")

    def _expire(self, p: _Proposal) -> None:
        with self._lock:
            state, p.state = p.state, _State.DONE
        if p.future.done():
            return
        if state is _State.WAITING:
            p.future.set_exception(ProposalTimeoutError("deadline passed before the write"))
        elif state is _State.HANDED:
            p.future.set_exception(
                OutcomeUnknownError(
                    "no majority confirmed the write in time: it may or may not be applied"
                )
            )

    async def transfer_leadership(self, target: str | None = None) -> str:
        """Raft's transfer (thesis 3.10): the leader stops appending (commands wait, and go to
        the new leader afterwards), waits until the target's log matches its own, sends it
        TimeoutNow and waits until another replica leads; -> the new leader. Bounded by
        TRANSFER_TIMEOUT_S."""
        deadline = time.monotonic() + TRANSFER_TIMEOUT_S
        self._transferring = True
        try:
            while True:
                try:
                    chosen = await asyncio.wrap_future(
                        self._driver.call(lambda: self._start_transfer(target))
                    )
                    break
                except _NotCaughtUpError:
                    if time.monotonic() >= deadline:
                        raise
                    await asyncio.sleep(0.01)  # the last entries are still replicating
            if chosen == self._cfg.self_address:
                return chosen
            while time.monotonic() < deadline:
                leader = self._status.leader
                if leader is not None and leader != self._cfg.self_address:
                    return leader
                await asyncio.sleep(0.02)
            raise OutcomeUnknownError(
                f"leadership did not move to {chosen} within {TRANSFER_TIMEOUT_S:.0f} s"
            )
        finally:
            self._transferring = False
            if not self._closed:
                await asyncio.wrap_future(self._driver.call(self._stop_holding))

    def _stop_holding(self) -> None:
        if self._so is not None:
            self._so.fx_holding = False

    async def add_member(self, address: str) -> None:
        parse_address(address, "address")
        await self._membership("add", address)

    async def remove_member(self, address: str) -> None:
        parse_address(address, "address")
        if address == self._cfg.self_address and self.is_leader:
            raise ShardRequestDeniedError(
                "the leader cannot remove itself: transfer leadership first"
            )
        await self._membership("remove", address)

    # -- driver thread: lifecycle ----------------------------------------------------------

    def _construct(self) -> None:
        cfg = self._cfg
        check_address_free(cfg.bind)
        root = os.path.join(cfg.data_dir, "raft", cfg.shard_id)
        os.makedirs(root, exist_ok=True)
        probation = enter_probation(root)
        journal = open_shard_journal(root, segment_bytes=cfg.journal_segment_bytes)
        dump = os.path.join(root, "snapshot")
        journal.before_trim = functools.partial(snapshot_file.fsync_dir, root)
        journal.on_flush = self.on_journal_flush
        t = cfg.timings
        conf = SyncObjConf(
            password=None,  # peers authenticate through raft/wire.py, not Fernet
            autoTick=False,
            appendEntriesUseBatch=False,
            appendEntriesPeriod=t.heartbeat_ms / 1000,
            raftMinTimeout=t.election_min_ms / 1000,
            raftMaxTimeout=t.election_max_ms / 1000,
            leaderFallbackTimeout=t.leader_fallback_ms / 1000,
            connectionRetryTime=t.reconnect_ms / 1000,
            connectionTimeout=t.connect_timeout_ms / 1000,
            # Frames are kept well below this, so pysyncobj never takes its chunked path for an
            # entry (RAFT.md problem 4); several frames still travel in one message.
            appendEntriesBatchSizeBytes=cfg.append_batch_bytes,
            sendBufferSize=1 << 20,
            recvBufferSize=1 << 20,
            commandsQueueSize=4 * cfg.frames_in_flight_max + 64,
            logCompactionMinEntries=cfg.compaction_entries_min,
            logCompactionMinTime=cfg.compaction_interval_s,
            logCompactionBatchSize=cfg.snapshot_chunk_bytes,
            fullDumpFile=dump,
            journalFile=os.path.join(root, "journal"),
            serializer=self._write_snapshot,
            deserializer=self._read_snapshot,
            useFork=False,
            dynamicMembershipChange=True,
            bindAddress=cfg.bind,
            dnsCacheTime=cfg.dns_cache_s,
            dnsFailCacheTime=cfg.dns_fail_cache_s,
            maxBindRetries=1,
        )
        try:
            self._so = HardenedSyncObj(
                cfg.self_address,
                list(cfg.peers),
                conf,
                journal,
                self._driver.poller,
                self._on_apply,
                self._load_snapshot,
                wire_secret=cfg.secret,
                wire_limits=cfg.wire_limits,
                wire_tls=cfg.tls,
                probation=probation,
                on_whole=functools.partial(leave_probation, root),
            )
        except Exception as e:
            journal.close()
            raise ShardStartError(f"raft shard {cfg.shard_id} cannot start: {e}") from e
        self._so.fx_commit_notice_s = t.commit_notice_ms / 1000
        self._journal = journal
        if self.on_stage is not None:
            journal.on_append = self._stamp_appended
            journal.on_durable = functools.partial(self._stamp, "durable")
            journal.on_commit = functools.partial(self._stamp, "committed")
            journal.on_truncate = self._timeline.truncated
            self._so.transport.on_send = self._stamp_sent
            self._so.fx_on_message = self._stamp_acked
        self._apply_thread.start()
        self._driver.attach(self)

    def _teardown(self) -> None:
        self._driver.detach(self)
        assert self._so is not None
        with contextlib.suppress(Exception):
            self._drain_applies()
        self._apply_queue.put(None)
        self._apply_thread.join(timeout=30)
        self._so.destroy()  # closes sockets and the journal (flushed first)
        self._journal_writer.shutdown(wait=True)

    # -- driver thread: one round ----------------------------------------------------------

    def step(self) -> bool:
        so = self._so
        journal = self._journal
        assert so is not None and journal is not None
        journal.poll_flushed()
        leading = so._isLeader()
        if leading != self._leading:
            self._leading = leading
            self._timeline.reset()
        leading_term = so.raftCurrentTerm if leading else None
        handed = self._hand_over(so)
        # pysyncobj's tick ends by polling the sockets itself: a message handled there came
        # after this tick decided commits and sends, so it needs another round at once (an ack
        # would otherwise wait for the next timer: measured, a commit held ~100 ms at p99).
        self._received_at_tick = so.transport.messages_received
        so.doTick(0.0)
        self._flush_applies()
        if leading and so._isLeader():
            # The leader's fsync runs on the journal writer while this thread goes on (acks,
            # the next frames): the commit index waits for it (JournalCore.setRaftCommitIndex).
            journal.flush_async(self._journal_writer, self._driver.wake)
        else:
            journal.flush()
        if (
            handed
            and leading_term is not None
            and so._isLeader()
            and so.raftCurrentTerm == leading_term
            and so.queued_commands() == 0
        ):
            # Still the leader of the same term and pysyncobj's command queue is drained: the
            # frames handed this round are in our log, up to its last index.
            self._appends_to_ack.append((journal.last_index, leading_term, handed))
        self._maybe_ack_appended(so, journal)
        now = time.monotonic()
        if now - self._status_at >= STATUS_INTERVAL_S or self._status_changed(so):
            self._status_at = now
            self._publish_status(so, now)
        return bool(self._incoming) and self._can_hand_over(so)

    def _maybe_ack_appended(self, so: HardenedSyncObj, journal: SegmentFileJournal) -> None:
        """Acknowledge ``on_append`` proposals whose entries are durable in our log. A leader
        never truncates its own log within its term, so entries of the term we still lead are
        the ones we appended."""
        while self._appends_to_ack:
            last_index, term, frame_ids = self._appends_to_ack[0]
            if not so._isLeader() or so.raftCurrentTerm != term:
                self._appends_to_ack.clear()  # pysyncobj reports their outcome instead
                return
            if journal.durable_index < last_index:
                return
            self._appends_to_ack.popleft()
            self._ack_appended(frame_ids)

    def next_wake_s(self) -> float:
        """Driver thread: seconds until pysyncobj's next timer (the leader's heartbeat, a
        follower's election deadline) or the transport's."""
        so = self._so
        if so is None:
            return 0.0
        if so.transport.messages_received != self._received_at_tick:
            return 0.0  # handled after the last tick's decisions: tick again now
        journal = self._journal
        if journal is not None and journal.flush_finished:
            # The writer's wake-up may have been drained by a poll inside the last tick, after
            # this round looked at the journal: take the flush now, not at the next timer.
            return 0.0
        transport_s = float(so.transport.next_timer_s(time.monotonic()))
        return min(so.fx_next_timer_s(), transport_s)

    def _can_hand_over(self, so: HardenedSyncObj) -> bool:
        if self._transferring and so._isLeader():
            return False  # a transfer waits for a follower to match our log: don't grow it
        return so._getLeader() is not None and len(self._frames) < self._cfg.frames_in_flight_max

    def _ack_appended(self, frame_ids: list[int]) -> None:
        done: list[tuple[_Proposal, object]] = [
            (p, Appended()) for fid in frame_ids for p in self._frames.get(fid, ()) if p.on_append
        ]
        if done:
            self.post_to_loop(self._resolve_all, done)

    def _hand_over(self, so: HardenedSyncObj) -> list[int]:
        """Hand waiting proposals to pysyncobj as frames; -> the frame ids handed."""
        handed: list[int] = []
        while self._incoming and self._can_hand_over(so):
            taken: list[_Proposal] = []
            size = 0
            with self._lock:
                while self._incoming and len(taken) < frames.PROPOSALS_PER_FRAME_MAX:
                    p = self._incoming[0]
                    if p.state is not _State.WAITING:
                        self._incoming.popleft()
                        continue
                    n = frames.encoded_size(size + len(p.payload), len(taken) + 1)
                    if taken and n > self._cfg.frame_bytes_max:
                        break
                    self._incoming.popleft()
                    p.state = _State.HANDED
                    taken.append(p)
                    size += len(p.payload)
            if not taken:
                break
            frame_id = next(self._frame_ids)
            handed.append(frame_id)
            self._frames[frame_id] = taken
            if self.on_stage is not None:
                self._maybe_trace(frame_id, taken)
            self.frames_proposed += 1
            so.fx_apply(
                frames.encode([p.payload for p in taken]),
                callback=functools.partial(self._on_frame_result, frame_id),
            )
        return handed

    def _on_apply(self, log_index: int, frame: bytes) -> int:
        # Inside pysyncobj's apply loop: only remember it; _flush_applies applies the whole run
        # of entries in one state transaction after the tick.
        self._pending_applies.append((log_index, frame))
        return log_index

    def _on_frame_result(self, frame_id: int, result: Any, error: int) -> None:
        taken = self._frames.pop(frame_id, None)
        trace = self._frame_traces.pop(frame_id, None)
        if taken is None:
            return
        if error == FAIL_REASON.SUCCESS:
            self._awaiting[int(result)] = taken
            if trace is not None:
                trace.entry = self._timeline.take(int(result))
                self._index_traces[int(result)] = trace
            return
        exc: Exception
        if error in (FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME):
            exc = OutcomeUnknownError(
                f"the leader changed while replicating ({fail_reason_name(error)}): the write "
                "may or may not be applied"
            )
        elif error == FAIL_REASON.QUEUE_FULL:
            exc = ShardBusyError("the replication queue is full")
        else:  # MISSING_LEADER, NOT_LEADER, DISCARDED, REQUEST_DENIED: never applied
            exc = NotLeaderError(self._status.leader)
        for p in taken:
            self._finish_threadsafe(p, error=exc)

    def _flush_applies(self) -> None:
        """Hand the entries committed this round to the apply thread, as one batch."""
        if not self._pending_applies:
            return
        entries: list[Entry] = []
        slots: list[int | None] = []  # per proposal: its position in entries (None: a barrier)
        spans: list[tuple[int, int, int]] = []  # (log index, first slot, count)
        for log_index, frame in self._pending_applies:
            payloads = frames.decode(frame)
            spans.append((log_index, len(slots), len(payloads)))
            for i, payload in enumerate(payloads):
                if payload:
                    slots.append(len(entries))
                    entries.append(Entry(frames.sub_index(log_index, i), payload))
                else:
                    slots.append(None)  # a barrier: ordered by the log, nothing to apply
        self._pending_applies.clear()
        assert self._journal is not None and self._so is not None
        # As far as this node can tell, the log is on the disks of a majority up to here: a
        # leader counts its followers too; anyone else its own journal, durable up to the
        # commit index before the index moves.
        if self._so._isLeader():
            durable_upto = self._so.fx_durable_on_majority()
        else:
            durable_upto = self._journal.durable_index
        waiting: list[tuple[list[_Proposal], int]] = []  # (proposals, first slot)
        for log_index, first, count in spans:
            taken = self._awaiting.pop(log_index, None)
            if taken is None:
                continue
            assert len(taken) == count, (len(taken), count)
            # The invariant of the product: nothing is acknowledged that is not on the disks of
            # a majority.
            if log_index > durable_upto:
                self.acked_not_durable_on_majority += 1
            waiting.append((taken, first))
        self.entries_applied += len(spans)
        traces = [t for li, _, _ in spans if (t := self._index_traces.pop(li, None)) is not None]
        self._timeline.forget_upto(spans[-1][0])
        batch = (entries, slots, waiting, traces)
        if self._maybe_apply_inline(batch):
            return
        # Applying runs on its own thread, so the next round's messages overlap with it (and
        # with its fsync where the state has one); batches stay in log order.
        self._apply_queue.put(batch)

    def _maybe_apply_inline(self, batch: Any) -> bool:
        """Apply a small batch here, on the driver thread, when the apply thread is idle and
        applies have been cheap (a state that commits without fsync: raft shards' stores,
        storage/unsynced_marker.py): a hand-off to the apply thread and back costs more than
        the apply (measured ~0.8 ms of 4 at c=1). Large batches, and states whose commits are
        slow, keep the thread, so the driver never stalls its heartbeats on a disk. -> whether
        it was applied."""
        if (
            self._apply_queue.unfinished_tasks  # earlier batches first: log order
            or len(batch[0]) > INLINE_APPLY_ENTRIES_MAX
            or self._apply_cost_s > INLINE_APPLY_COST_S_MAX
        ):
            return False
        if self._apply_batches([batch], retry=False):
            self.batches_applied_inline += 1
        else:
            # The state transaction rolled back: the apply thread retries it (and says why).
            self._apply_queue.put(batch)
        return True

    def _apply_routine(self) -> None:
        set_os_thread_name(self._apply_thread.name)
        while True:
            items = [self._apply_queue.get()]
            # Whatever else is queued goes into the same state transaction: under load the
            # batches committed while the last one was being fsync'd cost one fsync, not many.
            while len(items) < APPLY_BATCHES_COALESCED_MAX:
                try:
                    items.append(self._apply_queue.get_nowait())
                except queue.Empty:
                    break
            try:
                stop = items[-1] is None
                batches = [item for item in items if item is not None]
                if batches:
                    self._apply_batches(batches)
                if stop:
                    return
            finally:
                for _ in items:
                    self._apply_queue.task_done()

    def _apply_batches(self, batches: list[Any], *, retry: bool = True) -> bool:
        """Apply the entries of ``batches`` (as ``_flush_applies`` queued them, in log order) in
        one state transaction, then resolve their proposals. -> False only with ``retry=False``
        when the state machine refused the transaction (nothing applied, nothing resolved);
        with ``retry=True`` it stalls until the state machine can apply them.

        What the round posts to the loop (the commit listener's wake-ups, the answers, the
        traces) reaches it in one wake-up: the mailbox is held from the apply to the answers
        (not while a failed apply waits to be retried: other posts must not wait for a disk)."""
        mailbox = self._mailbox
        entries: list[Entry] = []
        for batch_entries, _slots, _waiting, _traces in batches:
            entries.extend(batch_entries)
        started_s = time.perf_counter()
        while True:
            if mailbox is not None:
                mailbox.hold()
            try:
                applied = self._sm.apply_batch(entries)
                break
            except Exception:
                if mailbox is not None:
                    mailbox.release()
                if not retry:
                    return False
                # Committed entries cannot be skipped: stall (and say so) until the state
                # machine can apply them, e.g. once disk space is freed.
                log.exception("shard %s: applying committed entries failed", self.shard_id)
                time.sleep(APPLY_RETRY_S)
        assert len(applied) == len(entries)
        try:
            self._answer(batches, applied, started_s)
        finally:
            if mailbox is not None:
                mailbox.release()
        return True

    def _answer(self, batches: list[Any], applied: list[object], started_s: float) -> None:
        applied_s = time.perf_counter()
        # What an apply costs lately (per batch; a moving average), for _maybe_apply_inline.
        self._apply_cost_s += (applied_s - started_s - self._apply_cost_s) / APPLY_COST_WEIGHT
        done: list[tuple[_Proposal, object]] = []
        traces: list[stages.FrameTrace] = []
        offset = 0
        for batch_entries, slots, waiting, batch_traces in batches:
            results = [None if k is None else applied[offset + k] for k in slots]
            offset += len(batch_entries)
            for taken, first in waiting:
                done.extend(zip(taken, results[first : first + len(taken)], strict=True))
            traces.extend(batch_traces)
        for trace in traces:
            trace.applied_s = applied_s
        self.batches_applied += 1
        self.proposals_applied += len(done)
        if done:
            self.post_to_loop(self._resolve_all, done)
        if traces:
            self.post_to_loop(self._observe_traces, traces)

    def _drain_applies(self) -> None:
        """Driver thread: wait until every committed entry handed out so far is applied."""
        self._flush_applies()
        self._apply_queue.join()

    def _status_changed(self, so: HardenedSyncObj) -> bool:
        """Role, term or leader moved since the last status: published at once, whatever the
        interval (the event loop routes by them)."""
        leader = so._getLeader()
        st = self._status
        return (
            so.raftCurrentTerm != st.term
            or so._isLeader() != (st.role == "leader")
            or (None if leader is None else leader.id) != st.leader
        )

    def _publish_status(self, so: HardenedSyncObj, now: float) -> None:
        leader = so._getLeader()
        role = "leader" if so._isLeader() else "follower" if leader is not None else "candidate"
        others = so.otherNodes
        members = (self._cfg.self_address, *sorted(n.id for n in others))
        connected = [n for n in others if so.isNodeConnected(n)]
        in_sync_members: tuple[str, ...] = ()
        if role == "leader":
            floor = so.raftCommitIndex - self._cfg.in_sync_lag_entries
            match = so.match_index
            in_sync_members = (
                self._cfg.self_address,
                *sorted(n.id for n in connected if match.get(n.id, 0) >= floor),
            )
            in_sync = len(in_sync_members)
        else:
            in_sync = 1 + len(connected)
        self._status = ShardStatus(
            shard_id=self._cfg.shard_id,
            role=role,
            term=so.raftCurrentTerm,
            commit_index=so.raftCommitIndex,
            applied_index=so.raftLastApplied,
            members=members,
            leader=None if leader is None else leader.id,
            pending_proposals=len(self._incoming) + sum(len(f) for f in self._frames.values()),
            in_sync=in_sync,
            on_probation=so.on_probation,
            connected=(self._cfg.self_address, *sorted(n.id for n in connected)),
            in_sync_members=in_sync_members,
        )
        if leader is not None:
            self._leaderless_since = now
        elif now - self._leaderless_since > 5 and now - self._last_leaderless_warning > 10:
            self._last_leaderless_warning = now
            unreachable = [n.id for n in so.otherNodes if not so.isNodeConnected(n)]
            log.warning(
                "shard %s has no leader for %.0f s; unreachable peers: %s",
                self._cfg.shard_id,
                now - self._leaderless_since,
                ", ".join(sorted(unreachable)) or "none",
            )

    # -- driver thread: snapshots ----------------------------------------------------------

    def _write_snapshot(self, path: str, data: Sequence[Any]) -> None:
        last, prev, cluster = data
        started = time.perf_counter()
        self._drain_applies()
        state_path = path + ".state"
        try:
            applied = frames.log_index_of(self._sm.write_snapshot(state_path))
            # Every state change up to the snapshot's entry is in the copy, nothing after it.
            assert applied <= last[1], (applied, last[1])
            members = [n.id if hasattr(n, "id") else str(n) for n in cluster]
            snapshot_file.write(path, tuple(last), tuple(prev), members, state_path)  # type: ignore[arg-type]
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(state_path)
        log.info("shard %s: snapshot at log index %d", self._cfg.shard_id, last[1])
        self._observe_snapshot("write", path, started)

    def _observe_snapshot(self, kind: str, path: str, started: float) -> None:
        if self.on_snapshot is not None:
            with contextlib.suppress(OSError):
                self.on_snapshot(kind, os.path.getsize(path), time.perf_counter() - started)

    def _read_snapshot(self, path: str) -> tuple[Any, Any, Any]:
        info = snapshot_file.read_info(path)
        return info.last, info.prev, list(info.members)

    def _load_snapshot(self, path: str, info: snapshot_file.SnapshotInfo) -> None:
        # A snapshot received from the leader was written and renamed by pysyncobj without an
        # fsync; the journal is cut back to its last entries right after this returns, so the
        # file (and its name) must be durable first.
        started = time.perf_counter()
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        snapshot_file.fsync_dir(os.path.dirname(path))
        self._drain_applies()  # what was committed before is at or below the snapshot
        if frames.log_index_of(self._sm.last_applied_index()) >= info.index:
            return  # our state is already as new (a restart after taking this snapshot)
        state_path = path + ".install"
        try:
            snapshot_file.extract_state(path, info, state_path)
            self._sm.install_snapshot(state_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(state_path)
        log.info("shard %s: installed the snapshot at log index %d", self._cfg.shard_id, info.index)
        self._observe_snapshot("install", path, started)

    # -- driver thread: administration -----------------------------------------------------

    def _start_transfer(self, target: str | None) -> str:
        so = self._so
        assert so is not None
        if not so._isLeader():
            raise NotLeaderError(self._status.leader)
        so.fx_holding = True  # from now on the log stops growing; see transfer_leadership
        match = so.match_index
        last = self._journal.last_index if self._journal else 0
        if target is None:
            ready = sorted((i, n) for n, i in match.items() if i == last)
            if not ready:
                raise _NotCaughtUpError("no follower is caught up with the leader's log")
            target = ready[-1][1]
        elif target == self._cfg.self_address:
            return target
        elif target not in match:
            raise ShardRequestDeniedError(f"{target} is not a member of shard {self.shard_id}")
        elif match[target] != last:
            raise _NotCaughtUpError(f"{target} is not caught up with the leader's log")
        outcome: list[int] = []
        so.transferLeadership(target, callback=lambda _r, err: outcome.append(err))
        if outcome and outcome[0] != FAIL_REASON.SUCCESS:
            raise ShardRequestDeniedError(
                f"{target} cannot take over now ({fail_reason_name(outcome[0])}): it is not "
                "connected or not caught up with the leader's log"
            )
        return target

    async def _membership(self, op: str, address: str) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()

        def settle(err: int) -> None:
            if not fut.done():
                fut.set_result(err)

        def done(_result: Any, err: int) -> None:
            loop.call_soon_threadsafe(settle, err)

        def start() -> None:
            so = self._so
            assert so is not None
            if op == "add":
                so.addNodeToCluster(address, callback=done)
            else:
                so.removeNodeFromCluster(address, callback=done)

        await asyncio.wrap_future(self._driver.call(start))
        try:
            err = await asyncio.wait_for(fut, self._cfg.ack_timeout_ms / 1000)
        except TimeoutError as e:
            raise OutcomeUnknownError(f"the membership change did not commit in time: {e}") from e
        if err != FAIL_REASON.SUCCESS:
            raise ShardRequestDeniedError(
                f"cannot {op} {address} ({fail_reason_name(err)}): one change at a time, the "
                "leader must have committed an entry of its term, and the address must "
                f"{'not ' if op == 'add' else ''}be a member"
            )

    # -- the latency budget (raft/stages.py) ------------------------------------------------

    def _maybe_trace(self, frame_id: int, taken: list[_Proposal]) -> None:
        now_s = time.perf_counter()
        if not self._sampler.take(now_s):
            return
        if len(self._frame_traces) >= stages.ENTRIES_TRACKED_MAX:
            self._frame_traces.clear()  # frames whose outcome never came (closed shards)
        first = taken[0]
        self._frame_traces[frame_id] = stages.FrameTrace(
            queued_s=first.queued_s,
            received_s=None if first.call is None else first.call.received_s,
            handed_s=now_s,
            calls=[p.call for p in taken if p.call is not None],
        )

    def _stamp_appended(self, index: int) -> None:
        if self._leading:
            self._timeline.appended(index, time.perf_counter())

    def _stamp(self, kind: str, upto: int) -> None:
        if self._leading:
            self._timeline.stamp(kind, upto, time.perf_counter())

    def _stamp_sent(self, _node: Any, message: Any) -> None:
        if self._leading and type(message) is dict and message.get("type") == "append_entries":
            entries = message.get("entries")
            if entries:
                self._timeline.stamp("sent", entries[-1][1], time.perf_counter())

    def _stamp_acked(self, _node: Any, message: Any) -> None:
        if (
            self._leading
            and type(message) is dict
            and message.get("type") == "next_node_idx"
            and message.get("success")
        ):
            self._timeline.stamp("acked", message["next_node_idx"] - 1, time.perf_counter())

    def _observe_traces(self, traces: list[stages.FrameTrace]) -> None:
        """Event loop, right after the frames' results were resolved."""
        observe = self.on_stage
        if observe is None:
            return
        resolved_s = time.perf_counter()
        for trace in traces:
            spent = stages.durations(trace, resolved_s)
            for call in trace.calls:
                call.resolved_s = resolved_s
                call.stages = spent
            for stage, seconds in spent.items():
                observe(stage, seconds)

    # -- completion ------------------------------------------------------------------------

    def _finish_threadsafe(self, p: _Proposal, *, error: BaseException) -> None:
        self.post_to_loop(self._finish, p, None, error)

    def _finish(
        self, p: _Proposal, result: object = None, error: BaseException | None = None
    ) -> None:
        p.state = _State.DONE
        if p.timer is not None:
            p.timer.cancel()
        if p.future.done():
            return
        if error is not None:
            p.future.set_exception(error)
        else:
            p.future.set_result(result)

    def _resolve_all(self, done: list[tuple[_Proposal, object]]) -> None:
        for p, result in done:
            self._finish(p, result)
