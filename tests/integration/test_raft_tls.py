"""raft_tls end to end (issue 22): three `fluxmq serve` replicas with `--raft-tls` replicate over
mutual TLS on their Raft ports, with the certificates their gRPC port serves; the Raft port
completes a TLS handshake with a CA-signed client certificate and refuses plaintext with a line
in the node's log."""

from __future__ import annotations

import os
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from tests.certs import LOCAL_SANS, Authority, CertFiles
from tests.integration.cluster import SECRET
from tests.integration.conftest import Node, free_port
from tests.integration.group_helpers import wait_for

pytestmark = pytest.mark.slow
RPC_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 5.0
MESSAGES = [b"tls-%d" % i for i in range(5)]


@dataclass
class Pki:
    ca_file: Path
    node: CertFiles  # serverAuth + clientAuth, SAN 127.0.0.1 / localhost: every node uses it


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("raft-tls-pki")
    ca = Authority("fluxmq raft CA")
    node = ca.issue("node", sans=LOCAL_SANS, server=True, client=True).write(d, "node")
    return Pki(ca_file=ca.write(d / "ca.pem"), node=node)


class TlsNode(Node):
    def __init__(self, data_dir: Path, pki: Pki, *extra: str) -> None:
        super().__init__(data_dir, *extra)
        key, chain = pki.node.pair()
        self.creds = grpc.ssl_channel_credentials(
            root_certificates=pki.ca_file.read_bytes(), private_key=key, certificate_chain=chain
        )

    def channel(self) -> grpc.Channel:
        return grpc.secure_channel(self.address, self.creds)


@pytest.fixture
def cluster(pki: Pki, tmp_path: Path) -> Iterator[tuple[list[TlsNode], list[str]]]:
    raft = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    nodes = []
    for i, addr in enumerate(raft):
        node = TlsNode(
            tmp_path / f"n{i}",
            pki,
            "--raft-listen", addr,
            "--peers", ",".join(a for a in raft if a != addr),
            "--auth", "off",
            "--tls-cert-file", str(pki.node.cert),
            "--tls-key-file", str(pki.node.key),
            "--tls-ca-file", str(pki.ca_file),
            "--tls-client-auth",
            "--raft-tls",
        )  # fmt: skip
        node.env = {**os.environ, "FLUXMQ_CLUSTER_SECRET": SECRET}
        nodes.append(node)
    try:
        for node in nodes:
            node.start()
        yield nodes, raft
    finally:
        for node in nodes:
            node.stop()


def shard_info(node: TlsNode) -> admin_pb2.ShardInfo | None:
    try:
        with node.channel() as ch:
            st = admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(
                admin_pb2.GetClusterStatusRequest(), timeout=5
            )
    except grpc.RpcError:
        return None
    return st.shards[0] if st.shards else None


def tls_probe(address: str, pki: Pki) -> dict[str, object]:
    """A TLS handshake with the Raft port, presenting the node certificate; -> the port's
    verified certificate."""
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    ctx.load_cert_chain(str(pki.node.cert), str(pki.node.key))
    host, _, port = address.rpartition(":")
    raw = socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S)
    with ctx.wrap_socket(raw, server_hostname=host) as tls:  # closes raw too
        cert = tls.getpeercert()
        assert cert is not None
        return dict(cert)


def plaintext_probe(address: str) -> bytes:
    """Says hello in plaintext (a frame of this wire's shape); -> what came back before the
    port closed the connection."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S) as sock:
        sock.sendall(b"\x40\x00\x00\x00" + b"\x01" * 64)
        got = b""
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(4096)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
        return got


def test_a_cluster_with_raft_tls_replicates_over_mutual_tls(
    cluster: tuple[list[TlsNode], list[str]], pki: Pki
) -> None:
    nodes, raft = cluster

    def leader() -> TlsNode | None:
        for node in nodes:
            info = shard_info(node)
            if info is not None and info.role == "leader":
                return node
        return None

    wait_for("a leader over TLS links", lambda: leader() is not None)
    first = leader()
    assert first is not None
    with first.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        stub.CreateQueue(
            pb.CreateQueueRequest(config=pb.QueueConfig(name="rt")), timeout=RPC_TIMEOUT_S
        )
        stub.Publish(
            pb.PublishRequest(queue="rt", messages=[pb.PublishMessage(value=v) for v in MESSAGES]),
            timeout=RPC_TIMEOUT_S,
        )

    def converged() -> bool:
        infos = [shard_info(n) for n in nodes]
        return all(i is not None for i in infos) and (
            len({(i.applied_index, i.digest) for i in infos if i is not None}) == 1
        )

    wait_for("every replica to apply the same log", converged)
    for address in raft:
        cert = tls_probe(address, pki)
        assert ("IP Address", "127.0.0.1") in cert["subjectAltName"]  # type: ignore[operator]
    assert plaintext_probe(raft[0]) == b""
    wait_for(
        "the refusal of plaintext in the log",
        lambda: "speaks plaintext and raft_tls is on here" in nodes[0].log_path.read_text(),
        timeout_s=PROBE_TIMEOUT_S,
    )
