"""Catching a follower up without resend storms.

pysyncobj's leader sends append-entries optimistically: it moves a follower's next index to the
end of what it sent, without waiting for an answer, and on every new entry it sends again from
there. A follower that lacks the entry before a message answers "reset" with the index it needs;
the leader then resends everything from that index, for up to an append period's worth of
sending. A follower far behind (a new replica, one refilled after a lost disk) under load
receives many messages it cannot use before the resend reaches it and answers "reset" to each:
each answer makes the leader queue the backlog again, the leader's buffer toward it grows past
its limit (raft/wire_transport.py closes the link at 256 MiB unread) and the follower never
catches up (measured: a 20 MB group under 4 publishers did not refill in 10 minutes).

``entries_must_wait``: while a follower's link holds more than ``BACKLOG_BYTES_MAX`` bytes its
socket has not taken, append-entries that carry entries are not queued behind them. The
follower answers the next message it cannot use with where it stands, and the leader sends from
there: a slow follower costs the leader a bounded buffer, and the resends are bounded with it.
(Dropping the echoed resets instead was tried: in the simulator's datagram network it changed
which entries a leader counted and a committed entry was lost, seed 2081; this rule only holds
back messages, which Raft tolerates like any lost message.)

Pure logic.
"""

from __future__ import annotations

from typing import Any

BACKLOG_BYTES_MAX = 16 << 20


def entries_must_wait(message: Any, backlog_bytes: int) -> bool:
    """Whether an outgoing ``message`` should not be queued on a link holding ``backlog_bytes``.

    >>> entries_must_wait({"type": "append_entries", "entries": [(b"x", 5, 1)]}, 32 << 20)
    True
    >>> entries_must_wait({"type": "append_entries", "entries": []}, 32 << 20)  # a heartbeat
    False
    """
    return (
        backlog_bytes > BACKLOG_BYTES_MAX
        and isinstance(message, dict)
        and message.get("type") == "append_entries"
        and bool(message.get("entries"))
    )
