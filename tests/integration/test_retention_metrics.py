"""Retention driven by the leader's timer, and the /metrics endpoint."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc

from .conftest import Node
from .rpc_helpers import rich_error


@pytest.fixture
def fast_node(tmp_path: Path):  # type: ignore[no-untyped-def]
    n = Node(tmp_path / "r", "--retention-interval-ms", "50")
    n.start()
    yield n
    n.stop()


def wait_for(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def low(stub: queue_pb2_grpc.QueueServiceStub, name: str) -> int:
    return stub.GetQueueStats(pb.GetQueueStatsRequest(name=name)).partitions[0].low_watermark


def test_retention_by_count_age_and_bytes_moves_low_watermark(fast_node: Node) -> None:
    with fast_node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        for name, retention in [
            ("by-count", pb.Retention(max_messages=10)),
            ("by-age", pb.Retention(max_age="500ms")),
            ("by-bytes", pb.Retention(max_bytes="4KiB")),
        ]:
            stub.CreateQueue(
                pb.CreateQueueRequest(config=pb.QueueConfig(name=name, retention=retention))
            )
            stub.Publish(
                pb.PublishRequest(queue=name, messages=[pb.PublishMessage(value=b"v" * 200)] * 50)
            )
        wait_for(lambda: low(stub, "by-count") == 40)
        wait_for(lambda: low(stub, "by-age") == 50)
        wait_for(lambda: low(stub, "by-bytes") > 0)
        stats = stub.GetQueueStats(pb.GetQueueStatsRequest(name="by-bytes"))
        assert stats.bytes <= 4096 and stats.partitions[0].high_watermark == 50
        with pytest.raises(grpc.RpcError) as info:
            stub.Fetch(pb.FetchRequest(queue="by-count", offset=5))
        e = rich_error(info.value)
        assert e.reason == "OFFSET_OUT_OF_RANGE" and e.metadata["low_watermark"] == "40"
        got = stub.Fetch(pb.FetchRequest(queue="by-count", offset=40))
        assert len(got.records) == 10


def scrape(node: Node) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def test_metrics_expose_publish_fetch_rpc_and_watermarks(node: Node) -> None:
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="m", partitions=2)))
        stub.Publish(
            pb.PublishRequest(
                queue="m", messages=[pb.PublishMessage(value=b"abc", partition=1)] * 5
            )
        )
        stub.Fetch(pb.FetchRequest(queue="m", partition=1))
        with pytest.raises(grpc.RpcError):
            stub.GetQueue(pb.GetQueueRequest(name="nope"))
    # A call's duration is observed as the server finishes it, which may be just after the
    # client has its answer: wait (bounded) for the last call's series.
    not_found = 'fluxmq_rpc_duration_seconds_count{code="NOT_FOUND",method="GetQueue"} 1.0'
    deadline = time.monotonic() + 10
    text = scrape(node)
    while not_found not in text and time.monotonic() < deadline:
        time.sleep(0.05)
        text = scrape(node)
    assert 'fluxmq_published_messages_total{queue="m"} 5.0' in text
    assert 'fluxmq_published_bytes_total{queue="m"} 15.0' in text
    assert 'fluxmq_fetched_messages_total{queue="m"} 5.0' in text
    assert 'fluxmq_partition_high_watermark{partition="1",queue="m"} 5.0' in text
    assert 'fluxmq_rpc_duration_seconds_count{code="OK",method="Publish"} 1.0' in text
    assert 'fluxmq_rpc_duration_seconds_count{code="NOT_FOUND",method="GetQueue"} 1.0' in text
    assert "fluxmq_storage_file_bytes" in text
    assert "fluxmq_apply_transactions_total" in text and "fluxmq_applied_commands_total" in text


def test_metrics_pass_promtool_lint(node: Node, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by `make test` (Debian package prometheus)"
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="lint")))
        stub.Publish(pb.PublishRequest(queue="lint", messages=[pb.PublishMessage(value=b"x")]))
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=scrape(node).encode(), capture_output=True, timeout=30
    )
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
