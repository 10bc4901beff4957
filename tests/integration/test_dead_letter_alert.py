"""The dead-letter alert: a warning in the log and fluxmq_dead_letter_alert{queue} = 1 once a
queue's DLQ holds more than its dead_letter_alert_threshold, cleared when it drops back."""

from __future__ import annotations

import urllib.request

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc

from .conftest import Node
from .test_retention_metrics import wait_for


def alert_value(node: Node, queue: str) -> float | None:
    url = f"http://127.0.0.1:{node.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(f'fluxmq_dead_letter_alert{{queue="{queue}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_dead_letter_alert_is_raised_past_threshold_and_cleared_by_purge(node: Node) -> None:
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        config = pb.QueueConfig(
            name="alerts", type=pb.QUEUE_TYPE_WORK, dead_letter_alert_threshold=2
        )
        stub.CreateQueue(pb.CreateQueueRequest(config=config))
        stub.CreateGroup(pb.CreateGroupRequest(queue="alerts", group="g"))
        stub.Publish(
            pb.PublishRequest(queue="alerts", messages=[pb.PublishMessage(value=b"x")] * 3)
        )
        leased = stub.Lease(
            pb.LeaseRequest(queue="alerts", group="g", consumer_id="c", max_messages=3)
        )
        assert len(leased.messages) == 3

        def nack_dead(receipts: list[pb.Receipt]) -> None:
            stub.Nack(pb.NackRequest(queue="alerts", group="g", receipts=receipts, dead=True))

        nack_dead([leased.messages[0].receipt, leased.messages[1].receipt])
        wait_for(lambda: alert_value(node, "alerts") == 0.0)  # at the threshold: no alert yet
        nack_dead([leased.messages[2].receipt])
        wait_for(lambda: alert_value(node, "alerts") == 1.0)
        assert "queue 'alerts' has 3 dead letters in 'alerts.dlq'" in node.log_path.read_text()

        stub.PurgeDeadLetters(pb.PurgeDeadLettersRequest(queue="alerts", all=True))
        wait_for(lambda: alert_value(node, "alerts") == 0.0)
        stats = stub.GetQueueStats(pb.GetQueueStatsRequest(name="alerts"))
        assert stats.dead_letters == 0
