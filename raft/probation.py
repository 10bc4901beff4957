"""Probation: a replica that starts with no Raft state is not a voter until it is whole again.

Raft's safety rests on every member remembering what it promised: the entries it acknowledged
and the votes it gave. A member whose disk was lost (replaced, wiped, restored from nothing)
and that comes back under the same address has forgotten both, yet the others still count it.
With three replicas: an entry committed on {A, C}; C loses its disk; A goes down. B (which
never had the entry) and the empty C are a majority: C votes for B, B leads, and the committed
entry is gone for good (B's log wins over A's when A returns). etcd refuses such a member
outright (it must be removed and added back); FluxMQ lets it rejoin under its name, on
probation:

- it grants no vote, does not campaign and takes no leadership transfer;
- its acknowledgements still count (an acknowledgement of index i says "I hold the leader's
  log up to i on disk": true of a refilled replica as of any other), so a leader with one
  healthy follower and a replica on probation commits as soon as both hold an entry;
- it leaves probation when it holds, on disk, everything a leader has committed: a leader's
  append-entries proves our log matches its own up to the commit index it reports, and that
  index covers every entry ever committed once the entry there is of the leader's own term
  (leader completeness: entries committed in earlier terms precede the leader's first entry,
  and pysyncobj's leader appends one as it takes office). Until it commits one, a new leader
  reports an older commit index, which proves nothing;
- or when a majority of the members, itself included, hold no entry and no member has said
  it holds one: the shard is being created. Why that is safe: a committed entry is held by a
  majority, which shares a member with any majority; if the only member shared is this
  replica, every other holder is outside the empty majority and did not answer (one that
  answered would have said it holds something). So it takes this replica's lost disk and
  every other holder of an entry down at once, and the remaining members never having held
  one: beyond the single fault three replicas tolerate. That is how the replicas of a new
  shard, all on probation because all are fresh, leave it together, even with a member down.

Which replicas start on probation is the caller's decision, kept on disk beside the journal
(``raft/pysyncobj_shard.py``): every replica whose Raft state did not exist when it started,
until it leaves probation. Pure logic: time is an input (``now_s``), nothing is sent from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROBE_INTERVAL_S = 0.5  # how often a replica on probation asks the members it has not heard

PROBE_TYPE = "fx_probe"
PROBE_REPLY_TYPE = "fx_probe_reply"


def holds_nothing(last_index: int) -> bool:
    """Whether a log ending at ``last_index`` holds no entry: pysyncobj starts every log with
    one no-op at index 1, and every later entry (a leader's first no-op included) follows it.

    >>> holds_nothing(1), holds_nothing(2)
    (True, False)
    """
    return last_index <= 1


@dataclass
class Probation:
    """The state of a replica on probation (``whole`` once it has left)."""

    members: frozenset[str]  # the other members, by Raft address
    empty_members: set[str] = field(default_factory=set)  # reported holding no entry
    # Members that reported holding an entry: the shard has a history, only a leader can
    # show this replica is whole again.
    holding_members: set[str] = field(default_factory=set)
    # The commit index a leader proved we hold, waiting for our journal to have it on disk.
    whole_at_index: int | None = None
    whole: bool = False
    reason: str = ""  # why it left probation (for the log line)
    next_probe_s: float = 0.0

    def on_probe_reply(self, member: str, member_holds_nothing: bool) -> None:
        """``member`` answered a probe.

        >>> p = Probation(frozenset({"b", "c"}))
        >>> p.on_probe_reply("b", True); p.whole  # with b, a majority of three holds nothing
        True
        >>> p = Probation(frozenset({"b", "c"}))
        >>> p.on_probe_reply("c", False); p.on_probe_reply("b", True); p.whole
        False
        """
        if self.whole or member not in self.members:
            return
        if member_holds_nothing:
            self.empty_members.add(member)
        else:
            self.holding_members.add(member)
        # A member can hold nothing and later something (a leader was elected meanwhile):
        # what it said last about holding something stands.
        self.empty_members -= self.holding_members
        empty_with_self = len(self.empty_members) + 1
        if not self.holding_members and 2 * empty_with_self > len(self.members) + 1:
            self._leave("a majority of the members, this one included, holds no entry")

    def on_leader_append(
        self, leader_commit: int, our_commit: int, our_term_at_commit: int | None, leader_term: int
    ) -> None:
        """A leader's append-entries was handled: the leader reported ``leader_commit``; our
        commit index is now ``our_commit`` (raised only as far as the message proved our log
        matches the leader's); the entry at ``leader_commit`` in our log has
        ``our_term_at_commit`` (None: we do not hold it).

        >>> p = Probation(frozenset({"b", "c"}))
        >>> p.on_leader_append(9, 9, 3, 4)  # the leader has not committed in its term yet
        >>> p.whole_at_index is None
        True
        >>> p.on_leader_append(12, 12, 4, 4)
        >>> p.whole_at_index, p.whole
        (12, False)
        >>> p.on_durable(12); p.whole
        True
        """
        if self.whole or our_commit < leader_commit or our_term_at_commit != leader_term:
            return
        if self.whole_at_index is None or leader_commit > self.whole_at_index:
            self.whole_at_index = leader_commit

    def on_durable(self, durable_index: int) -> None:
        """Our journal holds everything up to ``durable_index`` on disk."""
        if self.whole or self.whole_at_index is None or durable_index < self.whole_at_index:
            return
        self._leave(f"holds what the leader committed, up to index {self.whole_at_index}")

    def probe_due(self, now_s: float) -> frozenset[str]:
        """The members to ask now whether they hold any entry (empty: none, or not yet)."""
        if self.whole or now_s < self.next_probe_s:
            return frozenset()
        self.next_probe_s = now_s + PROBE_INTERVAL_S
        if self.holding_members:
            return frozenset()  # the shard has a history: only a leader's appends end probation
        return self.members - self.empty_members

    def waiting_for(self) -> list[str]:
        """The members not known to hold nothing (for the log line)."""
        return sorted(self.members - self.empty_members)

    def has_history(self) -> bool:
        """Whether a member said it holds an entry (only a leader can end probation then)."""
        return bool(self.holding_members)

    def _leave(self, reason: str) -> None:
        self.whole = True
        self.reason = reason
