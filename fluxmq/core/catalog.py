"""The queue catalog: every queue of a store by name, as the state machine keeps it in memory.

Below the state machine and the modules it uses (``dead_letters``), which all speak of catalog
entries; it imports none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys
from fluxmq.core.errors import queue_not_found
from fluxmq.core.queue_config import QueuePolicy, policy_of, validate_name
from storage.api import ReadTxn


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """A queue as the catalog holds it. Never mutated: an update replaces the entry."""

    queue: pb.Queue
    policy: QueuePolicy

    @property
    def name(self) -> str:
        return str(self.queue.config.name)

    @property
    def queue_id(self) -> int:
        return int(self.queue.queue_id)


def load_catalog(txn: ReadTxn) -> dict[str, QueueEntry]:
    catalog: dict[str, QueueEntry] = {}
    for _key, value in txn.scan(keys.QUEUE):
        queue = pb.Queue.FromString(value)
        catalog[queue.config.name] = QueueEntry(queue, policy_of(queue.config))
    return catalog


def find_entry(
    catalog: Mapping[str, QueueEntry], name: str, field_path: str = "queue"
) -> QueueEntry:
    """The queue a request names (a name that could not be a queue's is refused as such)."""
    entry = catalog.get(name)
    if entry is None:
        validate_name(name, field_path)
        raise queue_not_found(name)
    return entry


def same_environment(a: QueueEntry, b: QueueEntry) -> bool:
    return a.queue.config.environment == b.queue.config.environment


def dead_letter_entry(catalog: Mapping[str, QueueEntry], origin: QueueEntry) -> QueueEntry | None:
    """The DLQ of ``origin`` if it exists and is in the same environment (a queue of another
    environment never serves as one: its messages would cross environments)."""
    name = origin.policy.dead_letter_queue
    dlq = catalog.get(name) if name is not None else None
    return dlq if dlq is not None and same_environment(dlq, origin) else None
