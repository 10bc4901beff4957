"""The two messages of every replicated round in a fixed binary layout: no pickle on the hot
path.

pysyncobj's messages are dicts. Of them, ``append_entries`` (with its entries) and its answer
``next_node_idx`` are sent every round by every node; everything else (votes, snapshot chunks,
leadership transfer, the chunked form of one huge entry) is rare and stays pickled
(raft/wire.py). ``encode`` returns None for any message that is not exactly one of the
shapes below, with every field of the exact type and range, so a message is never changed on
its way: ``decode(kind, encode(m)) == m`` for every message it encodes.

Layouts, little endian:

``append_entries`` (``KIND_APPEND_ENTRIES``)::

    u64 term | u64 commit_index | u64 prevLogIdx | u64 prevLogTerm | u32 count
    then per entry: u64 index | u64 term | u32 length | command (length bytes)

``next_node_idx`` (``KIND_NEXT_INDEX``)::

    u64 next_node_idx | u8 flags (bit 0 reset, bit 1 success)

``next_node_idx`` with the term it answers (``KIND_NEXT_INDEX_TERM``, raft/_pysyncobj.py hook
12; sent only to a peer that said it reads it, ``termed_answers``)::

    u64 next_node_idx | u64 term | u8 flags

Decoding checks every length against the body before reading it and refuses trailing bytes.
It runs only on bytes whose MAC has been verified (wire.Session.open).
"""

from __future__ import annotations

import struct
from typing import Any

KIND_APPEND_ENTRIES = 17
KIND_NEXT_INDEX = 18
KIND_NEXT_INDEX_TERM = 19
HOT_KINDS = frozenset((KIND_APPEND_ENTRIES, KIND_NEXT_INDEX, KIND_NEXT_INDEX_TERM))
# A frame is bounded by the wire's frame limit; this bounds the entry count of a hostile body
# before any list is built (each entry takes at least its 20-byte header).
ENTRIES_PER_MESSAGE_MAX = 1 << 20

_U64_MAX = (1 << 64) - 1
_APPEND = struct.Struct("<QQQQI")
_ENTRY = struct.Struct("<QQI")
_NEXT = struct.Struct("<QB")
_NEXT_TERM = struct.Struct("<QQB")
_RESET = 1
_SUCCESS = 2
_APPEND_KEYS = frozenset(("type", "term", "commit_index", "entries", "prevLogIdx", "prevLogTerm"))
_NEXT_KEYS = frozenset(("type", "next_node_idx", "reset", "success"))
_NEXT_TERM_KEYS = _NEXT_KEYS | {"term"}


class HotMessageError(Exception):
    """A body of a hot kind that does not hold a message of that kind."""


def _u64(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _U64_MAX


def encode(message: Any, termed_answers: bool = True) -> tuple[int, bytes] | None:
    """-> (kind, body) for an append-entries or next-index message; None for anything else
    (it is sent pickled). ``termed_answers`` False: a next-index message with a term is left
    to pickle too (the peer does not read ``KIND_NEXT_INDEX_TERM``).

    >>> encode({"type": "next_node_idx", "next_node_idx": 5, "reset": False, "success": True})
    (18, b'\\x05\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02')
    >>> encode({"type": "request_vote", "term": 3}) is None
    True
    """
    if type(message) is not dict:
        return None
    kind = message.get("type")
    if kind == "append_entries":
        return _encode_append(message)
    if kind == "next_node_idx":
        keys = message.keys()
        if keys != _NEXT_KEYS and not (termed_answers and keys == _NEXT_TERM_KEYS):
            return None
        index, reset, success = message["next_node_idx"], message["reset"], message["success"]
        if not _u64(index) or type(reset) is not bool or type(success) is not bool:
            return None
        flags = (_RESET if reset else 0) | (_SUCCESS if success else 0)
        if "term" not in message:
            return KIND_NEXT_INDEX, _NEXT.pack(index, flags)
        if not _u64(message["term"]):
            return None
        return KIND_NEXT_INDEX_TERM, _NEXT_TERM.pack(index, message["term"], flags)
    return None


def _encode_append(message: dict[str, Any]) -> tuple[int, bytes] | None:
    if message.keys() != _APPEND_KEYS:
        return None  # the chunked form of one huge entry, or a snapshot chunk
    term, commit = message["term"], message["commit_index"]
    prev_index, prev_term = message["prevLogIdx"], message["prevLogTerm"]
    entries = message["entries"]
    if not (_u64(term) and _u64(commit) and _u64(prev_index) and _u64(prev_term)):
        return None  # e.g. prevLogIdx None: the leader does not hold the previous entry
    if type(entries) is not list or len(entries) > ENTRIES_PER_MESSAGE_MAX:
        return None
    parts = [_APPEND.pack(term, commit, prev_index, prev_term, len(entries))]
    for entry in entries:
        if type(entry) is not tuple or len(entry) != 3:
            return None
        command, index, entry_term = entry
        if type(command) is not bytes or not _u64(index) or not _u64(entry_term):
            return None
        parts.append(_ENTRY.pack(index, entry_term, len(command)))
        parts.append(command)
    return KIND_APPEND_ENTRIES, b"".join(parts)


def decode(kind: int, body: bytes) -> dict[str, Any]:
    """The message ``encode`` made ``body`` from. Raises HotMessageError otherwise."""
    if kind in (KIND_NEXT_INDEX, KIND_NEXT_INDEX_TERM):
        layout = _NEXT if kind == KIND_NEXT_INDEX else _NEXT_TERM
        if len(body) != layout.size:
            raise HotMessageError(f"a next-index message of {len(body)} bytes")
        index, *term, flags = layout.unpack(body)
        if flags & ~(_RESET | _SUCCESS):
            raise HotMessageError(f"a next-index message with unknown flags {flags:#x}")
        answer = {
            "type": "next_node_idx",
            "next_node_idx": index,
            "reset": bool(flags & _RESET),
            "success": bool(flags & _SUCCESS),
        }
        if term:
            answer["term"] = term[0]
        return answer
    if kind != KIND_APPEND_ENTRIES:
        raise HotMessageError(f"kind {kind} is not a hot message")
    if len(body) < _APPEND.size:
        raise HotMessageError("an append-entries message shorter than its header")
    term, commit, prev_index, prev_term, count = _APPEND.unpack_from(body, 0)
    if count > min(ENTRIES_PER_MESSAGE_MAX, (len(body) - _APPEND.size) // _ENTRY.size):
        raise HotMessageError(f"an append-entries message claims {count} entries")
    view = memoryview(body)
    pos = _APPEND.size
    entries: list[tuple[bytes, int, int]] = []
    for _ in range(count):
        if pos + _ENTRY.size > len(body):
            raise HotMessageError("an append-entries message truncated in an entry header")
        index, entry_term, length = _ENTRY.unpack_from(body, pos)
        pos += _ENTRY.size
        if pos + length > len(body):
            raise HotMessageError("an append-entries message truncated in an entry")
        entries.append((bytes(view[pos : pos + length]), index, entry_term))
        pos += length
    if pos != len(body):
        raise HotMessageError("trailing bytes after an append-entries message")
    return {
        "type": "append_entries",
        "term": term,
        "commit_index": commit,
        "entries": entries,
        "prevLogIdx": prev_index,
        "prevLogTerm": prev_term,
    }
