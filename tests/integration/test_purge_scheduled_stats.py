"""What GetQueueStats, DescribeGroup and the metrics call ``scheduled`` after a purge of one
scope: only messages that are not due yet. A purge of the delayed messages walks past the ready
ones (they stay pending for the group); they are ready, not scheduled."""

from __future__ import annotations

import re

from fluxmq._pb.v1 import queue_pb2 as pb

from .conftest import Node
from .delivery_helpers import Stub, describe, group, lease, publish, scrape, total, work_queue

READY = 10
DELAYED = 20
DELAY_MS = 600_000


def setup(stub: Stub, queue: str) -> None:
    work_queue(stub, queue, partitions=2)
    group(stub, queue)
    publish(stub, queue, *[b"ready-%d" % i for i in range(READY)])
    publish(stub, queue, *[b"later-%d" % i for i in range(DELAYED)], delay_ms=DELAY_MS)


def scheduled_stat(stub: Stub, queue: str) -> int:
    (g,) = stub.GetQueueStats(pb.GetQueueStatsRequest(name=queue)).groups
    return g.scheduled


def scheduled_metric(node: Node, queue: str) -> float:
    pattern = rf'^fluxmq_group_scheduled_messages{{[^}}]*queue="{re.escape(queue)}"[^}}]*}} (\S+)$'
    (value,) = re.findall(pattern, scrape(node), re.MULTILINE)
    return float(value)


def test_purging_scheduled_messages_leaves_no_scheduled_count(node: Node, stub: Stub) -> None:
    setup(stub, "sched")
    resp = stub.PurgeQueue(pb.PurgeQueueRequest(name="sched", scope=pb.PURGE_SCOPE_SCHEDULED))
    assert resp.skipped_deliveries == DELAYED
    assert scheduled_stat(stub, "sched") == 0
    assert total(describe(stub, "sched"), "scheduled") == 0
    assert scheduled_metric(node, "sched") == 0
    # Delivery agrees: the ready messages are all there, the delayed ones gone.
    got = lease(stub, "sched", n=100)
    assert sorted(m.record.value for m in got) == sorted(b"ready-%d" % i for i in range(READY))


def test_purging_ready_messages_counts_the_delayed_ones_as_scheduled(
    node: Node, stub: Stub
) -> None:
    setup(stub, "ready")
    resp = stub.PurgeQueue(pb.PurgeQueueRequest(name="ready", scope=pb.PURGE_SCOPE_READY))
    assert resp.skipped_deliveries == READY
    assert scheduled_stat(stub, "ready") == DELAYED
    assert total(describe(stub, "ready"), "scheduled") == DELAYED
    assert scheduled_metric(node, "ready") == DELAYED
    assert lease(stub, "ready", n=100) == []
