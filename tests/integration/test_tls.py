"""TLS on the gRPC port (issue 10): server certificate, mutual TLS, TLS between nodes when they
forward calls, and a bad TLS setting stopping the node at start.

Certificates come from tests/certs.py: a CA, node certificates naming 127.0.0.1 and localhost,
a client certificate, and a CA (with its own client certificate) nobody trusts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from cryptography import x509

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.auth import new_key
from fluxmq.metadata import EtcdMetadataStore, ShardRecord
from fluxmq.server.forwarding import FORWARDED_KEY, forwarded_metadata
from fluxmq.server.tls import names_host
from tests.certs import LOCAL_SANS, Authority, CertFiles, Issued
from tests.etcd_server import EtcdServer
from tests.integration.cluster import SECRET
from tests.integration.conftest import Node, free_port
from tests.integration.group_helpers import wait_for

pytestmark = pytest.mark.slow
RPC_TIMEOUT_S = 10.0
REFUSED_TIMEOUT_S = 5.0
EXIT_TIMEOUT_S = 30.0


# -- certificates ---------------------------------------------------------------------------


@dataclass
class Pki:
    ca: Authority
    ca_file: Path
    node: CertFiles  # serverAuth + clientAuth, SAN 127.0.0.1 / localhost: every node uses it
    client: CertFiles  # clientAuth, signed by ca
    other_ca_file: Path  # a CA trusted by nobody
    other_node: CertFiles  # a server certificate of the other CA, same SANs
    other_client: CertFiles  # a client certificate of the other CA


def node_cert(ca: Authority, name: str, *, expired: bool = False) -> Issued:
    """A certificate a node serves and forwards with: serverAuth + clientAuth, 127.0.0.1 and
    localhost."""
    return ca.issue(name, sans=LOCAL_SANS, server=True, client=True, expired=expired)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, other = Authority("fluxmq CA"), Authority("other CA")
    return Pki(
        ca=ca,
        ca_file=ca.write(d / "fluxmq-ca.pem"),
        node=node_cert(ca, "node").write(d, "node"),
        client=ca.issue("client", client=True).write(d, "client"),
        other_ca_file=other.write(d / "other-ca.pem"),
        other_node=node_cert(other, "other-node").write(d, "other-node"),
        other_client=other.issue("other-client", client=True).write(d, "other-client"),
    )


def credentials(
    ca: Path, client: CertFiles | None = None, *, api_key: str = ""
) -> grpc.ChannelCredentials:
    """TLS trusting ``ca``, with ``client``'s certificate (mTLS) and, given ``api_key``,
    ``authorization: Bearer <api_key>`` on every call."""
    key, chain = client.pair() if client is not None else (None, None)
    tls = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(), private_key=key, certificate_chain=chain
    )
    if not api_key:
        return tls
    return grpc.composite_channel_credentials(tls, grpc.access_token_call_credentials(api_key))


def tls_flags(pki: Pki, *, mtls: bool) -> tuple[str, ...]:
    flags = (
        "--tls-cert-file", str(pki.node.cert),
        "--tls-key-file", str(pki.node.key),
        "--tls-ca-file", str(pki.ca_file),
    )  # fmt: skip
    return (*flags, "--tls-client-auth") if mtls else flags


# -- nodes speaking TLS -----------------------------------------------------------------------


class TlsNode(Node):
    """A Node whose channels (its health wait included) use TLS."""

    def __init__(self, data_dir: Path, creds: grpc.ChannelCredentials, *extra: str) -> None:
        super().__init__(data_dir, *extra)
        self.creds = creds

    def channel(self) -> grpc.Channel:
        return grpc.secure_channel(self.address, self.creds)


def create(stub: queue_pb2_grpc.QueueServiceStub, name: str, **replication: object) -> pb.Queue:
    config = pb.QueueConfig(name=name, replication=pb.Replication(**replication))  # type: ignore[arg-type]
    return stub.CreateQueue(pb.CreateQueueRequest(config=config), timeout=30)


def refused(channel: grpc.Channel) -> grpc.RpcError:
    """The error of a call the node must refuse at the handshake."""
    with pytest.raises(grpc.RpcError) as exc:
        queue_pb2_grpc.QueueServiceStub(channel).GetQueueStats(
            pb.GetQueueStatsRequest(name="q"), timeout=REFUSED_TIMEOUT_S
        )
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE, exc.value
    return exc.value


@pytest.fixture(scope="module")
def tls_node(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNode]:
    n = TlsNode(
        tmp_path_factory.mktemp("tls") / "node",
        credentials(pki.ca_file),
        "--tls-cert-file", str(pki.node.cert),
        "--tls-key-file", str(pki.node.key),
    )  # fmt: skip
    n.start()
    yield n
    n.stop()


@pytest.fixture(scope="module")
def mtls_node(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNode]:
    n = TlsNode(
        tmp_path_factory.mktemp("mtls") / "node",
        credentials(pki.ca_file, pki.client),
        *tls_flags(pki, mtls=True),
    )
    n.start()
    yield n
    n.stop()


def test_a_client_trusting_the_ca_talks_tls(tls_node: TlsNode, pki: Pki) -> None:
    with tls_node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        create(stub, "q")
        stub.Publish(
            pb.PublishRequest(queue="q", messages=[pb.PublishMessage(value=b"x")]),
            timeout=RPC_TIMEOUT_S,
        )
        stats = stub.GetQueueStats(pb.GetQueueStatsRequest(name="q"), timeout=RPC_TIMEOUT_S)
        assert stats.messages == 1
    # The name in the certificate is checked: localhost is one of its SANs too.
    with grpc.secure_channel(f"localhost:{tls_node.port}", credentials(pki.ca_file)) as ch:
        stats = queue_pb2_grpc.QueueServiceStub(ch).GetQueueStats(
            pb.GetQueueStatsRequest(name="q"), timeout=RPC_TIMEOUT_S
        )
        assert stats.messages == 1
    assert f"serving on {tls_node.address} over TLS " in tls_node.log_path.read_text()


def test_a_plaintext_client_is_refused(tls_node: TlsNode) -> None:
    with grpc.insecure_channel(tls_node.address) as ch:
        refused(ch)


def test_a_client_trusting_another_ca_is_refused(tls_node: TlsNode, pki: Pki) -> None:
    with grpc.secure_channel(tls_node.address, credentials(pki.other_ca_file)) as ch:
        refused(ch)


def test_a_node_with_another_cas_certificate_is_not_trusted(pki: Pki, tmp_path: Path) -> None:
    n = TlsNode(
        tmp_path / "node",
        credentials(pki.other_ca_file),
        "--tls-cert-file", str(pki.other_node.cert),
        "--tls-key-file", str(pki.other_node.key),
    )  # fmt: skip
    n.start()
    try:
        with grpc.secure_channel(n.address, credentials(pki.ca_file)) as ch:
            refused(ch)
    finally:
        n.stop()


def test_mtls_requires_a_client_certificate_of_the_ca(mtls_node: TlsNode, pki: Pki) -> None:
    with grpc.secure_channel(mtls_node.address, credentials(pki.ca_file)) as ch:
        refused(ch)  # no client certificate
    with grpc.secure_channel(mtls_node.address, credentials(pki.ca_file, pki.other_client)) as ch:
        refused(ch)  # a client certificate of a CA the node does not trust
    with grpc.insecure_channel(mtls_node.address) as ch:
        refused(ch)
    with mtls_node.channel() as ch:  # the right one
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        create(stub, "m")
        assert stub.GetQueueStats(pb.GetQueueStatsRequest(name="m"), timeout=10).name == "m"
    assert f"serving on {mtls_node.address} over mTLS " in mtls_node.log_path.read_text()


# -- three nodes forwarding to each other over mTLS -------------------------------------------


def test_nodes_forward_calls_to_each_other_over_mtls(pki: Pki, tmp_path: Path) -> None:
    # Cluster mode authenticates by default: the nodes bootstrap an admin key, the test presents it.
    api_key = new_key("production")
    key_file = tmp_path / "admin.key"
    key_file.write_text(api_key + "\n")
    with EtcdServer() as etcd:
        raft = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        nodes = []
        for i, addr in enumerate(raft):
            peers = ",".join(a for a in raft if a != addr)
            node = TlsNode(
                tmp_path / f"n{i}",
                credentials(pki.ca_file, pki.client, api_key=api_key),
                "--raft-listen", addr,
                "--peers", peers,
                "--etcd", etcd.endpoint,
                "--node-id", f"n{i}",
                "--node-ttl-ms", "2000",
                "--auth-bootstrap-key-file", str(key_file),
                *tls_flags(pki, mtls=True),
            )  # fmt: skip
            node.env = {**os.environ, "FLUXMQ_CLUSTER_SECRET": SECRET}
            nodes.append(node)
        try:
            for node in nodes:
                node.start()
            run_forwarding_checks(nodes, etcd.endpoint)
        finally:
            for node in nodes:
                node.stop()


def cluster_status(node: TlsNode) -> admin_pb2.ClusterStatus | None:
    try:
        with node.channel() as ch:
            return admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(
                admin_pb2.GetClusterStatusRequest(), timeout=5
            )
    except grpc.RpcError:
        return None


def run_forwarding_checks(nodes: list[TlsNode], etcd_endpoint: str) -> None:
    n0, n1, n2 = nodes

    def sees_everyone(node: TlsNode) -> bool:
        st = cluster_status(node)
        return st is not None and len(st.nodes) == 3 and any(s.leader for s in st.shards)

    for node in nodes:
        wait_for(f"{node.address} to see the cluster", lambda n=node: sees_everyone(n))

    # A one-replica group on n1 only: n0 and n2 must forward every call for its queues.
    async def make_group() -> None:
        store = EtcdMetadataStore(etcd_endpoint, record_secret=SECRET)
        try:
            await store.create_shard(ShardRecord("gx", ("n1",), {"n1": free_port()}, 1, 0))
        finally:
            await store.close()

    asyncio.run(make_group())

    def knows_gx(node: TlsNode) -> bool:
        st = cluster_status(node)
        return st is not None and "gx" in {g.group_id for g in st.groups}

    for node in (n0, n2):
        wait_for(f"{node.address} to see group gx", lambda n=node: knows_gx(n))

    with n0.channel() as ch0, n2.channel() as ch2:
        s0, s2 = queue_pb2_grpc.QueueServiceStub(ch0), queue_pb2_grpc.QueueServiceStub(ch2)
        # CreateQueue on n0 goes to n1 (the group's only node) over the node-to-node channel.
        assert create(s0, "far", group="gx").config.replication.group == "gx"
        assert "gx" in {
            s.shard_id for s in (cluster_status(n1) or admin_pb2.ClusterStatus()).shards
        }
        assert "gx" not in {
            s.shard_id for s in (cluster_status(n0) or admin_pb2.ClusterStatus()).shards
        }
        _, call = s0.Publish.with_call(
            pb.PublishRequest(
                queue="far", messages=[pb.PublishMessage(value=b"%d" % i) for i in range(5)]
            ),
            timeout=30,
        )
        assert dict(call.trailing_metadata())["x-fluxmq-leader"] == n1.address
        got = s2.Fetch(pb.FetchRequest(queue="far", partition=0, max_messages=10), timeout=30)
        assert [r.value for r in got.records] == [b"%d" % i for i in range(5)]
        stats = s2.GetQueueStats(pb.GetQueueStatsRequest(name="far"), timeout=30)
        assert stats.messages == 5
        # A server stream relayed from n1 (forward_stream).
        tail = s0.Tail(pb.TailRequest(queue="far", partitions=[0]), timeout=30)
        assert next(iter(tail)).records[0].value == b"0"
        tail.cancel()
        # PublishStream forwards each request on its own (forward_unary).
        responses = list(
            s2.PublishStream(
                iter([pb.PublishStreamRequest(sequence=1, publish=pb.PublishRequest(
                    queue="far", messages=[pb.PublishMessage(value=b"streamed")]
                ))]),
                timeout=30,
            )
        )  # fmt: skip
        assert [r.sequence for r in responses] == [1]
        assert not responses[0].HasField("error"), responses[0].error
        assert s0.GetQueueStats(pb.GetQueueStatsRequest(name="far"), timeout=30).messages == 6


def test_forwarded_calls_carry_the_callers_authorization() -> None:
    context = SimpleNamespace(
        invocation_metadata=lambda: (
            ("authorization", "Bearer fmq_live_abc.secret"),
            ("x-other", "dropped"),
            (FORWARDED_KEY, "ignored"),
        )
    )
    md = dict(forwarded_metadata(context))
    assert md["authorization"] == "Bearer fmq_live_abc.secret"
    assert md[FORWARDED_KEY] == "1"
    assert "x-other" not in md


# -- bad TLS settings stop the node -----------------------------------------------------------


def serve_and_fail(data_dir: Path, *flags: str) -> str:
    """Run `fluxmq serve` with ``flags``; it must exit 1 soon; -> its stderr."""
    cmd = [
        sys.executable, "-m", "fluxmq", "serve",
        "--data-dir", str(data_dir),
        "--listen", f"127.0.0.1:{free_port()}",
        "--metrics-listen", "",
        *flags,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=EXIT_TIMEOUT_S)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    return done.stderr


def test_bad_tls_settings_stop_the_node_naming_the_setting(pki: Pki, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a pem file\n")
    expired = node_cert(pki.ca, "expired", expired=True).write(tmp_path, "expired")
    server_only = pki.ca.issue("server-only", sans=LOCAL_SANS, server=True).write(
        tmp_path, "server-only"
    )
    cases: list[tuple[tuple[str, ...], str, str]] = [
        (
            ("--tls-cert-file", str(pki.node.key), "--tls-key-file", str(pki.node.key)),
            "tls_cert_file",
            "no PEM certificate",
        ),
        (
            ("--tls-cert-file", str(pki.node.cert), "--tls-key-file", str(garbage)),
            "tls_key_file",
            "no PEM private key",
        ),
        (
            ("--tls-cert-file", str(pki.node.cert), "--tls-key-file", str(pki.client.key)),
            "tls_key_file",
            "does not belong to the certificate",
        ),
        (
            (*tls_flags(pki, mtls=False)[:4], "--tls-ca-file", str(garbage)),
            "tls_ca_file",
            "no PEM certificate",
        ),
        (
            ("--tls-cert-file", str(expired.cert), "--tls-key-file", str(expired.key)),
            "tls_cert_file",
            "expired",
        ),
        (
            (
                *("--tls-cert-file", str(server_only.cert)),
                *("--tls-key-file", str(server_only.key)),
                *("--tls-ca-file", str(pki.ca_file), "--tls-client-auth"),
            ),
            "tls_cert_file",
            "clientAuth",
        ),
        (
            ("--tls-cert-file", str(pki.node.cert)),
            "tls_cert_file and tls_key_file",
            "both or neither",
        ),
    ]
    for i, (flags, setting, words) in enumerate(cases):
        stderr = serve_and_fail(tmp_path / f"d{i}", *flags)
        assert "configuration error" in stderr, stderr
        assert setting in stderr and words in stderr, (flags, stderr)


def test_the_advertised_host_check_matches_as_grpc_does(pki: Pki) -> None:
    cert = x509.load_pem_x509_certificate(pki.node.cert.read_bytes())
    assert names_host(cert, "127.0.0.1") and names_host(cert, "localhost")
    assert not names_host(cert, "127.0.0.2") and not names_host(cert, "node-0.fluxmq")
    wildcard = pki.ca.issue("wild", sans=("127.0.0.1", "*.fluxmq.svc"), server=True, client=True)
    cert = x509.load_pem_x509_certificate(wildcard.cert_pem)
    assert names_host(cert, "fluxmq-0.fluxmq.svc")
    assert not names_host(cert, "a.b.fluxmq.svc") and not names_host(cert, "fluxmq.svc")
