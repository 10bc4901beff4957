"""WireTransport (raft/wire_transport.py) on real loopback sockets: nothing from a peer that has
not proven the cluster secret, nor any frame that fails its MAC, is ever unpickled; peers of
another wire version are refused with a line naming both versions; two real replicas complete
the handshake (one dials, one accepts) and replicate over it."""

from __future__ import annotations

import logging
import os
import pickle
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raft import wire
from raft._pysyncobj import FAIL_REASON
from tests.raft.helpers import free_port_dialling, free_ports
from tests.raft.ticked_node import (
    SECRET,
    TickedNode,
    WirePeer,
    dialer_proof,
    old_wire_frame,
    raw_frame,
    seal_payload,
)

OTHER_SECRET = "not-the-" + SECRET


@pytest.fixture
def unpickled(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many frames the wire has started to unpickle, in every node of the test."""
    count = [0]

    class Counting(wire._PlainUnpickler):
        def load(self) -> Any:
            count[0] += 1
            return super().load()

    monkeypatch.setattr(wire, "_PlainUnpickler", Counting)
    return count


@pytest.fixture
def make_node(tmp_path: Any) -> Iterator[Callable[..., TickedNode]]:
    nodes: list[TickedNode] = []

    def make(address: str | None = None, peers: list[str] | None = None) -> TickedNode:
        n = TickedNode(str(tmp_path / f"n{len(nodes)}"), address, peers)
        nodes.append(n)
        n.tick_until_bound()
        return n

    yield make
    for n in nodes:
        n.so.destroy()


@pytest.fixture
def node(make_node: Callable[..., TickedNode]) -> TickedNode:
    return make_node()


def wire_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "raft.wire"]


def refused_and_closed(node: TickedNode, peer: WirePeer) -> None:
    node.tick_until_closed(peer.sock)
    peer.close()
    assert node.transport.peers_open == 0 and node.pending() == 0


# -- nothing is decoded before authentication ------------------------------------------------


def test_a_peer_without_the_secret_is_dropped_before_any_decode(
    node: TickedNode, unpickled: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    peer = WirePeer(node, node.peers[0], secret=OTHER_SECRET)
    peer.send_hello()
    acceptor_nonce, _ = peer.read_challenge()
    # Its proof, and at once a message sealed with the session its own secret gives.
    theirs = wire.Session.derive(peer.key, peer.nonce, acceptor_nonce, peer.id, dialer=True)
    proof = dialer_proof(OTHER_SECRET, peer.nonce, acceptor_nonce, peer.id)
    peer.sock.sendall(proof + theirs.seal({"type": "request_vote", "term": 99}))
    refused_and_closed(node, peer)
    assert unpickled == [0] and node.received == []
    lines = wire_lines(caplog)
    assert len(lines) == 1, lines
    assert lines[0][0] == logging.WARNING and "different cluster secret" in lines[0][1]


def test_a_message_before_the_handshake_is_dropped_before_any_decode(
    node: TickedNode, unpickled: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """A MESSAGE frame in place of the hello (with a MAC under a key the sender made up)."""
    caplog.set_level(logging.INFO, logger="raft.wire")
    sock = node.connect()
    made_up = wire.Session(send_key=os.urandom(32), recv_key=os.urandom(32))
    sock.sendall(made_up.seal({"type": "append_entries", "term": 1}))
    node.tick_until_closed(sock)
    sock.close()
    assert unpickled == [0] and node.received == []
    assert any("unexpected frame of kind 16 in the handshake" in t for _, t in wire_lines(caplog))


@pytest.mark.parametrize("how", ["one-bit-flipped", "replayed"])
def test_a_frame_that_fails_its_hmac_is_dropped_before_any_decode(
    how: str, node: TickedNode, unpickled: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    peer = WirePeer(node, node.peers[0])
    peer.authenticate()
    unpickled[0] = 0  # the features messages of the link's opening
    good = peer.seal({"type": "fx-noop", "term": 0, "n": 1})
    peer.sock.sendall(good)
    node.tick_until("the first message arrives", lambda: len(node.received) == 1)
    assert unpickled == [1]
    if how == "replayed":
        bad = good
    else:
        flipped = bytearray(peer.seal({"type": "fx-noop", "term": 0, "n": 2}))
        flipped[len(flipped) // 2] ^= 0x10
        bad = bytes(flipped)
    peer.sock.sendall(bad)
    refused_and_closed(node, peer)
    assert unpickled == [1] and len(node.received) == 1
    lines = [t for level, t in wire_lines(caplog) if level == logging.WARNING]
    assert len(lines) == 1 and "failed its MAC" in lines[0], wire_lines(caplog)
    assert peer.id in lines[0]


def test_a_frame_reflected_back_to_the_node_does_not_authenticate(
    node: TickedNode, unpickled: list[int]
) -> None:
    """Per-direction session keys: what the node sent cannot be played back to it."""
    peer = WirePeer(node, node.peers[0])
    peer.authenticate()
    unpickled[0] = 0  # the features messages of the link's opening
    target = next(n for n in node.transport._open if n.id == peer.id)
    assert node.transport.send(target, {"type": "fx-noop", "term": 0})
    sent = node.recv_frame(peer.sock)
    assert wire.split(sent)[0] == wire.KIND_MESSAGE
    peer.sock.sendall(len(sent).to_bytes(4, "little") + sent)
    refused_and_closed(node, peer)
    assert unpickled == [0] and node.received == []


def test_a_reflected_challenge_proof_cannot_authenticate(
    node: TickedNode, unpickled: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """Without the secret, the best a dialer can send back is the acceptor's own proof: its
    role label makes it worthless as the dialer's."""
    caplog.set_level(logging.INFO, logger="raft.wire")
    peer = WirePeer(node, node.peers[0], secret=OTHER_SECRET)
    peer.send_hello()
    _, acceptors_proof = peer.read_challenge()
    peer.sock.sendall(wire.frame(wire.KIND_PROOF, acceptors_proof))
    refused_and_closed(node, peer)
    assert unpickled == [0]
    assert any("failed authentication" in t for _, t in wire_lines(caplog))


def test_an_unknown_peer_id_with_the_right_secret_is_dropped_before_any_decode(
    node: TickedNode, unpickled: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    peer = WirePeer(node, "127.0.0.1:9")
    peer.handshake()
    peer.send({"type": "request_vote", "term": 99})
    refused_and_closed(node, peer)
    assert unpickled == [0] and node.received == []
    (line,) = [t for _, t in wire_lines(caplog)]
    assert "'127.0.0.1:9'" in line and "not a peer of this shard" in line


class _Exec:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_an_authenticated_peers_frame_naming_a_global_is_refused_and_nothing_runs(
    node: TickedNode, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    marker = tmp_path / "executed"
    peer = WirePeer(node, node.peers[0])
    session = peer.authenticate()
    payload = pickle.dumps({"type": "append_entries", "term": 1, "x": _Exec(str(marker))})
    peer.sock.sendall(seal_payload(session, payload))
    refused_and_closed(node, peer)
    assert not marker.exists() and node.received == []
    (line,) = [t for _, t in wire_lines(caplog)]
    assert "posix.system is not allowed on the raft wire" in line and peer.id in line


# -- other wire versions ---------------------------------------------------------------------


def test_a_peer_of_another_wire_version_is_refused_with_a_clear_log_line(
    node: TickedNode, unpickled: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raft.wire")
    sock = node.connect()
    hello_body = wire.split(wire.hello(os.urandom(32), node.peers[0])[4:])[1]
    sock.sendall(raw_frame(wire.KIND_HELLO, hello_body, version=2))
    answer = node.recv_frame(sock)
    assert answer[0] == wire.WIRE_VERSION
    kind, body = wire.split(answer)
    assert kind == wire.KIND_REFUSED
    assert f"raft wire version {wire.WIRE_VERSION}" in wire.refused_reason(body)
    node.tick_until_closed(sock)
    sock.close()
    lines = wire_lines(caplog)
    assert len(lines) == 1, lines
    level, text = lines[0]
    assert level == logging.WARNING
    assert "raft wire version 2" in text and f"this node speaks version {wire.WIRE_VERSION}" in text
    assert unpickled == [0]


def test_a_peer_on_pysyncobjs_old_pickled_wire_is_refused_with_a_line_that_says_so(
    node: TickedNode, unpickled: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """A FluxMQ node from before wire version 1 opens with a Fernet token (its random key)."""
    caplog.set_level(logging.INFO, logger="raft.wire")
    sock = node.connect()
    sock.sendall(old_wire_frame(os.urandom(32)))
    kind, body = wire.split(node.recv_frame(sock))
    assert kind == wire.KIND_REFUSED
    assert f"raft wire version {wire.WIRE_VERSION}" in wire.refused_reason(body)
    node.tick_until_closed(sock)
    sock.close()
    (line,) = [t for level, t in wire_lines(caplog) if level == logging.WARNING]
    assert "pysyncobj's pickled wire" in line and "upgrade every node" in line
    assert unpickled == [0]


# -- the dialing side ------------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket standing in for the node's only peer."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        sock.settimeout(0)
        yield sock


@pytest.fixture
def dialling_node(make_node: Callable[..., TickedNode], listener: socket.socket) -> TickedNode:
    peer_address = f"127.0.0.1:{listener.getsockname()[1]}"
    return make_node(f"127.0.0.1:{free_port_dialling(peer_address)}", [peer_address])


def accept_from(node: TickedNode, listener: socket.socket) -> socket.socket:
    box: list[socket.socket] = []

    def accept() -> bool:
        try:
            box.append(listener.accept()[0])
        except BlockingIOError:
            return False
        return True

    node.tick_until("the node dials its peer", accept)
    return box[0]


def test_a_dialing_node_refused_by_its_peer_logs_the_peers_reason(
    dialling_node: TickedNode, listener: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    node = dialling_node
    caplog.set_level(logging.INFO, logger="raft.wire")
    sock = accept_from(node, listener)
    assert wire.split(node.recv_frame(sock))[0] == wire.KIND_HELLO
    sock.sendall(wire.refused("this node speaks raft wire version 9"))
    node.tick_until_closed(sock)
    sock.close()
    (line,) = [t for _, t in wire_lines(caplog)]
    assert node.peers[0] in line and "refused this node" in line and "version 9" in line


def test_a_dialing_node_checks_the_acceptors_proof_before_it_proves_anything(
    dialling_node: TickedNode, listener: socket.socket, unpickled: list[int]
) -> None:
    """An acceptor without the secret gets no PROOF to replay elsewhere, and no message."""
    node = dialling_node
    sock = accept_from(node, listener)
    kind, body = wire.split(node.recv_frame(sock))
    assert kind == wire.KIND_HELLO
    dialer_nonce, dialer_id = wire.parse_hello(body)
    other = wire.master_key(OTHER_SECRET)
    sock.sendall(wire.challenge(other, dialer_nonce, os.urandom(32), dialer_id))
    received = bytearray()
    node.tick_until("the node closes", lambda: _drain(sock, received))
    sock.close()
    assert received == b""  # no proof, no message
    assert node.transport.peers_open == 0 and unpickled == [0]


def _drain(sock: socket.socket, into: bytearray) -> bool:
    """Read what ``sock`` has into ``into``; True once it is closed."""
    sock.setblocking(False)
    try:
        while data := sock.recv(1 << 16):
            into += data
        return True
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


# -- two real replicas -----------------------------------------------------------------------


def tick_both_until(
    a: TickedNode, b: TickedNode, what: str, done: Callable[[], bool], wait_s: float = 20.0
) -> None:
    def step() -> bool:
        b.tick()
        return done()

    a.tick_until(what, step, wait_s)


def test_two_replicas_handshake_one_dialing_one_accepting_and_replicate(
    make_node: Callable[..., TickedNode],
) -> None:
    """The third member never runs: the two make a majority, so electing a leader and
    committing an entry both need messages to flow both ways over the authenticated link."""
    a_address, b_address, absent = sorted(f"127.0.0.1:{p}" for p in free_ports(3))
    a = make_node(a_address, [b_address, absent])
    b = make_node(b_address, [a_address, absent])
    tick_both_until(
        a, b, "both ends open", lambda: a.transport.peers_open == 1 == b.transport.peers_open
    )
    assert b.open_link(a_address).outgoing and not a.open_link(b_address).outgoing
    tick_both_until(a, b, "a leader", lambda: a.so._isLeader() or b.so._isLeader())
    leader, follower = (a, b) if a.so._isLeader() else (b, a)
    results: list[tuple[Any, Any]] = []
    leader.so.fx_apply(b"over the wire", callback=lambda *outcome: results.append(outcome))
    tick_both_until(a, b, "the entry commits", lambda: bool(results))
    index, error = results[0]
    assert error == FAIL_REASON.SUCCESS
    tick_both_until(a, b, "the follower applies it", lambda: bool(follower.applied))
    assert leader.applied == follower.applied == [(index, b"over the wire")]
    assert {sender for sender, _ in a.received} == {b_address}
    assert {sender for sender, _ in b.received} == {a_address}


def test_a_follower_answers_the_appends_of_one_read_after_a_single_fsync(
    node: TickedNode,
) -> None:
    """Each answer promises what the follower holds, so it leaves only after a flush; answers
    to frames read together share that flush (one fsync for the lot, not one per frame)."""
    leader = WirePeer(node, node.peers[0])
    leader.authenticate()
    heartbeat = {"type": "append_entries", "term": 1, "commit_index": 1}
    leader.send({**heartbeat, "prevLogIdx": 1, "prevLogTerm": 0, "entries": []})
    assert leader.recv()["success"]  # the new term is on disk (its own fsync, as it must)
    appends = 8
    burst = b"".join(
        leader.seal(
            {
                "type": "append_entries",
                "term": 1,
                "commit_index": 1,
                "prevLogIdx": 1 + k,
                "prevLogTerm": 0 if k == 0 else 1,
                "entries": [(b"entry-%d" % k, 2 + k, 1)],
            }
        )
        for k in range(appends)
    )
    fsyncs_before = node.journal.fsyncs
    leader.sock.sendall(burst)  # one write: the node reads the frames in one event
    answers = [leader.recv() for _ in range(appends)]
    assert [a["type"] for a in answers] == ["next_node_idx"] * appends
    assert all(a["success"] for a in answers)
    assert answers[-1]["next_node_idx"] == 2 + appends
    assert node.journal.durable_index == 1 + appends, "every acknowledged entry is on disk"
    assert node.journal.fsyncs - fsyncs_before == 1


@pytest.mark.parametrize(
    ("peer_reads_hot", "peer_reads_termed_answers"), [(True, True), (True, False), (False, False)]
)
def test_a_round_is_binary_with_a_current_peer_and_pickled_with_an_older_one(
    peer_reads_hot: bool, peer_reads_termed_answers: bool, node: TickedNode, unpickled: list[int]
) -> None:
    """Append-entries and its answer cross in their binary layout, nothing unpickled on either
    side, once the peer said it reads them; a peer from before them (a rolling upgrade) keeps
    getting pickled answers that mean the same. The answer carries its term (hook 12): in its
    own binary layout to a peer that reads it, pickled to one from before it."""
    leader = WirePeer(
        node,
        node.peers[0],
        reads_hot=peer_reads_hot,
        reads_termed_answers=peer_reads_termed_answers,
    )
    leader.authenticate()
    assert leader.node_reads_hot is True  # the node announced itself on opening the link
    unpickled[0] = 0
    leader.send(
        {
            "type": "append_entries",
            "term": 1,
            "commit_index": 1,
            "prevLogIdx": 1,
            "prevLogTerm": 0,
            "entries": [(b"entry", 2, 1)],
        }
    )
    kind, answer = leader.recv_kind()
    assert answer == {
        "type": "next_node_idx",
        "next_node_idx": 3,
        "reset": False,
        "success": True,
        "term": 1,
    }
    if peer_reads_termed_answers:
        assert kind == wire.KIND_NEXT_INDEX_TERM
        assert unpickled == [0]
    elif peer_reads_hot:
        assert kind == wire.KIND_MESSAGE
        assert unpickled == [1]  # the test's answer only: the append was binary
    else:
        assert kind == wire.KIND_MESSAGE
        assert unpickled == [2]  # the node's append and the test's answer
    assert node.journal.durable_index == 2
