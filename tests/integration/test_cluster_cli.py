"""``fluxmq cluster up/status/down``: etcd plus three nodes on loopback, started by the CLI as a
user would, used through node 2, a node killed and restarted, one started again on an empty
data directory (``start-node --wipe``) and refilled, one stopped, then all stopped and purged.
Plus the launcher's pieces that need no running cluster (port layout, refusing a second
``up``, a port in use)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2, queue_pb2_grpc
from fluxmq.devcluster.cli import main as cluster_main
from fluxmq.devcluster.launcher import (
    STATE_FILE,
    LauncherError,
    LocalCluster,
    node_specs,
    pid_alive,
    port_free,
)

CLI_TIMEOUT_S = 120.0
SPAN = 40  # ports probed per cluster: 3 nodes use base .. base+22, an added node +30 .. +32


def free_port_range(span: int = SPAN) -> int:
    """A base port with ``span`` consecutive free ports, below Linux's ephemeral range (where
    other tests' port-0 picks land)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 32_000 - span)
        if all(port_free(p) for p in range(base, base + span)):
            return base
    raise AssertionError(f"no {span} consecutive free ports in 20000..32000")


def fluxmq(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("FLUXMQ_CLUSTER_SECRET", None)
    return subprocess.run(
        [sys.executable, "-m", "fluxmq", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=env,
    )


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "cluster"
    yield root
    if (root / STATE_FILE).exists():  # a failed test leaves nothing running
        LocalCluster(root).down(purge=True)


def test_port_layout_and_node_ids(tmp_path: Path) -> None:
    specs = node_specs(tmp_path, 3, 7070)
    assert [s.node_id for s in specs] == ["node1", "node2", "node3"]
    assert [s.ports for s in specs] == [(7070, 7071, 7072), (7080, 7081, 7082), (7090, 7091, 7092)]
    assert specs[1].data_dir == str(tmp_path / "node2")
    assert specs[1].log == str(tmp_path / "node2.log")
    cluster = LocalCluster(tmp_path, nodes=3, base_port=7070)
    assert cluster.node_addresses == ["127.0.0.1:7070", "127.0.0.1:7080", "127.0.0.1:7090"]
    peers = cluster._node_command(specs[0], specs, "127.0.0.1:2379")
    assert peers[peers.index("--peers") + 1] == "127.0.0.1:7082,127.0.0.1:7092"
    assert peers[peers.index("--node-id") + 1] == "node1"
    # A node added later joins without a home group, and is no peer of the first ones.
    joined = dataclasses.replace(specs[2], index=4, node_id="node4", raft_port=7102, joined=True)
    command = cluster._node_command(joined, [*specs, joined], "127.0.0.1:2379")
    assert "--join" in command and "--peers" not in command
    first = cluster._node_command(specs[0], [*specs, joined], "127.0.0.1:2379")
    assert first[first.index("--peers") + 1] == "127.0.0.1:7082,127.0.0.1:7092"
    with pytest.raises(LauncherError, match="--nodes"):
        node_specs(tmp_path, 0, 7070)
    with pytest.raises(LauncherError, match="--base-port"):
        node_specs(tmp_path, 3, 65_520)


def test_secret_is_generated_once_and_private(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c")
    secret = cluster.secret()
    assert len(secret) == 32
    assert (tmp_path / "c" / "secret").stat().st_mode & 0o777 == 0o600
    assert LocalCluster(tmp_path / "c").secret() == secret


def test_up_refuses_while_the_recorded_cluster_runs(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    # A stand-in for node1: a live process whose command line names node1's data directory.
    fake = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", str(root / "node1")]
    )
    try:
        state = {
            "etcd": {"pid": 0, "client_port": 1, "data_dir": str(root / "etcd"), "log": ""},
            "nodes": [
                {
                    "index": 1,
                    "node_id": "node1",
                    "grpc_port": 1,
                    "metrics_port": 2,
                    "raft_port": 3,
                    "data_dir": str(root / "node1"),
                    "log": str(root / "node1.log"),
                    "pid": fake.pid,
                }
            ],
        }
        (root / STATE_FILE).write_text(json.dumps(state))
        deadline = time.monotonic() + 10
        while not pid_alive(fake.pid, str(root / "node1")):  # until exec'd
            assert time.monotonic() < deadline
            time.sleep(0.01)
        cluster = LocalCluster(root, base_port=free_port_range(), etcd_port=0)
        assert cluster.running_pids() == [fake.pid]
        with pytest.raises(LauncherError, match="already running"):
            cluster.up()
        assert cluster_main(["up", "--dir", str(root), "--etcd-port", "0"]) == 1
        assert json.loads((root / STATE_FILE).read_text()) == state  # left alone
        assert not (root / "etcd").exists()  # nothing was started
    finally:
        fake.kill()
        fake.wait(10)
    # The recorded process is gone: the file no longer means a running cluster.
    assert LocalCluster(root).running_pids() == []
    # A recycled pid running something else is not taken for the node.
    assert not pid_alive(os.getpid(), str(root / "node1"))


def test_up_names_a_port_in_use_and_starts_nothing(tmp_path: Path) -> None:
    base = free_port_range()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base + 11))  # node2's metrics port
        busy.listen()
        with pytest.raises(LauncherError, match=rf"{base + 11} \(node2 metrics\)"):
            LocalCluster(tmp_path / "c", base_port=base, etcd_port=0).up()
    assert not (tmp_path / "c" / STATE_FILE).exists()
    assert not (tmp_path / "c" / "etcd").exists()


@pytest.mark.slow
def test_cluster_up_status_use_down(cluster_dir: Path) -> None:
    base = free_port_range()
    d = str(cluster_dir)
    t0 = time.monotonic()
    up = fluxmq("cluster", "up", "--nodes", "3", "--dir", d, "--base-port", str(base),
                "--etcd-port", "0")  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    assert time.monotonic() - t0 < 90
    assert f"127.0.0.1:{base + 10}" in up.stdout
    state = json.loads((cluster_dir / STATE_FILE).read_text())
    pids = [int(state["etcd"]["pid"])] + [int(n["pid"]) for n in state["nodes"]]
    assert [n["grpc_port"] for n in state["nodes"]] == [base, base + 10, base + 20]
    assert (cluster_dir / "secret").stat().st_mode & 0o777 == 0o600
    # Clients authenticate (a cluster's default): the admin key is generated, private, and `up`
    # says how to use it.
    key_file = cluster_dir / "admin.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = key_file.read_text().strip()
    assert key.startswith("fmq_live_sk_") and f"FLUXMQ_API_KEY=$(cat {key_file})" in up.stdout
    md = (("authorization", f"Bearer {key}"),)

    status = fluxmq("cluster", "status", "--dir", d)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "3 nodes, 3 serving" in status.stdout
    assert "leader 127.0.0.1:" in status.stdout
    for i in (1, 2, 3):
        assert f"node{i}" in status.stdout

    # A second `up` on the same directory is refused and changes nothing.
    again = fluxmq("cluster", "up", "--dir", d, "--base-port", str(base), "--etcd-port", "0")
    assert again.returncode == 1 and "already running" in again.stderr
    assert json.loads((cluster_dir / STATE_FILE).read_text()) == state

    # Publish and fetch through node 2 (whichever node leads); without the key: refused.
    with grpc.insecure_channel(f"127.0.0.1:{base + 10}") as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ListQueues(queue_pb2.ListQueuesRequest(), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        stub.CreateQueue(
            queue_pb2.CreateQueueRequest(config=queue_pb2.QueueConfig(name="cli", partitions=1)),
            timeout=30,
            metadata=md,
        )
        sent = stub.Publish(
            queue_pb2.PublishRequest(
                queue="cli", messages=[queue_pb2.PublishMessage(value=b"via node2")]
            ),
            timeout=30,
            metadata=md,
        )
        assert sent.results[0].offset == 0
        got = stub.Fetch(
            queue_pb2.FetchRequest(queue="cli", partition=0, offset=0, wait_ms=2000),
            timeout=30,
            metadata=md,
        )
        assert [r.value for r in got.records] == [b"via node2"]

    # The library drives the same cluster through cluster.json: kill -9 node 2, bring it back.
    lib = LocalCluster(cluster_dir)
    assert lib.node_addresses[1] == f"127.0.0.1:{base + 10}"
    lib.kill9(2)
    st = lib.status()
    assert not st["ok"] and [n["alive"] for n in st["nodes"]] == [True, False, True]
    lib.restart(2)
    deadline = time.monotonic() + 30
    while not lib.status()["ok"]:
        assert time.monotonic() < deadline, lib.status()
        time.sleep(0.2)
    restarted = json.loads((cluster_dir / STATE_FILE).read_text())["nodes"][1]["pid"]
    assert restarted != state["nodes"][1]["pid"]
    pids.append(int(restarted))
    with grpc.insecure_channel(f"127.0.0.1:{base + 10}") as ch:
        got = queue_pb2_grpc.QueueServiceStub(ch).Fetch(
            queue_pb2.FetchRequest(queue="cli", partition=0, offset=0, wait_ms=5000),
            timeout=30,
            metadata=md,
        )
        assert [r.value for r in got.records] == [b"via node2"]

    # Node 3 loses its disk: the CLI kills it, wipes its data and starts it under its name; it
    # rejoins on probation and is refilled (it serves the message from its own replica).
    wiped = fluxmq("cluster", "start-node", "3", "--wipe", "--dir", d)
    assert wiped.returncode == 0 and "empty data directory" in wiped.stdout, wiped.stderr
    pids.append(int(json.loads((cluster_dir / STATE_FILE).read_text())["nodes"][2]["pid"]))
    deadline = time.monotonic() + 60
    while True:
        try:
            with grpc.insecure_channel(f"127.0.0.1:{base + 20}") as ch:
                got = queue_pb2_grpc.QueueServiceStub(ch).Fetch(
                    queue_pb2.FetchRequest(queue="cli", partition=0, offset=0, wait_ms=1000),
                    timeout=30,
                    metadata=md,
                )
            if [r.value for r in got.records] == [b"via node2"]:
                break
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, "node3 was not refilled"
        time.sleep(0.2)
    assert "left probation" in (cluster_dir / "node3.log").read_text()

    # A node added later joins without a home group: it serves (forwarding to g1's leader)
    # and is removed again (decommissioned, stopped); the home group's nodes cannot be.
    added = fluxmq("cluster", "add-node", "--dir", d)
    assert added.returncode == 0 and "node4 serving" in added.stdout, added.stderr
    node4 = json.loads((cluster_dir / STATE_FILE).read_text())["nodes"][3]
    assert node4["joined"] and node4["grpc_port"] == base + 30
    pids.append(int(node4["pid"]))
    with grpc.insecure_channel(f"127.0.0.1:{base + 30}") as ch:
        got = queue_pb2_grpc.QueueServiceStub(ch).Fetch(
            queue_pb2.FetchRequest(queue="cli", partition=0, offset=0, wait_ms=5000),
            timeout=30,
            metadata=md,
        )
        assert [r.value for r in got.records] == [b"via node2"]
    assert "joined without a home group" in (cluster_dir / "node4.log").read_text()
    refused_removal = fluxmq("cluster", "remove-node", "1", "--dir", d)
    assert refused_removal.returncode == 1 and "home group" in refused_removal.stderr
    removed = fluxmq("cluster", "remove-node", "4", "--dir", d)
    assert removed.returncode == 0 and "node4 decommissioned" in removed.stdout, removed.stderr
    assert not pid_alive(int(node4["pid"])) and not (cluster_dir / "node4").exists()
    assert len(lib.status()["nodes"]) == 3
    stopped = fluxmq("cluster", "stop-node", "3", "--dir", d)
    assert stopped.returncode == 0 and "node3 stopped" in stopped.stdout, stopped.stderr
    assert [n["alive"] for n in lib.status()["nodes"]] == [True, True, False]

    down = fluxmq("cluster", "down", "--dir", d, "--purge")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(pid_alive(pid) for pid in pids)
    assert not (cluster_dir / STATE_FILE).exists()
    assert not any((cluster_dir / f"node{i}").exists() for i in (1, 2, 3))
    assert not (cluster_dir / "etcd").exists()

    after = fluxmq("cluster", "status", "--dir", d)
    assert after.returncode == 1
