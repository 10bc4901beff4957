"""Outbox: when a Raft message may leave this node, with respect to its journal.

A message that promises what this node holds (a follower's acknowledgement, a vote, a vote
request) leaves only after the journal is durable; together with the journal's flush before the
commit index moves, no node acknowledges, votes for or applies what is not on its disk. Messages
that promise nothing about this node's disk leave at once (``promises_nothing``).

While frames that arrived together are handled (``hold`` ... ``release``), messages wait and
leave together, in order, after at most one flush: a follower that reads ten append-entries at
once fsyncs once, not ten times.

Transport-agnostic: raft/wire_transport.py and the simulator's in-memory transport (tests/sim)
both send through it, so the simulator checks the rule the product runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Messages that promise nothing about this node's disk:
# - "append_entries": only a leader sends them. Its own disk write may overlap its followers'
#   (Raft thesis 10.2.1): pysyncobj counts the leader toward a majority when it moves the commit
#   index, and the journal makes the log durable up to the commit index before it moves
#   (``JournalCore.setRaftCommitIndex``), so nothing is applied, acknowledged or announced as
#   committed before the leader's fsync too.
# - "apply_command" / "apply_command_response": a follower forwarding a command, and the leader
#   saying where it put it (the follower waits for the commit like any other).
NO_FLUSH_TYPES = frozenset({"append_entries", "apply_command", "apply_command_response"})


def promises_nothing(message: Any) -> bool:
    """Whether ``message`` may leave before the journal is durable.

    >>> promises_nothing({"type": "append_entries"}), promises_nothing({"type": "response_vote"})
    (True, False)
    """
    return type(message) is dict and message.get("type") in NO_FLUSH_TYPES


class Outbox:
    """``flush`` makes the journal durable; ``deliver(node, message)`` puts a message on the
    wire (-> whether it is thought sent)."""

    def __init__(self, flush: Callable[[], None], deliver: Callable[[Any, Any], bool]) -> None:
        self._flush = flush
        self._deliver = deliver
        self._held: list[tuple[Any, Any]] | None = None
        self.flush_before_send = True  # tests turn it off to prove the fsync checks can fail

    def send(self, node: Any, message: Any) -> bool:
        if self._held is not None:
            self._held.append((node, message))
            return True
        if self.flush_before_send and not promises_nothing(message):
            self._flush()
        return self._deliver(node, message)

    def hold(self) -> bool:
        """Start holding (-> True), or False if already holding (an inner call)."""
        if self._held is not None:
            return False
        self._held = []
        return True

    def release(self) -> None:
        """Send what was held, in order, after one flush if any of it needs one."""
        held, self._held = self._held or [], None
        if not held:
            return
        if self.flush_before_send and not all(promises_nothing(m) for _, m in held):
            self._flush()
        for node, message in held:
            self._deliver(node, message)
