"""Read-your-writes across nodes on a real 3-node cluster (issue 19 flake: a follower answered
GetQueue NOT_FOUND for a queue created through another node a few seconds earlier).

A follower that missed the create (paused while it was committed) resumes while the leader that
acknowledged it is paused in turn: the follower can neither reach that leader nor has it
applied the create. Its answer must be the queue or a retriable error, never NOT_FOUND; and
once the third replica (which has the create) leads, the follower serves the queue."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from tests.integration.cluster import Cluster
from tests.integration.conftest import Node
from tests.integration.rpc_helpers import rich_error

SETTLE_S = 30.0


def _pause(node: Node) -> None:
    assert node.proc is not None
    node.proc.send_signal(signal.SIGSTOP)


def _resume(node: Node) -> None:
    assert node.proc is not None and node.proc.poll() is None
    node.proc.send_signal(signal.SIGCONT)


def _get(node: Node, name: str) -> pb.Queue:
    with node.channel() as ch:
        return queue_pb2_grpc.QueueServiceStub(ch).GetQueue(
            pb.GetQueueRequest(name=name), timeout=10
        )


def test_follower_that_missed_a_create_never_answers_not_found(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start()
    paused: list[Node] = []
    try:
        leader = cluster.wait_leader()
        follower, third = (n for n in cluster.nodes if n is not leader)
        _pause(follower)
        paused.append(follower)
        with leader.channel() as ch:
            queue_pb2_grpc.QueueServiceStub(ch).CreateQueue(
                pb.CreateQueueRequest(config=pb.QueueConfig(name="orders")), timeout=10
            )  # acknowledged: committed on the leader and the third replica
        _pause(leader)
        paused.append(leader)
        _resume(follower)
        paused.remove(follower)

        answers: list[str] = []
        deadline = time.monotonic() + SETTLE_S
        while True:
            try:
                assert _get(follower, "orders").config.name == "orders"
                answers.append("queue")
                break
            except grpc.RpcError as err:
                info = rich_error(err)
                answers.append(f"{info.code.name} {info.reason}")
                assert info.code != grpc.StatusCode.NOT_FOUND, (answers, info.message)
                assert info.metadata.get("retriable") == "true", (answers, info.message)
                assert time.monotonic() < deadline, answers
                time.sleep(0.2)
        assert _get(third, "orders").config.name == "orders"
    finally:
        for node in paused:
            _resume(node)
        cluster.stop()
