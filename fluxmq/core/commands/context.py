"""``ApplyContext``: what a command handler may touch while one batch's write transaction is
open, and nothing else of the state machine.

The catalog and the node addresses are copied on first write: the state machine publishes the
copies only once the transaction commits, so an aborted batch leaves no trace in them. The
last-timestamp cache works the same way (this batch's stamps on top of the committed ones).
``DeliveryState`` is the state machine's own (it rolls that back itself on an abort), and so
is the dropped-dead-letters counter (a metric since start, not replicated state).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fluxmq.core import keys
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.delivery import DeliveryState, GroupState
from fluxmq.core.errors import queue_not_found
from storage.api import PartitionLog, WriteTxn


@dataclass(slots=True)
class ApplyCounters:
    """Counters the state machine keeps across batches (not part of the replicated state)."""

    dead_letters_dropped: int = 0  # dead messages of queues without a DLQ (since start)


@dataclass(slots=True)
class ApplyContext:
    txn: WriteTxn
    delivery: DeliveryState
    committed_catalog: Mapping[str, QueueEntry]
    committed_node_addresses: Mapping[str, str]
    committed_last_ts: Mapping[int, int]
    counters: ApplyCounters
    # The copies this batch wrote (None: unchanged), published by the state machine only after
    # the commit.
    catalog: dict[str, QueueEntry] | None = None
    node_addresses: dict[str, str] | None = None
    last_ts: dict[int, int] = field(default_factory=dict)  # log id -> this batch's last stamp
    # The queues the current command appended to (cleared after each command): where its
    # apply may have made messages ready for checked-out consumers.
    grown: set[int] = field(default_factory=set)

    def stamped(self, log_id: int, timestamp_ms: int) -> None:
        """Records were appended to ``log_id``, the last stamped ``timestamp_ms``."""
        self.last_ts[log_id] = timestamp_ms
        self.grown.add(log_id >> keys.PARTITION_BITS)

    def cat(self) -> Mapping[str, QueueEntry]:
        """The catalog as this batch left it so far."""
        return self.catalog if self.catalog is not None else self.committed_catalog

    def cat_for_write(self) -> dict[str, QueueEntry]:
        if self.catalog is None:
            self.catalog = dict(self.committed_catalog)
        return self.catalog

    def node_addresses_for_write(self) -> dict[str, str]:
        if self.node_addresses is None:
            self.node_addresses = dict(self.committed_node_addresses)
        return self.node_addresses

    def entry(self, name: str, queue_id: int | None = None) -> QueueEntry:
        """The queue a command names; with ``queue_id``, only the incarnation the leader saw
        (a queue deleted and created again under the same name is another queue)."""
        entry = self.cat().get(name)
        if entry is None or (queue_id is not None and entry.queue_id != queue_id):
            raise queue_not_found(name)
        return entry

    def group(self, queue: str, queue_id: int, group: str) -> tuple[QueueEntry, GroupState]:
        entry = self.entry(queue, queue_id)
        return entry, self.delivery.get(entry.queue_id, queue, group)

    def last_timestamp(self, log: PartitionLog) -> int:
        """The timestamp of the log's last stored record (0 when it has none): a function of
        the stored state only, so a replica that restarted computes the same value."""
        wm = log.watermarks()
        if wm.high == wm.low:
            return 0
        ts = self.last_ts.get(log.log_id)
        if ts is None:
            ts = self.committed_last_ts.get(log.log_id)
        if ts is None:
            ts = log.read(wm.high - 1, 1, 1)[0].timestamp_ms
        return ts

    def consumed_floor(self, entry: QueueEntry, partition: int, high: int) -> int:
        """The smallest offset some group of the queue still needs (``high`` if none)."""
        floor = high
        for g in self.delivery.of_queue(entry.queue_id):
            part = g.parts.get(partition)
            floor = min(floor, part.committed if part is not None else 0)
        return floor
