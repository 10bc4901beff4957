"""WireTransport: pysyncobj's ``Transport`` on FluxMQ's own wire (raft/wire.py).

pysyncobj decides what to send and when; this class moves the bytes, on the poller that the
process's Raft driver thread already waits on (no thread of its own). Compared with pysyncobj's
``TCPTransport`` it

- authenticates every peer with the cluster secret (challenge and proof both ways) and every
  frame with an HMAC, verified before anything is decoded; nothing from an unauthenticated peer
  is ever unpickled, and no zlib or Fernet runs per message;
- sends through an ``Outbox`` (raft/outbox.py): the journal is durable before any message that
  promises what this node holds leaves (acknowledgements, votes), which with the flush before
  the commit index moves means nothing is acknowledged, voted for or applied that is not on this
  node's disk; a leader's append-entries go out first and its fsync overlaps its followers';
  answers to frames read together leave after one flush;
- bounds what a connection may cost (raft/wire_guard.py): the declared frame size is checked
  before the body is buffered, a connection not authenticated within ``connect_timeout_ms`` is
  closed, at most ``handshakes_pending_max`` are in the handshake, one readiness event reads at
  most ``read_bytes_per_event_max``, and a peer that stops reading cannot make us buffer more
  than ``send_buffer_bytes_max`` for it;
- says in the log why a peer was refused: another wire version, another secret, not a peer of
  this shard, an oversized frame, a handshake that did not finish in time, a TLS failure; at
  most one line per kind and peer host per ``SECURITY_LOG_INTERVAL_S``, so the log cannot
  amplify an attack;
- optionally speaks mutual TLS (``WireTls``), layered inside: each link's bytes pass through an
  ``ssl.SSLObject`` and two ``ssl.MemoryBIO``s, so the poller still waits on plain sockets and
  every byte read from a socket is decrypted in the same event (nothing readable hides in an
  SSL buffer the poller cannot see). The secret's handshake and the per-frame HMAC run inside
  TLS unchanged: the secret still decides membership, TLS adds confidentiality and proves the
  certificates. The connect timeout covers both handshakes; the send buffer cap counts TLS
  bytes. Without ``WireTls`` no SSLObject exists and the plaintext path is as before.

One connection per pair of replicas: the one with the greater address dials (pysyncobj's rule).
"""

from __future__ import annotations

import enum
import errno
import ipaddress
import logging
import os
import re
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.node import TCPNode
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import set_keepalive
from pysyncobj.transport import Transport, TransportNotReadyError

from raft import catch_up, wire
from raft.outbox import Outbox
from raft.wire_guard import FrameReader, FrameTooLargeError, PendingHandshakes, WireLimits

log = logging.getLogger("raft.wire")

SECURITY_LOG_INTERVAL_S = 10.0
LOGGED_KEYS_MAX = 1024
LISTEN_BACKLOG = 128
ACCEPTS_PER_EVENT_MAX = 64
RECV_CHUNK_BYTES = 1 << 20
SEND_BUFFER_BYTES_MAX = 256 << 20
SOCKET_BUFFER_BYTES = 1 << 20
# The largest TLS record on the wire (TLS 1.2: 2^14 plaintext + 2048; 1.3 needs less). Before
# authentication a TLS link reads at most this at once: a record decrypts only when whole.
TLS_RECORD_BYTES_MAX = (1 << 14) + 2048
# A TLS stream's first bytes: a handshake record (0x16) of TLS 1.x (0x03). No frame of this
# wire starts so before authentication: its length prefix would declare more than allowed.
_TLS_RECORD_HEAD = b"\x16\x03"
_SSL_SOURCE = re.compile(r" \(_ssl\.c:\d+\)$")

_READ = POLL_EVENT_TYPE.READ
_WRITE = POLL_EVENT_TYPE.WRITE
_ERROR = POLL_EVENT_TYPE.ERROR


class _Phase(enum.Enum):
    CONNECTING = 1  # outgoing, TCP connect in progress
    AWAIT_HELLO = 2  # incoming, nothing received yet
    AWAIT_CHALLENGE = 3  # outgoing, hello sent
    AWAIT_PROOF = 4  # incoming, challenge sent
    OPEN = 5  # authenticated both ways
    CLOSED = 6


@dataclass(frozen=True, slots=True)
class WireTls:
    """Mutual TLS for the Raft links: ``server`` for accepted connections (requires and
    verifies the peer's certificate), ``client`` for dialed ones (verifies the peer's
    certificate and that it names the host of the peer's raft address; presents ours)."""

    server: ssl.SSLContext
    client: ssl.SSLContext

    @classmethod
    def from_files(cls, cert_file: str, key_file: str, ca_file: str) -> WireTls:
        """Both contexts from PEM files: this node's certificate (chain) and key, and the CA
        bundle that signs every node's. Raises OSError or ssl.SSLError naming what failed."""
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
        for ctx in (server, client):
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.options |= ssl.OP_NO_RENEGOTIATION  # TLS 1.2: no handshakes mid-link
            ctx.load_cert_chain(cert_file, key_file)
            ctx.load_verify_locations(cafile=ca_file)
        server.verify_mode = ssl.CERT_REQUIRED
        # No resumption: every link proves its certificate afresh (and no ticket bytes).
        server.num_tickets = 0
        return cls(server, client)


class _Link:
    """One TCP connection to a peer, either way."""

    __slots__ = (
        "deadline_s",
        "dialer_id",
        "dialer_nonce",
        "fileno",
        "node",
        "nonce",
        "out",
        "outgoing",
        "peer",
        "phase",
        "reader",
        "session",
        "sock",
        "subscribed",
        "tls",
        "tls_handshaking",
        "tls_in",
        "tls_out",
        "tls_raw_bytes_in",
    )

    def __init__(self, sock: socket.socket, *, outgoing: bool, node: Any, peer: str) -> None:
        self.sock = sock
        self.fileno = sock.fileno()
        self.outgoing = outgoing
        self.node = node  # outgoing: the peer dialed; incoming: set once authenticated
        self.peer = peer  # host:port, for the log
        self.phase = _Phase.CONNECTING if outgoing else _Phase.AWAIT_HELLO
        self.reader = FrameReader(0)
        self.out = bytearray()
        self.session: wire.Session | None = None
        self.nonce = os.urandom(wire.NONCE_BYTES)
        self.dialer_nonce = b""
        self.dialer_id = ""
        self.deadline_s = 0.0
        self.subscribed = 0
        self.tls: ssl.SSLObject | None = None  # None: plaintext (raft_tls off)
        self.tls_in: ssl.MemoryBIO | None = None  # socket bytes, to decrypt
        self.tls_out: ssl.MemoryBIO | None = None  # TLS bytes, to send
        self.tls_handshaking = False
        self.tls_raw_bytes_in = 0  # socket bytes received, to recognise a plaintext peer


def _is_closed(link: _Link) -> bool:
    return link.phase is _Phase.CLOSED


def _opens_in_plaintext(seen_bytes: int, data: bytes) -> bool:
    """Whether ``data``, after ``seen_bytes`` of an incoming stream, shows it does not open
    with a TLS record: a peer with raft_tls off says hello in plaintext."""
    head = _TLS_RECORD_HEAD[seen_bytes:]
    prefix = data[: len(head)]
    return prefix != head[: len(prefix)]


def _cert_names_host(cert: dict[str, Any], host: str) -> bool:
    """Whether a verified peer certificate (``SSLObject.getpeercert()``) names ``host`` in its
    subject alternative names: an IP, or a DNS name where a wildcard covers one leftmost label
    (the check a TLS client makes of the host it dials)."""
    host = host.strip("[]")
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    host = host.lower().rstrip(".")
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "IP Address" and ip is not None:
            try:
                if ipaddress.ip_address(value.strip()) == ip:
                    return True
            except ValueError:
                continue
        elif kind == "DNS" and ip is None:
            name = value.lower().rstrip(".")
            if name == host or (
                name.startswith("*.") and "." in host and host.split(".", 1)[1] == name[2:]
            ):
                return True
    return False


def _configure(sock: socket.socket, keepalive: Any) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if keepalive:
        set_keepalive(sock, *keepalive)
    sock.setblocking(False)


class WireTransport(Transport):  # type: ignore[misc]
    """Built by pysyncobj (``transportClass=``); reads ``_fx_wire_secret``, ``_fx_wire_limits``,
    ``_fx_wire_tls`` and ``_fx_journal`` from the SyncObj being constructed (raft/_pysyncobj.py
    sets them)."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self._so = syncObj
        self._conf = syncObj.conf
        self._poller = syncObj._poller
        self._self_node = selfNode
        self._key = wire.master_key(syncObj._fx_wire_secret)
        self._limits: WireLimits = syncObj._fx_wire_limits
        self._tls: WireTls | None = syncObj._fx_wire_tls
        self._journal = syncObj._fx_journal
        self._pending: PendingHandshakes[_Link] = PendingHandshakes(
            self._limits.handshakes_pending_max, self._limits.connect_timeout_ms
        )
        self._nodes: set[Any] = set()
        self._by_address: dict[str, Any] = {}
        self._open: dict[Any, _Link] = {}  # node -> its authenticated link
        self._dialing: dict[Any, _Link] = {}  # node -> our outgoing link not yet open
        self._incoming: set[_Link] = set()  # accepted, not yet authenticated
        self._last_dial_s: dict[Any, float] = {}
        self._server: socket.socket | None = None
        self._ready = False
        self._bind_attempts = 0
        self._last_bind_s = float("-inf")
        self._last_logged: dict[str, float] = {}
        self._destroying = False
        # Looked up at each call (not bound once), so a journal's flush can be replaced later.
        self.messages_received = 0  # authenticated messages handed to pysyncobj, ever
        self._outbox = Outbox(lambda: self._journal.flush(), self._deliver)
        # Observers (the latency budget): called with (node, message) as a message leaves.
        self.on_send: Callable[[Any, Any], None] | None = None
        self.entries_held_back = 0  # append-entries not queued behind a slow reader
        syncObj.addOnTickCallback(self._on_tick)
        for node in otherNodes:
            self.addNode(node)

    # -- pysyncobj's Transport interface ---------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready

    def tryGetReady(self) -> None:
        self._maybe_bind()

    def waitReady(self) -> None:
        if not self._ready:
            raise TransportNotReadyError

    def addNode(self, node: Any) -> None:
        self._nodes.add(node)
        self._by_address[node.address] = node

    def dropNode(self, node: Any) -> None:
        self._nodes.discard(node)
        self._by_address.pop(node.address, None)
        self._last_dial_s.pop(node, None)
        for link in (self._open.get(node), self._dialing.get(node)):
            if link is not None:
                self._close(link)

    def send(self, node: Any, message: Any) -> bool:
        if node not in self._open:
            return False
        return self._outbox.send(node, message)

    def _deliver(self, node: Any, message: Any) -> bool:
        link = self._open.get(node)
        if link is None:
            return False
        if catch_up.entries_must_wait(message, len(link.out)):
            # The follower is this far behind reading: the entries are sent again from where
            # it stands once it answers (raft/catch_up.py), instead of piling up here.
            self.entries_held_back += 1
            return True
        if self.on_send is not None:
            self.on_send(node, message)
        assert link.session is not None
        self._write(link, link.session.seal(message))
        return link.phase is _Phase.OPEN

    @property
    def flush_before_send(self) -> bool:
        return self._outbox.flush_before_send

    @flush_before_send.setter
    def flush_before_send(self, value: bool) -> None:  # tests prove the fsync checks can fail
        self._outbox.flush_before_send = value

    def destroy(self) -> None:
        self._destroying = True
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)
        for link in [*self._open.values(), *self._dialing.values(), *self._incoming]:
            self._close(link)
        if self._server is not None:
            self._poller.unsubscribe(self._server.fileno())
            self._server.close()
            self._server = None
        self._ready = False

    # -- what tests and status read --------------------------------------------------------

    @property
    def handshakes_pending(self) -> int:
        return len(self._pending)

    @property
    def peers_open(self) -> int:
        return len(self._open)

    def expire_handshakes(self, now_s: float) -> int:
        """Close incoming connections not authenticated within ``connect_timeout_ms``."""
        expired = self._pending.expired(now_s)
        for link in expired:
            self._refuse(
                link,
                "handshake-timeout",
                f"closed an incoming raft connection from {link.peer} that did not complete the "
                f"handshake within connect_timeout ({self._limits.connect_timeout_ms} ms)",
            )
        return len(expired)

    def next_timer_s(self, now_s: float) -> float:
        """Seconds until this transport's next timed action (a handshake deadline, a dial or
        its retry); inf when none is due."""
        due = self._pending.next_deadline_s()
        for link in self._dialing.values():
            due = min(due, link.deadline_s)
        if self._ready:
            for node in self._nodes:
                if self._should_dial(node) and node not in self._open and node not in self._dialing:
                    last = self._last_dial_s.get(node, float("-inf"))
                    due = min(due, last + self._conf.connectionRetryTime)
        return max(0.0, due - now_s)

    # -- listening -------------------------------------------------------------------------

    def _bind_address(self) -> tuple[str, int]:
        bind = self._conf.bindAddress or self._self_node.address
        host, port = bind.rsplit(":", 1)
        if self._conf.bindAddress is None:
            host = "0.0.0.0"
        elif host != "0.0.0.0":
            host = globalDnsResolver().resolve(host)
        return host, int(port)

    def _maybe_bind(self) -> None:
        now = time.monotonic()
        if self._ready or now < self._last_bind_s + self._conf.bindRetryTime:
            return
        self._last_bind_s = now
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(self._bind_address())
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except (OSError, TypeError, ValueError):
            sock.close()
            self._bind_attempts += 1
            retries = self._conf.maxBindRetries
            if retries and self._bind_attempts >= retries:
                raise TransportNotReadyError from None
            return
        self._server = sock
        self._poller.subscribe(sock.fileno(), self._on_accept, _READ | _ERROR)
        self._ready = True

    def _on_accept(self, descr: int, event: int) -> None:
        server = self._server
        if server is None or descr != server.fileno():
            self._poller.unsubscribe(descr)
            return
        for _ in range(ACCEPTS_PER_EVENT_MAX):
            try:
                sock, addr = server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._log("accept", logging.WARNING, f"cannot accept a raft connection: {e}")
                return
            try:
                _configure(sock, self._conf.tcp_keepalive)
            except OSError:
                sock.close()  # reset before we got to it
                continue
            link = _Link(sock, outgoing=False, node=None, peer=f"{addr[0]}:{addr[1]}")
            if not self._pending.admit(link, time.monotonic()):
                sock.close()
                self._log(
                    "handshakes-full",
                    logging.WARNING,
                    f"refused an incoming raft connection from {link.peer}: "
                    f"{self._limits.handshakes_pending_max} connections are already in the "
                    "handshake",
                    peer=addr[0],
                )
                continue
            link.reader.frame_bytes_max = self._limits.handshake_frame_bytes_max
            if self._tls is not None:
                self._start_tls(link, self._tls)
            self._incoming.add(link)
            self._subscribe(link, _READ | _ERROR)

    # -- dialing ---------------------------------------------------------------------------

    def _on_tick(self) -> None:
        if not self._ready:
            return
        now = time.monotonic()
        self.expire_handshakes(now)
        for node, link in list(self._dialing.items()):
            if now >= link.deadline_s:
                self._log(
                    f"dial-timeout@{node.address}",
                    logging.INFO,
                    f"raft peer {node.address} did not complete the handshake within "
                    f"connect_timeout ({self._limits.connect_timeout_ms} ms); retrying",
                )
                self._close(link)
        for node in self._nodes:
            if self._should_dial(node) and node not in self._open and node not in self._dialing:
                last = self._last_dial_s.get(node, float("-inf"))
                if now - last >= self._conf.connectionRetryTime:
                    self._last_dial_s[node] = now
                    self._dial(node, now)

    def _should_dial(self, node: Any) -> bool:
        return isinstance(node, TCPNode) and bool(self._self_node.address > node.address)

    def _dial(self, node: Any, now_s: float) -> None:
        host = node.ip  # resolved through pysyncobj's DNS cache (dnsCacheTime)
        if host is None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            _configure(sock, self._conf.tcp_keepalive)
            code = sock.connect_ex((host, node.port))
        except OSError:
            sock.close()
            return
        if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            return
        link = _Link(sock, outgoing=True, node=node, peer=node.address)
        link.deadline_s = now_s + self._limits.connect_timeout_ms / 1000
        link.reader.frame_bytes_max = self._limits.handshake_frame_bytes_max
        self._dialing[node] = link
        self._subscribe(link, _READ | _WRITE | _ERROR)

    # -- one connection's events -----------------------------------------------------------

    def _subscribe(self, link: _Link, mask: int) -> None:
        if link.subscribed != mask:
            link.subscribed = mask
            self._poller.subscribe(
                link.fileno, lambda descr, event: self._on_event(link, descr, event), mask
            )

    def _on_event(self, link: _Link, descr: int, event: int) -> None:
        if link.phase is _Phase.CLOSED or descr != link.fileno:
            self._poller.unsubscribe(descr)
            return
        if event & _ERROR:
            self._closed_by_peer(link)
            return
        if link.phase is _Phase.CONNECTING:
            if link.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._close(link)  # refused or unreachable: retried on a later tick
                return
            link.phase = _Phase.AWAIT_CHALLENGE
            self._subscribe(link, _READ | _ERROR)
            if self._tls is not None:
                self._start_tls(link, self._tls)
                self._tls_handshake(link)  # the hello follows once TLS is up
            else:
                self._write(link, wire.hello(link.nonce, self._self_node.address))
            return
        if event & _WRITE:
            self._flush(link)
        if event & _READ and not _is_closed(link):
            self._read(link)

    def _write(self, link: _Link, data: bytes) -> None:
        """Sends a frame: through TLS when the link has it, else as it is."""
        if link.tls is not None and link.phase is not _Phase.CLOSED:
            try:
                self._tls_encrypt(link, data)
            except ssl.SSLError as err:
                self._refuse_tls(link, err)
            return
        self._send(link, data)

    def _send(self, link: _Link, data: bytes) -> None:
        """Socket bytes out: what the socket does not take now waits in ``link.out`` (capped)."""
        if link.phase is _Phase.CLOSED:
            return
        if not link.out:
            try:
                sent = link.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._close(link)
                return
            if sent == len(data):
                return
            data = data[sent:]
        link.out += data
        if len(link.out) > SEND_BUFFER_BYTES_MAX:
            self._log(
                f"send-buffer@{link.peer}",
                logging.WARNING,
                f"closed the raft connection to {link.peer}: it has not read "
                f"{len(link.out)} bytes sent to it (limit {SEND_BUFFER_BYTES_MAX})",
            )
            self._close(link)
            return
        self._subscribe(link, _READ | _WRITE | _ERROR)

    def _flush(self, link: _Link) -> None:
        while link.out:
            try:
                sent = link.sock.send(link.out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(link)
                return
            del link.out[:sent]
        self._subscribe(link, _READ | _ERROR)

    def _read(self, link: _Link) -> None:
        # Answers to the frames of one read leave together after one flush (raft/outbox.py).
        outermost = self._outbox.hold()
        try:
            self._read_frames(link)
        finally:
            if outermost:
                self._outbox.release()

    def _read_frames(self, link: _Link) -> None:
        budget_bytes = self._limits.read_bytes_per_event_max
        reader = link.reader
        while link.phase is not _Phase.CLOSED:
            try:
                wanted = reader.bytes_wanted()
                if wanted == 0:
                    frame = reader.next_frame()
                    assert frame is not None
                    self._on_frame(link, frame)
                    continue
            except FrameTooLargeError as err:
                self._refuse_oversized(link, err)
                return
            except wire.WireError as err:
                self._refuse_protocol(link, err)
                return
            if budget_bytes <= 0:
                return  # the poller is level-triggered: the next round comes back for the rest
            # Before authentication read no further than the frame in progress, so a peer
            # cannot make us buffer more than its (small, capped) handshake frame; over TLS
            # no further than one record (a record decrypts only when whole).
            if link.session is not None:
                chunk_bytes = max(wanted, RECV_CHUNK_BYTES)
            elif link.tls is not None:
                chunk_bytes = max(wanted, TLS_RECORD_BYTES_MAX)
            else:
                chunk_bytes = wanted
            try:
                data = link.sock.recv(min(budget_bytes, chunk_bytes))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._closed_by_peer(link)
                return
            if not data:
                self._closed_by_peer(link)
                return
            budget_bytes -= len(data)
            if link.tls is None:
                reader.feed(data)
            elif not self._tls_feed(link, data):
                return

    # -- TLS (raft_tls) --------------------------------------------------------------------

    def _start_tls(self, link: _Link, tls: WireTls) -> None:
        link.tls_in, link.tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        if link.outgoing:
            # Verified like gRPC verifies a node: the certificate must name the host dialed.
            host = link.node.host.strip("[]")
            link.tls = tls.client.wrap_bio(
                link.tls_in, link.tls_out, server_side=False, server_hostname=host
            )
        else:
            link.tls = tls.server.wrap_bio(link.tls_in, link.tls_out, server_side=True)
        link.tls_handshaking = True

    def _tls_feed(self, link: _Link, data: bytes) -> bool:
        """Socket bytes in: decrypts all it can into the frame reader at once, so no plaintext
        waits inside the SSLObject where the poller cannot see it. False: the link cannot
        read on (closed, or its TLS handshake still going)."""
        assert link.tls is not None and link.tls_in is not None
        if not link.outgoing and _opens_in_plaintext(link.tls_raw_bytes_in, data):
            self._refuse_plaintext_peer(link)
            return False
        link.tls_raw_bytes_in += len(data)
        link.tls_in.write(data)
        if link.tls_handshaking and not self._tls_handshake(link):
            return False
        try:
            while True:
                plain = link.tls.read(RECV_CHUNK_BYTES)
                if not plain:  # the peer's close_notify
                    self._closed_by_peer(link)
                    return False
                link.reader.feed(plain)
        except ssl.SSLWantReadError:
            # Every whole record is decrypted. Reading may have produced TLS bytes to send
            # (a TLS 1.3 key update's answer): they leave now, not with the next frame.
            if link.tls_out is not None and link.tls_out.pending:
                self._tls_flush(link)
            return not _is_closed(link)
        except ssl.SSLZeroReturnError:
            self._closed_by_peer(link)
        except ssl.SSLError as err:
            self._refuse_tls(link, err)
        return False

    def _tls_handshake(self, link: _Link) -> bool:
        """One step of the TLS handshake on what has arrived; True once it is complete (the
        dialer then says hello on the secret's handshake, inside TLS)."""
        assert link.tls is not None
        try:
            link.tls.do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            self._tls_flush(link)
            return False
        except ssl.SSLError as err:
            self._tls_flush(link)  # the alert, so the peer's log says why too
            self._refuse_tls(link, err)
            return False
        link.tls_handshaking = False
        self._tls_flush(link)
        if link.outgoing:
            self._write(link, wire.hello(link.nonce, self._self_node.address))
        return not _is_closed(link)

    def _tls_encrypt(self, link: _Link, data: bytes) -> None:
        assert link.tls is not None
        with memoryview(data) as view:
            written = 0
            while written < len(view):
                written += link.tls.write(view[written:])
        self._tls_flush(link)

    def _tls_flush(self, link: _Link) -> None:
        """The TLS bytes the SSLObject produced, to the socket (or the capped send buffer)."""
        assert link.tls_out is not None
        data = link.tls_out.read()
        if data:
            self._send(link, data)

    def _refuse_tls(self, link: _Link, err: ssl.SSLError) -> None:
        reason = _SSL_SOURCE.sub("", str(err.args[1] if len(err.args) > 1 else err))
        during = " during the TLS handshake" if link.tls_handshaking else ""
        self._refuse(
            link,
            "tls",
            f"closed the raft connection {'to' if link.outgoing else 'from'} {link.peer}: TLS "
            f"failed{during}: {reason} (raft_tls: every node needs a certificate signed by the "
            "CA bundle of the others, naming the host of its raft address)",
        )

    def _tls_names_dialer(self, link: _Link) -> bool:
        """The dialer's certificate must name the host of the raft address it proved, as the
        dialer checks ours: a node's certificate then vouches for its raft identity both ways."""
        assert link.tls is not None
        host = link.dialer_id.rpartition(":")[0]
        if _cert_names_host(link.tls.getpeercert() or {}, host):
            return True
        self._refuse(
            link,
            "tls-identity",
            f"dropped an incoming raft connection from {link.peer}: it proved the secret as "
            f"{link.dialer_id!r}, but its certificate does not name {host!r} in its subject "
            "alternative names (raft_tls: a node's certificate must name the host of its raft "
            "address)",
        )
        return False

    def _refuse_plaintext_peer(self, link: _Link) -> None:
        self._refuse(
            link,
            "tls-plaintext",
            f"refused raft peer {link.peer}: it speaks plaintext and raft_tls is on here "
            "(turn raft_tls on at every node of the cluster, or off at all)",
        )

    # -- the protocol ----------------------------------------------------------------------

    def _on_frame(self, link: _Link, data: bytes) -> None:
        kind, body = wire.split(data)
        if link.phase is _Phase.OPEN:
            assert link.session is not None
            message = link.session.open(kind, body)
            reads_hot = wire.reads_hot(message)
            if reads_hot is not None:
                link.session.peer_reads_hot = reads_hot  # the link's first message
                link.session.peer_reads_termed_answers = wire.reads_termed_answers(message)
                return
            self.messages_received += 1
            self._onMessageReceived(link.node, message)
            return
        if kind == wire.KIND_REFUSED:
            self._log(
                f"refused-by@{link.peer}",
                logging.WARNING,
                f"raft peer {link.peer} refused this node: {wire.refused_reason(body)}",
            )
            self._close(link)
            return
        if link.phase is _Phase.AWAIT_HELLO and kind == wire.KIND_HELLO:
            link.dialer_nonce, link.dialer_id = wire.parse_hello(body)
            link.phase = _Phase.AWAIT_PROOF
            self._write(
                link, wire.challenge(self._key, link.dialer_nonce, link.nonce, link.dialer_id)
            )
        elif link.phase is _Phase.AWAIT_PROOF and kind == wire.KIND_PROOF:
            wire.check_proof(self._key, body, link.dialer_nonce, link.nonce, link.dialer_id)
            self._accepted(link)
        elif link.phase is _Phase.AWAIT_CHALLENGE and kind == wire.KIND_CHALLENGE:
            own_id = self._self_node.address
            acceptor_nonce, proof = wire.parse_challenge(self._key, body, link.nonce, own_id)
            self._write(link, proof)
            link.session = wire.Session.derive(
                self._key, link.nonce, acceptor_nonce, own_id, dialer=True
            )
            self._opened(link, link.node)
        else:
            raise wire.WireError(f"an unexpected frame of kind {kind} in the handshake")

    def _accepted(self, link: _Link) -> None:
        """An incoming connection proved the secret; it becomes its node's link if the id it
        proved is a peer of this shard."""
        self._pending.done(link)
        self._incoming.discard(link)
        node = self._by_address.get(link.dialer_id)
        if node is None:
            self._refuse(
                link,
                "unknown-peer",
                f"dropped an incoming raft connection from {link.dialer_id!r}, which is not a "
                "peer of this shard (check the peer lists of both nodes)",
            )
            return
        if link.tls is not None and not self._tls_names_dialer(link):
            return
        link.session = wire.Session.derive(
            self._key, link.dialer_nonce, link.nonce, link.dialer_id, dialer=False
        )
        previous = self._open.get(node)
        if previous is not None:
            self._close(previous)  # the peer reconnected: its old connection is dead to it
        self._opened(link, node)

    def _opened(self, link: _Link, node: Any) -> None:
        dialing = self._dialing.pop(node, None)
        if dialing is not None and dialing is not link:
            self._close(dialing)  # both ends dialed (a peer list out of step): keep one link
        link.node = node
        link.phase = _Phase.OPEN
        link.reader.frame_bytes_max = self._limits.frame_bytes_max
        self._open[node] = link
        assert link.session is not None
        # First on the link, before anything pysyncobj sends: what this node reads.
        self._write(link, link.session.seal(wire.features()))
        self._onNodeConnected(node)

    # -- closing ---------------------------------------------------------------------------

    def _close(self, link: _Link) -> None:
        if link.phase is _Phase.CLOSED:
            return
        was_open = link.phase is _Phase.OPEN
        link.phase = _Phase.CLOSED
        self._poller.unsubscribe(link.fileno)
        try:
            link.sock.close()
        except OSError:
            pass
        link.out.clear()
        link.reader.clear()
        link.tls = link.tls_in = link.tls_out = None
        self._pending.done(link)
        self._incoming.discard(link)
        node = link.node
        if node is not None and self._dialing.get(node) is link:
            del self._dialing[node]
        if node is not None and self._open.get(node) is link:
            del self._open[node]
            if was_open and not self._destroying:
                self._onNodeDisconnected(node)

    def _closed_by_peer(self, link: _Link) -> None:
        """The peer closed (or reset) the connection. Mid-handshake that is what a failover
        looks like (a peer stopped, paused or cut off), so it is an INFO line and never called a
        secret mismatch; a failed dial (CONNECTING) is retried quietly on a later tick."""
        if link.tls_handshaking and link.outgoing:
            self._log(
                "tls-closed",
                logging.INFO,  # as any close mid-handshake: a stopping peer does it too
                f"raft peer {link.peer} closed the connection during the TLS handshake: raft_tls "
                "may be off there (it then logs a frame it could not read), or it is stopping",
                peer=link.peer.rpartition(":")[0] or link.peer,
            )
        elif link.phase in (_Phase.AWAIT_HELLO, _Phase.AWAIT_CHALLENGE, _Phase.AWAIT_PROOF):
            stage = "the end" if link.phase is _Phase.AWAIT_PROOF else "its first message"
            if link.outgoing:
                kind = "outgoing-closed"
                text = (
                    f"raft peer {link.peer} closed the connection before {stage} of the "
                    "handshake (stopped, paused or unreachable mid-handshake)"
                )
            else:
                kind = "incoming-closed"
                text = (
                    f"an incoming raft connection from {link.peer} closed before {stage} of "
                    "the handshake (the peer stopped, was paused or cut off mid-handshake)"
                )
            self._log(kind, logging.INFO, text, peer=link.peer.rpartition(":")[0] or link.peer)
        self._close(link)

    def _refuse(self, link: _Link, kind: str, text: str) -> None:
        host = link.peer.rpartition(":")[0] or link.peer
        self._log(kind, logging.WARNING, text, peer=host)
        self._close(link)

    def _refuse_oversized(self, link: _Link, err: FrameTooLargeError) -> None:
        before = "" if link.session is not None else " before its handshake"
        # A TLS record's first bytes (0x16 0x03) read as a little-endian length prefix.
        looks_tls = link.session is None and err.declared_bytes & 0xFFFF == 0x0316
        hint = (
            ": it looks like a TLS handshake (raft_tls is on at that peer and off here)"
            if looks_tls and link.tls is None
            else ""
        )
        self._refuse(
            link,
            "oversized",
            f"refused a raft frame declaring {err.declared_bytes} bytes from {link.peer}{before} "
            f"(limit {err.limit_bytes} bytes) and closed the connection{hint}",
        )

    def _refuse_protocol(self, link: _Link, err: wire.WireError) -> None:
        who = link.dialer_id or link.peer
        if err.kind == "version" and link.session is None:
            # Say why to the peer too: its own log then names the mismatch.
            self._write(
                link, wire.refused(f"this node speaks raft wire version {wire.WIRE_VERSION}")
            )
            if link.out:  # what did not leave at once is not waited for
                link.out.clear()
        self._refuse(link, err.kind, f"refused raft peer {who}: {err.reason}")

    def _log(self, kind: str, level: int, text: str, peer: str | None = None) -> None:
        """At most one line of each ``kind`` (and ``peer``, if given) per
        SECURITY_LOG_INTERVAL_S: the port may be under attack, and the log must not become the
        attack's amplifier."""
        if self._destroying:
            return
        now = time.monotonic()
        key = kind if peer is None else f"{kind}@{peer}"
        if len(self._last_logged) >= LOGGED_KEYS_MAX:  # many peer hosts: forget old ones
            self._last_logged = {
                k: t for k, t in self._last_logged.items() if now - t < SECURITY_LOG_INTERVAL_S
            }
        last = self._last_logged.get(key)
        if last is None or now - last >= SECURITY_LOG_INTERVAL_S:
            self._last_logged[key] = now
            self_id = self._self_node.address if self._self_node is not None else "?"
            log.log(level, "%s (shard replica %s)", text, self_id)
