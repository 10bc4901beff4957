"""Every Prometheus metric of a node, declared in one place. Names are ``fluxmq_*`` with the unit
last; label sets are bounded: RPC methods and codes by the API, shards by placement, and queues
and partitions by ``SeriesLimits`` (any admin can create a thousand queues of 1,024 partitions;
unbounded, that is millions of series and a scrape that takes a core for a minute). Series of
queues and partitions are built from current state at scrape time, so a deleted queue's series
disappear with it."""

from __future__ import annotations

import importlib.metadata
import platform
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from fluxmq.core.namespaces import scope_of_name

if TYPE_CHECKING:
    from fluxmq.core.delivery import Delivery
    from raft import ShardStatus

# No `<name>_created` series beside every counter and histogram: they double the series a
# scrape carries and nothing reads them (a restart shows in the counters' resets).
disable_created_metrics()
REGISTRY = CollectorRegistry(auto_describe=True)
# Disk latencies: an fsync on a good SSD takes ~0.1-2 ms, on a noisy cloud disk up to 100s of ms.
FSYNC_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
)  # fmt: skip
STAGE_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128,
    0.256, 0.512, 1.024,
)  # fmt: skip


@dataclass(slots=True)
class SeriesLimits:
    """How many queues and partitions of a node /metrics names (``metrics_queue_series_max``,
    ``metrics_partition_series_max``). Each partition is 3 series, each queue about a dozen."""

    partitions_max: int = 4096
    queues_max: int = 1000
    # Environments besides the operators' whose queue names /metrics shows
    # (``metrics_named_environments``). /metrics takes no key: anyone who reaches the port
    # reads it, so another environment's names are opt-in.
    named_environments: frozenset[str] = frozenset()


LIMITS = SeriesLimits()


def set_series_limits(
    partitions_max: int, queues_max: int, named_environments: Iterable[str] = ()
) -> None:
    """Set by the daemon from its configuration, before the first scrape."""
    LIMITS.partitions_max = partitions_max
    LIMITS.queues_max = queues_max
    LIMITS.named_environments = frozenset(named_environments)


# (stored name, partitions) or (stored name, partitions, environment: "" for the operators').
HostedQueue = tuple[str, int] | tuple[str, int, str]


@dataclass(frozen=True, slots=True)
class SeriesPlan:
    """Which queues one scrape names, and what it folds.

    Queues are named by name order up to ``queues_max``. Of those, per-partition series go to
    the queues with the fewest partitions first, whole queues only, up to ``partitions_max``
    partitions: one queue of 1,024 partitions cannot push every small queue out."""

    queues: frozenset[str]  # named in queue-labelled series
    partition_queues: frozenset[str]  # also given per-partition series
    folded_queues: int  # queues named in no series, over queues_max
    folded_partitions: int  # partitions without per-partition series
    unnamed_queues: int = 0  # queues of environments whose names /metrics does not show


def plan_series(queues: Iterable[HostedQueue], limits: SeriesLimits = LIMITS) -> SeriesPlan:
    """``queues``: (stored name, partitions[, environment]) of every queue the node hosts, the
    environment "" for the operators' (default: the name's scope). Queues of an environment not
    in ``named_environments`` are named in no series.

    >>> limits = SeriesLimits(partitions_max=3, queues_max=2)
    >>> p = plan_series([("a", 4), ("b", 2), ("c", 1), ("staging:s", 1)], limits)
    >>> sorted(p.queues), sorted(p.partition_queues), p.folded_queues, p.folded_partitions
    (['a', 'b'], ['b'], 1, 6)
    >>> p.unnamed_queues
    1
    """
    every = sorted((q[0], q[1]) for q in queues)
    scopes = {q[0]: (q[2] if len(q) > 2 else scope_of_name(q[0])) for q in queues}  # type: ignore[misc]
    ordered = [q for q in every if not scopes[q[0]] or scopes[q[0]] in limits.named_environments]
    named = ordered[: limits.queues_max]
    budget = limits.partitions_max
    with_partitions: list[str] = []
    for name, partitions in sorted(named, key=lambda q: (q[1], q[0])):
        if partitions > budget:
            break  # sorted by size: no later queue fits either
        budget -= partitions
        with_partitions.append(name)
    total = sum(partitions for _name, partitions in every)
    exported = limits.partitions_max - budget
    return SeriesPlan(
        queues=frozenset(name for name, _p in named),
        partition_queues=frozenset(with_partitions),
        folded_queues=len(ordered) - len(named),
        folded_partitions=total - exported,
        unnamed_queues=len(every) - len(ordered),
    )


class _QueueCounterChild:
    __slots__ = ("_counter", "_queue")

    def __init__(self, counter: QueueCounter, queue: str) -> None:
        self._counter = counter
        self._queue = queue

    def inc(self, amount: float = 1) -> None:
        self._counter.inc(self._queue, amount)


class QueueCounter:
    """A counter by queue whose series live only as long as their queue: ``QueueCollector``
    exports the queues a ``SeriesPlan`` names and forgets the queues the node no longer hosts
    (a ``prometheus_client.Counter`` keeps a child per label value forever). Same call shape as
    a labelled Counter: ``COUNTER.labels(queue).inc(n)``."""

    # Values kept before a queue the node no longer hosts is forgotten without waiting for a
    # scrape (a node whose /metrics nobody reads still must not grow with every queue created).
    PRUNE_AT = 20_000

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self._values: dict[str, float] = {}
        self._lock = threading.Lock()
        self.hosted: Callable[[], Collection[str]] | None = None

    def labels(self, queue: str) -> _QueueCounterChild:
        return _QueueCounterChild(self, queue)

    def inc(self, queue: str, amount: float = 1) -> None:
        with self._lock:
            if queue not in self._values and len(self._values) >= self.PRUNE_AT:
                self._prune_locked()
            self._values[queue] = self._values.get(queue, 0) + amount

    def values(self) -> dict[str, float]:
        with self._lock:
            return dict(self._values)

    def forget_except(self, hosted: Collection[str]) -> None:
        with self._lock:
            for queue in [q for q in self._values if q not in hosted]:
                del self._values[queue]

    def _prune_locked(self) -> None:
        if self.hosted is None:
            return
        hosted = self.hosted()
        for queue in [q for q in self._values if q not in hosted]:
            del self._values[queue]


RPC_DURATION = Histogram(
    "fluxmq_rpc_duration_seconds",
    "Server-side duration of gRPC calls by method and status code.",
    ["method", "code"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
PUBLISHED_MESSAGES = QueueCounter(
    "fluxmq_published_messages",
    "Messages durably appended (duplicates excluded).",
)
PUBLISHED_BYTES = QueueCounter(
    "fluxmq_published_bytes",
    "Payload bytes (key + value + headers) durably appended.",
)
DUPLICATE_MESSAGES = QueueCounter(
    "fluxmq_duplicate_messages",
    "Published messages recognised as duplicates by idempotency key (nothing written).",
)
FETCHED_MESSAGES = QueueCounter(
    "fluxmq_fetched_messages",
    "Records returned by Fetch and Tail.",
)
FETCHED_BYTES = QueueCounter(
    "fluxmq_fetched_bytes",
    "Record value bytes returned by Fetch and Tail.",
)
RETENTION_REMOVED_MESSAGES = Counter(
    "fluxmq_retention_removed_messages",
    "Records removed by retention (age, count or bytes).",
    registry=REGISTRY,
)
LEASED_MESSAGES = QueueCounter(
    "fluxmq_leased_messages",
    "Messages leased to consumers (Lease and Consume), redeliveries included.",
)
ACKED_MESSAGES = QueueCounter(
    "fluxmq_acked_messages",
    "Receipts acked (ACKED status).",
)
NACKED_MESSAGES = QueueCounter(
    "fluxmq_nacked_messages",
    "Receipts nacked for a later retry (NACKED status).",
)
DELIVERED_BYTES = QueueCounter(
    "fluxmq_delivered_bytes",
    "Payload bytes (key + value) of messages leased to consumers, redeliveries included.",
)
REDELIVERED_MESSAGES = QueueCounter(
    "fluxmq_redelivered_messages",
    "Messages leased again after an earlier attempt (nack, lease expiry, consumer loss).",
)
EXPIRED_LEASES = Counter(
    "fluxmq_expired_leases",
    "Leases that passed their deadline unsettled (redelivered or dead-lettered).",
    registry=REGISTRY,
)
JOURNAL_FLUSH = Histogram(
    "fluxmq_raft_journal_fsync_seconds",
    "Raft journal flushes: one append and fdatasync for every change pending.",
    ["shard"],
    buckets=FSYNC_BUCKETS_S,
    registry=REGISTRY,
)
RAFT_STAGE = Histogram(
    "fluxmq_raft_stage_seconds",
    "The latency budget of replicated writes on the leader: seconds from the previous stage to "
    "this one, for sampled proposals (raft/stages.py lists the stages in order).",
    ["stage"],
    buckets=STAGE_BUCKETS_S,
    registry=REGISTRY,
)
APPLY_COMMIT = Histogram(
    "fluxmq_apply_commit_seconds",
    "Commits (with fsync) of the state store's write transactions that apply commands.",
    ["shard"],
    buckets=FSYNC_BUCKETS_S,
    registry=REGISTRY,
)
SNAPSHOT_DURATION = Histogram(
    "fluxmq_raft_snapshot_duration_seconds",
    "Raft snapshots written (kind=write, log compaction) or installed from the leader "
    "(kind=install).",
    ["shard", "kind"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
    registry=REGISTRY,
)
SNAPSHOT_BYTES = Gauge(
    "fluxmq_raft_snapshot_bytes",
    "Size of the last snapshot file written or installed.",
    ["shard"],
    registry=REGISTRY,
)


BUILD_INFO = Gauge(
    "fluxmq_build_info",
    "Always 1; the labels say what runs: FluxMQ's version and its Python, gRPC and pysyncobj",
    ["version", "python", "grpc", "pysyncobj"],
    registry=REGISTRY,
)


def package_version(name: str = "fluxmq") -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


BUILD_INFO.labels(
    package_version(),
    platform.python_version(),
    package_version("grpcio"),
    package_version("pysyncobj"),
).set(1)

PLACEMENT_CONTROLLER = Gauge(
    "fluxmq_placement_controller",
    "1 while this node holds the placement controller role (one node of the cluster at a time).",
    registry=REGISTRY,
)
UNDER_REPLICATED_GROUPS = Gauge(
    "fluxmq_under_replicated_groups",
    "Replication groups with a member that is not live, as the placement controller last saw "
    "them (0 on nodes that are not the controller).",
    registry=REGISTRY,
)
PLACEMENT_MOVES = Counter(
    "fluxmq_placement_moves",
    "Replicas the placement controller moved, by reason (dead_node: a member missing longer "
    "than node_dead_after_ms).",
    ["reason"],
    registry=REGISTRY,
)


def observe_raft_stage(stage: str, seconds: float) -> None:
    RAFT_STAGE.labels(stage).observe(seconds)


def observe_deliveries(queue: str, deliveries: Sequence[Delivery]) -> None:
    LEASED_MESSAGES.labels(queue).inc(len(deliveries))
    DELIVERED_BYTES.labels(queue).inc(
        sum(len(d.record.value) + len(d.record.key or b"") for d in deliveries)
    )
    again = sum(1 for d in deliveries if d.attempt > 1)
    if again:
        REDELIVERED_MESSAGES.labels(queue).inc(again)


def observe_snapshot(shard: str, kind: str, size_bytes: int, seconds: float) -> None:
    SNAPSHOT_DURATION.labels(shard, kind).observe(seconds)
    SNAPSHOT_BYTES.labels(shard).set(size_bytes)


GROUP_JOINS = QueueCounter(
    "fluxmq_group_joins",
    "JoinGroup requests applied (each one rebalances its group).",
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


QUEUE_COUNTERS: tuple[QueueCounter, ...] = (
    PUBLISHED_MESSAGES,
    PUBLISHED_BYTES,
    DUPLICATE_MESSAGES,
    FETCHED_MESSAGES,
    FETCHED_BYTES,
    LEASED_MESSAGES,
    ACKED_MESSAGES,
    NACKED_MESSAGES,
    DELIVERED_BYTES,
    REDELIVERED_MESSAGES,
    GROUP_JOINS,
)

# (name, partitions) of every queue the node hosts: what a SeriesPlan is made from.
HostedQueues = Callable[[], Iterable[HostedQueue]]


class QueueCollector(Collector):  # type: ignore[misc]
    """The per-queue counters (``QUEUE_COUNTERS``) of the queues a scrape names, and how many
    queues and partitions the scrape folds. Forgets the counts of queues no longer hosted."""

    def __init__(
        self, hosted: HostedQueues, counters: Sequence[QueueCounter] = QUEUE_COUNTERS
    ) -> None:
        self._hosted = hosted
        self._counters = tuple(counters)
        for counter in self._counters:
            counter.hosted = lambda: {q[0] for q in hosted()}

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        queues = list(self._hosted())
        plan = plan_series(queues)
        names = {q[0] for q in queues}
        out: list[GaugeMetricFamily | CounterMetricFamily] = []
        for counter in self._counters:
            counter.forget_except(names)
            family = CounterMetricFamily(counter.name, counter.documentation, labels=["queue"])
            for queue, value in sorted(counter.values().items()):
                if queue in plan.queues:
                    family.add_metric([queue], value)
            out.append(family)
        folded = GaugeMetricFamily(
            "fluxmq_metrics_series_folded",
            "Queues (kind=queue) named in no series and partitions (kind=partition) without "
            "per-partition series in this scrape, over metrics_queue_series_max and "
            "metrics_partition_series_max; queues of environments whose names are not shown "
            "(kind=environment, see metrics_named_environments).",
            labels=["kind"],
        )
        folded.add_metric(["queue"], plan.folded_queues)
        folded.add_metric(["partition"], plan.folded_partitions)
        folded.add_metric(["environment"], plan.unnamed_queues)
        out.append(folded)
        return out


class DeliveryCollector(Collector):  # type: ignore[misc]
    """Consumer-group and dead-letter gauges, read from committed state at scrape time, of the
    queues the scrape's ``SeriesPlan`` names (the row callables read only those)."""

    def __init__(
        self,
        groups: Callable[[Collection[str]], Iterable[GroupRow]],
        dead_letters: Callable[[Collection[str]], Iterable[tuple[str, int, bool]]],
        dropped: Callable[[], int],
        hosted: HostedQueues,
    ) -> None:
        self._groups = groups
        self._dead_letters = dead_letters  # -> (queue, depth, alert raised)
        self._dropped = dropped
        self._hosted = hosted

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        named = plan_series(self._hosted()).queues
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
        for row in self._groups(named):
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
        for queue, count, raised in self._dead_letters(named):
            depth.add_metric([queue], count)
            alert.add_metric([queue], 1 if raised else 0)
        dropped = CounterMetricFamily(
            "fluxmq_dead_letters_dropped_messages",
            "Dead messages of queues without a dead-letter queue (dropped), since start.",
        )
        dropped.add_metric([], self._dropped())
        return [lag, in_flight, scheduled, dead, filtered, skipped, depth, alert, dropped]


class StateCollector(Collector):  # type: ignore[misc]
    """Gauges read from committed state at scrape time, so the hot path never updates them.
    Per-partition series only for the partitions the scrape's ``SeriesPlan`` allows."""

    def __init__(
        self,
        partitions: Callable[[Collection[str]], Iterable[tuple[str, int, int, int, int]]],
        storage: Callable[[], tuple[int, int]],
        apply: Callable[[], tuple[int, int]],
        hosted: HostedQueues,
    ) -> None:
        self._partitions = partitions  # (queues wanted) -> (queue, partition, low, high, bytes)
        self._storage = storage  # -> (file bytes, used bytes)
        self._apply = apply  # -> (write transactions, commands applied)
        self._hosted = hosted

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
        wanted = plan_series(self._hosted()).partition_queues
        for queue, partition, lo, hi, nbytes in self._partitions(wanted):
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


class ShardCollector(Collector):  # type: ignore[misc]
    """Raft health of every shard the node hosts, from each shard's published status."""

    def __init__(self, shards: Callable[[], Iterable[ShardStatus]]) -> None:
        self._shards = shards

    def collect(self) -> Iterable[GaugeMetricFamily]:
        def family(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["shard"])

        is_leader = family("fluxmq_shard_is_leader", "1 while this replica leads the shard.")
        has_leader = family(
            "fluxmq_shard_has_leader", "1 while this replica knows a leader of the shard."
        )
        term = family("fluxmq_shard_term", "Raft term this replica is in.")
        commit = family("fluxmq_shard_commit_index", "Highest log index known committed.")
        applied = family("fluxmq_shard_applied_index", "Highest log index applied here.")
        lag = family(
            "fluxmq_shard_apply_lag_entries", "Committed entries not yet applied on this replica."
        )
        in_flight = family(
            "fluxmq_shard_proposals_in_flight",
            "Proposals waiting for the log or for a majority on this replica.",
        )
        in_sync = family(
            "fluxmq_shard_in_sync_replicas",
            "Replicas connected and caught up (this one included), as this replica sees them.",
        )
        replicas = family("fluxmq_shard_replicas", "Members of the shard.")
        probation = family(
            "fluxmq_shard_on_probation",
            "1 while this replica, started without its Raft state (a lost disk or a new "
            "replica), neither votes nor campaigns until it holds what the leader committed.",
        )
        for st in self._shards():
            key = [st.shard_id]
            is_leader.add_metric(key, 1 if st.role == "leader" else 0)
            has_leader.add_metric(key, 0 if st.leader is None else 1)
            term.add_metric(key, st.term)
            commit.add_metric(key, st.commit_index)
            applied.add_metric(key, st.applied_index)
            lag.add_metric(key, max(0, st.commit_index - st.applied_index))
            in_flight.add_metric(key, st.pending_proposals)
            in_sync.add_metric(key, st.in_sync)
            replicas.add_metric(key, len(st.members))
            probation.add_metric(key, 1 if st.on_probation else 0)
        return [
            is_leader,
            has_leader,
            term,
            commit,
            applied,
            lag,
            in_flight,
            in_sync,
            replicas,
            probation,
        ]


class NodeCollector(Collector):  # type: ignore[misc]
    """Readiness and the etcd session, as the readiness routine last saw them."""

    def __init__(self, ready: Callable[[], bool], etcd_session_up: Callable[[], bool]) -> None:
        self._ready = ready
        self._etcd = etcd_session_up

    def collect(self) -> Iterable[GaugeMetricFamily]:
        ready = GaugeMetricFamily(
            "fluxmq_node_ready", "1 while /readyz answers 200 (serving, shards led and caught up)."
        )
        ready.add_metric([], 1 if self._ready() else 0)
        etcd = GaugeMetricFamily(
            "fluxmq_etcd_session_up",
            "1 while the node's etcd registration (its leased session) is alive; 0 without etcd.",
        )
        etcd.add_metric([], 1 if self._etcd() else 0)
        return [ready, etcd]
