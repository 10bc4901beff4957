"""What the Raft transport logs about an incoming connection that never completes the
shared-secret handshake: a cluster-secret warning only when its first message really failed
authentication; a connection that closed before its first message (a peer stopped, paused or
cut off mid-handshake, as in every failover) is an INFO line saying just that."""

from __future__ import annotations

import logging
import os
import select
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.raft.helpers import free_port_dialling
from tests.raft.ticked_node import SECRET, frame, read_frame
from tests.raft.ticked_node import TickedNode as Node


def started(n: Node) -> Iterator[Node]:
    n.tick_until_bound()
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
