"""A queue's dead-letter operations see, move and delete only its own dead letters: a queue
holding its own messages cannot be named as a DLQ, and queues sharing one DLQ never touch each
other's letters (list, depth, replay, purge, alert), on one node and through a follower of a
3-replica cluster."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc

from .cluster import Cluster
from .conftest import Node
from .delivery_helpers import (
    DEAD_LETTERED,
    Stub,
    dead_letters,
    group,
    lease_all,
    nack,
    publish,
    receipts,
    scrape,
    values,
    wait_for,
    work_queue,
)
from .rpc_helpers import rich_error


def _stats(stub: Stub, name: str) -> pb.QueueStats:
    return stub.GetQueueStats(pb.GetQueueStatsRequest(name=name), timeout=10)


def _dead_letter(stub: Stub, queue: str, *items: bytes) -> None:
    publish(stub, queue, *items)
    got = lease_all(stub, queue, count=len(items))
    assert sorted(values(got)) == sorted(items)
    statuses = nack(stub, queue, "g", receipts(got), dead=True, reason="poison")
    assert statuses == [DEAD_LETTERED] * len(items)


def _gauge(node: Node, metric: str, queue: str) -> float | None:
    for line in scrape(node).splitlines():
        if line.startswith(f'{metric}{{queue="{queue}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def _alert(node: Node, queue: str) -> float | None:
    return _gauge(node, "fluxmq_dead_letter_alert", queue)


def test_a_queue_holding_messages_cannot_be_named_as_a_dead_letter_queue(stub: Stub) -> None:
    work_queue(stub, "orders")
    publish(stub, "orders", b"o1", b"o2", b"o3")
    with pytest.raises(grpc.RpcError) as info:
        work_queue(stub, "jobs", dead_letter_queue="orders")
    err = rich_error(info.value)
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.reason == "DEAD_LETTER_QUEUE_CONFLICT"
    assert err.fields == ["config.dead_letter_queue"]
    assert "cannot be the dead-letter queue of 'jobs'" in err.message
    # Nothing of orders can be reached through a "jobs" that was never created.
    with pytest.raises(grpc.RpcError) as missing:
        stub.PurgeDeadLetters(pb.PurgeDeadLettersRequest(queue="jobs", all=True))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert _stats(stub, "orders").messages == 3
    # A queue that is a source itself (it has a DLQ) is refused too, also on update.
    work_queue(stub, "jobs")
    with pytest.raises(grpc.RpcError) as upd:
        stub.UpdateQueue(
            pb.UpdateQueueRequest(
                config=pb.QueueConfig(name="jobs", dead_letter_queue="orders"),
                update_mask={"paths": ["dead_letter_queue"]},
            )
        )
    assert rich_error(upd.value).reason == "DEAD_LETTER_QUEUE_CONFLICT"


def _sharing_scenario(stub: Stub, read: Stub) -> None:
    """A and B share "shared"; ``read`` is the stub the reads go through (maybe a follower)."""
    work_queue(stub, "a", dead_letter_queue="shared", dead_letter_alert_threshold=1)
    work_queue(stub, "b", dead_letter_queue="shared")
    group(stub, "a")
    group(stub, "b")
    _dead_letter(stub, "a", b"a1")
    _dead_letter(stub, "b", b"b1", b"b2")
    shared = stub.GetQueue(pb.GetQueueRequest(name="shared"))
    assert shared.dead_letter_of == "a" and not shared.config.dead_letter_queue

    def listed(queue: str) -> list[bytes]:
        return sorted(d.record.value for d in dead_letters(read, queue))

    wait_for(lambda: listed("b") == [b"b1", b"b2"], 10, "B's letters on the reading node")
    assert listed("a") == [b"a1"]
    assert (_stats(read, "a").dead_letters, _stats(read, "b").dead_letters) == (1, 2)

    # A's replay takes A's letter only: A's consumers never see B's.
    replayed = stub.ReplayDeadLetters(pb.ReplayDeadLettersRequest(queue="a", all=True))
    assert replayed.replayed == 1
    assert values(lease_all(stub, "a", count=2, timeout_s=1.5)) == [b"a1"]
    assert sorted(d.record.value for d in dead_letters(stub, "b")) == [b"b1", b"b2"]

    # A's purge deletes A's letters only; B's stay, in the list and in the DLQ's log.
    _dead_letter(stub, "a", b"a2")
    purged = stub.PurgeDeadLetters(pb.PurgeDeadLettersRequest(queue="a", all=True))
    assert purged.purged == 1
    b_ids = [d.id for d in dead_letters(stub, "b")]
    assert len(b_ids) == 2
    # Ids of another queue's letters are not A's to purge.
    by_id = stub.PurgeDeadLetters(pb.PurgeDeadLettersRequest(queue="a", ids=b_ids))
    assert by_id.purged == 0
    wait_for(lambda: listed("a") == [] and _stats(read, "a").dead_letters == 0, 10, "A purged")
    assert listed("b") == [b"b1", b"b2"]
    assert _stats(read, "b").dead_letters == 2
    assert _stats(read, "shared").messages >= 2


def test_queues_sharing_a_dead_letter_queue_touch_only_their_own_letters(
    node: Node, stub: Stub
) -> None:
    _sharing_scenario(stub, stub)
    # The depth gauge is per source too (B: two letters, A: none left).
    assert _gauge(node, "fluxmq_dead_letter_messages", "b") == 2.0
    assert _gauge(node, "fluxmq_dead_letter_messages", "a") == 0.0
    # The alert of A counts A's letters only: B's two letters do not raise it.
    wait_for(lambda: _alert(node, "a") == 0.0, 10, "a's alert gauge")
    _dead_letter(stub, "a", b"a3", b"a4")
    wait_for(lambda: _alert(node, "a") == 1.0, 10, "a's alert past its threshold")
    assert "queue 'a' has 2 dead letters in 'shared'" in node.log_path.read_text()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, 3)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.slow
def test_dead_letter_scope_holds_through_a_follower_of_three_replicas(cluster: Cluster) -> None:
    leader = cluster.wait_leader()
    followers = [n for n in cluster.nodes if n is not leader]
    with followers[0].channel() as ch1, followers[1].channel() as ch2:
        one = queue_pb2_grpc.QueueServiceStub(ch1)
        two = queue_pb2_grpc.QueueServiceStub(ch2)
        _sharing_scenario(one, two)

        # Two creates racing through two nodes: "x" naming "y" as its DLQ, and "y" as an
        # ordinary queue (with a DLQ of its own). The state machine lets exactly one through.
        outcomes: dict[str, grpc.RpcError | None] = {}

        def create(stub: Stub, name: str, **config: str) -> None:
            try:
                work_queue(stub, name, **config)
                outcomes[name] = None
            except grpc.RpcError as err:
                outcomes[name] = err

        racers = [
            threading.Thread(target=create, args=(one, "x"), kwargs={"dead_letter_queue": "y"}),
            threading.Thread(target=create, args=(two, "y")),
        ]
        for t in racers:
            t.start()
        for t in racers:
            t.join(30)
        refused = [e for e in outcomes.values() if e is not None]
        assert len(outcomes) == 2 and len(refused) == 1, outcomes
        assert rich_error(refused[0]).reason == "DEAD_LETTER_QUEUE_CONFLICT"
    cluster.wait_converged()
