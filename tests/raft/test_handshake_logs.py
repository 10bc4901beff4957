"""What the Raft transport logs about an incoming connection that never completes the
shared-secret handshake: a cluster-secret warning only when its first message really failed
authentication; a connection that closed before its first message (a peer stopped, paused or
cut off mid-handshake, as in every failover) is an INFO line saying just that."""

from __future__ import annotations

import logging
import os
import pickle
import select
import socket
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pysyncobj.encryptor import getEncryptor

from raft import _pysyncobj
from raft._pysyncobj import HardenedSyncObj, SyncObjConf
from raft.journal import LmdbJournal
from tests.raft.helpers import free_port_dialling, free_ports

SECRET = "the-cluster-secret"
WAIT_S = 10.0


class Node:
    """One HardenedSyncObj whose peers never run, ticked by hand: its transport accepts the
    connections a test opens."""

    def __init__(
        self, root: str, address: str | None = None, peers: list[str] | None = None
    ) -> None:
        self.journal = LmdbJournal(os.path.join(root, "journal"))
        if address is None or peers is None:
            address, *peers = (f"127.0.0.1:{p}" for p in free_ports(3))
        self.address = address
        conf = SyncObjConf(
            password=SECRET,
            autoTick=False,
            fullDumpFile=os.path.join(root, "snapshot"),
            useFork=False,
            bindAddress=self.address,
            maxBindRetries=1,
        )
        self.so = HardenedSyncObj(
            self.address,
            peers,
            conf,
            self.journal,
            _pysyncobj.create_poller(),
            lambda index, frame: index,
            lambda path, info: None,
        )
        self.peers = peers

    def tick_until(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert time.monotonic() < deadline, f"not reached within {WAIT_S}s: {what}"
            self.so.doTick(0.01)

    def connect(self) -> socket.socket:
        host, port = self.address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
        self.tick_until("the connection is accepted", lambda: bool(self.unknown()))
        return sock

    def unknown(self) -> set[Any]:
        return set(self.so.transport._unknownConnections)


def started(n: Node) -> Iterator[Node]:
    n.tick_until("the raft port is bound", lambda: bool(n.so.transport.ready))
    yield n
    n.so.destroy()


@pytest.fixture
def node(tmp_path: Any) -> Iterator[Node]:
    yield from started(Node(str(tmp_path)))


@pytest.fixture
def peer() -> Iterator[socket.socket]:
    """A listening socket standing in for the node's only peer (bound before the node, so its
    port cannot be taken in between)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        sock.settimeout(0)
        yield sock


@pytest.fixture
def dialling_node(tmp_path: Any, peer: socket.socket) -> Iterator[Node]:
    """A node that opens the connection to ``peer`` itself: pysyncobj dials only the peers whose
    address sorts below its own, so a random port would leave it waiting one run in two."""
    peer_address = f"127.0.0.1:{peer.getsockname()[1]}"
    address = f"127.0.0.1:{free_port_dialling(peer_address)}"
    yield from started(Node(str(tmp_path), address, [peer_address]))


def frame(message: Any, secret: str) -> bytes:
    """One message as pysyncobj's TcpConnection sends it, encrypted with ``secret``."""
    token = getEncryptor(secret).encrypt_at_time(zlib.compress(pickle.dumps(message), 3), 1)
    return struct.pack("i", len(token)) + token


def read_frame(sock: socket.socket, secret: str) -> Any:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "closed"
            data += chunk
        return data

    (length,) = struct.unpack("i", exactly(4))
    return pickle.loads(zlib.decompress(getEncryptor(secret).decrypt(exactly(length))))


def select_readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def raft_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "raft.pysyncobj"]


def dropped(node: Node, caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    node.tick_until("the connection is dropped", lambda: not node.unknown())
    return raft_lines(caplog)


def test_connection_closed_before_its_first_message_is_not_called_a_secret_mismatch(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.pysyncobj")
    node.connect().close()
    lines = dropped(node, caplog)
    assert len(lines) == 1, lines
    level, text = lines[0]
    assert level == logging.INFO
    assert "closed before its first message" in text
    assert "secret" not in text


def test_connection_closed_half_way_through_the_handshake_is_not_a_secret_mismatch(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.pysyncobj")
    sock = node.connect()
    sock.sendall(frame(os.urandom(32), SECRET))  # our key: the node answers with its own
    node.tick_until("the node answers", lambda: select_readable(sock))
    sock.close()
    lines = dropped(node, caplog)
    assert [level for level, _ in lines] == [logging.INFO], lines
    assert "secret" not in lines[0][1]


def test_first_message_with_another_secret_is_logged_as_a_secret_mismatch(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.pysyncobj")
    sock = node.connect()
    sock.sendall(frame(os.urandom(32), "not-the-" + SECRET))
    lines = dropped(node, caplog)
    sock.close()
    assert len(lines) == 1, lines
    level, text = lines[0]
    assert level == logging.WARNING
    assert "failed authentication" in text and "different cluster secret" in text


def test_a_node_with_our_secret_but_not_a_peer_is_named(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.pysyncobj")
    sock = node.connect()
    ours = os.urandom(32)
    sock.sendall(frame(ours, SECRET))
    node.tick_until("the node answers", lambda: select_readable(sock))
    echoed, theirs = read_frame(sock, SECRET)
    assert echoed == ours
    sock.sendall(frame((theirs, "127.0.0.1:9"), SECRET))  # our address: not one of its peers
    lines = dropped(node, caplog)
    sock.close()
    assert len(lines) == 1, lines
    level, text = lines[0]
    assert level == logging.WARNING and "'127.0.0.1:9'" in text and "not a peer" in text
    assert "secret" not in text


def test_peer_that_closes_our_connection_before_answering_is_not_called_a_secret_mismatch(
    dialling_node: Node, peer: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    """Our side of the same failover: the peer accepts the connection and goes away before its
    first message. That is all we know (a peer with another secret reports the mismatch in its
    own log, where our handshake fails to authenticate)."""
    node = dialling_node
    caplog.set_level(logging.INFO, logger="raft.pysyncobj")
    accepted: list[socket.socket] = []

    def accept() -> bool:
        try:
            accepted.append(peer.accept()[0])
        except BlockingIOError:
            return False
        return True

    node.tick_until("the node connects to its peer", accept)
    accepted[0].close()
    node.tick_until("the closed connection is logged", lambda: bool(raft_lines(caplog)))
    lines = raft_lines(caplog)
    assert len(lines) == 1, lines
    level, text = lines[0]
    assert level == logging.INFO
    assert node.peers[0] in text and "closed the connection before its first message" in text
    assert "secret" not in text
