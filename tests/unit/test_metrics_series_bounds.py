"""The bounded parts of fluxmq.metrics and the /metrics exposition, without a node."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from fluxmq import metrics
from fluxmq.server.health import Exposition


def test_per_queue_counters_forget_queues_no_longer_hosted_without_a_scrape() -> None:
    counter = metrics.QueueCounter("fluxmq_test_messages", "test")
    hosted: set[str] = {"kept"}
    counter.hosted = lambda: hosted
    counter.labels("kept").inc(2)
    for i in range(metrics.QueueCounter.PRUNE_AT * 2):
        counter.labels(f"gone-{i}").inc()  # queues created and deleted, nobody scraping
    values = counter.values()
    assert len(values) <= metrics.QueueCounter.PRUNE_AT
    assert values["kept"] == 2


def test_the_queue_collector_exports_only_named_hosted_queues() -> None:
    counter = metrics.QueueCounter("fluxmq_test_messages", "test")
    hosted = [("a", 1), ("b", 1), ("c", 1)]
    collector = metrics.QueueCollector(lambda: hosted, counters=[counter])
    for queue in ("a", "b", "c", "deleted"):
        counter.labels(queue).inc()
    limits = metrics.LIMITS
    saved = (limits.partitions_max, limits.queues_max)
    metrics.set_series_limits(10, 2)
    try:
        families = {f.name: f for f in collector.collect()}
    finally:
        metrics.set_series_limits(*saved)
    exported = {s.labels["queue"] for s in families["fluxmq_test_messages"].samples}
    assert exported == {"a", "b"}
    assert "deleted" not in counter.values()  # forgotten, not merely hidden
    folded = {s.labels["kind"]: s.value for s in families["fluxmq_metrics_series_folded"].samples}
    assert folded == {"queue": 1, "partition": 1, "environment": 0}


def test_metrics_name_no_queue_of_another_environment_unless_it_is_opted_in() -> None:
    counter = metrics.QueueCounter("fluxmq_test_env_messages", "test")
    hosted = [("orders", 1), ("staging:orders", 2), ("development:payroll", 1)]
    collector = metrics.QueueCollector(lambda: hosted, counters=[counter])
    for queue, _partitions in hosted:
        counter.labels(queue).inc()
    limits = metrics.LIMITS
    saved = (limits.partitions_max, limits.queues_max, limits.named_environments)

    def scrape(*named: str) -> tuple[set[str], dict[str, float]]:
        metrics.set_series_limits(100, 100, named)
        try:
            families = {f.name: f for f in collector.collect()}
        finally:
            metrics.set_series_limits(*saved)
        samples = families["fluxmq_metrics_series_folded"].samples
        return (
            {s.labels["queue"] for s in families["fluxmq_test_env_messages"].samples},
            {s.labels["kind"]: s.value for s in samples},
        )

    exported, folded = scrape()
    assert exported == {"orders"}  # the operators' queue only: no other environment's name
    assert folded == {"queue": 0, "partition": 3, "environment": 2}
    exported, folded = scrape("staging")
    assert exported == {"orders", "staging:orders"}
    assert folded["environment"] == 1


def test_a_huge_queue_does_not_push_small_queues_out_of_partition_series() -> None:
    plan = metrics.plan_series(
        [("aaa-huge", 1024), ("small-1", 4), ("small-2", 4)],
        metrics.SeriesLimits(partitions_max=100, queues_max=10),
    )
    assert plan.partition_queues == {"small-1", "small-2"}
    assert plan.folded_partitions == 1024 and plan.folded_queues == 0


class _SlowCollector:
    """Blocks its first collect until released, counting collects."""

    def __init__(self) -> None:
        self.collects = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def collect(self) -> Iterable[GaugeMetricFamily]:
        self.collects += 1
        self.entered.set()
        assert self.release.wait(10)
        gauge = GaugeMetricFamily("fluxmq_test_gauge", "test")
        gauge.add_metric([], 1)
        return [gauge]


def test_concurrent_scrapes_share_one_rendering() -> None:
    registry = CollectorRegistry(auto_describe=False)
    slow = _SlowCollector()
    registry.register(slow)
    exposition = Exposition(registry)
    bodies: list[bytes] = []
    first = threading.Thread(target=lambda: bodies.append(exposition.render("")[0]))
    first.start()
    assert slow.entered.wait(10)
    others = [
        threading.Thread(target=lambda: bodies.append(exposition.render("")[0])) for _ in range(5)
    ]
    for t in others:
        t.start()
    deadline = time.monotonic() + 10
    while exposition.joined < len(others) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exposition.joined == len(others)  # waiting on the running rendering
    slow.release.set()
    for t in [first, *others]:
        t.join(10)
    assert len(bodies) == 6 and len(set(bodies)) == 1
    assert b"fluxmq_test_gauge 1.0" in bodies[0]
    assert slow.collects == 1 and exposition.renderings == 1
    exposition.render("")  # a later scrape renders afresh
    assert slow.collects == 2
