"""Every Prometheus metric of a node, declared in one place. Names are ``fluxmq_*`` with the unit
last; label sets are bounded (queue names are bounded by the queue limit, partitions by 1024, RPC
methods and codes by the API)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

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


class StateCollector(Collector):
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
