"""FluxMQ's Raft wire, version 1 (raft/wire.py), as pure functions: frames, the handshake,
per-direction sessions. No sockets: each step is driven by hand, as both ends would."""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any

import pytest

from raft import wire
from tests.raft.ticked_node import old_wire_frame, raw_frame, seal_payload

SECRET = "the-cluster-secret"
DIALER_ID = "10.0.0.2:7100"


def body_of(framed: bytes) -> bytes:
    """What follows a frame's length prefix (checked against it)."""
    (length,) = struct.unpack_from("<i", framed)
    assert length == len(framed) - 4
    return framed[4:]


def handshake(secret: str = SECRET) -> tuple[wire.Session, wire.Session]:
    """Both ends of one handshake done by the book -> (dialer's session, acceptor's session)."""
    key = wire.master_key(secret)
    dialer_nonce, acceptor_nonce = os.urandom(32), os.urandom(32)
    kind, body = wire.split(body_of(wire.hello(dialer_nonce, DIALER_ID)))
    assert kind == wire.KIND_HELLO
    nonce, claimed = wire.parse_hello(body)
    assert (nonce, claimed) == (dialer_nonce, DIALER_ID)
    kind, body = wire.split(body_of(wire.challenge(key, nonce, acceptor_nonce, claimed)))
    assert kind == wire.KIND_CHALLENGE
    got_nonce, proof = wire.parse_challenge(key, body, dialer_nonce, DIALER_ID)
    assert got_nonce == acceptor_nonce
    kind, body = wire.split(body_of(proof))
    assert kind == wire.KIND_PROOF
    wire.check_proof(key, body, dialer_nonce, acceptor_nonce, claimed)
    return (
        wire.Session.derive(key, dialer_nonce, acceptor_nonce, DIALER_ID, dialer=True),
        wire.Session.derive(key, dialer_nonce, acceptor_nonce, DIALER_ID, dialer=False),
    )


def deliver(frame: bytes, to: wire.Session) -> Any:
    return to.open(*wire.split(body_of(frame)))


APPEND = {
    "type": "append_entries",
    "term": 7,
    "commit_index": 41,
    "prevLogIdx": 40,
    "prevLogTerm": 7,
    "entries": [(b"\x00payload", 41, 7), (b"", 42, 7)],
    "serialized": (b"chunk", True, False),
    "members": {"a", "b"},
    "none": None,
    "float": 1.5,
}


# -- frames ----------------------------------------------------------------------------------


def test_a_frame_carries_its_length_version_and_kind() -> None:
    framed = wire.frame(wire.KIND_PROOF, b"body")
    assert framed == struct.pack("<i", 6) + bytes([wire.WIRE_VERSION, wire.KIND_PROOF]) + b"body"
    assert wire.split(body_of(framed)) == (wire.KIND_PROOF, b"body")


@pytest.mark.parametrize("data", [b"", b"\x01"])
def test_split_refuses_a_frame_shorter_than_its_header(data: bytes) -> None:
    with pytest.raises(wire.WireError) as caught:
        wire.split(data)
    assert caught.value.kind == "protocol" and "shorter than its header" in caught.value.reason


def test_split_names_both_versions_when_the_peer_speaks_another_one() -> None:
    with pytest.raises(wire.WireError) as caught:
        wire.split(body_of(raw_frame(wire.KIND_HELLO, b"x", version=2)))
    err = caught.value
    assert err.kind == "version"
    assert "raft wire version 2" in err.reason and f"version {wire.WIRE_VERSION}" in err.reason


def test_split_recognises_pysyncobjs_old_pickled_wire() -> None:
    """A node from before wire version 1 opens with a Fernet token of its random key."""
    with pytest.raises(wire.WireError) as caught:
        wire.split(body_of(old_wire_frame(os.urandom(32))))
    assert caught.value.kind == "version"
    assert "pysyncobj's pickled wire" in caught.value.reason


def test_a_refused_frame_carries_its_reason_capped() -> None:
    kind, body = wire.split(body_of(wire.refused("this node speaks raft wire version 1")))
    assert kind == wire.KIND_REFUSED
    assert wire.refused_reason(body) == "this node speaks raft wire version 1"
    _, long_body = wire.split(body_of(wire.refused("x" * 10_000)))
    assert len(wire.refused_reason(long_body)) == wire.REASON_BYTES_MAX


# -- the handshake ---------------------------------------------------------------------------


def test_the_handshake_by_the_book_authenticates_both_ends() -> None:
    dialer, acceptor = handshake()
    assert dialer.send_key == acceptor.recv_key and dialer.recv_key == acceptor.send_key


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"NOTRAFT" + bytes(32) + b"\x01\x00a",  # wrong magic
        wire.MAGIC + bytes(31),  # short nonce, no id length
        wire.MAGIC + bytes(32) + struct.pack("<H", 0),  # empty id
        wire.MAGIC + bytes(32) + struct.pack("<H", 5) + b"abc",  # id shorter than declared
        wire.MAGIC + bytes(32) + struct.pack("<H", 1) + b"ab",  # trailing bytes
        wire.MAGIC + bytes(32) + struct.pack("<H", 600) + b"a" * 600,  # id over the cap
        wire.MAGIC + bytes(32) + struct.pack("<H", 2) + b"\xff\xfe",  # not UTF-8
    ],
)
def test_a_malformed_hello_is_a_wire_error(body: bytes) -> None:
    with pytest.raises(wire.WireError) as caught:
        wire.parse_hello(body)
    assert caught.value.kind == "protocol"


@pytest.mark.parametrize("size", [0, 63, 65, 128])
def test_a_malformed_challenge_is_a_wire_error(size: int) -> None:
    with pytest.raises(wire.WireError) as caught:
        wire.parse_challenge(wire.master_key(SECRET), bytes(size), bytes(32), DIALER_ID)
    assert caught.value.kind == "protocol" and "malformed challenge" in caught.value.reason


@pytest.mark.parametrize("size", [0, 31, 33, 64])
def test_a_malformed_proof_is_a_wire_error(size: int) -> None:
    with pytest.raises(wire.WireError):
        wire.check_proof(wire.master_key(SECRET), bytes(size), bytes(32), bytes(32), DIALER_ID)


def test_a_challenge_from_an_acceptor_with_another_secret_fails_as_a_secret_mismatch() -> None:
    ours, theirs = wire.master_key(SECRET), wire.master_key("another")
    dialer_nonce = os.urandom(32)
    _, body = wire.split(body_of(wire.challenge(theirs, dialer_nonce, os.urandom(32), DIALER_ID)))
    with pytest.raises(wire.WireError) as caught:
        wire.parse_challenge(ours, body, dialer_nonce, DIALER_ID)
    assert caught.value.kind == "secret" and "different cluster secret" in caught.value.reason


def test_a_proof_made_with_another_secret_fails_as_a_secret_mismatch() -> None:
    ours, theirs = wire.master_key(SECRET), wire.master_key("another")
    dialer_nonce, acceptor_nonce = os.urandom(32), os.urandom(32)
    _, body = wire.split(body_of(wire.challenge(theirs, dialer_nonce, acceptor_nonce, DIALER_ID)))
    # The attacker answers with what its own secret gives (it cannot check ours).
    _, proof = wire.parse_challenge(theirs, body, dialer_nonce, DIALER_ID)
    with pytest.raises(wire.WireError) as caught:
        wire.check_proof(
            ours, wire.split(body_of(proof))[1], dialer_nonce, acceptor_nonce, DIALER_ID
        )
    assert caught.value.kind == "secret"


def test_a_reflected_challenge_proof_does_not_authenticate_the_dialer() -> None:
    """Without the secret, the dialer's best guess is the proof the acceptor just showed it:
    the role label makes the two different."""
    key = wire.master_key(SECRET)
    dialer_nonce, acceptor_nonce = os.urandom(32), os.urandom(32)
    _, body = wire.split(body_of(wire.challenge(key, dialer_nonce, acceptor_nonce, DIALER_ID)))
    acceptors_proof = body[wire.NONCE_BYTES :]
    with pytest.raises(wire.WireError) as caught:
        wire.check_proof(key, acceptors_proof, dialer_nonce, acceptor_nonce, DIALER_ID)
    assert caught.value.kind == "secret"


def test_a_dialers_proof_reflected_as_a_challenge_does_not_authenticate_the_acceptor() -> None:
    key = wire.master_key(SECRET)
    dialer_nonce, acceptor_nonce = os.urandom(32), os.urandom(32)
    _, body = wire.split(body_of(wire.challenge(key, dialer_nonce, acceptor_nonce, DIALER_ID)))
    _, proof = wire.parse_challenge(key, body, dialer_nonce, DIALER_ID)
    dialers_proof = wire.split(body_of(proof))[1]
    with pytest.raises(wire.WireError):
        wire.parse_challenge(key, acceptor_nonce + dialers_proof, dialer_nonce, DIALER_ID)


def test_a_proof_binds_the_claimed_id_and_both_nonces() -> None:
    key = wire.master_key(SECRET)
    dialer_nonce, acceptor_nonce = os.urandom(32), os.urandom(32)
    _, body = wire.split(body_of(wire.challenge(key, dialer_nonce, acceptor_nonce, DIALER_ID)))
    _, proof = wire.parse_challenge(key, body, dialer_nonce, DIALER_ID)
    answer = wire.split(body_of(proof))[1]
    for args in (
        (dialer_nonce, acceptor_nonce, "10.0.0.3:7100"),  # another id
        (os.urandom(32), acceptor_nonce, DIALER_ID),  # replayed against a new hello
        (dialer_nonce, os.urandom(32), DIALER_ID),  # replayed against a new challenge
    ):
        with pytest.raises(wire.WireError):
            wire.check_proof(key, answer, *args)


# -- sessions --------------------------------------------------------------------------------


def test_seal_and_open_round_trip_every_kind_of_value_a_raft_message_holds() -> None:
    dialer, acceptor = handshake()
    assert deliver(dialer.seal(APPEND), acceptor) == APPEND
    assert deliver(acceptor.seal({"type": "next_node_idx", "term": 7}), dialer) == {
        "type": "next_node_idx",
        "term": 7,
    }


def test_messages_open_in_order_in_both_directions() -> None:
    dialer, acceptor = handshake()
    for i in range(5):
        assert deliver(dialer.seal({"n": i}), acceptor) == {"n": i}
        assert deliver(acceptor.seal({"m": i}), dialer) == {"m": i}
    assert (dialer.send_seq, dialer.recv_seq) == (5, 5)


def test_a_replayed_frame_is_refused() -> None:
    dialer, acceptor = handshake()
    first = dialer.seal({"n": 0})
    deliver(first, acceptor)
    with pytest.raises(wire.WireError) as caught:
        deliver(first, acceptor)
    assert caught.value.kind == "secret" and "failed its MAC" in caught.value.reason


def test_reordered_frames_are_refused() -> None:
    dialer, acceptor = handshake()
    first, second = dialer.seal({"n": 0}), dialer.seal({"n": 1})
    with pytest.raises(wire.WireError):
        deliver(second, acceptor)
    assert deliver(first, acceptor) == {"n": 0}  # a refusal does not move the sequence
    assert deliver(second, acceptor) == {"n": 1}


def test_a_dropped_frame_makes_every_later_one_fail() -> None:
    dialer, acceptor = handshake()
    dialer.seal({"n": 0})  # never delivered
    with pytest.raises(wire.WireError):
        deliver(dialer.seal({"n": 1}), acceptor)


def test_a_frame_sent_to_the_acceptor_does_not_open_as_one_sent_to_the_dialer() -> None:
    """Per-direction keys: a frame reflected back to its sender does not authenticate."""
    dialer, acceptor = handshake()
    assert dialer.send_key != dialer.recv_key
    to_acceptor = dialer.seal({"n": 0})
    with pytest.raises(wire.WireError) as caught:
        deliver(to_acceptor, dialer)
    assert caught.value.kind == "secret"
    assert deliver(to_acceptor, acceptor) == {"n": 0}  # where it was sent, it opens


def test_a_frame_of_another_session_does_not_open() -> None:
    dialer, _ = handshake()
    _, other_acceptor = handshake()
    with pytest.raises(wire.WireError):
        deliver(dialer.seal({"n": 0}), other_acceptor)


@pytest.mark.parametrize("bit", [0, 7, 100, -1])
def test_one_flipped_bit_anywhere_in_a_message_is_refused(bit: int) -> None:
    dialer, acceptor = handshake()
    framed = bytearray(dialer.seal(APPEND))
    position = 6 + (bit % (len(framed) - 6))  # payload or MAC, after the header
    framed[position] ^= 0x01
    with pytest.raises(wire.WireError) as caught:
        deliver(bytes(framed), acceptor)
    assert caught.value.kind == "secret"


def test_a_message_frame_with_another_kind_byte_is_refused() -> None:
    dialer, acceptor = handshake()
    framed = bytearray(dialer.seal({"n": 0}))
    framed[5] = wire.KIND_PROOF
    with pytest.raises(wire.WireError) as caught:
        deliver(bytes(framed), acceptor)
    assert "kind" in caught.value.reason


def test_a_message_shorter_than_its_mac_is_refused() -> None:
    _, acceptor = handshake()
    with pytest.raises(wire.WireError) as caught:
        acceptor.open(wire.KIND_MESSAGE, b"x" * (wire.MAC_BYTES - 1))
    assert "shorter than its MAC" in caught.value.reason


EXECUTED: list[str] = []


def _execute(command: str) -> int:
    """What a malicious pickle below calls, if the unpickler ever let it."""
    EXECUTED.append(command)
    return 0


class _Boom:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_execute, ("id",))


@pytest.mark.parametrize(
    "payload",
    [
        pickle.dumps(_Boom()),
        pickle.dumps({"type": "append_entries", "x": _Boom()}),
        pickle.dumps(os.system),
        pickle.dumps(Exception("x")),
    ],
    ids=["a-call", "a-call-inside-a-message", "a-function", "a-class"],
)
def test_an_authenticated_message_naming_a_global_is_refused_by_the_unpickler(
    payload: bytes,
) -> None:
    EXECUTED.clear()
    dialer, acceptor = handshake()
    with pytest.raises(wire.WireError) as caught:
        deliver(seal_payload(dialer, payload), acceptor)
    assert "does not decode" in caught.value.reason and "not allowed" in caught.value.reason
    assert EXECUTED == []


def test_the_session_keys_derive_from_the_secret() -> None:
    key, other = wire.master_key(SECRET), wire.master_key("another")
    nonces = os.urandom(32), os.urandom(32)
    ours = wire.Session.derive(key, *nonces, DIALER_ID, dialer=True)
    theirs = wire.Session.derive(other, *nonces, DIALER_ID, dialer=False)
    with pytest.raises(wire.WireError):
        deliver(ours.seal({"n": 0}), theirs)
    assert key != other and SECRET.encode() not in key


# -- the binary hot messages ------------------------------------------------------------------

HOT_APPEND = {
    "type": "append_entries",
    "term": 7,
    "commit_index": 41,
    "prevLogIdx": 40,
    "prevLogTerm": 7,
    "entries": [(b"\x00payload", 41, 7), (b"", 42, 7)],
}
HOT_NEXT = {"type": "next_node_idx", "next_node_idx": 43, "reset": False, "success": True}


def test_hot_messages_go_binary_only_to_a_peer_that_said_it_reads_them() -> None:
    dialer, acceptor = handshake()
    for message in (HOT_APPEND, HOT_NEXT):
        sealed = dialer.seal(message)
        assert wire.split(body_of(sealed))[0] == wire.KIND_MESSAGE
        assert deliver(sealed, acceptor) == message
    dialer.peer_reads_hot = True  # as the transport does on reading the acceptor's features
    sealed = dialer.seal(HOT_APPEND)
    assert wire.split(body_of(sealed))[0] == wire.KIND_APPEND_ENTRIES
    assert pickle.dumps(HOT_APPEND["entries"][0][0]) not in sealed
    assert deliver(sealed, acceptor) == HOT_APPEND
    sealed = dialer.seal(HOT_NEXT)
    assert wire.split(body_of(sealed))[0] == wire.KIND_NEXT_INDEX
    assert deliver(sealed, acceptor) == HOT_NEXT
    # Other messages stay pickled on the same session.
    vote = {"type": "request_vote", "term": 8, "last_log_index": 42, "last_log_term": 7}
    sealed = dialer.seal(vote)
    assert wire.split(body_of(sealed))[0] == wire.KIND_MESSAGE
    assert deliver(sealed, acceptor) == vote


def test_the_mac_covers_the_kind_so_a_hot_frame_cannot_be_read_as_another() -> None:
    dialer, acceptor = handshake()
    dialer.peer_reads_hot = True
    framed = bytearray(dialer.seal(HOT_NEXT))
    framed[5] = wire.KIND_APPEND_ENTRIES  # length (4) | version (1) | kind
    with pytest.raises(wire.WireError) as caught:
        deliver(bytes(framed), acceptor)
    assert caught.value.kind == "secret"


def test_an_authenticated_hot_frame_that_does_not_decode_is_a_protocol_error() -> None:
    dialer, acceptor = handshake()
    body = b"\x01\x02\x03"  # not a next-index body, but MAC'd correctly
    header = bytes((wire.WIRE_VERSION, wire.KIND_NEXT_INDEX))
    mac = wire._mac(dialer.send_key, struct.pack("<Q", 0), header, body)
    framed = struct.pack("<i", 2 + len(body) + 32) + header + body + mac
    with pytest.raises(wire.WireError) as caught:
        deliver(framed, acceptor)
    assert caught.value.kind == "protocol" and "does not decode" in caught.value.reason


def test_an_answer_with_its_term_goes_binary_only_to_a_peer_that_said_it_reads_it() -> None:
    # raft/_pysyncobj.py hook 12; a peer from before it reads the old layout, so the answer
    # goes pickled to it (it ignores the term), never cut down to the old layout.
    dialer, acceptor = handshake()
    dialer.peer_reads_hot = True
    answer = {**HOT_NEXT, "term": 7}
    sealed = dialer.seal(answer)
    assert wire.split(body_of(sealed))[0] == wire.KIND_MESSAGE
    assert deliver(sealed, acceptor) == answer
    dialer.peer_reads_termed_answers = True
    sealed = dialer.seal(answer)
    assert wire.split(body_of(sealed))[0] == wire.KIND_NEXT_INDEX_TERM
    assert deliver(sealed, acceptor) == answer
    sealed = dialer.seal(HOT_NEXT)
    assert wire.split(body_of(sealed))[0] == wire.KIND_NEXT_INDEX
    assert deliver(sealed, acceptor) == HOT_NEXT


def test_the_features_message_says_what_a_node_reads() -> None:
    assert wire.reads_hot(wire.features()) is True
    assert wire.reads_termed_answers(wire.features()) is True
    before = {"type": wire.FEATURES_TYPE, "reads": list(wire.HOT_READS)}
    assert wire.reads_hot(before) is True and wire.reads_termed_answers(before) is False
    assert wire.reads_termed_answers(HOT_APPEND) is False
    assert wire.reads_hot({"type": wire.FEATURES_TYPE, "reads": ["append_entries"]}) is False
    assert wire.reads_hot({"type": wire.FEATURES_TYPE}) is False
    assert wire.reads_hot(HOT_APPEND) is None
    assert wire.reads_hot("x") is None
