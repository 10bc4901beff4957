"""The disk-loss schedule (issue 37, item 4), driven step by step on a simulated cluster.

1. Three replicas elect a leader A and commit a few commands everywhere.
2. B is cut off; commands proposed to A commit on {A, C} and are acknowledged.
3. C loses its disk (``Cluster.wipe``) and A crashes; the network heals; C restarts empty.
   For ``window_steps`` only B and the empty C are up: a majority by count, but only C ever
   held the new commands, and it has forgotten them.
4. A restarts; the cluster settles.

Safe: no leader in step 3 (C on probation refuses its vote), and every acknowledged command is
applied on every replica in the end. Without hook 10 (``SimSettings(probation=False)``) B is
elected in step 3 with C's vote, and the checker reports the committed commands B lacks
("leader completeness") as it takes office.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from tests.sim.checker import SafetyViolation
from tests.sim.clock import simulated
from tests.sim.cluster import Cluster, SimSettings, _scratch_root

STEPS_MAX = 2_000  # any phase that waits, at most (10 ms each)


@dataclass
class DiskLossResult:
    acked_while_b_was_away: int
    leaders_while_a_was_down: list[str]  # replicas that led during step 3
    applied_everywhere: bool  # every acknowledged command applied on every replica
    converged: bool


def _step_until(cluster: Cluster, done: object, what: str) -> None:
    for _ in range(STEPS_MAX):
        cluster.step(faulty=False)
        if callable(done) and done():
            return
    raise AssertionError(f"seed {cluster.seed}: {what} within {STEPS_MAX} steps")


def _leaders(cluster: Cluster) -> list[str]:
    return sorted(n for n, r in cluster.replicas.items() if r.so._isLeader())


def run_disk_loss(
    seed: int, settings: SimSettings | None = None, window_steps: int = 400
) -> DiskLossResult:
    settings = settings or SimSettings(members=3)
    root = _scratch_root()
    cluster = Cluster(seed, settings, root)
    try:
        with simulated(cluster.clock, cluster.raft_rng):
            return _run(cluster, window_steps)
    except SafetyViolation as e:
        raise SafetyViolation(f"{e}\n{cluster.trace_text()}") from None
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(cluster: Cluster, window_steps: int) -> DiskLossResult:
    cluster.start()
    _step_until(cluster, lambda: len(_leaders(cluster)) == 1, "a first leader")
    a = _leaders(cluster)[0]
    b, c = sorted(n for n in cluster.ids if n != a)
    before = [f"s{cluster.seed}-before-{i}".encode() for i in range(3)]
    for command in before:
        cluster.replicas[a].propose(command)
    _step_until(cluster, lambda: set(before) <= set(cluster.checker.acked), "3 acknowledged")
    _step_until(cluster, cluster.converged, "every replica applying them")

    cluster.network.partition([{a, c}, {b}])
    cluster._event(f"partition {a},{c} | {b}")
    on_two = [f"s{cluster.seed}-on-two-{i}".encode() for i in range(10)]
    for command in on_two:
        cluster.replicas[a].propose(command)
    _step_until(cluster, lambda: set(on_two) <= set(cluster.checker.acked), "10 acked on two")
    acked_on_two = len(set(on_two) & set(cluster.checker.acked))

    cluster.wipe(c)
    cluster.crash(a)
    cluster.network.heal()
    cluster._event("heal")
    cluster.restart(c)
    leaders_seen: set[str] = set()
    for _ in range(window_steps):
        cluster.step(faulty=False)
        leaders_seen.update(_leaders(cluster))

    cluster.restart(a)
    converged = False
    for _ in range(STEPS_MAX):
        cluster.step(faulty=False)
        if cluster.converged() and not any(r.so.on_probation for r in cluster.replicas.values()):
            converged = True
            break
    acked = set(cluster.checker.acked)
    applied_everywhere = all(
        acked <= {command for _index, command in r.sm.applied} for r in cluster.replicas.values()
    )
    for node, r in sorted(cluster.replicas.items()):
        cluster.checker.check_applied_history(node, r.sm.applied)
    return DiskLossResult(
        acked_while_b_was_away=acked_on_two,
        leaders_while_a_was_down=sorted(leaders_seen),
        applied_everywhere=applied_everywhere,
        converged=converged,
    )
