"""Assignors: every partition has exactly one owner, members are balanced, results do not depend
on the order members are listed in, sticky moves no more than balance requires, and the planned
moves never give a partition to two members at once. Seeded; the seed is in every message."""

from __future__ import annotations

import doctest
import random

import pytest

from fluxmq.core import assignors
from fluxmq.core.assignors import Assignment, assign, plan_moves, sticky_assign

SEEDS = range(200)


def _check_complete_and_balanced(a: Assignment, members: list[str], partitions: int, why: str):
    owned = sorted(p for ps in a.values() for p in ps)
    assert sorted(a) == sorted(members), why
    if members:
        assert owned == list(range(partitions)), why
        counts = [len(ps) for ps in a.values()]
        assert max(counts) - min(counts) <= 1, why
    for ps in a.values():
        assert ps == sorted(ps), why


def _random_group(rng: random.Random) -> tuple[list[str], int]:
    members = [f"m{rng.randrange(1000):03d}" for _ in range(rng.randrange(0, 9))]
    return sorted(set(members)), rng.randrange(0, 40)


def test_doctests_of_the_worked_examples_hold() -> None:
    assert doctest.testmod(assignors).failed == 0


@pytest.mark.parametrize("strategy", assignors.STRATEGIES)
def test_every_partition_has_one_owner_and_members_are_balanced(strategy: str) -> None:
    for seed in SEEDS:
        rng = random.Random(seed)
        members, partitions = _random_group(rng)
        why = f"seed={seed} strategy={strategy} members={members} partitions={partitions}"
        a = assign(strategy, members, partitions, {})
        _check_complete_and_balanced(a, members, partitions, why)
        shuffled = members[:]
        rng.shuffle(shuffled)
        assert assign(strategy, shuffled, partitions, {}) == a, why


def test_sticky_moves_only_what_balance_requires() -> None:
    for seed in SEEDS:
        rng = random.Random(seed)
        members, partitions = _random_group(rng)
        current = sticky_assign(members, partitions, {})
        # Some leave, some join.
        stay = [m for m in members if rng.random() < 0.7]
        joined = [f"n{i}" for i in range(rng.randrange(0, 3))]
        after = sorted(stay + joined)
        why = f"seed={seed} before={current} after_members={after}"
        new = sticky_assign(after, partitions, current)
        _check_complete_and_balanced(new, after, partitions, why)
        if not after:
            continue
        # A stayer keeps min(what it had, its quota) partitions; nothing else of theirs moves.
        base, extra = divmod(partitions, len(after))
        for i, m in enumerate(after):
            quota = base + (1 if i < extra else 0)
            kept = set(current.get(m, [])) & set(new[m])
            assert len(kept) == min(len(current.get(m, [])), quota), why


def test_planned_moves_never_give_a_partition_two_owners() -> None:
    for seed in SEEDS:
        rng = random.Random(seed)
        members, partitions = _random_group(rng)
        old = sticky_assign(members, partitions, {})
        after = sorted({*members[: rng.randrange(0, len(members) + 1)], "z1", "z2"})
        new = assign(rng.choice(assignors.STRATEGIES), after, partitions, old)
        why = f"seed={seed} old={old} new={new}"
        moves = plan_moves(old, new)
        # Phase 1: revocations; owners are then exactly keep.
        owned = {p: m for m, ps in old.items() for p in ps}
        for m, ps in moves.revoke.items():
            for p in ps:
                assert owned.pop(p) == m, why
        for m, ps in moves.keep.items():
            assert all(owned[p] == m for p in ps), why
        # Phase 2: grants go only to partitions nobody holds.
        for grants in (moves.grant_now, moves.grant_after_release):
            for m, ps in grants.items():
                for p in ps:
                    assert p not in owned, why
                    owned[p] = m
        assert owned == {p: m for m, ps in new.items() for p in ps}, why


def test_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown assignment strategy"):
        assign("fastest", ["a"], 3)
