"""What a node knows of its queues, consumer groups and calls, read the one way both the metrics
endpoint (the daemon's collectors) and ``GetClusterStatus`` (the admin service) read it.

The row builders read committed state (any thread: they take the state's lock and LMDB read
transactions); the counter and histogram readers read this process's ``fluxmq.metrics``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

from fluxmq import metrics
from fluxmq.core import keys
from fluxmq.core.errors import FluxError
from fluxmq.core.namespaces import scope_of_name
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.shard.runtime import ShardRuntime

# -- state rows (the metrics collectors' and the status's) ---------------------------------------


def hosted_queues(
    runtimes: Iterable[ShardRuntime], operators: str = "production"
) -> list[tuple[str, int, str]]:
    """-> (name, partitions, environment) of every queue of ``runtimes`` (the catalogs only: no
    LMDB read); the environment "" for the operators' (``operators``), else the name's scope,
    or for a queue made before namespaces its config's."""
    out = []
    for runtime in runtimes:
        for entry in list(runtime.state.catalog.values()):
            env = scope_of_name(entry.name) or str(entry.queue.config.environment)
            out.append((entry.name, entry.policy.partitions, "" if env == operators else env))
    return out


def partition_rows(
    state: QueueStateMachine, only: Collection[str] | None = None
) -> Iterator[tuple[str, int, int, int, int]]:
    """-> (queue, partition, low watermark, high watermark, stored bytes) of every partition
    (of the queues in ``only`` when given: the others are not read at all)."""
    with state.store.read() as txn:
        for entry in list(state.catalog.values()):
            if only is not None and entry.name not in only:
                continue
            for p in range(entry.policy.partitions):
                lg = txn.log(keys.log_id(entry.queue_id, p))
                wm = lg.watermarks()
                yield entry.name, p, wm.low, wm.high, lg.size_bytes()


def group_rows(
    runtime: ShardRuntime, only: Collection[str] | None = None
) -> Iterator[metrics.GroupRow]:
    """One row per consumer group of every queue (in ``only`` when given), summed over the
    partitions."""
    reader = runtime.reader
    for entry in list(runtime.state.catalog.values()):
        if only is not None and entry.name not in only:
            continue
        for meta in reader.groups(entry):
            try:
                parts = reader.group_partitions(entry, meta.name, runtime.now_ms())
            except FluxError:
                continue  # deleted meanwhile
            yield metrics.GroupRow(
                entry.name,
                meta.name,
                sum(p.lag for p in parts),
                sum(p.in_flight for p in parts),
                sum(p.scheduled for p in parts),
                sum(p.dead for p in parts),
                sum(p.filtered for p in parts),
                sum(p.skipped_by_retention for p in parts),
            )


def dead_letter_rows(
    runtime: ShardRuntime, only: Collection[str] | None = None
) -> Iterator[tuple[str, int, bool]]:
    """-> (queue, dead letters, alert raised) of every queue (in ``only`` when given) with a
    dead-letter queue."""
    for entry in list(runtime.state.catalog.values()):
        if entry.policy.dead_letter_queue is None or (only is not None and entry.name not in only):
            continue
        depth = runtime.reader.dead_letter_depth(entry)
        yield entry.name, depth, entry.name in runtime.dead_letters.alerts


@dataclass(slots=True)
class QueueRow:
    """One queue of a replication group, from its committed state."""

    name: str
    partitions: int = 0
    published: int = 0  # sum of high watermarks
    stored: int = 0  # sum of high - low
    stored_bytes: int = 0
    dead_letter_queue: str = ""
    dead_letters: int = 0
    alert: bool = False
    groups: list[metrics.GroupRow] = field(default_factory=list)


def queue_rows(runtime: ShardRuntime) -> list[QueueRow]:
    """Every queue of ``runtime``'s shard, by name, with its consumer groups and dead letters
    (built from the rows above, so they say what /metrics says)."""
    rows: dict[str, QueueRow] = {}

    def row(name: str) -> QueueRow:
        return rows.setdefault(name, QueueRow(name))

    for name, _p, low, high, nbytes in partition_rows(runtime.state):
        r = row(name)
        r.partitions += 1
        r.published += high
        r.stored += high - low
        r.stored_bytes += nbytes
    for g in group_rows(runtime):
        row(g.queue).groups.append(g)
    for name, depth, raised in dead_letter_rows(runtime):
        r = row(name)
        r.dead_letters, r.alert = depth, raised
    for entry in list(runtime.state.catalog.values()):
        if entry.name in rows and entry.policy.dead_letter_queue is not None:
            rows[entry.name].dead_letter_queue = entry.policy.dead_letter_queue
    for r in rows.values():
        r.groups.sort(key=lambda g: g.group)
    return [rows[k] for k in sorted(rows)]


# -- this process's counters --------------------------------------------------------------------

QUEUE_COUNTERS: tuple[tuple[str, metrics.QueueCounter], ...] = (
    ("published_messages", metrics.PUBLISHED_MESSAGES),
    ("published_bytes", metrics.PUBLISHED_BYTES),
    ("delivered_messages", metrics.LEASED_MESSAGES),
    ("delivered_bytes", metrics.DELIVERED_BYTES),
    ("redelivered_messages", metrics.REDELIVERED_MESSAGES),
    ("acked_messages", metrics.ACKED_MESSAGES),
    ("nacked_messages", metrics.NACKED_MESSAGES),
)


def queue_counters(queues: Iterable[str]) -> dict[str, dict[str, int]]:
    """-> queue -> counter name (QUEUE_COUNTERS) -> value, for the ``queues`` given that this
    process counted anything for."""
    wanted = set(queues)
    out: dict[str, dict[str, int]] = {}
    for name, counter in QUEUE_COUNTERS:
        for queue, value in counter.values().items():
            if queue in wanted:
                out.setdefault(queue, {})[name] = int(value)
    return out


@dataclass(slots=True)
class RpcRow:
    method: str
    calls: int
    errors_by_code: dict[str, int]
    p50_s: float
    p99_s: float
    seconds_sum: float


def quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """The ``q`` quantile of a histogram given as (upper bound, cumulative count), sorted by
    bound and ending at +Inf: linear within the bucket it falls in, the highest finite bound
    when it falls in +Inf, 0 without observations (PromQL's histogram_quantile).

    >>> quantile(0.5, [(1.0, 0), (2.0, 10), (math.inf, 10)])
    1.5
    >>> quantile(0.99, [(1.0, 5), (math.inf, 10)])
    1.0
    """
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return 0.0
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def rpc_rows() -> list[RpcRow]:
    """Per method, every status code together: calls, errors by code, latency quantiles."""
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    sums: dict[str, float] = defaultdict(float)
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for family in metrics.RPC_DURATION.collect():
        for s in family.samples:
            method, code = s.labels.get("method", ""), s.labels.get("code", "")
            if s.name.endswith("_bucket"):
                buckets[method][float(s.labels["le"])] += s.value
            elif s.name.endswith("_count"):
                counts[method][code] = int(s.value)
            elif s.name.endswith("_sum"):
                sums[method] += s.value
    out = []
    for method in sorted(counts):
        cumulative = sorted(buckets[method].items())
        out.append(
            RpcRow(
                method=method,
                calls=sum(counts[method].values()),
                errors_by_code={c: n for c, n in counts[method].items() if c != "OK" and n},
                p50_s=quantile(0.5, cumulative),
                p99_s=quantile(0.99, cumulative),
                seconds_sum=sums[method],
            )
        )
    return out


def readiness() -> str:
    """ "ready" / "not_ready" as the node's readiness gauge (fluxmq_node_ready, what /readyz
    answers) says; "" when the node publishes none (metrics_listen off)."""
    for family in metrics.REGISTRY.restricted_registry(["fluxmq_node_ready"]).collect():
        for s in family.samples:
            if s.name == "fluxmq_node_ready":
                return "ready" if s.value else "not_ready"
    return ""
