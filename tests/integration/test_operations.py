"""What an operator and Kubernetes see of a node: /healthz, /readyz, gRPC health per service,
Raft-health and disk metrics, and a graceful SIGTERM that hands leadership over before the
node stops, under load, losing nothing acknowledged."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from tests.integration.cluster import Cluster, started
from tests.integration.conftest import Node
from tests.integration.test_cluster_durability import check_replicas, create_queue, publish_batches

WAIT_S = 30.0


def http_get(node: Node, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{node.metrics_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def samples(node: Node) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the node's /metrics by (name, sorted labels)."""
    code, text = http_get(node, "/metrics")
    assert code == 200
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def grpc_health(node: Node, service: str) -> int:
    with node.channel() as ch:
        return int(
            health_pb2_grpc.HealthStub(ch)
            .Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            .status
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with started(Cluster(tmp_path)) as c:
        yield c


def test_single_node_is_live_and_ready_and_unknown_paths_are_404(node: Node) -> None:
    assert http_get(node, "/healthz") == (200, "ok\n")
    wait_for("ready", lambda: http_get(node, "/readyz") == (200, "ready\n"))
    assert http_get(node, "/nothing")[0] == 404
    for service in ("", "fluxmq.v1.QueueService", "fluxmq.v1.AdminService"):
        assert grpc_health(node, service) == health_pb2.HealthCheckResponse.SERVING, service
    m = samples(node)
    assert m[("fluxmq_node_ready", ())] == 1
    assert m[("fluxmq_etcd_session_up", ())] == 0  # no etcd on a single node
    assert m[("fluxmq_shard_is_leader", (("shard", "local"),))] == 1


def test_delivery_metrics_count_bytes_and_redeliveries(node: Node) -> None:
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="m")))
        stub.CreateGroup(pb.CreateGroupRequest(queue="m", group="g"))
        stub.Publish(pb.PublishRequest(queue="m", messages=[pb.PublishMessage(value=b"x" * 100)]))
        first = stub.Lease(
            pb.LeaseRequest(queue="m", group="g", consumer_id="c", max_messages=1, lease_ms=60_000)
        )
        stub.Nack(
            pb.NackRequest(
                queue="m", group="g", receipts=[first.messages[0].receipt], retry_after_ms=1
            )
        )
        wait_for(
            "redelivery",
            lambda: bool(
                stub.Lease(
                    pb.LeaseRequest(
                        queue="m", group="g", consumer_id="c", max_messages=1, lease_ms=60_000
                    )
                ).messages
            ),
        )
    m = samples(node)
    q = (("queue", "m"),)
    assert m[("fluxmq_leased_messages_total", q)] == 2
    assert m[("fluxmq_delivered_bytes_total", q)] == 200
    assert m[("fluxmq_redelivered_messages_total", q)] == 1
    assert m[("fluxmq_apply_commit_seconds_count", (("shard", "local"),))] > 0


def test_replica_without_a_leader_is_not_ready_and_recovers(cluster: Cluster) -> None:
    a, b, c = cluster.nodes
    for n in cluster.nodes:
        wait_for("ready", lambda n=n: http_get(n, "/readyz")[0] == 200)
    m = [samples(n) for n in cluster.nodes]
    shard = (("shard", "g1"),)
    assert sum(x[("fluxmq_shard_is_leader", shard)] for x in m) == 1
    assert all(x[("fluxmq_shard_replicas", shard)] == 3 for x in m)
    assert all(x[("fluxmq_shard_has_leader", shard)] == 1 for x in m)
    b.stop()
    c.stop()
    wait_for("a lone replica is not ready", lambda: http_get(a, "/readyz")[0] == 503)
    _code, body = http_get(a, "/readyz")
    assert "shard g1 has no leader" in body
    assert http_get(a, "/healthz")[0] == 200  # alive all the same: no restart wanted
    assert grpc_health(a, "fluxmq.v1.QueueService") == health_pb2.HealthCheckResponse.NOT_SERVING
    assert samples(a)[("fluxmq_node_ready", ())] == 0
    b.start()
    c.start()
    wait_for("ready again", lambda: http_get(a, "/readyz")[0] == 200)
    assert grpc_health(a, "fluxmq.v1.QueueService") == health_pb2.HealthCheckResponse.SERVING


def test_sigterm_on_the_leader_under_load_hands_leadership_over_first_and_loses_nothing(
    cluster: Cluster,
) -> None:
    create_queue(cluster, "term")
    leader = cluster.wait_leader()
    i = cluster.nodes.index(leader)
    progress = threading.Event()
    result: list[tuple[list[bytes], int]] = []
    errors: list[BaseException] = []

    def on_batch(b: int) -> None:
        if b == 30:
            progress.set()

    def publisher() -> None:
        try:
            result.append(publish_batches(cluster, "term", 120, on_batch))
        except BaseException as err:  # reported by the main thread
            errors.append(err)
            progress.set()

    t = threading.Thread(target=publisher, name="publisher")
    t.start()
    assert progress.wait(WAIT_S) and not errors, errors
    m = samples(leader)
    assert m[("fluxmq_raft_journal_fsync_seconds_count", (("shard", "g1"),))] > 0
    assert m[("fluxmq_shard_proposals_in_flight", (("shard", "g1"),))] >= 0
    assert leader.stop() == 0  # SIGTERM, clean exit
    t.join(120)
    assert not t.is_alive() and not errors, errors
    acked, retries = result[0]

    log = leader.log_path.read_text()
    handed = [ln for ln in log.splitlines() if "handed leadership of g1 to" in ln]
    assert handed, log[-3000:]
    target = handed[-1].split("handed leadership of g1 to ")[1].split(" ")[0]
    assert target in cluster.raft and target != cluster.raft[i]
    assert log.index("handed leadership of g1") < log.index("stopped cleanly")
    new = cluster.wait_leader()
    assert cluster.raft[cluster.nodes.index(new)] == target

    leader.start()  # the old leader rejoins as a follower and catches up
    check_replicas(cluster, "term", acked)
    print(f"\n{len(acked)} acked across the SIGTERM ({retries} retries)")


def test_json_logs_carry_the_request_id_of_the_call(tmp_path: Path) -> None:
    n = Node(tmp_path / "j", "--log-json", "--log-level", "DEBUG")
    n.start()
    try:
        with n.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            with pytest.raises(grpc.RpcError):
                stub.GetQueueStats(
                    pb.GetQueueStatsRequest(name="absent"),
                    metadata=(("x-request-id", "req-7f3a"),),
                )
    finally:
        n.stop()
    lines = [json.loads(ln) for ln in n.log_path.read_text().splitlines() if ln.startswith("{")]
    assert lines and all({"ts", "level", "logger", "msg", "request_id"} <= set(x) for x in lines)
    mine = [x for x in lines if x["request_id"] == "req-7f3a"]
    assert any("GetQueueStats NOT_FOUND" in x["msg"] for x in mine), mine
