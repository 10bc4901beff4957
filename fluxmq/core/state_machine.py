"""The queue state machine: applies commands, in log order, to one store.

Deterministic and clock-free: every time it needs comes inside the command (``now_ms``, stamped
by the leader). A run of entries is applied in one write transaction (group commit: one fsync),
and the last applied index is written in that same transaction, so replaying entries that were
already applied changes nothing.

A command that is refused (queue not found, ...) is a *result*, not an exception: the refusal is
as deterministic as a success and must not abort the other commands of the same transaction.
An exception from storage aborts the whole transaction; nothing of the batch is applied.

What each command does is in its family's module of ``fluxmq.core.commands`` (``HANDLERS``);
this class owns the store, the transaction around a batch, and what is published after it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from fluxmq.core import keys
from fluxmq.core.catalog import QueueEntry, load_catalog
from fluxmq.core.commands import (
    Op,
    checkout,
    decode,
    leases,
    letters,
    members,
    queues,
    retention,
    transact,
)
from fluxmq.core.commands import append as append_cmds
from fluxmq.core.commands.context import ApplyContext, ApplyCounters
from fluxmq.core.delivery import DeliveryState, Push
from fluxmq.core.errors import FluxError
from fluxmq.core.views import DeliveryView, StateView
from storage.api import Store, WriteTxn


class Entry(Protocol):
    """A log entry as the replication layer hands it over (raft.Entry has this shape)."""

    @property
    def index(self) -> int: ...

    @property
    def payload(self) -> bytes: ...


Result = object  # pb.Queue | AppendResult | int | RetentionResult | None | FluxError
Handler = Callable[[ApplyContext, Any], Result]

# Every op and the function that applies it (each in its family's module of fluxmq.core.commands).
HANDLERS: Mapping[Op, Handler] = {
    Op.CREATE_QUEUE: queues.apply_create_queue,
    Op.UPDATE_QUEUE: queues.apply_update_queue,
    Op.DELETE_QUEUE: queues.apply_delete_queue,
    Op.APPEND: append_cmds.apply_append,
    Op.PURGE: queues.apply_purge,
    Op.APPLY_RETENTION: retention.apply_retention,
    Op.CREATE_GROUP: leases.apply_create_group,
    Op.DELETE_GROUP: leases.apply_delete_group,
    Op.LEASE: leases.apply_lease,
    Op.ACK: leases.apply_ack,
    Op.NACK: leases.apply_nack,
    Op.EXTEND_LEASE: leases.apply_extend,
    Op.EXPIRE_LEASES: leases.apply_expire_leases,
    Op.COMMIT_OFFSETS: leases.apply_commit_offsets,
    Op.RESET_OFFSETS: leases.apply_reset_offsets,
    Op.REPLAY_DEAD_LETTERS: letters.apply_replay_dead_letters,
    Op.PURGE_DEAD_LETTERS: letters.apply_purge_dead_letters,
    Op.TRANSACT: transact.apply_transact,
    Op.JOIN_GROUP: members.apply_join_group,
    Op.LEAVE_GROUP: members.apply_leave_group,
    Op.RELEASE_PARTITIONS: members.apply_release_partitions,
    Op.EXPIRE_MEMBERS: members.apply_expire_members,
    Op.RECORD_NODE_ADDRESS: queues.apply_record_node_address,
    Op.INIT_PRODUCER: append_cmds.apply_init_producer,
    Op.CHECKOUT: checkout.apply_checkout,
    Op.CHECKIN: checkout.apply_checkin,
}

# Called after each commit (from the applying thread) with the logs that grew, the consumer
# groups that changed, and what was assigned to checked-out consumers.
CommitListener = Callable[[list[int], list[int], list[Push]], None]


class QueueStateMachine:
    """Owns the writes to one store, and every piece of mutable state derived from it.

    One applier at a time calls ``apply_batch`` and ``install_snapshot`` (the shard serializes
    them). Everyone else reads ``view`` (an immutable ``StateView``, swapped in after each
    commit) and read transactions of the store; nothing here is shared through a lock."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._catalog: dict[str, QueueEntry] = {}
        self._node_addresses: dict[str, str] = {}  # raft address -> gRPC address
        self._applied = 0
        # Last timestamp per log, to keep timestamps of a log non-decreasing even if the leader's
        # clock steps back. Filled from storage on a miss, so it only ever reflects commits.
        self._last_ts: dict[int, int] = {}
        self.delivery = DeliveryState()
        self._reload()
        self._view = self._whole_view()
        # How waiting readers learn about new records whoever proposed them, and how the
        # leader's Consume streams get what the apply assigned to them.
        self.commit_listener: CommitListener | None = None
        self._counters = ApplyCounters()

    @property
    def view(self) -> StateView:
        """The state as of the last commit, never changed afterwards (any thread)."""
        return self._view

    @property
    def catalog(self) -> Mapping[str, QueueEntry]:
        """The catalog as of the last commit (any thread)."""
        return self._view.catalog

    @property
    def store(self) -> Store:
        return self._store

    @property
    def dead_letters_dropped(self) -> int:
        """Dead messages of queues without a usable DLQ, dropped since start (a metric)."""
        return self._counters.dead_letters_dropped

    def last_applied_index(self) -> int:
        return self._applied

    def node_address(self, raft_address: str) -> str | None:
        """The gRPC address the node at ``raft_address`` recorded (None: never recorded)."""
        return self._view.node_addresses.get(raft_address)

    def _whole_view(self) -> StateView:
        return StateView(
            self._applied, self._catalog, self._node_addresses, DeliveryView.of(self.delivery)
        )

    def _reload(self) -> None:
        """Derive everything held in memory from the store, from one consistent view."""
        with self._store.read() as txn:
            catalog = load_catalog(txn)
            node_addresses = {
                k[len(keys.NODE_ADDRESS) :].decode(): v.decode()
                for k, v in txn.scan(keys.NODE_ADDRESS)
            }
            raw = txn.get(keys.APPLIED)
            delivery = DeliveryState.load(txn)
        if delivery.legacy_slot_keys:
            # A store from before slot runs: rewrite its slots as runs now. The runs are a
            # function of the state, so every replica that opens its copy writes the same rows.
            with self._store.write() as wtxn:
                delivery.flush(wtxn)
        self._catalog = catalog
        self._node_addresses = node_addresses
        self._applied = keys.U64.unpack(raw)[0] if raw else 0
        self._last_ts = {}
        self.delivery = delivery

    def digest(self) -> str:
        """Hex sha256 of the whole replicated state, equal on replicas that applied the same
        entries. The applied index is left out: a replica reports it on its own, and entries that
        change nothing (skipped ones, no-ops) must not make equal states differ.

        Reads one consistent view of the store (hashing a large store must not stall applies);
        a caller that needs the index the digest belongs to reads the applied index before and
        after, and tries again if it moved."""
        return self._store.digest(exclude_kv_keys=(keys.APPLIED,))

    def write_snapshot(self, path: str) -> int:
        """Write a copy of the whole state to the new file ``path`` (fsync'd); return the
        applied index it reflects. Applies wait only while the copy's view is opened, not during
        the copy: the view is a read transaction that later commits do not change."""
        with self._store.read() as txn:
            # A read transaction sees whole commits only, and the applied index is written in
            # the same transaction as the batch: the copy is exactly the state at ``applied``.
            raw = txn.get(keys.APPLIED)
            applied = keys.U64.unpack(raw)[0] if raw else 0
            self._store.copy_to(path, txn)
        return applied

    def install_snapshot(self, path: str) -> None:
        """Replace the whole state by the copy in ``path`` (written by ``write_snapshot``),
        atomically for readers of the store; then wake every waiting reader, since any log or
        group may have changed."""
        old_logs = self._log_ids()
        old_groups = self._group_ids()
        self._store.replace_from(path)
        self._reload()
        self._view = self._whole_view()
        log_ids = sorted(old_logs | self._log_ids())
        group_ids = sorted(old_groups | self._group_ids())
        if self.commit_listener is not None:
            self.commit_listener(log_ids, group_ids, [])

    def _log_ids(self) -> set[int]:
        return {
            keys.log_id(entry.queue_id, partition)
            for entry in self._catalog.values()
            for partition in range(entry.policy.partitions)
        }

    def _group_ids(self) -> set[int]:
        return {g.group_id for by_name in self.delivery.groups.values() for g in by_name.values()}

    def apply_batch(self, entries: Sequence[Entry]) -> list[Result]:
        """Apply ``entries`` (indexes increasing, not necessarily consecutive: the replication
        log holds entries that never reach the state machine) in one durable transaction.
        Entries at or below the last applied index are skipped (their result is None)."""
        results: list[Result] = []
        applied = self._applied
        try:
            with self._store.write() as txn:
                batch = self._context(txn)
                for entry in entries:
                    if entry.index <= applied:
                        results.append(None)
                        continue
                    results.append(self._apply_one(batch, entry.payload))
                    applied = entry.index
                # Delivery rows once per batch: commands of one batch that touch the same run
                # (acks of one lease, say) rewrite its row once. Nothing reads them before.
                self.delivery.flush(txn)
                if applied != self._applied:
                    txn.put(keys.APPLIED, keys.U64.pack(applied))
        except BaseException:
            # The transaction rolled back: so must the in-memory delivery state (the published
            # view never saw any of it; nothing it assigned was pushed).
            with self._store.read() as rtxn:
                self.delivery = DeliveryState.load(rtxn)
            raise
        # Committed: only now do readers see the new catalog and the new timestamps.
        self._applied = applied
        if batch.catalog is not None:
            self._catalog = batch.catalog
        if batch.node_addresses is not None:
            self._node_addresses = batch.node_addresses
        self._last_ts.update(batch.last_ts)
        touched = sorted(self.delivery.touched)
        members_touched = set(self.delivery.members_touched)
        pushes = self.delivery.pushes
        self.delivery.touched.clear()
        self.delivery.members_touched.clear()
        self.delivery.pushes = []
        before = self._view
        self._view = StateView(
            applied,
            self._catalog,
            self._node_addresses,
            DeliveryView.changed(before.delivery, self.delivery, touched, members_touched),
        )
        if (batch.last_ts or touched) and self.commit_listener is not None:
            self.commit_listener(sorted(batch.last_ts), touched, pushes)
        return results

    # -- dispatch ---------------------------------------------------------------------------

    def _context(self, txn: WriteTxn) -> ApplyContext:
        return ApplyContext(
            txn,
            self.delivery,
            self._catalog,
            self._node_addresses,
            self._last_ts,
            self._counters,
        )

    def _apply_one(self, ctx: ApplyContext, payload: bytes) -> Result:
        op, cmd = decode(payload)
        try:
            result = self._dispatch(ctx, op, cmd)
        except FluxError as err:
            # Refusals are raised before anything changes (checked first, then applied).
            assert not self.delivery.dead_letters
            return err
        else:
            # Delivery is decided at apply: what this command made ready goes to the
            # checked-out consumers now, in the same transaction, alike on every replica.
            # (It refuses nothing: an exception here aborts the batch, as a storage error.)
            checkout.assign_checked_out(ctx, op, cmd)
            return result
        finally:
            self.delivery.changed.clear()
            ctx.grown.clear()

    def _dispatch(self, ctx: ApplyContext, op: Op, cmd: object) -> Result:
        handler = HANDLERS.get(op)
        if handler is None:
            raise AssertionError(f"op {op} has no handler")
        return handler(ctx, cmd)
