"""A node whose shards run in a shard process (``shard_processes = 1``): the front end owns the
gRPC port and relays; the shard process may die and is restarted; nothing acknowledged is lost,
whichever of the two is killed."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.server.shard_process.supervisor import PID_FILE

from .conftest import Node
from .test_crash import BATCH, BATCHES, PARTITIONS, batch_values, read_all

LOAD_S_MAX = 90.0
PROCESS_GONE_S = 10.0


def shard_pid(node: Node) -> int:
    return int((node.data_dir / PID_FILE).read_text().strip())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purposes
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + PROCESS_GONE_S
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.02)


def error_info(err: grpc.RpcError) -> tuple[str, bool]:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason, info.metadata.get("retriable") == "true"
    raise AssertionError("no ErrorInfo")


def queue_service_status(node: Node) -> int:
    with node.channel() as ch:
        return int(
            health_pb2_grpc.HealthStub(ch)
            .Check(health_pb2.HealthCheckRequest(service="fluxmq.v1.QueueService"), timeout=2)
            .status
        )


def wait_queue_service(node: Node, status: int) -> None:
    deadline = time.monotonic() + 30
    while queue_service_status(node) != status:
        assert time.monotonic() < deadline, f"QueueService never reached status {status}"
        time.sleep(0.02)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    n = Node(tmp_path / "n", "--shard-processes", "1")
    n.start()
    yield n  # type: ignore[misc]
    n.stop()


def _load(
    node: Node, values: list[list[bytes]], on_acked: object
) -> dict[int, list[tuple[int, int]]]:
    """Four publishers send every batch until each is acknowledged (bounded in time); a batch
    whose call failed is sent again (its first attempt may have been committed: the test
    checks atomicity and loss, not duplicates)."""
    acked: dict[int, list[tuple[int, int]]] = {}
    lock = threading.Lock()
    pending = list(range(BATCHES))
    deadline = time.monotonic() + LOAD_S_MAX
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        stub.CreateQueue(
            pb.CreateQueueRequest(config=pb.QueueConfig(name="crash", partitions=PARTITIONS))
        )

        def publisher() -> None:
            while time.monotonic() < deadline:
                with lock:
                    if not pending:
                        return
                    b = pending.pop(0)
                req = pb.PublishRequest(
                    queue="crash", messages=[pb.PublishMessage(value=v) for v in values[b]]
                )
                try:
                    res = stub.Publish(req, timeout=20)
                except grpc.RpcError:
                    with lock:
                        pending.append(b)
                    time.sleep(0.05)
                    continue
                with lock:
                    acked[b] = [(r.partition, r.offset) for r in res.results]
                    on_acked(len(acked))  # type: ignore[operator]

        threads = [threading.Thread(target=publisher) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(LOAD_S_MAX + 30)
    return acked


def kill_after(pid: int, acked: int) -> tuple[Callable[[int], None], threading.Event]:
    """An ``on_acked`` for ``_load`` that kill -9s ``pid`` once ``acked`` batches are
    acknowledged, and the event set when it did."""
    killed = threading.Event()

    def on_acked(count: int) -> None:
        if count >= acked and not killed.is_set():
            killed.set()
            os.kill(pid, signal.SIGKILL)

    return on_acked, killed


def _check(
    node: Node, values: list[list[bytes]], acked: dict[int, list[tuple[int, int]]], seed: int
) -> None:
    with node.channel() as ch:
        stored = read_all(queue_pb2_grpc.QueueServiceStub(ch))
    for b, positions in acked.items():
        for i, pos in enumerate(positions):
            assert stored.get(pos) == values[b][i], f"seed {seed}: acked batch {b} msg {i} lost"
    counts: dict[bytes, int] = {}
    for value in stored.values():
        counts[value[:10]] = counts.get(value[:10], 0) + 1
    for b in range(BATCHES):
        n = {counts.get(b"b%03d-m%03d-" % (b, i), 0) for i in range(BATCH)}
        assert len(n) == 1, f"seed {seed}: batch {b} half-written ({n})"


def test_acknowledged_messages_survive_kill_9_of_the_shard_process_under_load(node: Node) -> None:
    seed = random.randrange(1 << 30)
    values = [batch_values(b, random.Random(seed + b)) for b in range(BATCHES)]
    first = shard_pid(node)
    front_end = node.proc
    on_acked, killed = kill_after(first, 30)
    acked = _load(node, values, on_acked)
    assert killed.is_set(), f"seed {seed}: the shard process was never killed"
    assert len(acked) == BATCHES, f"seed {seed}: {BATCHES - len(acked)} batches never acknowledged"
    assert front_end is not None and front_end.poll() is None, "the front end kept running"
    assert shard_pid(node) != first and not alive(first), "a new shard process serves"
    _check(node, values, acked, seed)


def test_kill_9_of_the_node_takes_its_shard_process_and_a_restart_loses_nothing(
    tmp_path: Path,
) -> None:
    seed = random.randrange(1 << 30)
    values = [batch_values(b, random.Random(seed + b)) for b in range(BATCHES)]
    node = Node(tmp_path / "n", "--shard-processes", "1")
    node.start()
    try:
        acked = _load(node, values, lambda count: None)
        child = shard_pid(node)
        node.kill9()
        node.start()  # at once: the dying shard process must not hold the ports or the store
        assert not alive(child)
        _check(node, values, acked, seed)
    finally:
        node.stop()


def test_queue_service_is_not_serving_while_the_shard_process_restarts(node: Node) -> None:
    assert queue_service_status(node) == health_pb2.HealthCheckResponse.SERVING
    first = shard_pid(node)
    os.kill(first, signal.SIGKILL)
    # The front end sees it die at once, and starts another after a back-off.
    wait_queue_service(node, health_pb2.HealthCheckResponse.NOT_SERVING)
    wait_queue_service(node, health_pb2.HealthCheckResponse.SERVING)
    assert shard_pid(node) != first
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="after")))
        res = stub.Publish(
            pb.PublishRequest(queue="after", messages=[pb.PublishMessage(value=b"x")])
        )
        assert len(res.results) == 1


def test_a_call_while_no_shard_process_serves_is_refused_as_retriable(node: Node) -> None:
    first = shard_pid(node)
    os.kill(first, signal.SIGSTOP)  # the process holds still; the front end still relays
    try:
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                stub.ListQueues(pb.ListQueuesRequest(), timeout=0.5)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        os.kill(first, signal.SIGKILL)
        wait_gone(first)
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            try:
                stub.ListQueues(pb.ListQueuesRequest(), timeout=5)
            except grpc.RpcError as refused:
                # Before the new shard process serves (GROUP_UNAVAILABLE: nothing was done), or
                # sent before the front end saw it die (OUTCOME_UNKNOWN): retriable either way.
                assert refused.code() == grpc.StatusCode.UNAVAILABLE
                reason, retriable = error_info(refused)
                assert reason in ("GROUP_UNAVAILABLE", "OUTCOME_UNKNOWN") and retriable
    finally:
        if alive(first):
            os.kill(first, signal.SIGKILL)


def test_a_shard_process_that_cannot_start_stops_the_node_with_its_reason(tmp_path: Path) -> None:
    data = tmp_path / "n"
    data.mkdir()
    (data / "MODE").write_text("cluster g1\n")  # a cluster replica's directory
    node = Node(data, "--shard-processes", "1")
    node.spawn()
    assert node.proc is not None
    code = node.proc.wait(60)
    assert code == 1
    assert "belongs to a 'cluster g1' node" in node.log_path.read_text()


def test_sigterm_stops_the_shard_process_with_the_node(node: Node) -> None:
    child = shard_pid(node)
    assert node.stop() == 0
    wait_gone(child)
