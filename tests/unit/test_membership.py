"""Consumer-group membership (fluxmq/core/membership.py), pure: seeded random runs of joins,
re-joins, replacements, removals, releases and partition growth, checked after every step
against the guarantees of the module doc, plus the worked examples and the session tracker.

A failure names its seed and strategy: rerun one with ``Sim(seed, strategy).go()``.
"""

from __future__ import annotations

import doctest
import random
from collections.abc import Callable

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq.core import membership
from fluxmq.core.assignors import STRATEGIES, assign, sticky_assign
from fluxmq.core.errors import FluxError
from fluxmq.core.membership import (
    MEMBERS_PER_GROUP_MAX,
    SESSION_TIMEOUT_MS_DEFAULT,
    SESSION_TIMEOUT_MS_MAX,
    SESSION_TIMEOUT_MS_MIN,
    STRATEGY_DEFAULT,
    Member,
    Membership,
    SessionTracker,
    check_member,
    join,
    rebalance,
    releasable,
    release,
    remove,
    validate_join,
)

SEEDS = range(300)
STEPS = 40
MEMBERS_CAP = 12
TIMEOUT = 10_000

# member id -> (generation, fenced_below, owned, revoking, pending)
View = tuple[int, int, frozenset[int], frozenset[int], frozenset[int]]


def snapshot(ms: Membership) -> dict[str, View]:
    return {
        mid: (
            m.generation,
            m.fenced_below,
            frozenset(m.owned),
            frozenset(m.revoking),
            frozenset(m.pending),
        )
        for mid, m in ms.members.items()
    }


def holders(ms: Membership) -> dict[int, str]:
    return {p: mid for mid, m in ms.members.items() for p in m.holds()}


def quotas(ids: list[str], partitions: int) -> dict[str, int]:
    ordered = sorted(ids)
    if not ordered:
        return {}
    base, extra = divmod(partitions, len(ordered))
    return {m: base + (1 if i < extra else 0) for i, m in enumerate(ordered)}


def release_all(ms: Membership) -> list[int]:
    """Every member heartbeats at its current generation with nothing leased."""
    out: list[int] = []
    for mid in sorted(ms.members):
        out += release(ms, mid, ms.members[mid].generation, busy=lambda p: False)
    return out


def is_stale(ms: Membership, member_id: str, generation_id: int, exact: bool = False) -> bool:
    try:
        check_member(ms, member_id, generation_id, exact=exact)
    except FluxError as err:
        assert err.reason == "STALE_GENERATION", err
        return True
    return False


def stale(call: Callable[[], object]) -> FluxError:
    with pytest.raises(FluxError) as info:
        call()
    assert info.value.reason == "STALE_GENERATION", info.value
    return info.value


class Sim:
    """One seeded run over one strategy; ``go`` checks every guarantee after every step."""

    def __init__(self, seed: int, strategy: str) -> None:
        self.seed, self.strategy = seed, strategy
        self.rng = random.Random(seed)
        self.partitions = self.rng.randint(1, 64)
        self.ms = Membership(0, strategy, {})
        self.next_consumer = 0
        self.next_member = 0
        self.now = 0
        self.where = ""

    def tag(self, step: int, what: str) -> None:
        self.where = f"seed={self.seed} strategy={self.strategy} step={step} {what}"

    def new_member_id(self) -> str:
        self.next_member += 1
        return f"m{self.next_member:03d}"

    def go(self, steps: int = STEPS) -> None:
        rng, ms = self.rng, self.ms
        for step in range(steps):
            self.now += rng.randint(0, 500)
            before = snapshot(ms)
            held_before = holders(ms)
            gen_before = ms.group_generation
            released: list[int] = []
            releaser: str | None = None
            busy_set: set[int] = set()
            ids = sorted(ms.members)
            action = rng.choices(
                ["join", "rejoin", "replace", "remove", "release", "stale", "grow"],
                weights=[5 if len(ids) < MEMBERS_CAP else 0, 1, 1, 2, 6, 2, 1],
            )[0]
            if not ids and action in ("rejoin", "replace", "remove", "release", "stale"):
                action = "join"
            self.tag(step, action)
            if action == "join":
                self.next_consumer += 1
                mid = self.new_member_id()
                m = join(
                    ms,
                    self.partitions,
                    f"c{self.next_consumer}",
                    mid,
                    TIMEOUT,
                    self.strategy,
                    self.now,
                )
                assert ms.members[mid] is m and m.generation == ms.group_generation, self.where
                assert m.fenced_below == m.generation and m.joined_ms == self.now, self.where
            elif action == "rejoin":
                old = ms.members[rng.choice(ids)]
                timeout = rng.randint(SESSION_TIMEOUT_MS_MIN, SESSION_TIMEOUT_MS_MAX)
                again = join(
                    ms,
                    self.partitions,
                    old.consumer_id,
                    old.member_id,
                    timeout,
                    self.strategy,
                    self.now + 1,
                )
                assert again is old and again.session_timeout_ms == timeout, self.where
                assert snapshot(ms) == before and ms.group_generation == gen_before, self.where
            elif action == "replace":
                old = ms.members[rng.choice(ids)]
                mid = self.new_member_id()
                m = join(
                    ms, self.partitions, old.consumer_id, mid, TIMEOUT, self.strategy, self.now
                )
                assert old.member_id not in ms.members and ms.members[mid] is m, self.where
                assert ms.by_consumer(old.consumer_id) is m, self.where
                assert is_stale(ms, old.member_id, old.generation), self.where
            elif action == "remove":
                gone = rng.sample(ids, rng.randint(1, min(2, len(ids))))
                n = remove(ms, [*gone, "never-joined"], self.partitions)
                assert n == len(gone) and not set(gone) & set(ms.members), self.where
            elif action == "release":
                releaser = rng.choice(ids)
                m = ms.members[releaser]
                busy_set = {p for p in m.revoking if rng.random() < 0.4}
                expect = sorted(m.revoking - busy_set)
                waiting = {p: w.member_id for w in ms.members.values() for p in w.pending}
                released = release(ms, releaser, m.generation, busy=busy_set.__contains__)
                assert released == expect, (self.where, released, expect)
                assert m.revoking == busy_set, self.where
                for p in released:
                    assert p in ms.members[waiting[p]].owned, (self.where, p)
                if not released:
                    assert ms.group_generation == gen_before, self.where
            elif action == "stale":
                # A heartbeat from before the member's last assignment change releases nothing.
                mid = rng.choice(ids)
                m = ms.members[mid]
                old_gen = rng.randrange(0, m.generation)
                assert releasable(ms, mid, old_gen, busy=lambda p: False) == [], self.where
                assert release(ms, mid, old_gen, busy=lambda p: False) == [], self.where
                assert snapshot(ms) == before and ms.group_generation == gen_before, self.where
            else:
                self.partitions = min(64, self.partitions + rng.randint(1, 8))
                rebalance(ms, self.partitions)
            self.check(before, held_before, gen_before, action, releaser, released, busy_set)
            if rng.random() < 0.1:
                self.converge()
        self.converge()

    def check(
        self,
        before: dict[str, View],
        held_before: dict[int, str],
        gen_before: int,
        action: str,
        releaser: str | None,
        released: list[int],
        busy_set: set[int],
    ) -> None:
        ms, where = self.ms, self.where
        ms.check()
        assert ms.group_generation >= gen_before, where
        held: dict[int, str] = {}
        waiting: dict[int, str] = {}
        for mid, m in ms.members.items():
            assert not m.owned & m.revoking, where
            for p in m.holds() | m.pending:
                assert 0 <= p < self.partitions, (where, mid, p)
            for p in m.holds():
                assert p not in held, f"{where}: partition {p} held by {held[p]} and {mid}"
                held[p] = mid
            for p in m.pending:
                assert p not in waiting, f"{where}: partition {p} pending for two members"
                waiting[p] = mid
        if ms.members:  # every partition has a holder; a waiter waits on a revoking holder
            assert sorted(held) == list(range(self.partitions)), where
        for p, w in waiting.items():
            assert p in ms.members[held[p]].revoking and held[p] != w, (where, p)
        # A live holder loses a partition only by releasing it (nothing leased there).
        for p, was in held_before.items():
            now = held.get(p)
            if was != now and was in ms.members:
                assert action == "release" and was == releaser, (where, p, was, now)
                assert p in released and p not in busy_set, (where, p)
                assert now is None or p in before[now][4], (where, p, now)
        for mid, m in ms.members.items():
            assert not is_stale(ms, mid, m.generation), where
            assert not is_stale(ms, mid, m.generation, exact=True), where
            assert is_stale(ms, mid, m.generation - 1, exact=True), where
            assert not is_stale(ms, mid, m.fenced_below), where
            assert is_stale(ms, mid, m.generation + 1), where
            assert not m.fenced_below or is_stale(ms, mid, m.fenced_below - 1), where
            old = before.get(mid)
            if old is None:
                continue
            gen, fenced, owned, revoking, pending = old
            assert m.generation >= gen and m.fenced_below >= fenced, where
            lost = owned - m.owned
            # Fenced exactly when it lost an owned partition (gaining one never fences).
            assert (m.fenced_below > fenced) == bool(lost), (where, mid, lost)
            if lost:
                assert m.fenced_below == m.generation == ms.group_generation, where
            if m.owned != owned or m.pending != pending:
                assert m.generation > gen, (where, mid)
            if m.generation > gen:
                assert (owned, revoking, pending) != (
                    frozenset(m.owned),
                    frozenset(m.revoking),
                    frozenset(m.pending),
                ), (where, mid)

    def converge(self) -> None:
        ms, where = self.ms, f"{self.where} (converging)"
        release_all(ms)
        for m in ms.members.values():
            assert not m.revoking and not m.pending, (where, m)
        ids = sorted(ms.members)
        owned = {mid: sorted(m.owned) for mid, m in ms.members.items()}
        if self.strategy == "sticky":
            quota = quotas(ids, self.partitions)
            assert {mid: len(ps) for mid, ps in owned.items()} == quota, where
            everything = list(range(self.partitions)) if ids else []
            assert sorted(p for ps in owned.values() for p in ps) == everything, where
            assert sticky_assign(ids, self.partitions, owned) == owned, where
        else:
            assert owned == assign(self.strategy, ids, self.partitions), where
        gen = ms.group_generation
        rebalance(ms, self.partitions)  # converged: a rebalance changes nothing
        assert ms.group_generation == gen, where


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_partition_is_never_held_by_two_members_and_moves_only_when_released(
    strategy: str,
) -> None:
    for seed in SEEDS:
        Sim(seed, strategy).go()


# -- worked cases --------------------------------------------------------------------------------


def converged(strategy: str, partitions: int, member_ids: list[str]) -> Membership:
    ms = Membership(0, strategy, {})
    for mid in member_ids:
        join(ms, partitions, f"c-{mid}", mid, TIMEOUT, strategy, now_ms=0)
        release_all(ms)
    return ms


def test_sticky_fourth_member_takes_exactly_one_partition_and_the_others_are_untouched() -> None:
    ms = converged("sticky", 6, ["a", "b", "c"])
    assert {mid: sorted(m.owned) for mid, m in ms.members.items()} == {
        "a": [0, 1],
        "b": [3, 4],
        "c": [2, 5],  # c took what a and b gave up, a and b kept the rest
    }
    before = snapshot(ms)
    d = join(ms, 6, "c-d", "d", TIMEOUT, "sticky", now_ms=0)
    revoked = {mid: sorted(m.revoking) for mid, m in ms.members.items() if m.revoking}
    assert revoked == {"c": [5]}  # the minimum: d's share is one partition
    assert sorted(d.pending) == [5] and not d.owned
    for mid in ("a", "b"):
        assert snapshot(ms)[mid] == before[mid]  # same partitions, generation and fence
    c = ms.members["c"]
    assert sorted(c.owned) == [2] and c.fenced_below == c.generation > before["c"][0]
    assert release(ms, "c", c.generation, busy=lambda p: False) == [5]
    assert sorted(d.owned) == [5] and not d.pending
    for mid in ("a", "b"):
        assert snapshot(ms)[mid] == before[mid]


def test_sticky_join_revokes_only_the_newcomers_share_and_fences_only_who_lost() -> None:
    for seed in range(200):
        rng = random.Random(seed)
        partitions = rng.randint(1, 64)
        ids = sorted(f"m{i:02d}" for i in rng.sample(range(40), rng.randint(1, 8)))
        ms = converged("sticky", partitions, ids)
        before = snapshot(ms)
        new = f"m{rng.choice([i for i in range(41) if f'm{i:02d}' not in ids]):02d}"
        m = join(ms, partitions, f"c-{new}", new, TIMEOUT, "sticky", now_ms=0)
        where = f"seed={seed} partitions={partitions} ids={ids} new={new}"
        revoked = sum(len(x.revoking) for x in ms.members.values())
        assert revoked == len(m.pending) == quotas([*ids, new], partitions)[new], where
        for mid in ids:
            x = ms.members[mid]
            if x.revoking:
                assert x.fenced_below == x.generation > before[mid][0], (where, mid)
            else:
                assert snapshot(ms)[mid] == before[mid], (where, mid)


def test_check_member_rejects_unknown_fenced_and_future_generations_and_exact_needs_current() -> (
    None
):
    ms = converged("range", 4, ["a"])  # a: generation 1, owns everything
    a = ms.members["a"]
    assert (a.generation, a.fenced_below) == (1, 1)  # nothing older may speak for it
    join(ms, 4, "c-b", "b", TIMEOUT, "range", now_ms=0)  # a loses 2 and 3: fenced at 2
    assert (a.generation, a.fenced_below) == (2, 2)
    join(ms, 4, "c-c", "c", TIMEOUT, "range", now_ms=0)
    b = ms.members["b"]
    # b lost a partition it was only waiting for: a new generation, but no fence.
    assert b.fenced_below == 2 and b.generation == 3
    err = stale(lambda: check_member(ms, "nobody", 1))
    assert err.metadata == {"member_id": "nobody", "generation_id": "1"}
    stale(lambda: check_member(None, "a", 1))
    stale(lambda: check_member(ms, "a", 1))  # before a lost partitions
    stale(lambda: check_member(ms, "a", a.generation + 1))  # from the future
    assert check_member(ms, "a", a.generation) is a
    assert check_member(ms, "b", 2) is b  # older than current but not fenced
    stale(lambda: check_member(ms, "b", 0))  # older than b itself
    assert check_member(ms, "b", 3) is b
    stale(lambda: check_member(ms, "b", 4))
    # Taking new work (exact) needs the current generation, even when nothing was fenced.
    assert check_member(ms, "b", 3, exact=True) is b
    stale(lambda: check_member(ms, "b", 2, exact=True))
    stale(lambda: check_member(ms, "b", 0, exact=True))
    assert check_member(ms, "a", a.generation, exact=True) is a


def test_a_member_id_admitted_again_does_not_accept_its_previous_incarnations_generations() -> None:
    ms = converged("range", 2, ["a"])
    join(ms, 2, "cb", "b", TIMEOUT, "range", now_ms=0)  # a loses 1: generation 1 is stale
    stale(lambda: check_member(ms, "a", 1))
    remove(ms, ["a"], 2)  # its session expires...
    # ...while the leader, which read the membership before the expiry was applied, re-admits
    # the consumer under the member id it asked for.
    join(ms, 2, "ca", "a", TIMEOUT, "range", now_ms=0)
    stale(lambda: check_member(ms, "a", 1))


def test_the_module_doc_worked_examples_hold() -> None:
    assert doctest.testmod(membership).failed == 0


def test_rejoin_with_the_member_id_of_another_consumer_or_another_strategy_is_refused() -> None:
    ms = converged("range", 4, ["a"])
    before = snapshot(ms)
    with pytest.raises(FluxError) as info:
        join(ms, 4, "someone-else", "a", TIMEOUT, "range", now_ms=0)
    assert info.value.reason == "INVALID_ARGUMENT"
    with pytest.raises(FluxError) as info:
        join(ms, 4, "c-b", "b", TIMEOUT, "sticky", now_ms=0)
    assert info.value.reason == "INVALID_ARGUMENT"
    assert snapshot(ms) == before and set(ms.members) == {"a"}


def test_a_full_group_refuses_a_new_member_but_takes_a_replacement() -> None:
    ms = Membership(0, "round_robin", {})
    for i in range(MEMBERS_PER_GROUP_MAX):
        join(ms, 4, f"c{i}", f"m{i}", TIMEOUT, "round_robin", now_ms=0, assigns=False)
    with pytest.raises(FluxError) as info:
        join(ms, 4, "c-new", "m-new", TIMEOUT, "round_robin", now_ms=0, assigns=False)
    assert info.value.reason == "GROUP_FULL"
    assert len(ms.members) == MEMBERS_PER_GROUP_MAX and "m-new" not in ms.members
    join(ms, 4, "c0", "m0-restarted", TIMEOUT, "round_robin", now_ms=0, assigns=False)
    assert "m0" not in ms.members and len(ms.members) == MEMBERS_PER_GROUP_MAX


def test_shared_groups_track_members_without_assigning_partitions() -> None:
    ms = Membership(0, "sticky", {})
    a = join(ms, 4, "ca", "a", TIMEOUT, "sticky", now_ms=0, assigns=False)
    b = join(ms, 4, "cb", "b", TIMEOUT, "sticky", now_ms=0, assigns=False)
    assert (a.generation, b.generation) == (1, 2)
    assert not (a.holds() | a.pending | b.holds() | b.pending)
    assert remove(ms, ["a"], 4, assigns=False) == 1 and set(ms.members) == {"b"}
    ms.check()


def test_removing_the_holder_hands_its_revoked_partitions_over_at_once() -> None:
    ms = converged("range", 4, ["a"])
    b = join(ms, 4, "cb", "b", TIMEOUT, "range", now_ms=0)
    assert sorted(b.pending) == [2, 3] and not b.owned
    gen = b.generation
    assert remove(ms, ["a"], 4) == 1
    assert sorted(b.owned) == [0, 1, 2, 3] and not b.pending
    assert b.generation > gen and b.fenced_below <= gen


def test_validate_join_defaults_and_bounds() -> None:
    assert validate_join("", 0) == (STRATEGY_DEFAULT, SESSION_TIMEOUT_MS_DEFAULT)
    assert validate_join("range", SESSION_TIMEOUT_MS_MIN) == ("range", SESSION_TIMEOUT_MS_MIN)
    assert validate_join("sticky", SESSION_TIMEOUT_MS_MAX) == ("sticky", SESSION_TIMEOUT_MS_MAX)
    for strategy, timeout, bad in [
        ("cooperative", 10_000, "strategy"),
        ("range", SESSION_TIMEOUT_MS_MIN - 1, "session_timeout_ms"),
        ("range", SESSION_TIMEOUT_MS_MAX + 1, "session_timeout_ms"),
    ]:
        with pytest.raises(FluxError) as info:
            validate_join(strategy, timeout)
        assert info.value.reason == "INVALID_ARGUMENT"
        assert info.value.metadata["field"] == bad


# -- session tracker -----------------------------------------------------------------------------


def one_member(timeout_ms: int = 1_000, member_id: str = "m-w") -> Membership:
    ms = Membership(0, "sticky", {})
    join(ms, 2, "w", member_id, timeout_ms, "sticky", now_ms=0)
    return ms


def test_an_unseen_member_gets_a_full_session_from_the_first_look() -> None:
    t = SessionTracker()
    ms = one_member(1_000)
    assert t.lapsed([(7, ms)], now_ms=50_000) == []  # joined long ago, never seen: starts now
    assert t.lapsed([(7, ms)], now_ms=51_000) == []  # exactly one session: not lapsed yet
    assert t.lapsed([(7, ms)], now_ms=51_001) == [(7, "m-w")]


def test_a_heartbeat_postpones_the_expiry() -> None:
    t = SessionTracker()
    ms = one_member(1_000)
    assert t.lapsed([(7, ms)], now_ms=0) == []
    t.saw(7, "m-w", 900)
    assert t.lapsed([(7, ms)], now_ms=1_500) == []
    assert t.lapsed([(7, ms)], now_ms=1_900) == []
    assert t.lapsed([(7, ms)], now_ms=1_901) == [(7, "m-w")]


def test_a_leader_change_gives_everyone_a_full_session_again() -> None:
    t = SessionTracker()
    a, b = one_member(1_000, "m-a"), one_member(5_000, "m-b")
    groups = [(1, a), (2, b)]
    assert t.lapsed(groups, now_ms=0) == []
    assert t.lapsed(groups, now_ms=5_001) == [(1, "m-a"), (2, "m-b")]
    t.reset()
    assert t.lapsed(groups, now_ms=9_000) == []
    assert t.lapsed(groups, now_ms=10_001) == [(1, "m-a")]
    assert t.lapsed(groups, now_ms=14_001) == [(1, "m-a"), (2, "m-b")]


def test_members_are_tracked_per_group() -> None:
    t = SessionTracker()
    g1, g2 = one_member(1_000), one_member(1_000)  # the same member id in two groups
    assert t.lapsed([(1, g1), (2, g2)], now_ms=0) == []
    t.saw(2, "m-w", 800)
    assert t.lapsed([(1, g1), (2, g2)], now_ms=1_500) == [(1, "m-w")]


def test_members_gone_from_the_state_or_forgotten_stop_being_tracked() -> None:
    t = SessionTracker()
    ms = one_member(1_000)
    assert t.lapsed([(7, ms)], now_ms=0) == []
    # Gone from the state (left, expired, group deleted): the tracker drops it, so the same id
    # seen again later starts a new session instead of lapsing at once.
    assert t.lapsed([], now_ms=100) == []
    assert t.lapsed([(7, ms)], now_ms=10_000) == []
    assert t.lapsed([(7, ms)], now_ms=11_001) == [(7, "m-w")]
    t.forget(7, "m-w")
    assert t.lapsed([(7, ms)], now_ms=20_000) == []
    assert t.lapsed([(7, ms)], now_ms=21_001) == [(7, "m-w")]
    t.forget(7, "never-seen")  # harmless


# -- stored form ---------------------------------------------------------------------------------


def test_membership_round_trips_through_its_stored_form() -> None:
    for strategy in STRATEGIES:
        for seed in range(40):
            sim = Sim(seed, strategy)
            for _ in range(4):
                sim.go(steps=8)
                st = sim.ms.to_proto()
                again = Membership.from_proto(
                    cpb.MembershipState.FromString(st.SerializeToString())
                )
                assert again == sim.ms, f"seed={seed} strategy={strategy}"
                assert again.to_proto().SerializeToString() == st.SerializeToString()


def test_a_stored_form_breaking_the_invariants_is_refused() -> None:
    ms = Membership(
        5,
        "range",
        {
            "a": Member("a", "ca", TIMEOUT, 5, 0, {0, 1}),
            "b": Member("b", "cb", TIMEOUT, 5, 0, {1}),
        },
    )
    with pytest.raises(AssertionError):
        Membership.from_proto(ms.to_proto())
