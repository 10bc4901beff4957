"""/metrics stays bounded whatever queues an admin creates: per-partition series only up to
``metrics_partition_series_max`` partitions (smallest queues first), queue series only for the
first ``metrics_queue_series_max`` queues by name, the rest counted in
``fluxmq_metrics_series_folded``; a deleted queue's series disappear with it."""

from __future__ import annotations

import importlib.metadata
import platform
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc

from .conftest import Node

PARTITION_SERIES_MAX = 10
QUEUE_SERIES_MAX = 3
# name -> partitions. Named (first 3 by name): a, b, c. Partition budget 10, smallest first:
# b (4) fits, c (8) does not, so only b has per-partition series.
QUEUES = {"a": 64, "b": 4, "c": 8, "d": 1, "e": 2}


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Node]:
    n = Node(
        tmp_path / "n",
        "--metrics-partition-series-max", str(PARTITION_SERIES_MAX),
        "--metrics-queue-series-max", str(QUEUE_SERIES_MAX),
    )  # fmt: skip
    n.start()
    yield n
    n.stop()


def scrape(node: Node) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=30) as r:
        return str(r.read().decode())


def queues_in(text: str, metric: str) -> set[str]:
    return set(re.findall(rf'^{metric}{{[^}}]*queue="([^"]+)"', text, re.M))


def partition_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("fluxmq_partition_")]


def folded(text: str, kind: str) -> float:
    match = re.search(rf'^fluxmq_metrics_series_folded{{kind="{kind}"}} (\S+)$', text, re.M)
    assert match, f"no fluxmq_metrics_series_folded{{kind={kind!r}}} in the scrape"
    return float(match.group(1))


def setup_queues(stub: queue_pb2_grpc.QueueServiceStub) -> None:
    for name, partitions in QUEUES.items():
        stub.CreateQueue(
            pb.CreateQueueRequest(config=pb.QueueConfig(name=name, partitions=partitions))
        )
        stub.Publish(pb.PublishRequest(queue=name, messages=[pb.PublishMessage(value=b"v")] * 3))


def test_metrics_series_are_capped_and_folded_series_are_counted(capped: Node) -> None:
    with capped.channel() as ch:
        setup_queues(queue_pb2_grpc.QueueServiceStub(ch))
    first, second = scrape(capped), scrape(capped)
    for text in (first, second):
        assert queues_in(text, "fluxmq_partition_high_watermark") == {"b"}
        assert len(partition_lines(text)) == 3 * QUEUES["b"]  # high, low, bytes per partition
        assert queues_in(text, "fluxmq_published_messages_total") == {"a", "b", "c"}
        assert folded(text, "queue") == 2  # d and e
        assert folded(text, "partition") == sum(QUEUES.values()) - QUEUES["b"]
    # Nothing accumulates from one scrape to the next.
    assert len(first.splitlines()) == len(second.splitlines())


def test_many_partitions_keep_the_scrape_bounded(capped: Node) -> None:
    with capped.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        for i in range(20):
            stub.CreateQueue(
                pb.CreateQueueRequest(config=pb.QueueConfig(name=f"wide-{i:02d}", partitions=64))
            )
    text = scrape(capped)
    assert partition_lines(text) == []  # no queue of 64 fits a budget of 10 partitions
    assert folded(text, "partition") == 20 * 64
    assert folded(text, "queue") == 20 - QUEUE_SERIES_MAX
    assert len(queues_in(text, "fluxmq_[a-z_]+")) <= QUEUE_SERIES_MAX


def test_a_deleted_queues_series_disappear(capped: Node) -> None:
    with capped.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        setup_queues(stub)
        assert "b" in queues_in(scrape(capped), "fluxmq_published_messages_total")
        stub.DeleteQueue(pb.DeleteQueueRequest(name="b"))
    text = scrape(capped)
    assert 'queue="b"' not in text
    # b's place is taken by the next queue by name, and the freed budget by the smallest ones.
    assert queues_in(text, "fluxmq_published_messages_total") == {"a", "c", "d"}
    assert queues_in(text, "fluxmq_partition_high_watermark") == {"c", "d"}
    assert folded(text, "queue") == 1


def test_capped_metrics_pass_promtool_lint(capped: Node) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by `make test` (Debian package prometheus)"
    with capped.channel() as ch:
        setup_queues(queue_pb2_grpc.QueueServiceStub(ch))
    proc = subprocess.run(
        [promtool, "check", "metrics"],
        input=scrape(capped).encode(),
        capture_output=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_build_info_names_what_runs_and_no_created_series_are_scraped(capped: Node) -> None:
    """One fluxmq_build_info series (version, Python, gRPC, pysyncobj), as a node's shard
    process serves it through the front end; and no <name>_created series, which would double
    what every scrape carries."""
    with capped.channel() as ch:
        setup_queues(queue_pb2_grpc.QueueServiceStub(ch))
    text = scrape(capped)
    (line,) = [x for x in text.splitlines() if x.startswith("fluxmq_build_info{")]
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    assert labels["version"] == importlib.metadata.version("fluxmq")
    assert labels["python"] == platform.python_version()
    assert labels["grpc"] == grpc.__version__ and labels["pysyncobj"] == "0.3.17"
    assert line.endswith(" 1.0")
    assert "fluxmq_published_messages_total{" in text
    created = [x for x in text.splitlines() if re.match(r"^\w+_created[{ ]", x)]
    assert not created, created[:3]
