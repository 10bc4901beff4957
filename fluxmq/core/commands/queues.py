"""Queue commands at apply: create, update, delete, purge; and the node-address record."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import dead_letters as dls
from fluxmq.core import keys, limits
from fluxmq.core import membership as msh
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.commands.context import ApplyContext
from fluxmq.core.commands.results import PurgeResult
from fluxmq.core.errors import FluxError, queue_exists
from fluxmq.core.queue_config import policy_of


def apply_record_node_address(ctx: ApplyContext, cmd: cpb.RecordNodeAddressCmd) -> None:
    ctx.node_addresses_for_write()[cmd.raft_address] = cmd.grpc_address
    ctx.txn.put(keys.NODE_ADDRESS + cmd.raft_address.encode(), cmd.grpc_address.encode())


def apply_create_queue(ctx: ApplyContext, cmd: cpb.CreateQueueCmd) -> pb.Queue:
    name = cmd.config.name
    if name in ctx.cat():
        raise queue_exists(name)
    check_dead_letter_environments(ctx.cat(), cmd.config)
    serves, adopt = dls.dead_letter_role(ctx.cat(), cmd.config, None, _messages_held(ctx))
    if len(ctx.cat()) >= limits.QUEUES_MAX:
        raise FluxError("QUEUE_LIMIT", f"the broker holds {limits.QUEUES_MAX} queues already")
    txn = ctx.txn
    raw = txn.get(keys.NEXT_QUEUE_ID)
    queue_id = keys.U64.unpack(raw)[0] if raw else 1
    txn.put(keys.NEXT_QUEUE_ID, keys.U64.pack(queue_id + 1))
    queue = pb.Queue(
        config=cmd.config,
        queue_id=queue_id,
        created_at_ms=cmd.now_ms,
        updated_at_ms=cmd.now_ms,
        dead_letter_of=serves,
    )
    txn.put(keys.queue_key(name), queue.SerializeToString())
    ctx.cat_for_write()[name] = QueueEntry(queue, policy_of(queue.config))
    if adopt is not None:
        _mark_dead_letter_queue(ctx, adopt, name)
    return queue


def _messages_held(ctx: ApplyContext) -> Callable[[QueueEntry], bool]:
    def holds(entry: QueueEntry) -> bool:
        for partition in range(entry.policy.partitions):
            wm = ctx.txn.log(keys.log_id(entry.queue_id, partition)).watermarks()
            if wm.high > wm.low:
                return True
        return False

    return holds


def _mark_dead_letter_queue(ctx: ApplyContext, entry: QueueEntry, origin: str) -> None:
    """``entry`` becomes a DLQ (of ``origin`` first): from now on it never gets a DLQ."""
    queue = pb.Queue()
    queue.CopyFrom(entry.queue)
    queue.dead_letter_of = origin
    ctx.txn.put(keys.queue_key(entry.name), queue.SerializeToString())
    ctx.cat_for_write()[entry.name] = QueueEntry(queue, entry.policy)


def apply_update_queue(ctx: ApplyContext, cmd: cpb.UpdateQueueCmd) -> pb.Queue:
    old = ctx.entry(cmd.config.name, cmd.queue_id)
    if old.queue.updated_at_ms != cmd.expected_updated_at_ms:
        raise FluxError(
            "CONCURRENT_UPDATE",
            f"queue {cmd.config.name!r} changed while this update was prepared; retry it",
            retriable=True,
        )
    if cmd.config.partitions < old.queue.config.partitions:
        raise FluxError("INVALID_ARGUMENT", "partitions can grow but never shrink")
    if cmd.config.type != old.queue.config.type:
        raise FluxError("INVALID_ARGUMENT", "the queue type cannot be changed")
    check_dead_letter_environments(ctx.cat(), cmd.config)
    _serves, adopt = dls.dead_letter_role(ctx.cat(), cmd.config, old, _messages_held(ctx))
    queue = pb.Queue()
    queue.CopyFrom(old.queue)
    queue.config.CopyFrom(cmd.config)
    # Strictly increasing, so every update makes a new version even within one millisecond.
    queue.updated_at_ms = max(cmd.now_ms, old.queue.updated_at_ms + 1)
    ctx.txn.put(keys.queue_key(cmd.config.name), queue.SerializeToString())
    ctx.cat_for_write()[cmd.config.name] = QueueEntry(queue, policy_of(queue.config))
    if adopt is not None:
        _mark_dead_letter_queue(ctx, adopt, cmd.config.name)
    if cmd.config.partitions > old.queue.config.partitions:
        _rebalance_members(ctx, old, cmd.config.partitions)
    return queue


def _rebalance_members(ctx: ApplyContext, entry: QueueEntry, partitions: int) -> None:
    """New partitions of an ordered group go to its members at once."""
    for g in ctx.delivery.of_queue(entry.queue_id):
        if g.membership is not None and g.membership.members and g.ordered:
            msh.rebalance(g.membership, partitions)
            ctx.delivery.save_membership(ctx.txn, g)


def apply_delete_queue(ctx: ApplyContext, cmd: cpb.DeleteQueueCmd) -> None:
    entry = ctx.entry(cmd.name)
    txn = ctx.txn
    txn.delete(keys.queue_key(cmd.name))
    # The records go in bounded chunks on later retention passes: deleting a large queue
    # must not hold the writer (and every other queue's publishes) for seconds.
    for partition in range(entry.policy.partitions):
        txn.put(keys.TRASH + keys.U64.pack(keys.log_id(entry.queue_id, partition)), b"")
    ctx.delivery.delete_queue(txn, entry.queue_id)
    del ctx.cat_for_write()[cmd.name]


def apply_purge(ctx: ApplyContext, cmd: cpb.PurgeCmd) -> PurgeResult:
    """Querator's clear, per group; then the log loses what no group needs any more."""
    entry = ctx.entry(cmd.name, cmd.queue_id or None)
    groups = ctx.delivery.of_queue(entry.queue_id)
    npart = entry.policy.partitions
    skipped = sum(
        ctx.delivery.purge(ctx.txn, g, entry.policy, cmd.scope, cmd.destructive, cmd.now_ms)
        for g in groups
    )
    purged = 0
    if cmd.destructive or cmd.scope != pb.PURGE_SCOPE_SCHEDULED:
        for partition in range(npart):
            log = ctx.txn.log(keys.log_id(entry.queue_id, partition))
            floor = ctx.consumed_floor(entry, partition, log.watermarks().high)
            purged += log.truncate_before(floor).removed_records
    return PurgeResult(purged, skipped)


def check_dead_letter_environments(
    catalog: Mapping[str, QueueEntry], config: pb.QueueConfig
) -> None:
    """PERMISSION_DENIED when creating or updating ``config`` would pair a queue with a DLQ of
    another environment: its DLQ exists elsewhere, or it is the DLQ some other environment's
    queue names. Checked in the state machine, so racing creates through two nodes cannot
    slip past it."""
    dlq_name = policy_of(config).dead_letter_queue
    dlq = catalog.get(dlq_name) if dlq_name is not None else None
    if dlq is not None and dlq.queue.config.environment != config.environment:
        raise FluxError(
            "PERMISSION_DENIED",
            f"queue {config.name!r} cannot use {dlq_name!r} as its dead-letter queue: it belongs "
            "to another environment",
            metadata={"queue": config.name, "dead_letter_queue": str(dlq_name)},
        )
    for entry in catalog.values():
        if (
            entry.policy.dead_letter_queue == config.name
            and entry.name != config.name
            and entry.queue.config.environment != config.environment
        ):
            raise FluxError(
                "PERMISSION_DENIED",
                f"the name {config.name!r} is the dead-letter queue of a queue in another "
                "environment: choose another name",
                metadata={"queue": config.name},
            )
