"""One HardenedSyncObj whose peers never run, ticked by hand, and the bytes of FluxMQ's Raft
wire (raft/wire.py) as a peer or an attacker would send them: for tests that speak to a node's
Raft port from the outside."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any

from pysyncobj.encryptor import getEncryptor

from raft import _pysyncobj, wire
from raft._pysyncobj import HardenedSyncObj, SyncObjConf
from raft.segment_journal import SegmentFileJournal
from raft.wire_guard import WireLimits
from tests.raft.helpers import free_ports

SECRET = "the-cluster-secret"
WAIT_S = 10.0
_LENGTH = struct.Struct("<i")


class TickedNode:
    """Its transport accepts the connections a test opens; without ``address`` and ``peers``
    it takes three free loopback ports (its own and two peers')."""

    def __init__(
        self,
        root: str,
        address: str | None = None,
        peers: list[str] | None = None,
        limits: WireLimits | None = None,
        secret: str = SECRET,
    ) -> None:
        self.journal = SegmentFileJournal(os.path.join(root, "journal"))
        self.applied: list[tuple[int, bytes]] = []  # (log index, frame) as committed here
        if address is None or peers is None:
            address, *peers = (f"127.0.0.1:{p}" for p in free_ports(3))
        self.address = address
        self.peers = peers
        conf = SyncObjConf(
            password=None,
            autoTick=False,
            fullDumpFile=os.path.join(root, "snapshot"),
            useFork=False,
            bindAddress=self.address,
            maxBindRetries=1,
        )
        self.so = HardenedSyncObj(
            self.address,
            self.peers,
            conf,
            self.journal,
            _pysyncobj.create_poller(),
            self._apply,
            lambda path, info: None,
            wire_secret=secret,
            wire_limits=limits,
        )
        # Every message the transport hands to pysyncobj, (sender address, message), in order.
        self.received: list[tuple[str, Any]] = []
        self._wrap_message_callback()

    def _apply(self, index: int, frame: bytes) -> int:
        self.applied.append((index, frame))
        return index

    def _wrap_message_callback(self) -> None:
        transport = self.transport
        inner = transport._onMessageReceivedCallback

        def record(node: Any, message: Any) -> None:
            self.received.append((node.address, message))
            if inner is not None:
                inner(node, message)

        transport.setOnMessageReceivedCallback(record)

    @property
    def transport(self) -> Any:
        return self.so.transport

    def tick(self) -> None:
        self.so.doTick(0.005)

    def tick_until(self, what: str, done: Callable[[], bool], wait_s: float = WAIT_S) -> None:
        deadline = time.monotonic() + wait_s
        while not done():
            assert time.monotonic() < deadline, f"not reached within {wait_s}s: {what}"
            self.tick()

    def tick_until_bound(self) -> None:
        self.tick_until("the raft port is bound", lambda: bool(self.transport.ready))

    def dial(self) -> socket.socket:
        """A connection to the node's Raft port (not yet accepted: the node accepts on a tick)."""
        host, port = self.address.rsplit(":", 1)
        return socket.create_connection((host, int(port)), timeout=WAIT_S)

    def connect(self) -> socket.socket:
        """A connection the node has accepted (it is in the handshake)."""
        before = self.pending()
        sock = self.dial()
        self.tick_until("the connection is accepted", lambda: self.pending() > before)
        return sock

    def pending(self) -> int:
        """The node's incoming connections still in the handshake."""
        return int(self.transport.handshakes_pending)

    def incoming_links(self) -> list[Any]:
        """The transport's accepted connections not yet authenticated (its ``_Link`` objects)."""
        return list(self.transport._incoming)

    def open_link(self, peer_id: str) -> Any:
        """The transport's authenticated connection with the peer ``peer_id``."""
        return next(link for node, link in self.transport._open.items() if node.id == peer_id)

    def recv_frame(self, sock: socket.socket) -> bytes:
        """One frame off ``sock`` (what follows its length prefix), ticking the node while it
        is on its way."""
        return read_frame(sock, self.tick)

    def closed(self, sock: socket.socket) -> bool:
        return closed_by_peer(sock)

    def tick_until_closed(self, sock: socket.socket, what: str = "the node closes it") -> None:
        self.tick_until(what, lambda: closed_by_peer(sock))


def read_frame(sock: socket.socket, wait: Callable[[], None]) -> bytes:
    """One frame off ``sock`` (what follows its length prefix), calling ``wait`` while it is
    on its way. AssertionError if the socket closes first."""
    sock.setblocking(False)
    deadline = time.monotonic() + WAIT_S

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            assert time.monotonic() < deadline, f"no frame within {WAIT_S}s"
            try:
                chunk = sock.recv(n - len(data))
            except BlockingIOError:
                wait()
                continue
            assert chunk, "closed"
            data += chunk
        return data

    (length,) = _LENGTH.unpack(exactly(_LENGTH.size))
    return exactly(length)


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the other end closed ``sock`` (EOF or reset); False while it is open.
    Whatever it sent before is read and thrown away."""
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


def raw_frame(kind: int, body: bytes, version: int = wire.WIRE_VERSION) -> bytes:
    """A frame of any version and kind, as a peer of another FluxMQ version (or an attacker)
    would send it."""
    return _LENGTH.pack(2 + len(body)) + bytes([version, kind]) + body


def old_wire_frame(message: Any, secret: str = SECRET) -> bytes:
    """One message as pysyncobj's own TcpConnection sent it (a FluxMQ node from before wire
    version 1): pickled, zlib level 3, a Fernet token under ``secret``, a native int prefix."""
    token: bytes = getEncryptor(secret).encrypt_at_time(zlib.compress(pickle.dumps(message), 3), 1)
    return struct.pack("i", len(token)) + token


def seal_payload(session: wire.Session, payload: bytes) -> bytes:
    """A MESSAGE frame whose pickled body is ``payload`` as given (any bytes, also a pickle no
    honest replica would write), with a valid MAC for ``session``'s next sequence number:
    what a peer holding the secret could send."""
    header = bytes([wire.WIRE_VERSION, wire.KIND_MESSAGE])
    mac: bytes = wire._mac(session.send_key, struct.pack("<Q", session.send_seq), header, payload)
    session.send_seq += 1
    return _LENGTH.pack(len(header) + len(payload) + wire.MAC_BYTES) + header + payload + mac


def dialer_proof(secret: str, dialer_nonce: bytes, acceptor_nonce: bytes, dialer_id: str) -> bytes:
    """A PROOF frame as a dialer holding ``secret`` computes it (without checking the
    acceptor's proof first, as an attacker with another secret would have to)."""
    key = wire.master_key(secret)
    return wire.frame(
        wire.KIND_PROOF, wire._proof(key, b"dialer", dialer_nonce, acceptor_nonce, dialer_id)
    )


class WirePeer:
    """The test's end of one connection to a TickedNode, dialing it as a replica with id
    ``peer_id`` and the cluster secret ``secret`` would (raft/wire.py does the bytes).

    With ``reads_hot`` (the default) it announces, as a current node does, that it reads the
    binary append-entries and next-index messages; without, it is a node from before them.
    ``reads_termed_answers`` False: it reads them, but not the answer with its term (a node
    from before raft/_pysyncobj.py hook 12)."""

    def __init__(
        self,
        node: TickedNode,
        peer_id: str,
        secret: str = SECRET,
        *,
        reads_hot: bool = True,
        reads_termed_answers: bool = True,
    ) -> None:
        self.node = node
        self.reads_hot = reads_hot
        self.reads_termed_answers = reads_termed_answers
        self.node_reads_hot: bool | None = None  # what the node's features message said
        self.id = peer_id
        self.secret = secret
        self.key = wire.master_key(secret)
        self.nonce = os.urandom(wire.NONCE_BYTES)
        self.session: wire.Session | None = None
        self.sock = node.connect()

    def close(self) -> None:
        self.sock.close()

    def send_hello(self) -> None:
        self.sock.sendall(wire.hello(self.nonce, self.id))

    def read_challenge(self) -> tuple[bytes, bytes]:
        """-> (the acceptor's nonce, its proof), not checked."""
        kind, body = wire.split(self.node.recv_frame(self.sock))
        assert kind == wire.KIND_CHALLENGE, (kind, body)
        return body[: wire.NONCE_BYTES], body[wire.NONCE_BYTES :]

    def handshake(self) -> wire.Session:
        """Hello, the node's challenge checked, our proof sent; the session is this side's
        (whether the node then keeps the connection is for the test to see)."""
        self.send_hello()
        kind, body = wire.split(self.node.recv_frame(self.sock))
        assert kind == wire.KIND_CHALLENGE, (kind, body)
        acceptor_nonce, proof = wire.parse_challenge(self.key, body, self.nonce, self.id)
        self.sock.sendall(proof)
        self.session = wire.Session.derive(
            self.key, self.nonce, acceptor_nonce, self.id, dialer=True
        )
        return self.session

    def authenticate(self) -> wire.Session:
        """The handshake, and the node's side of it done: the connection is open both ways."""
        session = self.handshake()
        self.node.tick_until("the node authenticates the peer", lambda: self.node.pending() == 0)
        assert any(n.id == self.id for n in self.node.transport._open), "the node dropped us"
        kind, first = self.recv_kind()
        assert kind == wire.KIND_MESSAGE, kind
        self.node_reads_hot = wire.reads_hot(first)
        assert self.node_reads_hot is not None, f"the node's first message was {first!r}"
        if self.reads_hot:
            session.peer_reads_hot = self.node_reads_hot
            session.peer_reads_termed_answers = wire.reads_termed_answers(first)
            features = wire.features()
            if not self.reads_termed_answers:
                features["reads"] = list(wire.HOT_READS)
            self.send(features)
            link = next(v for n, v in self.node.transport._open.items() if n.id == self.id)
            self.node.tick_until("the node reads our features", lambda: link.session.peer_reads_hot)
        return session

    def seal(self, message: Any) -> bytes:
        assert self.session is not None, "not authenticated"
        return self.session.seal(message)

    def send(self, message: Any) -> None:
        self.sock.sendall(self.seal(message))

    def recv(self) -> Any:
        return self.recv_kind()[1]

    def recv_kind(self) -> tuple[int, Any]:
        """The next frame's kind and message."""
        assert self.session is not None, "not authenticated"
        kind, body = wire.split(self.node.recv_frame(self.sock))
        return kind, self.session.open(kind, body)
