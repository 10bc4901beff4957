"""Every Prometheus metric of a node, declared in one place. Names are ``fluxmq_*`` with the unit
last; label sets are bounded (queue names are bounded by the queue limit, partitions by 1024, RPC
methods and codes by the API)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)

RPC_DURATION = Histogram(
    "fluxmq_rpc_duration_seconds",
    "Server-side duration of gRPC calls by method and status code.",
    ["method", "code"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
PUBLISHED_MESSAGES = Counter(
    "fluxmq_published_messages",
    "Messages durably appended (duplicates excluded).",
    ["queue"],
    registry=REGISTRY,
)
PUBLISHED_BYTES = Counter(
    "fluxmq_published_bytes",
    "Payload bytes (key + value + headers) durably appended.",
    ["queue"],
    registry=REGISTRY,
)
DUPLICATE_MESSAGES = Counter(
    "fluxmq_duplicate_messages",
    "Published messages recognised as duplicates by idempotency key (nothing written).",
    ["queue"],
    registry=REGISTRY,
)
FETCHED_MESSAGES = Counter(
    "fluxmq_fetched_messages",
    "Records returned by Fetch and Tail.",
    ["queue"],
    registry=REGISTRY,
)
FETCHED_BYTES = Counter(
    "fluxmq_fetched_bytes",
    "Record value bytes returned by Fetch and Tail.",
    ["queue"],
    registry=REGISTRY,
)
RETENTION_REMOVED_MESSAGES = Counter(
    "fluxmq_retention_removed_messages",
    "Records removed by retention (age, count or bytes).",
    registry=REGISTRY,
)
LEASED_MESSAGES = Counter(
    "fluxmq_leased_messages",
    "Messages leased to consumers (Lease and Consume), redeliveries included.",
    ["queue"],
    registry=REGISTRY,
)
ACKED_MESSAGES = Counter(
    "fluxmq_acked_messages", "Receipts acked (ACKED status).", ["queue"], registry=REGISTRY
)
NACKED_MESSAGES = Counter(
    "fluxmq_nacked_messages",
    "Receipts nacked for a later retry (NACKED status).",
    ["queue"],
    registry=REGISTRY,
)
EXPIRED_LEASES = Counter(
    "fluxmq_expired_leases",
    "Leases that passed their deadline unsettled (redelivered or dead-lettered).",
    registry=REGISTRY,
)
GROUP_JOINS = Counter(
    "fluxmq_group_joins",
    "JoinGroup requests applied (each one rebalances its group).",
    ["queue"],
    registry=REGISTRY,
)
EXPIRED_MEMBERS = Counter(
    "fluxmq_expired_members",
    "Consumer-group members removed because their session lapsed (no heartbeat in time).",
    registry=REGISTRY,
)


class GroupRow(NamedTuple):
    queue: str
    group: str
    lag: int
    in_flight: int
    scheduled: int
    dead: int
    filtered: int
    skipped_by_retention: int


class DeliveryCollector(Collector):  # type: ignore[misc]
    """Consumer-group and dead-letter gauges, read from committed state at scrape time."""

    def __init__(
        self,
        groups: Callable[[], Iterable[GroupRow]],
        dead_letters: Callable[[], Iterable[tuple[str, int, bool]]],
        dropped: Callable[[], int],
    ) -> None:
        self._groups = groups
        self._dead_letters = dead_letters  # -> (queue, depth, alert raised)
        self._dropped = dropped

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["queue", "group"]
        lag = GaugeMetricFamily(
            "fluxmq_group_lag_messages",
            "Messages of the queue the group is not done with (high watermark - committed).",
            labels=labels,
        )
        in_flight = GaugeMetricFamily(
            "fluxmq_group_in_flight_messages", "Messages leased and not settled.", labels=labels
        )
        scheduled = GaugeMetricFamily(
            "fluxmq_group_scheduled_messages",
            "Retries and delayed messages waiting for their due time.",
            labels=labels,
        )
        dead = CounterMetricFamily(
            "fluxmq_group_dead_lettered_messages",
            "Messages the group dead-lettered (max attempts, TTL, nack dead).",
            labels=labels,
        )
        filtered = CounterMetricFamily(
            "fluxmq_group_filtered_messages",
            "Messages skipped by the group's filter.",
            labels=labels,
        )
        skipped = CounterMetricFamily(
            "fluxmq_group_skipped_by_retention_messages",
            "Messages removed by retention before the group consumed them.",
            labels=labels,
        )
        for row in self._groups():
            key = [row.queue, row.group]
            lag.add_metric(key, row.lag)
            in_flight.add_metric(key, row.in_flight)
            scheduled.add_metric(key, row.scheduled)
            dead.add_metric(key, row.dead)
            filtered.add_metric(key, row.filtered)
            skipped.add_metric(key, row.skipped_by_retention)
        depth = GaugeMetricFamily(
            "fluxmq_dead_letter_messages",
            "Dead letters of the queue not yet replayed or purged.",
            labels=["queue"],
        )
        alert = GaugeMetricFamily(
            "fluxmq_dead_letter_alert",
            "1 while the queue's dead letters exceed its dead_letter_alert_threshold.",
            labels=["queue"],
        )
        for queue, count, raised in self._dead_letters():
            depth.add_metric([queue], count)
            alert.add_metric([queue], 1 if raised else 0)
        dropped = CounterMetricFamily(
            "fluxmq_dead_letters_dropped_messages",
            "Dead messages of queues without a dead-letter queue (dropped), since start.",
        )
        dropped.add_metric([], self._dropped())
        return [lag, in_flight, scheduled, dead, filtered, skipped, depth, alert, dropped]


class StateCollector(Collector):  # type: ignore[misc]
    """Gauges read from committed state at scrape time, so the hot path never updates them."""

    def __init__(
        self,
        partitions: Callable[[], Iterable[tuple[str, int, int, int, int]]],
        storage: Callable[[], tuple[int, int]],
        apply: Callable[[], tuple[int, int]],
    ) -> None:
        self._partitions = partitions  # -> (queue, partition, low, high, bytes)
        self._storage = storage  # -> (file bytes, used bytes)
        self._apply = apply  # -> (write transactions, commands applied)

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        high = GaugeMetricFamily(
            "fluxmq_partition_high_watermark",
            "Next offset to be written in the partition.",
            labels=["queue", "partition"],
        )
        low = GaugeMetricFamily(
            "fluxmq_partition_low_watermark",
            "First offset still stored in the partition (moves up with retention and purge).",
            labels=["queue", "partition"],
        )
        size = GaugeMetricFamily(
            "fluxmq_partition_stored_bytes",
            "Encoded bytes of the records stored in the partition.",
            labels=["queue", "partition"],
        )
        for queue, partition, lo, hi, nbytes in self._partitions():
            labels = [queue, str(partition)]
            high.add_metric(labels, hi)
            low.add_metric(labels, lo)
            size.add_metric(labels, nbytes)
        file_bytes, used_bytes = self._storage()
        storage_file = GaugeMetricFamily(
            "fluxmq_storage_file_bytes", "Size of the node's LMDB data file on disk."
        )
        storage_file.add_metric([], file_bytes)
        storage_used = GaugeMetricFamily(
            "fluxmq_storage_used_bytes", "Bytes of LMDB pages in use (freed pages are reused)."
        )
        storage_used.add_metric([], used_bytes)
        transactions, commands = self._apply()
        txns = CounterMetricFamily(
            "fluxmq_apply_transactions",
            "Write transactions (one fsync each) that applied commands; commands / transactions "
            "is the group-commit factor.",
        )
        txns.add_metric([], transactions)
        cmds = CounterMetricFamily("fluxmq_applied_commands", "Commands applied.")
        cmds.add_metric([], commands)
        return [high, low, size, storage_file, storage_used, txns, cmds]
