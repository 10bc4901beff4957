"""FluxMQ's Raft wire, version 1: frames, the peer handshake, and message codec.

pysyncobj keeps the Raft rules; these are the bytes between replicas (``raft/wire_transport.py``
moves them). What pysyncobj's own wire did per message, and this one does not: zlib level 3 over
the pickled message, then Fernet (AES-CBC, HMAC-SHA256 and base64) over that. Here a message is
encoded once (the two of every round in a binary layout, the rest pickled) and authenticated
with one HMAC-SHA256; nothing is compressed or encrypted (TLS, when wanted, is the network's
job or a later transport option).

Every frame::

    i32 little-endian length of what follows | u8 version | u8 kind | body

Kinds:

- ``HELLO`` (dialer -> acceptor): ``MAGIC | nonce (32) | u16 id length | id`` where id is the
  dialer's Raft address (its identity in the membership).
- ``CHALLENGE`` (acceptor -> dialer): ``nonce (32) | proof (32)``: the acceptor proves it holds
  the cluster secret over both nonces and the dialer's id.
- ``PROOF`` (dialer -> acceptor): ``proof (32)``: the dialer proves it holds the secret.
- ``MESSAGE`` (either way, after the handshake): ``pickled message | mac (32)``; the MAC is
  HMAC-SHA256 under the direction's session key over ``u64 sequence | version | kind | body``,
  so a frame cannot be altered, replayed, reordered or reflected back to its sender.
- ``APPEND_ENTRIES`` and ``NEXT_INDEX`` (either way, after the handshake): pysyncobj's two
  messages of every round in a fixed binary layout (raft/hot_messages.py), MAC'd like MESSAGE.
  A node sends them only to a peer whose first message on the link, a pickled
  ``fx_wire_features`` message, said it reads them; every other message stays pickled. A node
  from before them ignores the features message (pysyncobj drops unknown message types), so
  nodes of both kinds replicate together during a rolling upgrade.
- ``NEXT_INDEX_TERM``: the append-entries answer with its term (raft/_pysyncobj.py hook 12),
  binary only to a peer whose features say ``next_node_idx_term``; to any other it goes
  pickled (a node from before it ignores the term).
- ``REFUSED`` (either way, before authentication): a UTF-8 reason, only ever logged.

The MAC is verified before anything is decoded, and only an authenticated peer's bytes are ever
decoded or unpickled, by an unpickler that refuses every global (plain containers, numbers,
bytes and strings only: all a pysyncobj message holds). Proofs carry a role label, so a
challenge cannot be answered by reflecting it back to the node that sent it.

Time is not read here; sockets are not touched here. Everything is a pure function of its
inputs, so tests drive each step by hand.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import pickle
import struct
from dataclasses import dataclass
from typing import Any

from raft import hot_messages

WIRE_VERSION = 1
MAGIC = b"FXRAFT"

KIND_HELLO = 1
KIND_CHALLENGE = 2
KIND_PROOF = 3
KIND_MESSAGE = 16
KIND_APPEND_ENTRIES = hot_messages.KIND_APPEND_ENTRIES  # 17
KIND_NEXT_INDEX = hot_messages.KIND_NEXT_INDEX  # 18
KIND_NEXT_INDEX_TERM = hot_messages.KIND_NEXT_INDEX_TERM  # 19
KIND_REFUSED = 127

FEATURES_TYPE = "fx_wire_features"
HOT_READS = ("append_entries", "next_node_idx")
TERMED_ANSWERS_READ = "next_node_idx_term"

NONCE_BYTES = 32
MAC_BYTES = 32
NODE_ID_BYTES_MAX = 512
REASON_BYTES_MAX = 512
# The largest handshake frame (a HELLO with the longest id), with room to spare.
HANDSHAKE_FRAME_BYTES_MAX = 2 + len(MAGIC) + NONCE_BYTES + 2 + NODE_ID_BYTES_MAX + 64

_LENGTH = struct.Struct("<i")
_HEADER = struct.Struct("<BB")
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")
# What pysyncobj's wire starts with (a Fernet token, base64 of version byte 0x80): a FluxMQ node
# from before wire version 1. Recognised only to say so in the log.
_PYSYNCOBJ_TOKEN_PREFIX = b"gAAAAA"


class WireError(Exception):
    """The peer broke the protocol: the connection is closed, and ``reason`` logged."""

    def __init__(self, reason: str, *, kind: str = "protocol") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind  # "protocol" | "version" | "secret" | "unknown-peer"


def master_key(secret: str) -> bytes:
    """The key every proof and session key derives from (the secret itself never signs)."""
    assert secret, "a cluster secret is required"
    return hashlib.sha256(b"fluxmq raft wire|" + secret.encode()).digest()


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.digest(key, b"".join(parts), "sha256")


def frame(kind: int, body: bytes) -> bytes:
    """>>> frame(KIND_PROOF, b"x")[4:]
    b'\\x01\\x03x'
    """
    return _LENGTH.pack(2 + len(body)) + _HEADER.pack(WIRE_VERSION, kind) + body


def split(data: bytes) -> tuple[int, bytes]:
    """A frame's kind and body, from what follows its length prefix. Raises WireError for
    another wire version (saying which) or a frame too short to have a header."""
    if data.startswith(_PYSYNCOBJ_TOKEN_PREFIX):
        raise WireError(
            "the peer speaks pysyncobj's pickled wire (a FluxMQ node older than raft wire "
            f"version {WIRE_VERSION}): upgrade every node of the cluster",
            kind="version",
        )
    if len(data) < _HEADER.size:
        raise WireError("a frame shorter than its header")
    version, kind = _HEADER.unpack_from(data, 0)
    if version != WIRE_VERSION:
        raise WireError(
            f"the peer speaks raft wire version {version}; this node speaks version "
            f"{WIRE_VERSION}: run one FluxMQ version on every node of the cluster",
            kind="version",
        )
    return kind, data[_HEADER.size :]


# -- the handshake ---------------------------------------------------------------------------


def hello(nonce: bytes, node_id: str) -> bytes:
    raw_id = node_id.encode()
    assert len(nonce) == NONCE_BYTES and 0 < len(raw_id) <= NODE_ID_BYTES_MAX
    return frame(KIND_HELLO, MAGIC + nonce + _U16.pack(len(raw_id)) + raw_id)


def parse_hello(body: bytes) -> tuple[bytes, str]:
    """-> (the dialer's nonce, the id it claims; not yet proven)."""
    head = len(MAGIC) + NONCE_BYTES + _U16.size
    if len(body) < head or not body.startswith(MAGIC):
        raise WireError("the first frame is not a FluxMQ raft hello")
    nonce = body[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
    (id_bytes,) = _U16.unpack_from(body, len(MAGIC) + NONCE_BYTES)
    if not 0 < id_bytes <= NODE_ID_BYTES_MAX or len(body) != head + id_bytes:
        raise WireError("a hello with a malformed node id")
    try:
        node_id = body[head:].decode()
    except UnicodeDecodeError:
        raise WireError("a hello with a node id that is not UTF-8") from None
    return nonce, node_id


def _proof(
    key: bytes, role: bytes, dialer_nonce: bytes, acceptor_nonce: bytes, dialer_id: str
) -> bytes:
    return _mac(key, b"proof|", role, b"|", dialer_nonce, acceptor_nonce, dialer_id.encode())


def challenge(key: bytes, dialer_nonce: bytes, acceptor_nonce: bytes, dialer_id: str) -> bytes:
    proof = _proof(key, b"acceptor", dialer_nonce, acceptor_nonce, dialer_id)
    return frame(KIND_CHALLENGE, acceptor_nonce + proof)


def parse_challenge(
    key: bytes, body: bytes, dialer_nonce: bytes, dialer_id: str
) -> tuple[bytes, bytes]:
    """The dialer checks the acceptor's proof. -> (acceptor nonce, the PROOF frame to send)."""
    if len(body) != NONCE_BYTES + MAC_BYTES:
        raise WireError("a malformed challenge")
    acceptor_nonce, proof = body[:NONCE_BYTES], body[NONCE_BYTES:]
    expected = _proof(key, b"acceptor", dialer_nonce, acceptor_nonce, dialer_id)
    if not hmac.compare_digest(proof, expected):
        raise WireError(
            "the peer failed authentication: it holds a different cluster secret, or is not a "
            "FluxMQ node",
            kind="secret",
        )
    answer = _proof(key, b"dialer", dialer_nonce, acceptor_nonce, dialer_id)
    return acceptor_nonce, frame(KIND_PROOF, answer)


def check_proof(
    key: bytes, body: bytes, dialer_nonce: bytes, acceptor_nonce: bytes, dialer_id: str
) -> None:
    expected = _proof(key, b"dialer", dialer_nonce, acceptor_nonce, dialer_id)
    if len(body) != MAC_BYTES or not hmac.compare_digest(body, expected):
        raise WireError(
            "the peer failed authentication: it holds a different cluster secret, or is not a "
            "FluxMQ node",
            kind="secret",
        )


def refused(reason: str) -> bytes:
    return frame(KIND_REFUSED, reason.encode()[:REASON_BYTES_MAX])


def refused_reason(body: bytes) -> str:
    return body[:REASON_BYTES_MAX].decode(errors="replace")


# -- authenticated messages ------------------------------------------------------------------


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain values only: a frame that names any class or function is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed on the raft wire")


@dataclass(slots=True)
class Session:
    """One connection's authenticated channel: a key and a frame sequence per direction."""

    send_key: bytes
    recv_key: bytes
    send_seq: int = 0
    recv_seq: int = 0
    # Set once the peer's features message says it reads the binary hot messages.
    peer_reads_hot: bool = False
    # ... and the binary append-entries answer with its term (KIND_NEXT_INDEX_TERM).
    peer_reads_termed_answers: bool = False

    @classmethod
    def derive(
        cls, key: bytes, dialer_nonce: bytes, acceptor_nonce: bytes, dialer_id: str, *, dialer: bool
    ) -> Session:
        def direction(label: bytes) -> bytes:
            return _mac(
                key, b"session|", label, b"|", dialer_nonce, acceptor_nonce, dialer_id.encode()
            )

        to_acceptor, to_dialer = direction(b"to-acceptor"), direction(b"to-dialer")
        if dialer:
            return cls(send_key=to_acceptor, recv_key=to_dialer)
        return cls(send_key=to_dialer, recv_key=to_acceptor)

    def seal(self, message: Any) -> bytes:
        """One message as a frame (length prefix included): an append-entries or next-index
        message in its binary layout when the peer said it reads them (``peer_reads_hot``),
        anything else pickled in a MESSAGE frame."""
        hot = (
            hot_messages.encode(message, termed_answers=self.peer_reads_termed_answers)
            if self.peer_reads_hot
            else None
        )
        if hot is None:
            kind, body = KIND_MESSAGE, pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        else:
            kind, body = hot
        header = _HEADER.pack(WIRE_VERSION, kind)
        mac = _mac(self.send_key, _U64.pack(self.send_seq), header, body)
        self.send_seq += 1
        return b"".join((_LENGTH.pack(len(header) + len(body) + MAC_BYTES), header, body, mac))

    def open(self, kind: int, body: bytes) -> Any:
        """The message in a frame's body (its kind and body as ``split`` returned them),
        authenticated before it is decoded. Raises WireError on anything else."""
        if kind != KIND_MESSAGE and kind not in hot_messages.HOT_KINDS:
            raise WireError(f"a frame of kind {kind} after the handshake")
        if len(body) < MAC_BYTES:
            raise WireError("a message shorter than its MAC")
        payload, mac = body[:-MAC_BYTES], body[-MAC_BYTES:]
        header = _HEADER.pack(WIRE_VERSION, kind)
        expected = _mac(self.recv_key, _U64.pack(self.recv_seq), header, payload)
        if not hmac.compare_digest(mac, expected):
            raise WireError(
                "a message failed its MAC (altered, replayed or out of order)", kind="secret"
            )
        self.recv_seq += 1
        try:
            if kind != KIND_MESSAGE:
                return hot_messages.decode(kind, payload)
            return _PlainUnpickler(io.BytesIO(payload)).load()
        except Exception as e:
            raise WireError(f"an authenticated message that does not decode: {e}") from e


def features() -> dict[str, Any]:
    """The message a node sends first on every link: what it reads besides pickled messages.
    A node that predates it hands it to pysyncobj, which ignores message types it does not
    know, and keeps receiving pickled messages only (a rolling upgrade mixes the two)."""
    return {"type": FEATURES_TYPE, "reads": [*HOT_READS, TERMED_ANSWERS_READ]}


def reads_hot(message: Any) -> bool | None:
    """None when ``message`` is not a features message; else whether its sender reads the
    binary append-entries and next-index messages."""
    if type(message) is not dict or message.get("type") != FEATURES_TYPE:
        return None
    reads = message.get("reads")
    return isinstance(reads, list) and all(r in reads for r in HOT_READS)


def reads_termed_answers(message: Any) -> bool:
    """Whether a features message says its sender reads ``KIND_NEXT_INDEX_TERM`` (False for
    a node from before it, and for anything that is not a features message)."""
    if reads_hot(message) is not True:
        return False
    assert isinstance(message, dict)
    return TERMED_ANSWERS_READ in message["reads"]
