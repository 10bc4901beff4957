"""Idempotent producer sessions across a leader's kill -9 in a 3-node cluster with etcd (issue 23,
"Must show"): a request sent again after the leader died, to whichever node leads next, is
answered with its first offsets (duplicate=true) and every message is stored exactly once, in
order, also when the first attempt's answer was lost with the leader. Raw gRPC stubs; the nodes
and etcd run on loopback. One cluster serves both tests (each on its own queue): the killed
leader is restarted at the end of a test, and the replicas must then converge."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from google.rpc import status_pb2

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.conftest import Node
from tests.integration.rpc_helpers import rich_error, status_details

pytestmark = pytest.mark.slow
Stub = queue_pb2_grpc.QueueServiceStub
RPC_TIMEOUT_S = 5.0
FORWARDED_QUEUE = "sessions-forwarded"
RETRY_BUDGET_S = 25.0  # an election after a kill -9 takes a few seconds on loopback
# What a node answers while the queue has no leader, or the node it forwards to is dead.
TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with EtcdServer() as etcd:
        c = Cluster(tmp_path_factory.mktemp("sessions"), 3, "--etcd", etcd.endpoint)
        for i, node in enumerate(c.nodes):
            node.extra = (*node.extra, "--node-id", f"n{i}")
        c.start()
        try:
            yield c
        finally:
            c.stop()


@pytest.fixture
def cluster(shared_cluster: Cluster) -> Iterator[Cluster]:
    """The shared cluster with every node running again after the test, also after a failure
    (a node left dead would make the next test's kill take the majority away)."""
    yield shared_cluster
    for node in shared_cluster.nodes:
        if node.proc is None or node.proc.poll() is not None:
            node.start()


class Session:
    """One producer session on one partition, numbering its requests as the SDK does."""

    def __init__(self, cluster: Cluster, queue: str) -> None:
        self.cluster, self.queue = cluster, queue
        leader = cluster.wait_leader()
        with leader.channel() as ch:
            s = Stub(ch)
            s.CreateQueue(
                pb.CreateQueueRequest(config=pb.QueueConfig(name=queue, partitions=1)),
                timeout=RPC_TIMEOUT_S,
            )
            grant = s.InitProducer(pb.InitProducerRequest(queue=queue), timeout=RPC_TIMEOUT_S)
        self.producer_id, self.epoch = grant.producer_id, grant.producer_epoch
        self.next_sequence = 0
        self.sent: list[bytes] = []

    def request(self, *values: bytes) -> pb.PublishRequest:
        req = pb.PublishRequest(
            queue=self.queue,
            messages=[pb.PublishMessage(value=v, partition=0) for v in values],
            producer=pb.ProducerSession(
                producer_id=self.producer_id,
                producer_epoch=self.epoch,
                first_sequence=self.next_sequence,
            ),
            request_timeout_ms=int(RPC_TIMEOUT_S * 1000),
        )
        self.next_sequence += len(values)
        self.sent.extend(values)
        return req


def send(node: Node, req: pb.PublishRequest) -> tuple[pb.PublishResponse, str]:
    """-> the answer and the address of the node that leads the queue (its trailer)."""
    with node.channel() as ch:
        resp, call = Stub(ch).Publish.with_call(req, timeout=RPC_TIMEOUT_S)
    return resp, dict(call.trailing_metadata())["x-fluxmq-leader"]


def send_until_answered(cluster: Cluster, req: pb.PublishRequest) -> tuple[pb.PublishResponse, str]:
    """The same request to the live nodes in turn until one answers OK (bounded in time);
    anything but a transient refusal fails the test."""
    deadline = time.monotonic() + RETRY_BUDGET_S
    attempt = 0
    while True:
        alive = cluster.alive()
        node = alive[attempt % len(alive)]
        attempt += 1
        try:
            return send(node, req)
        except grpc.RpcError as err:
            assert err.code() in TRANSIENT, (err.code(), err.details())
            assert time.monotonic() < deadline, f"no answer in {RETRY_BUDGET_S} s: {err.details()}"
            time.sleep(0.1)


def node_at(cluster: Cluster, address: str) -> Node:
    return next(n for n in cluster.nodes if n.address == address)


def offsets(resp: pb.PublishResponse) -> list[tuple[int, int, int]]:
    return [(r.partition, r.offset, r.timestamp_ms) for r in resp.results]


def heal_and_check(cluster: Cluster, killed: Node, session: Session) -> None:
    """The killed node back: every replica converges to the same state, and each one holds the
    session's messages exactly once, in order."""
    killed.start()
    cluster.wait_converged()
    for node in cluster.nodes:
        assert cluster.fetch_all(node, session.queue) == session.sent, node.address


def test_request_resent_after_leader_kill9_is_answered_duplicate_with_its_first_offsets(
    cluster: Cluster,
) -> None:
    session = Session(cluster, "sessions-kill")
    send_until_answered(cluster, session.request(b"m0", b"m1"))
    req = session.request(b"m2", b"m3", b"m4")
    first, leader_address = send(cluster.wait_leader(), req)
    assert [r.duplicate for r in first.results] == [False] * 3
    assert [r.offset for r in first.results] == [2, 3, 4]
    old_leader = node_at(cluster, leader_address)
    old_leader.kill9()

    again, new_leader_address = send_until_answered(cluster, req)
    assert new_leader_address != leader_address
    assert offsets(again) == offsets(first)
    assert [r.duplicate for r in again.results] == [True] * 3

    for i in range(5, 20, 3):  # the session goes on under the new leader
        more, _ = send_until_answered(
            cluster, session.request(*(b"m%d" % j for j in range(i, i + 3)))
        )
        assert [(r.offset, r.duplicate) for r in more.results] == [
            (j, False) for j in range(i, i + 3)
        ]
    new_leader = node_at(cluster, new_leader_address)
    assert cluster.fetch_all(new_leader, session.queue) == session.sent
    assert session.sent == [b"m%d" % j for j in range(20)]
    heal_and_check(cluster, old_leader, session)


# How long after sending the leader is killed: at once (the request most likely never reaches
# its log) and about one replicated round later (most likely stored, its answer not yet sent).
@pytest.mark.parametrize("kill_after_s", [0.0, 0.003], ids=["at-once", "one-round"])
def test_request_whose_answer_died_with_the_leader_is_stored_exactly_once(
    cluster: Cluster, kill_after_s: float
) -> None:
    session = Session(cluster, f"sessions-lost-answer-{int(kill_after_s * 1000)}ms")
    send_until_answered(cluster, session.request(b"m0"))
    leader = cluster.wait_leader()
    req = session.request(b"m1", b"m2")
    with leader.channel() as ch:
        # The leader dies while the request is in flight: the attempt may have been stored or
        # not; its answer is lost either way unless it came back in that moment (then the
        # retry must repeat it).
        pending = Stub(ch).Publish.future(req, timeout=RPC_TIMEOUT_S)
        time.sleep(kill_after_s)
        leader.kill9()
        try:
            answered: list[tuple[int, int, int]] | None = offsets(pending.result())
        except grpc.RpcError as err:
            assert err.code() in TRANSIENT, err
            answered = None
    retried, new_leader_address = send_until_answered(cluster, req)
    # Whether the first attempt reached a majority or not, the retry is answered with the one
    # stored copy's offsets (duplicate=true if the first attempt was stored).
    assert [r.offset for r in retried.results] == [1, 2]
    landed = [r.duplicate for r in retried.results]
    assert landed in ([True, True], [False, False])
    if answered is not None:
        assert landed == [True, True] and offsets(retried) == answered
    print(f"first attempt answered: {answered is not None}; stored before the kill: {landed[0]}")
    after, _ = send_until_answered(cluster, session.request(b"m3"))
    assert [(r.offset, r.duplicate) for r in after.results] == [(3, False)]
    new_leader = node_at(cluster, new_leader_address)
    assert cluster.fetch_all(new_leader, session.queue) == [b"m0", b"m1", b"m2", b"m3"]
    heal_and_check(cluster, leader, session)


def forwarded_request(
    grant: pb.InitProducerResponse, seq: int, *values: bytes, epoch: int | None = None
) -> pb.PublishRequest:
    return pb.PublishRequest(
        queue=FORWARDED_QUEUE,
        messages=[pb.PublishMessage(value=v, partition=0) for v in values],
        producer=pb.ProducerSession(
            producer_id=grant.producer_id,
            producer_epoch=grant.producer_epoch if epoch is None else epoch,
            first_sequence=seq,
        ),
    )


def test_session_calls_through_a_follower_keep_their_answers_and_refusals(cluster: Cluster) -> None:
    """A follower forwards InitProducer and session publishes to the leader: the retry is still
    a duplicate, and a refusal keeps its code, reason, retriable flag and field."""
    leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n is not leader)
    config = pb.QueueConfig(name=FORWARDED_QUEUE, partitions=1)
    with leader.channel() as ch:
        Stub(ch).CreateQueue(pb.CreateQueueRequest(config=config), timeout=RPC_TIMEOUT_S)
    with follower.channel() as ch:
        s = Stub(ch)
        init = pb.InitProducerRequest(queue=FORWARDED_QUEUE, producer_name="fwd")
        old = s.InitProducer(init, timeout=RPC_TIMEOUT_S)
        grant = s.InitProducer(init, timeout=RPC_TIMEOUT_S)
        assert (grant.producer_id, grant.producer_epoch) == (old.producer_id, 1)

        first, call = s.Publish.with_call(
            forwarded_request(grant, 0, b"a", b"b"), timeout=RPC_TIMEOUT_S
        )
        assert dict(call.trailing_metadata())["x-fluxmq-leader"] == leader.address  # forwarded
        again = s.Publish(forwarded_request(grant, 0, b"a", b"b"), timeout=RPC_TIMEOUT_S)
        assert offsets(again) == offsets(first)
        assert [r.duplicate for r in again.results] == [True, True]

        refusals = [
            (forwarded_request(grant, 7, b"x"), "OUT_OF_ORDER_SEQUENCE", "true"),
            (forwarded_request(grant, 2, b"z", epoch=0), "PRODUCER_FENCED", "false"),
        ]
        for req, reason, retriable in refusals:
            with pytest.raises(grpc.RpcError) as info:
                s.Publish(req, timeout=RPC_TIMEOUT_S)
            e = rich_error(info.value)
            assert (e.code, e.reason) == (grpc.StatusCode.FAILED_PRECONDITION, reason)
            assert e.metadata["retriable"] == retriable, reason

        stray = forwarded_request(grant, 2, b"c")
        stray.messages[0].ClearField("partition")
        publishes = [
            forwarded_request(grant, 0, b"a", b"b"),
            stray,
            forwarded_request(grant, 2, b"c"),
        ]
        stream = (pb.PublishStreamRequest(sequence=i, publish=p) for i, p in enumerate(publishes))
        dup, bad, ok = s.PublishStream(stream, timeout=RPC_TIMEOUT_S)
        assert [(r.offset, r.duplicate) for r in dup.results] == [(0, True), (1, True)]
        details = status_details(status_pb2.Status.FromString(bad.error.status_details))
        assert bad.error.reason == "INVALID_ARGUMENT"
        assert details.fields == ["publish.messages[0].partition"]
        assert [(r.offset, r.duplicate) for r in ok.results] == [(2, False)]
    assert cluster.fetch_all(leader, FORWARDED_QUEUE) == [b"a", b"b", b"c"]
