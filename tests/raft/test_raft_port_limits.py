"""The Raft port's defences on today's transport (pysyncobj's, hardened in raft/_pysyncobj.py),
one node ticked by hand: an oversized declared frame closes the connection before its body is
buffered, a connection that does not complete the handshake is closed at connect_timeout, the
number of connections in the handshake is capped, a peer holding the secret still gets
through and may then send large frames, and one connection's read per event is bounded."""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pysyncobj.tcp_connection import TcpConnection

from raft import _pysyncobj
from raft.wire_guard import WireLimits
from tests.raft.ticked_node import TickedNode as Node
from tests.raft.ticked_node import frame, read_frame


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


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the node closed ``sock`` (EOF or reset); False while it is open."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(1 << 16)
            if not data:
                return True
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def raft_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "raft.pysyncobj"]


def test_an_oversized_declared_frame_is_refused_and_closed_before_its_body_is_buffered(
    make_node: Callable[..., Node], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.pysyncobj")
    node = make_node()
    sock = node.connect()
    (conn,) = node.unknown()
    sock.sendall(struct.pack("i", 0x7FFFFFFF) + os.urandom(256 << 10))
    node.tick_until("the connection is closed", lambda: not node.unknown())
    assert len(conn._fx_reader) == 0
    node.tick_until("the attacker sees the close", lambda: closed_by_peer(sock))
    sock.close()
    lines = [t for t in raft_lines(caplog) if "refused a raft frame" in t]
    assert len(lines) == 1, raft_lines(caplog)
    assert "2147483647 bytes" in lines[0] and "before its handshake" in lines[0]
    assert f"limit {64 << 10} bytes" in lines[0]


def test_oversized_frames_are_logged_once_per_peer_host_per_interval(
    make_node: Callable[..., Node], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.pysyncobj")
    node = make_node()
    for _ in range(5):
        sock = node.dial()
        sock.sendall(struct.pack("i", 0x7FFFFFFF) + b"x" * 64)
        node.tick_until("the attacker sees the close", lambda s=sock: closed_by_peer(s))
        sock.close()
    lines = [t for t in raft_lines(caplog) if "refused a raft frame" in t]
    assert len(lines) == 1, lines


def test_a_connection_that_does_not_complete_the_handshake_is_closed_at_connect_timeout(
    make_node: Callable[..., Node], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.pysyncobj")
    node = make_node(connect_timeout_ms=300)
    sock = node.connect()
    accepted_at = time.monotonic()
    node.tick_until("the idle connection is closed", lambda: closed_by_peer(sock), wait_s=5.0)
    assert time.monotonic() - accepted_at >= 0.25
    sock.close()
    assert not node.unknown() and node.so.transport.fx_handshakes_pending == 0
    assert any("within connect_timeout (300 ms)" in t for t in raft_lines(caplog))


def test_the_handshake_deadline_is_driven_by_the_tick_clock(
    make_node: Callable[..., Node],
) -> None:
    node = make_node(connect_timeout_ms=60_000)
    sock = node.connect()
    transport = node.so.transport
    assert transport.fx_expire_handshakes(time.monotonic() + 59.0) == 0
    assert node.unknown()
    assert transport.fx_expire_handshakes(time.monotonic() + 60.5) == 1
    assert not node.unknown()
    node.tick_until("the attacker sees the close", lambda: closed_by_peer(sock))
    sock.close()


def test_connections_beyond_the_handshake_cap_are_refused_at_once(
    make_node: Callable[..., Node], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.pysyncobj")
    node = make_node(handshakes_pending_max=4)
    socks: list[socket.socket] = []
    try:
        for i in range(7):
            sock = node.dial()
            socks.append(sock)
            if i < 4:
                node.tick_until("accepted", lambda i=i: len(node.unknown()) == i + 1)
            else:
                node.tick_until("refused", lambda s=sock: closed_by_peer(s))
        assert [closed_by_peer(s) for s in socks] == [False] * 4 + [True] * 3
        assert len(node.unknown()) == 4 and node.so.transport.fx_handshakes_pending == 4
        refusals = [t for t in raft_lines(caplog) if "already in the handshake" in t]
        assert len(refusals) == 1, raft_lines(caplog)  # one line per host and interval
    finally:
        for s in socks:
            s.close()


def test_a_peer_with_the_secret_completes_the_handshake_then_may_send_large_frames(
    make_node: Callable[..., Node], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.pysyncobj")
    node = make_node(connect_timeout_ms=500)
    sock = node.dial()
    ours = os.urandom(32)
    sock.sendall(frame(ours))
    node.tick_until("the connection is accepted", lambda: bool(node.unknown()))
    (conn,) = node.unknown()
    box: list[Any] = []
    reader = threading.Thread(target=lambda: box.append(read_frame(sock)))
    reader.start()
    node.tick_until("the node answers", lambda: not reader.is_alive())
    echoed, theirs = box[0]
    assert echoed == ours
    sock.sendall(frame((theirs, node.peers[0])))  # a configured peer: authenticated
    node.tick_until("the handshake completes", lambda: not node.unknown())
    assert node.so.transport.fx_handshakes_pending == 0
    assert conn._fx_reader.frame_bytes_max == 8 << 20
    large = frame((theirs, {"type": "fx-padding", "term": 0, "pad": os.urandom(1 << 20)}))
    assert len(large) > 64 << 10
    sock.sendall(large)
    end = time.monotonic() + 1.0  # past connect_timeout: an authenticated peer stays
    node.tick_until("a second goes by", lambda: time.monotonic() > end)
    assert not closed_by_peer(sock)
    sock.close()
    assert not [t for t in raft_lines(caplog) if "refused" in t or "connect_timeout" in t]


def test_one_readiness_event_reads_at_most_the_per_event_budget() -> None:
    """A sender that keeps the socket full must not keep the driver thread reading: the stock
    connection reads until the socket is drained."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    poller = _pysyncobj.create_poller()
    conn = TcpConnection(poller=poller, socket=ours, recvBufferSize=64 << 10)
    budget = 256 << 10
    _pysyncobj._bound(conn, 16 << 20, limits(read_bytes_per_event_max=budget), "test")
    theirs.setblocking(False)
    sent = 0
    payload = struct.pack("i", 15 << 20) + os.urandom(2 << 20)
    try:
        sent = theirs.send(payload)
    except BlockingIOError:
        pass
    assert sent > 2 * budget
    conn._TcpConnection__tryReadBuffer()
    assert 0 < len(conn._fx_reader) <= budget
    conn._TcpConnection__tryReadBuffer()
    assert len(conn._fx_reader) <= 2 * budget
    conn.disconnect()
    theirs.close()
