"""Clear startup errors in cluster mode, and peers without the cluster secret kept out."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2, queue_pb2_grpc
from tests.integration.cluster import SECRET, Cluster
from tests.integration.conftest import free_port

pytestmark = pytest.mark.slow


def run_node(
    tmp_path: Path, *args: str, secret: str | None = SECRET
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("FLUXMQ_CLUSTER_SECRET", None)
    if secret is not None:
        env["FLUXMQ_CLUSTER_SECRET"] = secret
    cmd = [
        sys.executable, "-m", "fluxmq", "serve",
        "--data-dir", str(tmp_path / "d"),
        "--listen", f"127.0.0.1:{free_port()}",
        "--metrics-listen", "",
        *args,
    ]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def test_cluster_mode_without_a_secret_refuses_to_start(tmp_path: Path) -> None:
    r = run_node(
        tmp_path,
        "--raft-listen", f"127.0.0.1:{free_port()}",
        "--peers", f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}",
        secret=None,
    )  # fmt: skip
    assert r.returncode == 1
    assert "cluster_secret" in r.stderr and "FLUXMQ_CLUSTER_SECRET" in r.stderr


def test_cluster_mode_without_peers_is_a_configuration_error(tmp_path: Path) -> None:
    r = run_node(tmp_path, "--raft-listen", f"127.0.0.1:{free_port()}")
    assert r.returncode == 1
    assert "peers" in r.stderr


def test_a_cluster_without_etcd_refuses_to_start_open_unless_told(tmp_path: Path) -> None:
    # Auth is on by default in cluster mode and the keys live in etcd: a static-peer cluster
    # must say auth = off, never silently run without authentication.
    r = run_node(
        tmp_path,
        "--raft-listen", f"127.0.0.1:{free_port()}",
        "--peers", f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}",
    )  # fmt: skip
    assert r.returncode == 1
    assert "auth: a cluster keeps its API keys in etcd" in r.stderr
    assert "auth = off" in r.stderr and "on by default in cluster mode" in r.stderr


def test_a_raft_port_in_use_is_a_clear_startup_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run_node(
            tmp_path,
            "--raft-listen", f"127.0.0.1:{port}",
            "--peers", f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}",
            "--auth", "off",
        )  # fmt: skip
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port} for raft (--raft-listen" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_data_dir_of_a_single_node_is_refused_in_cluster_mode(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "MODE").write_text("single\n")
    r = run_node(
        tmp_path,
        "--raft-listen", f"127.0.0.1:{free_port()}",
        "--peers", f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}",
        "--auth", "off",
    )  # fmt: skip
    assert r.returncode == 1
    assert "belongs to a 'single' node" in r.stderr


def test_a_missing_peer_is_named_in_the_log_while_there_is_no_leader(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    lonely = cluster.nodes[0]
    lonely.start()
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            text = lonely.log_path.read_text()
            if "has no leader" in text:
                break
            time.sleep(0.2)
        assert "has no leader" in text
        assert cluster.raft[1] in text and cluster.raft[2] in text
    finally:
        cluster.stop()


def test_a_peer_with_the_wrong_secret_is_ignored_and_logged(tmp_path: Path) -> None:
    good = Cluster(tmp_path / "good")
    # Same membership, but the third replica holds another secret.
    intruder = good.nodes[2]
    intruder.env = {**os.environ, "FLUXMQ_CLUSTER_SECRET": "a-different-secret-of-the-intruder"}
    try:
        intruder.start()
        good.nodes[0].start()
        good.nodes[1].start()
        with good.wait_leader().channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            stub.CreateQueue(
                queue_pb2.CreateQueueRequest(config=queue_pb2.QueueConfig(name="q")), timeout=10
            )
            stub.Publish(
                queue_pb2.PublishRequest(
                    queue="q", messages=[queue_pb2.PublishMessage(value=b"x")]
                ),
                timeout=10,
            )
        with intruder.channel() as ch:
            with pytest.raises(grpc.RpcError) as err:
                queue_pb2_grpc.QueueServiceStub(ch).GetQueue(
                    queue_pb2.GetQueueRequest(name="q"), timeout=5
                )
            # It never got the log and knows no leader to catch up with: it cannot tell
            # whether q exists, so it says so (retriable), never a NOT_FOUND guessed.
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        logs = "".join(n.log_path.read_text() for n in good.nodes)
        assert "cluster secret" in logs
    finally:
        good.stop()
