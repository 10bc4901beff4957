"""TLS on the Raft links (raft_tls, raft/wire_transport.py): replicas of one shard speak mutual
TLS with the node certificates, under the cluster secret's handshake and the per-frame HMAC;
what travels between them is not readable by whoever taps the connection; a replica whose
certificate another CA signed, or that speaks plaintext, never joins, and the log says why in
one line.

Certificates come from tests/certs.py: node certificates naming 127.0.0.1 and localhost, signed
by the cluster's CA or by another CA."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from fluxmq.config import ConfigError, load
from raft.wire_transport import WireTls
from tests.certs import LOCAL_SANS, Authority, CertFiles
from tests.raft.helpers import FAST, SECRET, LocalCluster, free_ports

MARKER = b"raft-tls-marker-0123456789-payload"
TAP_BYTES_MAX = 64 << 20  # what one tap keeps per connection and direction, at most
EXIT_TIMEOUT_S = 30.0
REFUSAL_WAIT_S = 3.0
STEP_S = 0.1
CONNECT_TIMEOUT_MS = 800
BIG_ENTRY_BYTES = 3 << 20


@dataclass
class Pki:
    ca_file: Path
    node: CertFiles  # serverAuth + clientAuth, SAN 127.0.0.1 / localhost
    other_ca_file: Path
    other_node: CertFiles  # the same, signed by a CA the cluster does not trust
    elsewhere: CertFiles  # signed by the cluster's CA, naming only elsewhere.example


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("raft-pki")
    ca, other = Authority("fluxmq raft CA"), Authority("other raft CA")

    def node(by: Authority, stem: str) -> CertFiles:
        return by.issue(stem, sans=LOCAL_SANS, server=True, client=True).write(d, stem)

    return Pki(
        ca_file=ca.write(d / "ca.pem"),
        node=node(ca, "node"),
        other_ca_file=other.write(d / "other-ca.pem"),
        other_node=node(other, "other-node"),
        elsewhere=ca.issue(
            "elsewhere", sans=("elsewhere.example",), server=True, client=True
        ).write(d, "elsewhere"),
    )


def tls_of(cert: CertFiles, ca_file: Path) -> WireTls:
    return WireTls.from_files(str(cert.cert), str(cert.key), str(ca_file))


# -- a loopback tap: what an eavesdropper on the network sees ----------------------------------


class Tap:
    """Listens on ``listen_port`` and relays every connection to ``target_port``, keeping the
    bytes of each direction (bounded) for the test to read."""

    def __init__(self, listen_port: int, target_port: int) -> None:
        self.target_port = target_port
        self.streams: list[bytearray] = []  # one per connection and direction
        self._lock = threading.Lock()
        self._closed = False
        self._socks: list[socket.socket] = []
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", listen_port))
        self._server.listen(16)
        self._server.settimeout(0.2)
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                stream = bytearray()
                self.streams.append(stream)
                t = threading.Thread(target=self._pump, args=(src, dst, stream), daemon=True)
                self._threads.append(t)
                t.start()

    def _pump(self, src: socket.socket, dst: socket.socket, stream: bytearray) -> None:
        src.settimeout(0.2)
        while not self._closed:
            try:
                data = src.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            if len(stream) < TAP_BYTES_MAX:
                stream += data
            try:
                dst.sendall(data)
            except OSError:
                break
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        self._server.close()
        with self._lock:
            for s in self._socks:
                s.close()
        for t in self._threads:
            t.join(timeout=2)


@dataclass
class Tapped:
    """Three replicas whose raft addresses are taps in front of the ports they bind: every
    byte between two replicas crosses a tap."""

    cluster: LocalCluster
    taps: list[Tap]
    binds: dict[str, str]  # raft address -> where that replica binds

    def streams(self) -> list[bytes]:
        return [bytes(s) for tap in self.taps for s in tap.streams if s]

    async def replicate(self, tls: WireTls | None) -> None:
        c = self.cluster
        try:
            for a in c.addresses:
                await c.start(a, bind_address=self.binds[a], tls=tls)
            leader = await c.leader()
            await leader.propose(MARKER)
            await c.converged()
            assert all(sm.payloads() == [MARKER] for sm in c.sms.values())
        finally:
            await c.stop_all()


@pytest.fixture
def tapped(tmp_path: Path) -> Iterator[Tapped]:
    c = LocalCluster(str(tmp_path))
    real_ports = free_ports(3)
    pairs = list(zip(c.addresses, real_ports, strict=True))
    taps = [Tap(int(address.rpartition(":")[2]), port) for address, port in pairs]
    yield Tapped(c, taps, {a: f"127.0.0.1:{p}" for a, p in pairs})
    for tap in taps:
        tap.close()


async def test_raft_links_speak_tls_when_raft_tls_is_on(pki: Pki, tapped: Tapped) -> None:
    await tapped.replicate(tls_of(pki.node, pki.ca_file))
    streams = tapped.streams()
    assert len(streams) >= 4, "each of the three links carries bytes both ways"
    for stream in streams:
        # A TLS handshake record (ClientHello one way, ServerHello the other) opens each.
        assert stream[:2] == b"\x16\x03", stream[:16]
        assert MARKER not in stream
        assert b"append_entries" not in stream and b"request_vote" not in stream


async def test_the_tap_reads_the_payload_of_plaintext_links(tapped: Tapped) -> None:
    """The control of the test above: without raft_tls the same tap reads the proposal."""
    await tapped.replicate(None)
    streams = tapped.streams()
    assert any(MARKER in s for s in streams)
    assert not any(s[:2] == b"\x16\x03" for s in streams)


async def test_entries_of_many_tls_records_replicate_intact(pki: Pki, tmp_path: Path) -> None:
    """Megabyte entries span hundreds of TLS records and several socket reads and writes: every
    replica applies them byte for byte (nothing lost in the SSLObject between two events)."""
    c = LocalCluster(str(tmp_path), entry_bytes_max=BIG_ENTRY_BYTES)
    payloads = [bytes([i]) * (BIG_ENTRY_BYTES - 1024 * (i + 1)) for i in range(3)] + [b"small"]
    try:
        for a in c.addresses:
            await c.start(a, tls=tls_of(pki.node, pki.ca_file))
        leader = await c.leader()
        await asyncio.gather(*(leader.propose(p) for p in payloads))
        await c.converged()
        for sm in c.sms.values():
            assert sorted(sm.payloads()) == sorted(payloads)
    finally:
        await c.stop_all()


# -- refused peers -----------------------------------------------------------------------------


def wire_warnings(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "raft.wire" and r.levelno >= level]


def by_replica(lines: list[str], replica: str) -> list[str]:
    return [line for line in lines if line.endswith(f"(shard replica {replica})")]


async def run_with_an_outsider(
    c: LocalCluster, members: list[str], outsider: str, outsider_tls: WireTls | None, tls: WireTls
) -> None:
    """The members form the shard over TLS and commit; the outsider (another certificate, or
    plaintext) is never let in: no member ever holds a link to it, and it applies nothing."""
    for a in members:
        await c.start(a, tls=tls)
    await c.start(outsider, tls=outsider_tls)
    leader = await c.leader()
    assert leader.address in members
    await leader.propose(b"members only")
    # Several reconnect rounds (reconnect_ms) of the dials between the outsider and them.
    for _ in range(round(REFUSAL_WAIT_S / STEP_S)):
        await asyncio.sleep(STEP_S)
        for a in members:
            so = c.shards[a].syncobj
            assert so is not None and so.transport.peers_open == 1  # the other member only
    assert c.sms[outsider].payloads() == []
    assert all(c.sms[a].payloads() == [b"members only"] for a in members)


def order_addresses(c: LocalCluster, outsider_dials: bool) -> tuple[list[str], str]:
    """(members, outsider): the outsider's address sorts above the members' when it is the one
    that dials (the greater address dials), below when they dial it."""
    ordered = sorted(c.addresses)
    if outsider_dials:
        return ordered[:2], ordered[2]
    return ordered[1:], ordered[0]


@pytest.mark.parametrize("outsider_dials", [True, False], ids=["it-dials", "it-is-dialed"])
async def test_a_peer_with_a_certificate_of_another_ca_is_dropped_with_a_log_line(
    outsider_dials: bool, pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    c = LocalCluster(str(tmp_path))
    members, outsider = order_addresses(c, outsider_dials)
    try:
        # It trusts the cluster's CA, but its own certificate is of another CA.
        await run_with_an_outsider(
            c, members, outsider, tls_of(pki.other_node, pki.ca_file), tls_of(pki.node, pki.ca_file)
        )
    finally:
        await c.stop_all()
    lines = wire_warnings(caplog)
    for member in members:
        mine = [line for line in by_replica(lines, member) if "TLS failed" in line]
        # One line per member (rate-limited per peer host), naming the peer and the reason.
        assert len(mine) == 1, lines
        assert "certificate verify failed" in mine[0], mine
        if outsider_dials:
            assert "from 127.0.0.1:" in mine[0]  # an accepted connection: its source port
        else:
            assert f"to {outsider}" in mine[0]


@pytest.mark.parametrize("outsider_dials", [True, False], ids=["it-dials", "it-is-dialed"])
async def test_a_plaintext_peer_cannot_join_a_tls_group_and_the_log_says_why(
    outsider_dials: bool, pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    c = LocalCluster(str(tmp_path))
    members, outsider = order_addresses(c, outsider_dials)
    try:
        await run_with_an_outsider(c, members, outsider, None, tls_of(pki.node, pki.ca_file))
    finally:
        await c.stop_all()
    # A close mid-handshake is INFO (a stopping peer does it too); the refusals are WARNINGs.
    lines = wire_warnings(caplog, logging.INFO if not outsider_dials else logging.WARNING)
    for member in members:
        mine = by_replica(lines, member)
        if outsider_dials:
            why = [line for line in mine if "speaks plaintext and raft_tls is on here" in line]
        else:
            why = [line for line in mine if f"raft peer {outsider} closed the connection during "
                   "the TLS handshake: raft_tls may be off there" in line]  # fmt: skip
        assert len(why) == 1, lines
    if not outsider_dials:
        # The plaintext node, for its part, says that what it refused looked like TLS.
        theirs = by_replica(lines, outsider)
        assert theirs and all("raft_tls is on at that peer and off here" in t for t in theirs)


@pytest.mark.parametrize("outsider_dials", [True, False], ids=["it-dials", "it-is-dialed"])
async def test_a_certificate_that_does_not_name_the_peers_raft_host_is_refused_both_ways(
    outsider_dials: bool, pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Signed by the right CA and holding the secret, but the certificate names another host:
    the dialer checks the acceptor's certificate against the host it dials, the acceptor the
    dialer's against the host of the raft address the dialer proved."""
    caplog.set_level(logging.INFO, logger="raft.wire")
    c = LocalCluster(str(tmp_path))
    members, outsider = order_addresses(c, outsider_dials)
    try:
        await run_with_an_outsider(
            c, members, outsider, tls_of(pki.elsewhere, pki.ca_file), tls_of(pki.node, pki.ca_file)
        )
    finally:
        await c.stop_all()
    lines = wire_warnings(caplog)
    for member in members:
        mine = by_replica(lines, member)
        if outsider_dials:
            why = [line for line in mine if f"it proved the secret as '{outsider}', but its "
                   "certificate does not name '127.0.0.1'" in line]  # fmt: skip
        else:
            why = [line for line in mine if f"to {outsider}: TLS failed" in line
                   and "IP address mismatch" in line]  # fmt: skip
        assert len(why) == 1, lines


async def test_a_tls_handshake_that_does_not_finish_within_connect_timeout_is_closed(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The connect timeout covers the TLS handshake: a connection that sends the first bytes
    of a ClientHello and stops is closed, with the handshake-timeout line."""
    caplog.set_level(logging.INFO, logger="raft.wire")
    timings = replace(FAST, connect_timeout_ms=CONNECT_TIMEOUT_MS)
    c = LocalCluster(str(tmp_path), timings=timings)
    address = c.addresses[0]
    try:
        shard = await c.start(address, tls=tls_of(pki.node, pki.ca_file))
        so = shard.syncobj
        assert so is not None
        host, _, port = address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"\x16\x03\x01\x02\x00\x01")  # a record header and a few bytes
            await asyncio.sleep(CONNECT_TIMEOUT_MS / 1000 / 4)
            assert so.transport.handshakes_pending == 1  # still waiting for the rest
            sock.settimeout(CONNECT_TIMEOUT_MS / 1000 * 4)
            assert sock.recv(1) == b""  # closed by the node, not by this timeout
        assert so.transport.handshakes_pending == 0
    finally:
        await c.stop_all()
    assert any(
        "did not complete the handshake within connect_timeout" in line
        for line in wire_warnings(caplog)
    )


# -- configuration -----------------------------------------------------------------------------


def serve_and_fail(data_dir: Path, *flags: str) -> str:
    """Run `fluxmq serve` in cluster mode with ``flags``; it must exit 1 soon; -> its stderr."""
    grpc_port, raft_port, peer_port = free_ports(3)
    cmd = [
        sys.executable, "-m", "fluxmq", "serve",
        "--data-dir", str(data_dir),
        "--listen", f"127.0.0.1:{grpc_port}",
        "--metrics-listen", "",
        "--raft-listen", f"127.0.0.1:{raft_port}",
        "--peers", f"127.0.0.1:{peer_port}",
        "--auth", "off",
        *flags,
    ]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "FLUXMQ_CLUSTER_SECRET": SECRET * 2}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=EXIT_TIMEOUT_S, env=env)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    return done.stderr


def test_raft_tls_without_a_ca_file_stops_the_node_naming_the_setting(
    pki: Pki, tmp_path: Path
) -> None:
    stderr = serve_and_fail(
        tmp_path / "d",
        *("--tls-cert-file", str(pki.node.cert), "--tls-key-file", str(pki.node.key)),
        "--raft-tls",
    )
    assert "configuration error" in stderr, stderr
    assert "raft_tls: needs tls_cert_file, tls_key_file and tls_ca_file" in stderr, stderr
    assert "missing: tls_ca_file" in stderr, stderr


def test_raft_tls_on_a_single_node_is_refused_naming_the_setting(pki: Pki) -> None:
    flags = [
        *("--tls-cert-file", str(pki.node.cert), "--tls-key-file", str(pki.node.key)),
        *("--tls-ca-file", str(pki.ca_file), "--raft-tls"),
    ]
    with pytest.raises(ConfigError, match=re.escape("raft_tls: needs raft_listen (cluster mode)")):
        load(flags, environ={})
    assert load(flags[:-1], environ={}).raft_tls is False  # off by default
