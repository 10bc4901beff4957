"""Fault schedules chosen by a seed: pure, so a seed names one schedule on every machine.

>>> s = plan(7, mode="static", kinds=("kill_leader", "partition_follower"))
>>> [step.kind for step in s.steps], s.mode
(['kill_leader', 'partition_follower'], 'static')
>>> plan(7) == plan(7)
True
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Every fault a schedule can inject. "leader"/"follower" are of the queue's shard at the moment
# the fault starts; a partition cuts node-to-node traffic only (clients reach every node).
FAULT_KINDS = (
    "kill_leader",  # kill -9, restarted after the hold
    "kill_follower",
    "kill_all",  # kill -9 of every node at once
    "stop_leader",  # SIGSTOP for the hold, then SIGCONT
    "stop_follower",
    "restart_storm",  # one node killed again and again while it starts
    "transfer_leader",  # leadership moved under load, several times
    "partition_leader",  # the leader cut off from both peers
    "partition_follower",  # a follower cut off from both peers
    "partition_bridge",  # the leader cut from one follower; the other sees both halves
    "etcd_cut_leader",  # the leader cannot reach etcd (etcd mode only)
)
PARTITION_KINDS = frozenset(k for k in FAULT_KINDS if k.startswith("partition_"))
ETCD_ONLY = frozenset({"etcd_cut_leader"})
MODES = ("static", "etcd")


@dataclass(frozen=True, slots=True)
class Step:
    at_s: float  # when the fault starts, from the start of the load
    kind: str
    hold_s: float  # how long it lasts before it is healed (restart, SIGCONT, heal)
    pick: int  # which candidate node (a follower, a storm's victim), modulo the candidates


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int
    mode: str
    steps: tuple[Step, ...]
    load_s: float  # producers and consumers run this long; faults happen within it

    def describe(self) -> str:
        steps = ", ".join(f"{s.kind}@{s.at_s:.1f}s/{s.hold_s:.1f}s" for s in self.steps)
        return f"seed {self.seed}, {self.mode} mode: {steps}"


def plan(
    seed: int,
    *,
    mode: str | None = None,
    kinds: tuple[str, ...] | None = None,
    load_s: float = 20.0,
) -> Schedule:
    """The schedule of ``seed``: its mode (unless given) and 2-3 faults (unless ``kinds`` names
    them), one after another with a pause between, all healed before the load ends."""
    rng = random.Random(seed)
    chosen_mode = mode if mode is not None else rng.choice(MODES)
    if chosen_mode not in MODES:
        raise ValueError(f"mode {chosen_mode!r} is not one of {MODES}")
    allowed = [k for k in FAULT_KINDS if chosen_mode == "etcd" or k not in ETCD_ONLY]
    if kinds is None:
        kinds = tuple(rng.choice(allowed) for _ in range(rng.randint(2, 3)))
    for kind in kinds:
        if kind not in allowed:
            raise ValueError(f"fault {kind!r} is not possible in {chosen_mode} mode")
    steps = []
    at_s = rng.uniform(2.0, 3.5)
    for kind in kinds:
        hold_s = rng.uniform(1.0, 2.0) if kind == "kill_all" else rng.uniform(2.0, 4.0)
        steps.append(Step(round(at_s, 2), kind, round(hold_s, 2), rng.randrange(1 << 16)))
        at_s += hold_s + rng.uniform(2.0, 3.5)  # the cluster recovers between faults
    return Schedule(seed, chosen_mode, tuple(steps), max(load_s, at_s + 2.0))
