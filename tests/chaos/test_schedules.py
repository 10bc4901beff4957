"""Seeded fault schedules against a fresh 3-node cluster, on every CI run: no acknowledged
message lost, none duplicated, nothing unexpected, each producer's acknowledged messages in
order, replicas equal, the group's accounting exact. Together the CI schedules inject every
fault kind, in both modes (static peers, etcd). ``pytest tests/chaos --seed N`` replays one
schedule (a CI seed with its faults, any other seed as the soak draws it)."""

from __future__ import annotations

import doctest
import os
from pathlib import Path

import pytest

from tests.chaos import schedule as schedule_module
from tests.chaos.harness import run_schedule
from tests.chaos.network import leftover_chains
from tests.chaos.schedule import FAULT_KINDS, MODES, Schedule, plan

pytestmark = pytest.mark.slow

# seed -> (mode, faults): every fault kind at least once, both modes.
CI_SCHEDULES: dict[int, tuple[str, tuple[str, ...]]] = {
    1: ("static", ("kill_leader", "partition_follower")),
    2: ("static", ("kill_follower", "stop_leader")),
    3: ("static", ("kill_all", "transfer_leader")),
    4: ("static", ("partition_leader", "restart_storm")),
    5: ("etcd", ("partition_bridge", "stop_follower")),
    6: ("etcd", ("etcd_cut_leader", "kill_leader")),
    7: ("etcd", ("partition_leader", "transfer_leader")),
    8: ("etcd", ("restart_storm", "partition_bridge")),
}


def schedule_of(seed: int) -> Schedule:
    """The schedule a seed names: a CI seed's faults, or the soak's draw for any other."""
    if seed in CI_SCHEDULES:
        mode, kinds = CI_SCHEDULES[seed]
        return plan(seed, mode=mode, kinds=kinds)
    return plan(seed)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" in metafunc.fixturenames:
        replay = metafunc.config.getoption("--seed")
        metafunc.parametrize("seed", [replay] if replay is not None else sorted(CI_SCHEDULES))


def test_the_ci_schedules_cover_every_fault_kind_in_both_modes() -> None:
    kinds = {k for _mode, ks in CI_SCHEDULES.values() for k in ks}
    assert kinds == set(FAULT_KINDS)
    assert {mode for mode, _ks in CI_SCHEDULES.values()} == set(MODES)


def test_a_seed_names_one_schedule_whose_faults_end_before_the_load() -> None:
    assert doctest.testmod(schedule_module).failed == 0
    for seed in range(200):
        drawn = plan(seed)
        assert drawn == plan(seed)
        assert drawn.mode in MODES and 2 <= len(drawn.steps) <= 3
        assert all(s.kind in FAULT_KINDS for s in drawn.steps)
        assert drawn.mode == "etcd" or all(s.kind != "etcd_cut_leader" for s in drawn.steps)
        last = drawn.steps[-1]
        assert last.at_s + last.hold_s < drawn.load_s
    with pytest.raises(ValueError):
        plan(1, mode="static", kinds=("etcd_cut_leader",))


def test_no_acknowledged_message_is_lost_duplicated_or_reordered_under_faults(
    seed: int, tmp_path: Path
) -> None:
    schedule = schedule_of(seed)
    report = run_schedule(schedule, tmp_path / f"seed-{seed}")
    print(report.text())  # the timeline, shown with -rA (and with the failure)
    own_chain = f"FMQCHAOS{os.getpid()}"
    assert own_chain not in leftover_chains(), "the schedule left its iptables chain behind"
    assert report.ok, report.text()
    assert report.acked > 0, report.text()
