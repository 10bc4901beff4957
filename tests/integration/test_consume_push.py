"""Consume streams push in the round that commits (issue: deliver in the round that commits),
over real gRPC on a real node: the stream's consumer is checked out of its group in the
replicated state, and an append's apply assigns it the new message, so the message costs no
round of its own; a stream that ends, or whose node restarts, no longer takes messages."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq._pb.v1 import admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb

from .conftest import Node
from .delivery_helpers import Stub, group, lease, publish, wait_for, work_queue

STREAM_S = 20.0  # bound on every stream of these tests


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node")
    n.start()
    yield n
    n.stop()


class Stream:
    """A Consume stream read by a thread: its messages arrive on ``got``."""

    def __init__(self, stub: Stub, queue_name: str, consumer: str, window: int = 10) -> None:
        self.call = stub.Consume(
            pb.ConsumeRequest(
                queue=queue_name, group="g", consumer_id=consumer, max_in_flight=window
            ),
            timeout=STREAM_S,
        )
        self.got: queue.Queue[pb.LeasedMessage] = queue.Queue()
        self.ended: list[grpc.RpcError] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self.call:
                for m in response.messages:
                    self.got.put(m)
        except grpc.RpcError as err:
            self.ended.append(err)

    def take(self, timeout_s: float = 5.0) -> pb.LeasedMessage:
        return self.got.get(timeout=timeout_s)

    def close(self) -> None:
        self.call.cancel()
        self._thread.join(5)


def queue_with_group(channel: grpc.Channel, name: str) -> Stub:
    """A stub of ``channel``, with a new work queue ``name`` and its group ``g``."""
    stub = queue_pb2_grpc.QueueServiceStub(channel)
    work_queue(stub, name)
    group(stub, name)
    return stub


def applied_index(channel: grpc.Channel) -> int:
    status = admin_pb2_grpc.AdminServiceStub(channel).GetClusterStatus(
        apb.GetClusterStatusRequest()
    )
    return max(s.applied_index for s in status.shards)


def checked_out(stub: Stub, queue_name: str, consumer: str) -> bool:
    """Whether ``consumer``'s stream is checked out: a message published now goes to it."""
    publish(stub, queue_name, b"probe")
    time.sleep(0.3)
    return not lease(stub, queue_name, consumer="prober", n=1)


def test_a_message_published_to_an_idle_stream_costs_no_round_of_its_own(node: Node) -> None:
    with node.channel() as ch:
        stub = queue_with_group(ch, "push")
        stream = Stream(stub, "push", "c1")
        try:
            time.sleep(0.5)  # the checkout (one command) applies; then the node is idle
            before = applied_index(ch)
            publish(stub, "push", b"hello")
            m = stream.take()
            assert m.record.value == b"hello" and m.receipt.attempt == 1
            time.sleep(0.3)  # a lease proposed after the delivery would show here
            # Only the append went through the log: it assigned the message as it applied.
            assert applied_index(ch) == before + 1
            # The ack is a round; its apply frees credit (nothing waits, so no push).
            acked = stub.Ack(pb.AckRequest(queue="push", group="g", receipts=[m.receipt]))
            assert list(acked.statuses) == [pb.RECEIPT_STATUS_ACKED]
        finally:
            stream.close()


def test_a_stream_takes_no_more_than_its_window_until_it_acks(node: Node) -> None:
    with node.channel() as ch:
        stub = queue_with_group(ch, "window")
        stream = Stream(stub, "window", "c1", window=2)
        try:
            publish(stub, "window", b"a", b"b", b"c")
            first = [stream.take(), stream.take()]
            assert [m.record.value for m in first] == [b"a", b"b"]
            with pytest.raises(queue.Empty):
                stream.take(timeout_s=0.5)
            stub.Ack(pb.AckRequest(queue="window", group="g", receipts=[first[0].receipt]))
            assert stream.take().record.value == b"c"  # pushed in the ack's round
        finally:
            stream.close()


def test_a_stream_that_ended_takes_no_more_messages(node: Node) -> None:
    with node.channel() as ch:
        stub = queue_with_group(ch, "ended")
        stream = Stream(stub, "ended", "c1")
        publish(stub, "ended", b"first")
        assert stream.take().record.value == b"first"
        desc = stub.DescribeGroup(pb.DescribeGroupRequest(queue="ended", group="g"))
        assert [(s.consumer_id, s.max_in_flight) for s in desc.streaming] == [("c1", 10)]
        stream.close()
        # The stream's end checks its consumer in: new messages wait for somebody who asks.
        wait_for(
            lambda: not checked_out(stub, "ended", "c1"),
            timeout_s=5,
            what="the ended stream's consumer checked in",
        )
        desc = stub.DescribeGroup(pb.DescribeGroupRequest(queue="ended", group="g"))
        assert list(desc.streaming) == []


def test_a_stream_whose_client_went_away_gives_its_unacked_messages_back_at_once(
    node: Node,
) -> None:
    """As AMQP requeues a closed channel's unacked messages: a cancelled stream's leases end
    when its end applies, not when they would have run out (the queue's lease is 30 s)."""
    with node.channel() as ch:
        stub = queue_with_group(ch, "gone")
        first = Stream(stub, "gone", "c1")
        publish(stub, "gone", b"a", b"b")
        held = sorted(first.take().record.value for _ in range(2))
        assert held == [b"a", b"b"]
        first.close()  # cancelled, nothing acked
        second = Stream(stub, "gone", "c2")
        try:
            again = sorted(second.take(timeout_s=10).record.value for _ in range(2))
            assert again == held
        finally:
            second.close()
        redelivered = lease(stub, "gone", consumer="c3")
        assert redelivered == []  # c2 holds them now: nothing is leased twice


def test_end_consume_keeps_what_the_stream_was_given_leased(node: Node) -> None:
    """A graceful end (EndConsume) is not a client gone: what it was given stays its own."""
    with node.channel() as ch:
        stub = queue_with_group(ch, "kept")
        stream = Stream(stub, "kept", "c1")
        try:
            publish(stub, "kept", b"a")
            m = stream.take()
            assert stub.EndConsume(
                pb.EndConsumeRequest(queue="kept", group="g", consumer_id="c1")
            ).ended
            stream._thread.join(5)
            assert lease(stub, "kept", consumer="c2") == []  # still c1's
            ack = stub.Ack(pb.AckRequest(queue="kept", group="g", receipts=[m.receipt]))
            assert list(ack.statuses) == [pb.RECEIPT_STATUS_ACKED]
        finally:
            stream.close()


def test_a_restarted_node_checks_in_the_streams_it_no_longer_serves(node: Node) -> None:
    with node.channel() as ch:
        stub = queue_with_group(ch, "orphan")
        stream = Stream(stub, "orphan", "c1")
        publish(stub, "orphan", b"first")
        assert stream.take().record.value == b"first"
    node.kill9()  # no checkin: the checkout outlives its stream on disk
    stream.close()
    node.start()
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        # The leader's orphan pass checks the dead stream's consumer in; the message it held
        # stays leased until its lease ends, the new ones go to whoever asks.
        wait_for(
            lambda: not checked_out(stub, "orphan", "c1"),
            timeout_s=10,
            what="the dead stream's consumer checked in after the restart",
        )


def test_end_consume_ends_the_stream_after_what_it_was_given(node: Node) -> None:
    with node.channel() as ch:
        stub = queue_with_group(ch, "ending")
        stream = Stream(stub, "ending", "c1", window=10)
        try:
            publish(stub, "ending", b"a", b"b", b"c")
            got = [stream.take().record.value for _ in range(3)]
            end = pb.EndConsumeRequest(queue="ending", group="g", consumer_id="c1")
            assert stub.EndConsume(end).ended
            stream._thread.join(5)
            assert not stream._thread.is_alive() and not stream.ended  # ended with OK
            assert got == [b"a", b"b", b"c"]
            # Nothing more is assigned to c1; a second EndConsume finds no stream.
            publish(stub, "ending", b"d")
            assert [m.record.value for m in lease(stub, "ending", consumer="other")] == [b"d"]
            assert not stub.EndConsume(end).ended
        finally:
            stream.close()


def test_end_consume_of_an_unknown_group_is_not_found(node: Node) -> None:
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        work_queue(stub, "ending2")
        with pytest.raises(grpc.RpcError) as err:
            stub.EndConsume(pb.EndConsumeRequest(queue="ending2", group="nope", consumer_id="c"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
