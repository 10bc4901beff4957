"""What the Raft transport logs (logger ``raft.wire``) about a connection that never completes
the cluster-secret handshake: a secret warning only when a proof really failed authentication;
a connection that closed mid-handshake (a peer stopped, paused or cut off, as in every
failover) is an INFO line saying just that; a peer holding the secret but not in this shard's
membership is named."""

from __future__ import annotations

import logging
import os
import select
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from raft import wire
from tests.raft.helpers import free_port_dialling
from tests.raft.ticked_node import SECRET, WirePeer, dialer_proof
from tests.raft.ticked_node import TickedNode as Node

OTHER_SECRET = "not-the-" + SECRET


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
    """A node that opens the connection to ``peer`` itself: the replica with the greater address
    dials, so a random port would leave it waiting one run in two."""
    peer_address = f"127.0.0.1:{peer.getsockname()[1]}"
    address = f"127.0.0.1:{free_port_dialling(peer_address)}"
    yield from started(Node(str(tmp_path), address, [peer_address]))


def raft_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "raft.wire"]


def dropped(node: Node, caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    node.tick_until("the connection is dropped", lambda: node.pending() == 0)
    return raft_lines(caplog)


def accepted_from(node: Node, peer: socket.socket) -> socket.socket:
    box: list[socket.socket] = []

    def accept() -> bool:
        try:
            box.append(peer.accept()[0])
        except BlockingIOError:
            return False
        return True

    node.tick_until("the node connects to its peer", accept)
    return box[0]


def test_connection_closed_before_its_first_message_is_not_called_a_secret_mismatch(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
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
    caplog.set_level(logging.INFO, logger="raft.wire")
    peer = WirePeer(node, node.peers[0])
    peer.send_hello()
    peer.read_challenge()  # the node answered: half-way
    peer.close()
    lines = dropped(node, caplog)
    assert [level for level, _ in lines] == [logging.INFO], lines
    assert "closed before the end of the handshake" in lines[0][1]
    assert "secret" not in lines[0][1]


def test_connection_reset_half_way_through_the_handshake_is_not_a_secret_mismatch(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """Closed with the node's challenge unread: the kernel resets the connection, which the
    node sees as an error event or a failed read, not as an end of stream."""
    caplog.set_level(logging.INFO, logger="raft.wire")
    peer = WirePeer(node, node.peers[0])
    peer.send_hello()
    node.tick_until("the challenge arrives", lambda: bool(select.select([peer.sock], [], [], 0)[0]))
    peer.close()
    lines = dropped(node, caplog)
    assert [level for level, _ in lines] == [logging.INFO], lines
    assert "closed before the end of the handshake" in lines[0][1]
    assert "secret" not in lines[0][1]


def test_a_proof_made_with_another_secret_is_logged_as_a_secret_mismatch(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    peer = WirePeer(node, node.peers[0], secret=OTHER_SECRET)
    peer.send_hello()
    acceptor_nonce, _ = peer.read_challenge()
    peer.sock.sendall(dialer_proof(OTHER_SECRET, peer.nonce, acceptor_nonce, peer.id))
    lines = dropped(node, caplog)
    node.tick_until_closed(peer.sock)
    peer.close()
    assert len(lines) == 1, lines
    level, text = lines[0]
    assert level == logging.WARNING
    assert "failed authentication" in text and "different cluster secret" in text
    assert node.transport.peers_open == 0


def test_a_node_with_our_secret_but_not_a_peer_is_named(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    peer = WirePeer(node, "127.0.0.1:9")  # the secret, but not one of its peers
    peer.handshake()
    lines = dropped(node, caplog)
    node.tick_until_closed(peer.sock)
    peer.close()
    assert len(lines) == 1, lines
    level, text = lines[0]
    assert level == logging.WARNING and "'127.0.0.1:9'" in text and "not a peer" in text
    assert "secret" not in text
    assert node.transport.peers_open == 0


def test_peer_that_closes_our_connection_before_answering_is_not_called_a_secret_mismatch(
    dialling_node: Node, peer: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    """Our side of the same failover: the peer accepts the connection and goes away before its
    first message. That is all we know, so INFO, naming the peer."""
    node = dialling_node
    caplog.set_level(logging.INFO, logger="raft.wire")
    accepted_from(node, peer).close()
    node.tick_until("the closed connection is logged", lambda: bool(raft_lines(caplog)))
    lines = raft_lines(caplog)
    assert len(lines) == 1, lines
    level, text = lines[0]
    assert level == logging.INFO
    assert node.peers[0] in text and "closed the connection before its first message" in text
    assert "secret" not in text


def test_an_acceptor_with_another_secret_is_logged_as_a_secret_mismatch_by_the_dialer(
    dialling_node: Node, peer: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    """The acceptor proves the secret first (its challenge), so the dialing side knows too,
    and says so before it proves anything of its own."""
    node = dialling_node
    caplog.set_level(logging.INFO, logger="raft.wire")
    sock = accepted_from(node, peer)
    kind, body = wire.split(node.recv_frame(sock))
    assert kind == wire.KIND_HELLO
    dialer_nonce, dialer_id = wire.parse_hello(body)
    assert dialer_id == node.address
    other_key = wire.master_key(OTHER_SECRET)
    sock.sendall(wire.challenge(other_key, dialer_nonce, os.urandom(wire.NONCE_BYTES), dialer_id))
    node.tick_until_closed(sock)
    sock.close()
    lines = raft_lines(caplog)
    assert len(lines) == 1, lines
    level, text = lines[0]
    assert level == logging.WARNING
    assert node.peers[0] in text and "different cluster secret" in text
    assert node.transport.peers_open == 0
