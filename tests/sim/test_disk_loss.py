"""Issue 37, item 4: a replica that lost its disk is not a voter until it is whole again.

The schedule (tests/sim/disk_loss.py): commit on {A, C}, wipe C, kill A; B and the empty C are
up alone for 4 s of simulated time; then A returns. Seeded: each seed draws other election
timeouts and message orders; a failure names the seed."""

from __future__ import annotations

import pytest

from tests.sim.cluster import SimSettings
from tests.sim.disk_loss import run_disk_loss

SEEDS = range(3000, 3030)


@pytest.mark.parametrize("seed", SEEDS)
def test_commit_on_two_then_wipe_one_and_kill_the_other_loses_nothing(seed: int) -> None:
    result = run_disk_loss(seed)
    assert result.acked_while_b_was_away == 10
    assert result.leaders_while_a_was_down == [], (
        f"seed {seed}: {result.leaders_while_a_was_down} led while only B and the wiped C were up"
    )
    assert result.converged, f"seed {seed}: the cluster did not settle after A returned"
    assert result.applied_everywhere, f"seed {seed}: an acknowledged command is missing"


def test_without_probation_the_wiped_replica_elects_a_leader_that_lost_commits() -> None:
    # The negative control: the same schedule with hook 10 off. C votes for B at once, and B,
    # which never had the commands committed on {A, C}, takes office without them.
    failures = []
    for seed in SEEDS[:10]:
        try:
            run_disk_loss(seed, SimSettings(members=3, probation=False))
        except AssertionError as e:
            failures.append(str(e))
    assert len(failures) >= 8, failures
    assert all("leader completeness" in f and "replay" in f for f in failures), failures[:2]
