"""Consumer-group membership: who is in a group, which partitions each member owns, and the
generation fencing that keeps two members from owning a partition at once (DESIGN §5).

It follows Kafka's newest consumer protocol (KIP-848): the server assigns, rebalances are
incremental, and every member has its own *generation* (Kafka's member epoch), bumped whenever
its own assignment changes. A rebalance computes a target with the group's assignor and then
moves only what differs:

- a partition nobody holds goes to its target owner at once;
- a partition held by another member is first *revoked* (the holder stops getting work from it)
  and stays *pending* for its new owner until the holder released it: the holder's heartbeat
  acknowledged the generation that revoked it and it holds no lease there any more, or the
  holder left or its session expired.

A member that lost partitions is fenced: requests carrying a generation older than the one
that took them away are stale (``STALE_GENERATION``); gaining partitions does not fence, so an
unaffected member keeps working through other members' rebalances.

Pure and deterministic: time and the new member ids come in as arguments (the leader chooses
them and writes them into the command), so every replica computes the same membership.

Worked example: ``a`` owns all six partitions; ``b`` joins.

>>> ms = Membership(0, "sticky", {})
>>> a = join(ms, 6, "worker-a", "m-a", 10_000, "sticky", now_ms=0)
>>> sorted(a.owned)
[0, 1, 2, 3, 4, 5]
>>> b = join(ms, 6, "worker-b", "m-b", 10_000, "sticky", now_ms=0)
>>> sorted(a.owned), sorted(a.revoking), sorted(b.owned), sorted(b.pending)
([0, 1, 2], [3, 4, 5], [], [3, 4, 5])

``a`` heartbeats with its new generation (it has seen the revoke) but still has a batch out on
partition 5: partitions 3 and 4 move, 5 waits.

>>> release(ms, "m-a", a.generation, busy=lambda p: p == 5)
[3, 4]
>>> sorted(b.owned), sorted(b.pending)
([3, 4], [5])

A request ``a`` made before it lost partitions is stale:

>>> try:
...     check_member(ms, "m-a", 1)
... except FluxError as err:
...     print(err.reason)
STALE_GENERATION
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq.core.assignors import STRATEGIES, assign
from fluxmq.core.errors import FluxError, invalid_argument

SESSION_TIMEOUT_MS_DEFAULT = 10_000
SESSION_TIMEOUT_MS_MIN = 1_000
SESSION_TIMEOUT_MS_MAX = 300_000
MEMBERS_PER_GROUP_MAX = 256
MEMBER_ID_CHARS_MAX = 256
EXPIRES_PER_PASS_MAX = 1000  # members expired by one ExpireMembers command
STRATEGY_DEFAULT = "sticky"
# While a member waits for partitions it asks again this much sooner: a grant reaches it well
# inside one heartbeat interval of the release.
PENDING_HEARTBEAT_DIVISOR = 4


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    """A third of the session: two heartbeats may be lost before the session lapses."""
    return max(100, session_timeout_ms // 3)


@dataclass(slots=True)
class Member:
    member_id: str
    consumer_id: str
    session_timeout_ms: int
    generation: int = 0
    fenced_below: int = 0
    owned: set[int] = field(default_factory=set)
    revoking: set[int] = field(default_factory=set)
    pending: set[int] = field(default_factory=set)
    joined_ms: int = 0

    def holds(self) -> set[int]:
        return self.owned | self.revoking


@dataclass(slots=True)
class Membership:
    group_generation: int
    strategy: str
    members: dict[str, Member]

    # -- encoding (the stored row) -------------------------------------------------------------

    def to_proto(self) -> cpb.MembershipState:
        return cpb.MembershipState(
            group_generation=self.group_generation,
            strategy=self.strategy,
            members=[
                cpb.MemberState(
                    member_id=m.member_id,
                    consumer_id=m.consumer_id,
                    session_timeout_ms=m.session_timeout_ms,
                    generation=m.generation,
                    fenced_below=m.fenced_below,
                    owned=sorted(m.owned),
                    revoking=sorted(m.revoking),
                    pending=sorted(m.pending),
                    joined_ms=m.joined_ms,
                )
                for m in sorted(self.members.values(), key=lambda m: m.member_id)
            ],
        )

    @classmethod
    def from_proto(cls, st: cpb.MembershipState) -> Membership:
        ms = cls(
            st.group_generation,
            st.strategy,
            {
                m.member_id: Member(
                    m.member_id,
                    m.consumer_id,
                    m.session_timeout_ms,
                    m.generation,
                    m.fenced_below,
                    set(m.owned),
                    set(m.revoking),
                    set(m.pending),
                    m.joined_ms,
                )
                for m in st.members
            },
        )
        ms.check()
        return ms

    def check(self) -> None:
        """The invariants: a partition has at most one holder and at most one member waiting
        for it; whoever waits for a partition waits on a holder that is revoking it."""
        held: dict[int, str] = {}
        waiting: dict[int, str] = {}
        for m in self.members.values():
            assert not (m.owned & m.revoking), (m.member_id, m.owned, m.revoking)
            assert not (m.pending & m.holds()), (m.member_id, m.pending)
            assert m.fenced_below <= m.generation <= self.group_generation, m.member_id
            for p in m.holds():
                assert p not in held, f"partition {p} held by {held.get(p)} and {m.member_id}"
                held[p] = m.member_id
            for p in m.pending:
                assert p not in waiting, f"partition {p} pending for two members"
                waiting[p] = m.member_id
        for p, mid in waiting.items():
            holder = held.get(p)
            assert holder is not None and p in self.members[holder].revoking, (p, mid, holder)

    def copy(self) -> Membership:
        """A copy that shares nothing mutable with this one (for published views)."""
        return Membership(
            self.group_generation,
            self.strategy,
            {
                mid: dataclasses.replace(
                    m, owned=set(m.owned), revoking=set(m.revoking), pending=set(m.pending)
                )
                for mid, m in self.members.items()
            },
        )

    def by_consumer(self, consumer_id: str) -> Member | None:
        for m in self.members.values():
            if m.consumer_id == consumer_id:
                return m
        return None


def stale_generation(message: str, member_id: str, generation_id: int) -> FluxError:
    return FluxError(
        "STALE_GENERATION",
        message,
        metadata={"member_id": member_id, "generation_id": str(generation_id)},
    )


def check_member(
    ms: Membership | None, member_id: str, generation_id: int, *, exact: bool = False
) -> Member:
    """The member a request is made for, if the request's generation is still good.

    Settling work (acks, commits) only needs a generation the member has not been fenced
    from; taking new work (``exact``: leases) needs the member's current generation, so that
    it never gets messages of a partition it does not know it owns yet."""
    m = ms.members.get(member_id) if ms is not None else None
    if m is None:
        raise stale_generation(
            f"member {member_id!r} is not in the group (its session expired, it left or "
            "another member replaced it): join again",
            member_id,
            generation_id,
        )
    if (
        generation_id < m.fenced_below
        or generation_id > m.generation
        or (exact and generation_id != m.generation)
    ):
        raise stale_generation(
            f"generation {generation_id} of member {member_id!r} is stale (current "
            f"{m.generation}; partitions were taken away at {m.fenced_below}): heartbeat to "
            "get the current assignment",
            member_id,
            generation_id,
        )
    return m


def validate_join(strategy: str, session_timeout_ms: int) -> tuple[str, int]:
    strategy = strategy or STRATEGY_DEFAULT
    if strategy not in STRATEGIES:
        raise invalid_argument("strategy", f"unknown assignor {strategy!r}: one of {STRATEGIES}")
    timeout = session_timeout_ms or SESSION_TIMEOUT_MS_DEFAULT
    if not SESSION_TIMEOUT_MS_MIN <= timeout <= SESSION_TIMEOUT_MS_MAX:
        raise invalid_argument(
            "session_timeout_ms",
            f"must be {SESSION_TIMEOUT_MS_MIN}..{SESSION_TIMEOUT_MS_MAX} ms",
        )
    return strategy, timeout


def join(
    ms: Membership,
    partitions: int,
    consumer_id: str,
    member_id: str,
    session_timeout_ms: int,
    strategy: str,
    now_ms: int,
    *,
    assigns: bool = True,
) -> Member:
    """Add (or re-admit) a member and rebalance. A consumer id joining again under a new member
    id replaces its old member (a restarted worker), whose requests are stale from then on."""
    if ms.members and strategy != ms.strategy:
        raise invalid_argument(
            "strategy", f"the group's members use {ms.strategy!r}; join with the same assignor"
        )
    current = ms.members.get(member_id)
    if current is not None:
        if current.consumer_id != consumer_id:
            raise invalid_argument(
                "member_id", f"member {member_id!r} belongs to consumer {current.consumer_id!r}"
            )
        current.session_timeout_ms = session_timeout_ms
        return current
    old = ms.by_consumer(consumer_id)
    if old is not None:
        del ms.members[old.member_id]
    if len(ms.members) >= MEMBERS_PER_GROUP_MAX:
        raise FluxError(
            "GROUP_FULL",
            f"a group has at most {MEMBERS_PER_GROUP_MAX} members",
            metadata={"member_limit": str(MEMBERS_PER_GROUP_MAX)},
        )
    ms.strategy = strategy
    m = Member(member_id, consumer_id, session_timeout_ms, joined_ms=now_ms)
    ms.members[member_id] = m
    rebalance(ms, partitions, assigns=assigns, always_bump={member_id})
    # A member id can come back (re-joining after an expiry raced with the join): nothing an
    # earlier incarnation was told may be accepted from the new one.
    m.fenced_below = m.generation
    return m


def remove(ms: Membership, member_ids: list[str], partitions: int, *, assigns: bool = True) -> int:
    """Members gone (left, or session expired): what they held is free at once."""
    gone = [mid for mid in member_ids if ms.members.pop(mid, None) is not None]
    if gone:
        rebalance(ms, partitions, assigns=assigns)
    return len(gone)


def rebalance(
    ms: Membership, partitions: int, *, assigns: bool = True, always_bump: set[str] | None = None
) -> None:
    """Move towards the assignor's target, changing only what differs (see the module doc).
    ``assigns=False`` (shared groups): nobody owns partitions, membership is liveness only."""
    ids = sorted(ms.members)
    target: dict[str, list[int]] = {}
    if assigns and ids:
        heading = {mid: sorted(m.owned | m.pending) for mid, m in ms.members.items()}
        target = assign(ms.strategy, ids, partitions, heading)
    target_owner = {p: mid for mid, ps in target.items() for p in ps}
    holder = {p: mid for mid, m in ms.members.items() for p in m.holds()}
    owned: dict[str, set[int]] = {mid: set() for mid in ids}
    revoking: dict[str, set[int]] = {mid: set() for mid in ids}
    pending: dict[str, set[int]] = {mid: set() for mid in ids}
    for p in sorted(set(target_owner) | set(holder)):
        t, h = target_owner.get(p), holder.get(p)
        if h is None or h == t:
            if t is not None:
                owned[t].add(p)
        else:
            revoking[h].add(p)
            if t is not None:
                pending[t].add(p)
    bump = set(always_bump or ())
    for mid, m in ms.members.items():
        if (owned[mid], revoking[mid], pending[mid]) != (m.owned, m.revoking, m.pending):
            bump.add(mid)
    if not bump:
        return
    ms.group_generation += 1
    for mid in bump:
        m = ms.members[mid]
        if m.owned - owned[mid]:
            m.fenced_below = ms.group_generation
        m.owned, m.revoking, m.pending = owned[mid], revoking[mid], pending[mid]
        m.generation = ms.group_generation
    ms.check()


def releasable(
    ms: Membership, member_id: str, generation_id: int, busy: Callable[[int], bool]
) -> list[int]:
    """The revoked partitions ``member_id`` may hand over now (it saw the revoke, no lease)."""
    m = ms.members.get(member_id)
    if m is None or generation_id < m.generation:
        return []
    return [p for p in sorted(m.revoking) if not busy(p)]


def release(
    ms: Membership, member_id: str, generation_id: int, busy: Callable[[int], bool]
) -> list[int]:
    """Hand the revoked partitions the member acknowledged to whoever waits for them."""
    done = releasable(ms, member_id, generation_id, busy)
    if not done:
        return []
    m = ms.members[member_id]
    waiting = {p: w for w in ms.members.values() for p in w.pending}
    ms.group_generation += 1
    for p in done:
        m.revoking.discard(p)
        w = waiting.get(p)
        if w is not None:
            w.pending.discard(p)
            w.owned.add(p)
            w.generation = ms.group_generation
    ms.check()
    return done


class SessionTracker:
    """The leader's memory of heartbeats (never replicated: only expiry becomes a command).

    A member the tracker has not seen yet (it joined through another leader, or this node just
    became leader) gets one full session from the first time the tracker looks: a new leader
    never expires members for heartbeats it could not have received.

    >>> t = SessionTracker()
    >>> ms = Membership(0, "sticky", {})
    >>> _ = join(ms, 2, "w", "m-w", 1_000, "sticky", now_ms=0)
    >>> t.lapsed([(7, ms)], now_ms=5_000)  # first look: the session starts now
    []
    >>> t.lapsed([(7, ms)], now_ms=6_001)
    [(7, 'm-w')]
    """

    def __init__(self) -> None:
        self._seen_ms: dict[tuple[int, str], int] = {}

    def saw(self, group_id: int, member_id: str, now_ms: int) -> None:
        self._seen_ms[(group_id, member_id)] = now_ms

    def forget(self, group_id: int, member_id: str) -> None:
        self._seen_ms.pop((group_id, member_id), None)

    def reset(self) -> None:
        self._seen_ms.clear()

    def lapsed(self, groups: list[tuple[int, Membership]], now_ms: int) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        live: set[tuple[int, str]] = set()
        for group_id, ms in groups:
            for mid, m in sorted(ms.members.items()):
                key = (group_id, mid)
                live.add(key)
                seen = self._seen_ms.setdefault(key, now_ms)
                if now_ms - seen > m.session_timeout_ms:
                    out.append(key)
        for key in set(self._seen_ms) - live:  # gone from the state: forget (bounded memory)
            del self._seen_ms[key]
        return out
