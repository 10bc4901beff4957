"""Consumer-group membership over the wire: server-side assignment, incremental rebalance,
session expiry after kill -9, generation fencing (real node, real member processes)."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from tests.integration.conftest import Node
from tests.integration.group_helpers import (
    MemberProcess,
    check_single_owner,
    describe,
    owners,
    read_events,
    settled,
    wait_for,
)
from tests.integration.rpc_helpers import rich_error

Stub = queue_pb2_grpc.QueueServiceStub
SESSION_MS = 2000


def _ordered_queue(stub: Stub, name: str, partitions: int, kind: int = pb.QUEUE_TYPE_WORK) -> None:
    stub.CreateQueue(
        pb.CreateQueueRequest(config=pb.QueueConfig(name=name, partitions=partitions, type=kind))
    )
    stub.CreateGroup(pb.CreateGroupRequest(queue=name, group="g", mode=pb.DELIVERY_MODE_ORDERED))


def _publish(stub: Stub, queue: str, count: int, partitions: int) -> None:
    for start in range(0, count, 100):
        msgs = [
            pb.PublishMessage(value=b"m%d" % i, partition=i % partitions)
            for i in range(start, min(count, start + 100))
        ]
        stub.Publish(pb.PublishRequest(queue=queue, messages=msgs), timeout=10)


def _join(stub: Stub, queue: str, consumer: str, **kw: object) -> pb.MemberAssignment:
    return stub.JoinGroup(
        pb.JoinGroupRequest(queue=queue, group="g", consumer_id=consumer, **kw), timeout=10
    )


def _beat(stub: Stub, queue: str, a: pb.MemberAssignment) -> pb.MemberAssignment:
    return stub.Heartbeat(
        pb.HeartbeatRequest(
            queue=queue, group="g", member_id=a.member_id, generation_id=a.generation_id
        ),
        timeout=10,
    )


@pytest.mark.slow
def test_rebalance_moves_only_what_must_move_and_no_partition_has_two_owners(
    node: Node, stub: Stub, tmp_path: Path
) -> None:
    queue, parts = "orders", 6
    _ordered_queue(stub, queue, parts)
    _publish(stub, queue, 600, parts)
    events = tmp_path / "events.jsonl"
    members = [
        MemberProcess([node.address], queue, "g", f"c{i}", events, session_ms=SESSION_MS)
        for i in range(3)
    ]
    try:
        # Three member processes start (interpreter, SDK, join, rebalance): on a loaded 2-core
        # machine that has taken more than 30 s once; show the group if it does not settle.
        wait_for(
            "3 members with 2 partitions each",
            lambda: settled(describe(stub, queue, "g"), 3, parts),
            timeout_s=60,
            show=lambda: describe(stub, queue, "g"),
        )
        before = owners(describe(stub, queue, "g"))
        assert sorted(list(before.values()).count(c) for c in ("c0", "c1", "c2")) == [2, 2, 2]

        members.append(
            MemberProcess([node.address], queue, "g", "c3", events, session_ms=SESSION_MS)
        )
        wait_for(
            "the 4th member to get its partitions",
            lambda: settled(describe(stub, queue, "g"), 4, parts),
        )
        after = owners(describe(stub, queue, "g"))
        moved = [p for p in range(parts) if before[p] != after[p]]
        # 6 over 4 members is 2,2,1,1: only what the newcomer gets changes hands.
        assert moved == sorted(p for p, c in after.items() if c == "c3"), (before, after)
        assert 1 <= len(moved) <= 2

        _publish(stub, queue, 600, parts)
        victim = members[0]
        victim.kill9()
        took = wait_for(
            "the killed member's partitions to move",
            lambda: settled(describe(stub, queue, "g"), 3, parts),
            timeout_s=SESSION_MS / 1000 + 20,
        )
        final = owners(describe(stub, queue, "g"))
        assert "c0" not in final.values()
        assert took > 0  # it waited for the session to lapse (reported, not asserted on time)

        def drained() -> bool:
            desc = describe(stub, queue, "g")
            return all(p.lag == 0 for p in desc.partitions)

        wait_for("every message to be acked", drained, timeout_s=60)
    finally:
        for m in members:
            m.stop()
    changes = check_single_owner(read_events(events), {"c0": victim.killed_at or 0.0})
    assert changes >= 6 + 2 + 2  # first assignment, the newcomer's two, the victim's two


def test_commit_with_stale_generation_is_rejected(stub: Stub) -> None:
    queue = "clicks"
    _ordered_queue(stub, queue, 4, kind=pb.QUEUE_TYPE_STREAM)
    _publish(stub, queue, 8, 4)
    a = _join(stub, queue, "a", session_timeout_ms=60_000)
    assert sorted(a.assigned) == [0, 1, 2, 3]
    b = _join(stub, queue, "b", session_timeout_ms=60_000)
    assert sorted(b.pending) == [2, 3] and not b.assigned  # waits for a to let go
    old = a.generation_id
    with pytest.raises(grpc.RpcError) as exc:
        stub.CommitOffsets(
            pb.CommitOffsetsRequest(
                queue=queue, group="g", offsets={0: 1}, member_id=a.member_id, generation_id=old
            )
        )
    err = rich_error(exc.value)
    assert err.code == grpc.StatusCode.ABORTED and err.reason == "STALE_GENERATION"
    assert err.metadata["member_id"] == a.member_id

    a2 = _beat(stub, queue, a)  # learns the revoke; acknowledging it hands 2 and 3 over
    assert a2.generation_id > old and sorted(a2.assigned) == [0, 1]
    stub.CommitOffsets(
        pb.CommitOffsetsRequest(
            queue=queue,
            group="g",
            offsets={0: 1},
            member_id=a.member_id,
            generation_id=a2.generation_id,
        )
    )
    a3 = _beat(stub, queue, a2)
    assert not a3.revoking
    b2 = _beat(stub, queue, b)
    assert sorted(b2.assigned) == [2, 3] and not b2.pending


def test_member_that_missed_a_rebalance_gets_should_rejoin(stub: Stub) -> None:
    queue = "jobs"
    _ordered_queue(stub, queue, 2)
    a = _join(stub, queue, "a", session_timeout_ms=1000)
    b = _join(stub, queue, "b", session_timeout_ms=60_000)
    b = _beat(stub, queue, b)
    # a stays silent past its session: it is expired and b takes everything.
    wait_for(
        "a to be expired",
        lambda: [m.consumer_id for m in describe(stub, queue, "g").members] == ["b"],
        timeout_s=15,
    )
    late = _beat(stub, queue, a)
    assert late.should_rejoin and "session expired" in late.reason
    with pytest.raises(grpc.RpcError) as exc:
        stub.Ack(
            pb.AckRequest(
                queue=queue,
                group="g",
                receipts=[pb.Receipt(partition=0, offset=0, lease_id=1)],
                member_id=a.member_id,
                generation_id=a.generation_id,
            )
        )
    assert rich_error(exc.value).reason == "STALE_GENERATION"
    again = _join(stub, queue, "a", session_timeout_ms=60_000, member_id=a.member_id)
    assert again.member_id != a.member_id  # the old id stays fenced
    assert not again.should_rejoin


def test_ordered_group_with_members_leases_only_owned_partitions(stub: Stub) -> None:
    queue = "owned"
    _ordered_queue(stub, queue, 2)
    _publish(stub, queue, 10, 2)
    a = _join(stub, queue, "a", session_timeout_ms=60_000)
    b = _join(stub, queue, "b", session_timeout_ms=60_000)
    a = _beat(stub, queue, a)
    b = _beat(stub, queue, b)
    for m, consumer in ((a, "a"), (b, "b")):
        resp = stub.Lease(
            pb.LeaseRequest(
                queue=queue,
                group="g",
                consumer_id=consumer,
                max_messages=100,
                member_id=m.member_id,
                generation_id=m.generation_id,
            )
        )
        assert {x.receipt.partition for x in resp.messages} == set(m.assigned)
    with pytest.raises(grpc.RpcError) as exc:
        stub.Lease(pb.LeaseRequest(queue=queue, group="g", consumer_id="outsider"))
    err = rich_error(exc.value)
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "MEMBER_REQUIRED"


@pytest.mark.parametrize(
    ("request_kw", "field"),
    [
        ({"strategy": "fastest"}, "strategy"),
        ({"session_timeout_ms": 10}, "session_timeout_ms"),
        ({"session_timeout_ms": 10_000_000}, "session_timeout_ms"),
        ({"consumer_id": ""}, "consumer_id"),
        ({"member_id": "x" * 300}, "member_id"),
    ],
)
def test_bad_join_is_rejected_with_the_field(
    stub: Stub, request_kw: dict[str, object], field: str
) -> None:
    queue = "badjoin"
    try:
        _ordered_queue(stub, queue, 2)
    except grpc.RpcError:
        pass
    kw: dict[str, object] = {"consumer_id": "c"} | request_kw
    with pytest.raises(grpc.RpcError) as exc:
        stub.JoinGroup(pb.JoinGroupRequest(queue=queue, group="g", **kw))  # type: ignore[arg-type]
    err = rich_error(exc.value)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.fields, err


def test_membership_rpcs_on_unknown_group_say_group_not_found(stub: Stub) -> None:
    stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="nogroup")))
    for call, req in (
        (stub.JoinGroup, pb.JoinGroupRequest(queue="nogroup", group="x", consumer_id="c")),
        (stub.Heartbeat, pb.HeartbeatRequest(queue="nogroup", group="x", member_id="m")),
        (stub.LeaveGroup, pb.LeaveGroupRequest(queue="nogroup", group="x", member_id="m")),
    ):
        with pytest.raises(grpc.RpcError) as exc:
            call(req)
        assert rich_error(exc.value).reason == "GROUP_NOT_FOUND"


def test_group_membership_survives_a_restart(node: Node, stub: Stub) -> None:
    queue = "durable"
    _ordered_queue(stub, queue, 3)
    a = _join(stub, queue, "a", session_timeout_ms=60_000)
    node.kill9()
    node.start()
    with node.channel() as ch:
        s2 = queue_pb2_grpc.QueueServiceStub(ch)
        desc = describe(s2, queue, "g")
        assert [m.member_id for m in desc.members] == [a.member_id]
        # The restarted leader gives the member a full session before expiring it.
        beat = _beat(s2, queue, a)
        assert not beat.should_rejoin and sorted(beat.assigned) == [0, 1, 2]
    time.sleep(0)  # keep the node fixture's channel use ordered
