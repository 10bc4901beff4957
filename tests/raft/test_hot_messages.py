"""raft/hot_messages.py: the binary layout of append-entries and next-index messages carries
exactly what pysyncobj put in them, refuses every other shape (those stay pickled), and a body
that does not hold a message is refused with HotMessageError, never anything else."""

from __future__ import annotations

import random
from typing import Any

import pytest

from raft import hot_messages
from raft.hot_messages import (
    KIND_APPEND_ENTRIES,
    KIND_NEXT_INDEX,
    KIND_NEXT_INDEX_TERM,
    HotMessageError,
    decode,
    encode,
)

SEED = 3500
U64_MAX = (1 << 64) - 1


def append(entries: list[Any], **fields: Any) -> dict[str, Any]:
    message = {
        "type": "append_entries",
        "term": 4,
        "commit_index": 17,
        "prevLogIdx": 20,
        "prevLogTerm": 3,
        "entries": entries,
    }
    message.update(fields)
    return message


def next_index(
    index: int = 21, *, reset: bool = False, success: bool = True, term: int | None = None
) -> dict[str, Any]:
    message = {"type": "next_node_idx", "next_node_idx": index, "reset": reset, "success": success}
    if term is not None:
        message["term"] = term  # raft/_pysyncobj.py hook 12
    return message


def _kind(message: dict[str, Any]) -> int:
    if message["type"] == "append_entries":
        return KIND_APPEND_ENTRIES
    return KIND_NEXT_INDEX_TERM if "term" in message else KIND_NEXT_INDEX


def random_message(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.3:
        return next_index(
            rng.choice([0, 1, rng.randrange(U64_MAX), U64_MAX]),
            reset=rng.random() < 0.5,
            success=rng.random() < 0.5,
            term=rng.choice([None, 0, rng.randrange(U64_MAX), U64_MAX]),
        )
    first = rng.randrange(1, 1 << 40)
    entries = [
        (rng.randbytes(rng.choice([0, 1, 30, 300, 5000])), first + k, rng.randrange(1, 9))
        for k in range(rng.choice([0, 1, 2, 7, 40]))
    ]
    return append(entries, term=rng.randrange(U64_MAX), commit_index=rng.randrange(1 << 40))


def test_every_hot_message_decodes_to_exactly_what_was_encoded() -> None:
    rng = random.Random(SEED)
    for k in range(500):
        message = random_message(rng)
        encoded = encode(message)
        assert encoded is not None, (SEED, k, message)
        kind, body = encoded
        assert kind == _kind(message)
        assert decode(kind, body) == message, (SEED, k)


def test_an_answer_with_its_term_is_binary_only_for_a_peer_that_reads_it() -> None:
    assert encode(next_index(term=5)) == (
        KIND_NEXT_INDEX_TERM,
        (21).to_bytes(8, "little") + (5).to_bytes(8, "little") + b"\x02",
    )
    assert encode(next_index(term=5), termed_answers=False) is None  # pickled: term kept
    assert encode(next_index(), termed_answers=False) == encode(next_index())


def test_a_heartbeat_with_no_entries_keeps_its_empty_entry_list() -> None:
    kind, body = encode(append([]))  # type: ignore[misc]
    assert decode(kind, body)["entries"] == []


@pytest.mark.parametrize(
    "message",
    [
        append([], prevLogIdx=None, prevLogTerm=None),  # the leader lacks the previous entry
        append([(b"x", 21, 4)], transmission="start"),  # pysyncobj's chunked huge entry
        {"type": "append_entries", "term": 4, "commit_index": 1, "serialized": b"chunk"},
        append([[b"x", 21, 4]]),  # an entry that is not a tuple
        append([(bytearray(b"x"), 21, 4)]),  # a command that is not bytes
        append([(b"x", 21, 4, 0)]),
        append([], term=True),  # a bool is not a term
        append([], term=-1),
        append([], commit_index=U64_MAX + 1),
        append(
            (),
        ),  # entries not a list
        append([], extra=1),
        next_index(reset=1),  # type: ignore[arg-type]
        next_index(term=True),  # type: ignore[arg-type]
        next_index(term=-1),
        {**next_index(term=3), "extra": 1},
        {"type": "next_node_idx", "next_node_idx": 3, "success": True},
        {"type": "request_vote", "term": 3, "last_log_index": 1, "last_log_term": 1},
        {"type": "response_vote", "term": 3},
        ["append_entries"],
        None,
    ],
)
def test_any_other_shape_is_left_to_pickle(message: Any) -> None:
    assert encode(message) is None


def test_a_body_that_does_not_hold_a_message_is_refused_and_only_with_hot_message_error() -> None:
    rng = random.Random(SEED + 1)
    refused = 0
    for k in range(2000):
        kind, body = encode(random_message(rng))  # type: ignore[misc]
        damaged = bytearray(body)
        how = rng.choice(["cut", "extend", "flip", "count"])
        if how == "cut" and damaged:
            del damaged[rng.randrange(len(damaged)) :]
        elif how == "extend":
            damaged += rng.randbytes(rng.randrange(1, 30))
        elif how == "flip" and damaged:
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        elif kind == KIND_APPEND_ENTRIES:
            damaged[32:36] = rng.randrange(1 << 32).to_bytes(4, "little")
        try:
            decoded = decode(kind, bytes(damaged))
        except HotMessageError:
            refused += 1
            continue
        assert decoded["type"] in ("append_entries", "next_node_idx"), (SEED + 1, k)
    assert refused > 500  # most damage is seen; a flipped bit in a value is not (the MAC's job)


@pytest.mark.parametrize(
    ("kind", "body", "reason"),
    [
        (KIND_NEXT_INDEX, b"\x00" * 8, "of 8 bytes"),
        (KIND_NEXT_INDEX, b"\x00" * 8 + b"\x04", "unknown flags"),
        (KIND_NEXT_INDEX, b"\x00" * 17, "of 17 bytes"),
        (KIND_NEXT_INDEX_TERM, b"\x00" * 9, "of 9 bytes"),
        (KIND_NEXT_INDEX_TERM, b"\x00" * 16 + b"\x08", "unknown flags"),
        (KIND_APPEND_ENTRIES, b"\x00" * 10, "shorter than its header"),
        (KIND_APPEND_ENTRIES, b"\x00" * 32 + (1 << 31).to_bytes(4, "little"), "claims"),
        (16, b"", "not a hot message"),
    ],
)
def test_malformed_bodies_name_what_is_wrong(kind: int, body: bytes, reason: str) -> None:
    with pytest.raises(HotMessageError, match=reason):
        decode(kind, body)


def test_the_entry_count_is_bounded_by_the_body_before_any_entry_is_read() -> None:
    # A count that the body cannot hold is refused up front, whatever it claims.
    header = hot_messages._APPEND.pack(1, 1, 1, 1, 3)
    entry = hot_messages._ENTRY.pack(2, 1, 0)
    with pytest.raises(HotMessageError, match="claims 3 entries"):
        decode(KIND_APPEND_ENTRIES, header + entry * 2)
    assert len(decode(KIND_APPEND_ENTRIES, header + entry * 3)["entries"]) == 3
