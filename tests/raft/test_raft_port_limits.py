"""The Raft port's defences on FluxMQ's wire (raft/wire_transport.py), one node ticked by hand:
an oversized declared frame closes the connection before its body is buffered, a connection
that does not complete the handshake is closed at connect_timeout, the number of connections
in the handshake is capped, a peer holding the secret still gets through and may then send
large frames, and one connection's read per event is bounded."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
import termios
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raft.wire_guard import HANDSHAKE_FRAME_BYTES_MAX, FrameReader, WireLimits
from tests.raft.ticked_node import TickedNode as Node
from tests.raft.ticked_node import WirePeer, closed_by_peer


def limits(**overrides: Any) -> WireLimits:
    values: dict[str, Any] = {"frame_bytes_max": 8 << 20, "connect_timeout_ms": 60_000}
    return WireLimits(**{**values, **overrides})


@pytest.fixture
def make_node(tmp_path: Any) -> Iterator[Callable[..., Node]]:
    nodes: list[Node] = []

    def make(**overrides: Any) -> Node:
        n = Node(str(tmp_path / str(len(nodes))), limits=limits(**overrides))
        nodes.append(n)
        n.tick_until_bound()
        return n

    yield make
    for n in nodes:
        n.so.destroy()


class CountingReader(FrameReader):
    """A FrameReader that counts every byte handed to it."""

    def __init__(self, frame_bytes_max: int) -> None:
        super().__init__(frame_bytes_max)
        self.fed_bytes = 0

    def feed(self, data: bytes) -> None:
        self.fed_bytes += len(data)
        super().feed(data)


def queued_bytes(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive buffer."""
    raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    return int(struct.unpack("i", raw)[0])


def raft_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "raft.wire"]


def test_an_oversized_declared_frame_is_refused_and_closed_before_its_body_is_buffered(
    make_node: Callable[..., Node], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    node = make_node()
    sock = node.connect()
    (link,) = node.incoming_links()
    link.reader = counting = CountingReader(link.reader.frame_bytes_max)
    sock.sendall(struct.pack("<i", 0x7FFFFFFF) + os.urandom(256 << 10))
    node.tick_until("the connection is closed", lambda: node.pending() == 0)
    assert counting.fed_bytes == 4  # the length prefix, and nothing of the body
    node.tick_until_closed(sock, "the attacker sees the close")
    sock.close()
    lines = [t for t in raft_lines(caplog) if "refused a raft frame" in t]
    assert len(lines) == 1, raft_lines(caplog)
    assert "2147483647 bytes" in lines[0] and "before its handshake" in lines[0]
    assert f"limit {HANDSHAKE_FRAME_BYTES_MAX} bytes" in lines[0]


def test_oversized_frames_are_logged_once_per_peer_host_per_interval(
    make_node: Callable[..., Node], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    node = make_node()
    for _ in range(5):
        sock = node.dial()
        sock.sendall(struct.pack("<i", 0x7FFFFFFF) + b"x" * 64)
        node.tick_until_closed(sock, "the attacker sees the close")
        sock.close()
    lines = [t for t in raft_lines(caplog) if "refused a raft frame" in t]
    assert len(lines) == 1, lines


def test_a_connection_that_does_not_complete_the_handshake_is_closed_at_connect_timeout(
    make_node: Callable[..., Node], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    node = make_node(connect_timeout_ms=300)
    sock = node.connect()
    accepted_at = time.monotonic()
    node.tick_until("the idle connection is closed", lambda: closed_by_peer(sock), wait_s=5.0)
    assert time.monotonic() - accepted_at >= 0.25
    sock.close()
    assert node.pending() == 0 and not node.incoming_links()
    assert any("within connect_timeout (300 ms)" in t for t in raft_lines(caplog))


def test_the_handshake_deadline_is_driven_by_the_tick_clock(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(connect_timeout_ms=60_000)
    sock = node.connect()
    transport = node.transport
    assert transport.expire_handshakes(time.monotonic() + 59.0) == 0
    assert node.pending() == 1
    assert transport.expire_handshakes(time.monotonic() + 60.5) == 1
    assert node.pending() == 0 and not node.incoming_links()
    node.tick_until_closed(sock, "the attacker sees the close")
    sock.close()


def test_connections_beyond_the_handshake_cap_are_refused_at_once(
    make_node: Callable[..., Node], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    node = make_node(handshakes_pending_max=4)
    socks: list[socket.socket] = []
    try:
        for i in range(7):
            sock = node.dial()
            socks.append(sock)
            if i < 4:
                node.tick_until("accepted", lambda: node.pending() == len(socks))
            else:
                node.tick_until_closed(sock, "refused")
        assert [closed_by_peer(s) for s in socks] == [False] * 4 + [True] * 3
        assert node.pending() == 4 and len(node.incoming_links()) == 4
        refusals = [t for t in raft_lines(caplog) if "already in the handshake" in t]
        assert len(refusals) == 1, raft_lines(caplog)  # one line per host and interval
    finally:
        for s in socks:
            s.close()


def test_a_peer_with_the_secret_completes_the_handshake_then_may_send_large_frames(
    make_node: Callable[..., Node], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    node = make_node(connect_timeout_ms=500)
    peer = WirePeer(node, node.peers[0])  # a configured peer
    peer.authenticate()
    assert node.pending() == 0 and node.transport.peers_open == 1
    link = node.open_link(peer.id)
    assert link.reader.frame_bytes_max == 8 << 20
    large = peer.seal({"type": "fx-padding", "term": 0, "pad": os.urandom(1 << 20)})
    assert len(large) > HANDSHAKE_FRAME_BYTES_MAX
    peer.sock.sendall(large)
    node.tick_until("the large message arrives", lambda: bool(node.received))
    assert node.received[0][1]["type"] == "fx-padding"
    end = time.monotonic() + 1.0  # past connect_timeout: an authenticated peer stays
    node.tick_until("a second goes by", lambda: time.monotonic() > end)
    assert not closed_by_peer(peer.sock)
    assert node.transport.peers_open == 1
    peer.close()
    assert not [t for t in raft_lines(caplog) if "refused" in t or "connect_timeout" in t]


def test_one_readiness_event_reads_at_most_the_per_event_budget(
    make_node: Callable[..., Node],
) -> None:
    """A sender that keeps the socket full must not keep the driver thread reading: one event
    reads at most ``read_bytes_per_event_max``, and the level-triggered poller comes back."""
    budget = 256 << 10
    node = make_node(frame_bytes_max=16 << 20, read_bytes_per_event_max=budget)
    peer = WirePeer(node, node.peers[0])
    peer.authenticate()
    link = node.open_link(peer.id)
    peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    peer.sock.setblocking(False)
    sent = 0
    # A frame declaring 15 MiB (under the cap) whose first 2 MiB are on their way.
    payload = struct.pack("<i", 15 << 20) + os.urandom(2 << 20)
    while sent < len(payload):
        try:
            sent += peer.sock.send(payload[sent:])
        except BlockingIOError:
            break
    assert sent > 2 * budget
    deadline = time.monotonic() + 5.0
    while queued_bytes(link.sock) <= 2 * budget:  # loopback: the bytes are on their way
        assert time.monotonic() < deadline, queued_bytes(link.sock)
        time.sleep(0.001)
    node.transport._read(link)
    assert 0 < len(link.reader) <= budget
    node.transport._read(link)
    assert budget < len(link.reader) <= 2 * budget
    peer.close()
