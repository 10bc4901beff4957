"""A cluster whose nodes run two shard processes each (``shard_processes = 2``, etcd): the home
group runs in a node's first shard process, the placed groups are shared out over both; any node
serves any queue; kill -9 of the shard process that runs a group loses nothing acknowledged
(real etcd, real nodes)."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.server.shard_process.siblings import group_process
from fluxmq.server.shard_process.supervisor import pid_file
from tests.integration.conftest import authorized_channel
from tests.integration.group_helpers import wait_for
from tests.integration.rpc_helpers import rich_error
from tests.integration.test_placement import KEY, create, launched, metadata, stub

pytestmark = pytest.mark.slow
PUBLISH_S_MAX = 60.0


def shards_of(address: str) -> set[str]:
    with authorized_channel(address, KEY) as ch:
        st = admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(
            admin_pb2.GetClusterStatusRequest(skip_digest=True), timeout=10
        )
    return {s.shard_id for s in st.shards}


def publish_until_acked(s: object, queue: str, value: bytes) -> None:
    deadline = time.monotonic() + PUBLISH_S_MAX
    while True:
        try:
            s.Publish(  # type: ignore[attr-defined]
                pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(value=value)]),
                timeout=10,
            )
            return
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err  # retriable while it restarts
            assert time.monotonic() < deadline, f"{queue}: never acknowledged again"
            time.sleep(0.1)


def test_placed_groups_run_in_every_shard_process_and_survive_one_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLUXMQ_SHARD_PROCESSES", "2")
    clusters = launched(tmp_path / "c")
    cluster = next(clusters)
    try:
        metadata(cluster, "put_setting", "auto_provision_groups", "true")
        # Two groups of three replicas before they are reused: one per shard process.
        metadata(cluster, "put_setting", "groups_per_size", "2")
        ch1, s1 = stub(cluster.node_addresses[0])
        with ch1:
            spread = create(s1, "spread", factor=3)  # a second 3-replica group: g2
            home = create(s1, "home", factor=3)  # then the least loaded: the home group g1
            solo = create(s1, "solo", factor=1)  # a 1-replica group: g3
        groups = {q.config.name: q.config.replication.group for q in (spread, home, solo)}
        assert groups == {"spread": "g2", "home": "g1", "solo": "g3"}, groups
        assert [group_process(groups[q], 2, "g1") for q in ("spread", "home")] == [1, 0]
        spec = cluster.specs()[0]
        wait_for("the placed group to start", lambda: "g2" in shards_of(spec.address))
        # Which shard process runs each group, as the node's metrics port labels its series.
        with urllib.request.urlopen(f"http://{spec.metrics_address}/metrics", timeout=10) as r:
            scraped = r.read().decode()
        runs = {
            s.labels["shard"]: s.labels["shard_process"]
            for f in text_string_to_metric_families(scraped)
            if f.name == "fluxmq_shard_is_leader"
            for s in f.samples
        }
        assert runs["g1"] == "0" and runs["g2"] == "1", runs

        # Any node serves every queue, whichever shard process of whichever node runs it.
        for address in cluster.node_addresses:
            ch, s = stub(address)
            with ch:
                for queue in groups:
                    publish_until_acked(s, queue, f"{queue}@{address}".encode())
        expected = {q: [f"{q}@{a}".encode() for a in cluster.node_addresses] for q in groups}
        for address in cluster.node_addresses:
            ch, s = stub(address)
            with ch:
                for queue, values in expected.items():
                    got = s.Fetch(
                        pb.FetchRequest(queue=queue, partition=0, max_messages=100), timeout=30
                    )
                    assert [r.value for r in got.records] == values, (queue, address)

        # kill -9 of the shard process that runs g2 on one node: its node restarts it, the
        # replica catches up, and every acknowledged message is still there.
        pid = int(Path(pid_file(spec.data_dir, 1)).read_text().strip())
        os.kill(pid, signal.SIGKILL)
        ch, s = stub(spec.address)
        with ch:
            publish_until_acked(s, "spread", b"after")
            got = s.Fetch(
                pb.FetchRequest(queue="spread", partition=0, max_messages=100), timeout=30
            )
            assert [r.value for r in got.records] == [*expected["spread"], b"after"]
        assert int(Path(pid_file(spec.data_dir, 1)).read_text().strip()) != pid
        wait_for("g2 to run on the node again", lambda: "g2" in shards_of(spec.address))

        metadata(cluster, "put_setting", "groups_per_size", "lots")
        ch, s = stub(spec.address)
        with ch, pytest.raises(grpc.RpcError) as err:
            create(s, "refused", factor=3)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert rich_error(err.value).reason == "INVALID_CLUSTER_SETTING"
    finally:
        next(clusters, None)
