"""The simulation driver: N replicas, one seed, a bounded number of steps.

A step advances the simulated clock by one tick, delivers the messages due, ticks every live
replica in a seeded order, checks the safety properties (tests/sim/checker.py), then maybe
proposes commands (to the leader or to followers, which forward them), crashes a replica (its
journal keeps only what was flushed), restarts one, partitions the network or heals it. After
the faulty phase the network is healed, every replica restarted, and the cluster given a bounded
number of clean steps to converge; then every replica's applied history is compared with the
run's. Everything random comes from the seed: ``run(seed)`` twice gives the same history.
"""

from __future__ import annotations

import collections
import hashlib
import os
import random
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from raft.journal import Item
from tests.sim.checker import SafetyChecker, SafetyViolation
from tests.sim.clock import SimClock, simulated
from tests.sim.network import Faults, NetworkStats, SimNetwork, SimTransport
from tests.sim.replica import ObservedJournal, Replica

TRACE_LINES = 30
LeaderView = tuple[str, int, Sequence[Item]]  # (node, term, its log) of a live leader


@dataclass(frozen=True)
class SimSettings:
    members: int = 3
    steps: int = 300  # faulty phase, 10 ms of simulated time each
    settle_steps_max: int = 400  # clean phase: stops early once converged
    tick_s: float = 0.01
    snapshots: bool = True
    stock_append: bool = False  # hook 3 off: pysyncobj's own append-entries handler
    flush_before_send: bool = True
    network: str = "tcp"  # or "datagram": see tests/sim/network.py
    propose_p: float = 0.3
    crash_p: float = 0.012
    restart_p: float = 0.05
    partition_p: float = 0.01
    heal_p: float = 0.03
    reset_p: float = 0.02  # a connection breaks and is made again
    # Hook 10 (raft/probation.py): a replica started without Raft state is on probation, as
    # raft/ starts every new replica and every one whose disk was lost. Off: the negative
    # control, where a wiped replica votes at once.
    probation: bool = True


@dataclass
class RunResult:
    seed: int
    history: str  # sha256 of everything observable, step by step
    acked: int
    committed: int
    terms: int
    crashes: int
    partitions: int
    snapshots_written: int
    snapshots_installed: int
    converged: bool
    network: NetworkStats = field(default_factory=NetworkStats)
    # Commits a leader took while its own copy was still only in memory (hook 7): a majority of
    # followers had fsync'd them.
    leader_commits_before_own_fsync: int = 0


def _scratch_root() -> str:
    # Snapshot files are fsync'd (raft/snapshot_file.py): on tmpfs that costs nothing.
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return tempfile.mkdtemp(prefix="fluxmq-sim-", dir=base)


class Cluster:
    def __init__(self, seed: int, settings: SimSettings, root: str) -> None:
        self.seed = seed
        self.settings = settings
        self.root = root
        self.rng = random.Random(f"{seed}:driver")
        self.raft_rng = random.Random(f"{seed}:raft")
        self.clock = SimClock()
        self.network = SimNetwork(
            f"{seed}:net", self.clock, Faults.draw(self.rng, settings.network)
        )
        self.transport_class = SimTransport.bound_to(self.network)
        self.ids = [f"10.0.0.{i + 1}:7100" for i in range(settings.members)]
        self.checker = SafetyChecker(seed, settings.members)
        self.replicas: dict[str, Replica] = {}
        self.crashed: dict[str, ObservedJournal] = {}
        # Replicas whose "disk" holds the probation mark (raft/pysyncobj_shard.PROBATION_FILE).
        self.probation_marks: set[str] = set()
        self.trace: collections.deque[str] = collections.deque(maxlen=TRACE_LINES)
        self.history = hashlib.sha256()
        self.step_no = 0
        self.proposed = 0
        self.crashes = 0
        self.partitions = 0
        self.leader_commits_before_own_fsync = 0

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        for node in self.ids:
            self.crashed[node] = ObservedJournal()
            if self.settings.probation:
                self.probation_marks.add(node)  # new replicas: no Raft state yet
        for node in self.ids:
            self.restart(node)

    def restart(self, node: str) -> None:
        journal = self.crashed.pop(node)
        root = os.path.join(self.root, node.replace(":", "_"))
        os.makedirs(root, exist_ok=True)
        r = Replica(
            node,
            self.ids,
            root,
            journal,
            self.checker,
            self.transport_class,
            stock_append=self.settings.stock_append,
            snapshots=self.settings.snapshots,
            probation=node in self.probation_marks,
            on_whole=lambda: self._left_probation(node),
        )
        r.transport.flush_before_send = self.settings.flush_before_send
        self.replicas[node] = r
        self.network.attach(r.transport)
        self._event(f"restart {node} (log {journal.last_index}, term {journal.getCurrentTerm()})")

    def crash(self, node: str) -> None:
        r = self.replicas.pop(node)
        self.network.detach(node)
        after = r.journal.crash()
        assert isinstance(after, ObservedJournal)
        self.crashed[node] = after
        self.crashes += 1
        lost = r.journal.last_index - after.last_index
        self._event(f"crash {node} (log {r.journal.last_index}, {lost:+d} not flushed)")

    def wipe(self, node: str) -> None:
        """``node`` crashes and loses its disk: journal, term, vote and snapshot. It restarts
        (``restart``) with nothing, on probation unless the settings turn hook 10 off."""
        self.crash(node)
        self.crashed[node] = ObservedJournal()
        root = os.path.join(self.root, node.replace(":", "_"))
        shutil.rmtree(root, ignore_errors=True)
        if self.settings.probation:
            self.probation_marks.add(node)
        self._event(f"wipe {node}: its disk is lost")

    def _left_probation(self, node: str) -> None:
        self.probation_marks.discard(node)
        self._event(f"{node} left probation")

    # -- one step ---------------------------------------------------------------------------

    def step(self, faulty: bool) -> None:
        self.step_no += 1
        self.checker.step = self.step_no
        self.clock.advance(self.settings.tick_s)
        self.clock.new_tick()
        self.network.deliver_due()
        order = sorted(self.replicas)
        self.raft_rng.shuffle(order)
        for node in order:
            self.clock.new_tick()
            self.replicas[node].tick()
        for node in order:  # the leaders' journal writers catch up, or not yet
            self.replicas[node].writer.run_some(self.raft_rng)
        self.observe()
        if faulty:
            self.act()
        elif self.rng.random() < self.settings.propose_p / 3:
            self.propose()

    def observe(self) -> None:
        live = sorted(self.replicas)
        leaders: list[LeaderView] = [
            # A journal indexes like a sequence of items (pysyncobj relies on it too).
            (n, self.replicas[n].so.raftCurrentTerm, cast(Sequence[Item], self.replicas[n].journal))
            for n in live
            if self.replicas[n].so._isLeader()
        ]
        for node, term, log in leaders:
            if self.checker.on_leader(term, node):
                self.checker.on_new_leader(node, term, log)
                self._event(f"{node} leads term {term}")
        for node in live:
            self._observe_commits(node, leaders)
        for node in live:
            self._observe_truncation(node)
        for node in live:
            r = self.replicas[node]
            for command, index in r.acks:
                self.checker.on_ack(node, command, index)
            r.acks.clear()
        self.history.update(
            repr(
                [
                    (n, r.so.raftCurrentTerm, r.so.raftCommitIndex, r.so.raftLastApplied)
                    for n, r in sorted(self.replicas.items())
                ]
            ).encode()
        )

    def _observe_commits(self, node: str, leaders: list[LeaderView]) -> None:
        r = self.replicas[node]
        commit = r.so.raftCommitIndex
        if commit <= r.commit_seen:
            r.commit_seen = commit  # a restart reads its commit index back from the journal
            return
        log = r.journal
        first = log[0][1]
        is_leader = r.so._isLeader()
        durable = self._durable_logs() if is_leader else {}
        if is_leader and commit > r.journal.durable_index:
            self.leader_commits_before_own_fsync += 1
        for index in range(max(r.commit_seen + 1, first), min(commit, log.last_index) + 1):
            item = log[index - first]
            # Whoever holds it as committed learned that in its current term or before.
            committed_by = min(
                int(o.so.raftCurrentTerm)
                for o in self.replicas.values()
                if o.so.raftCommitIndex >= index
            )
            self.checker.on_commit(node, item, leaders, committed_by)
            if is_leader:
                self.checker.check_majority_durable(node, item, durable)
        r.commit_seen = commit

    def _observe_truncation(self, node: str) -> None:
        """A journal that deleted entries this step: the committed entries among them must
        still be durable on a majority (Raft deletes only entries that conflict with the
        leader's, which committed entries never do)."""
        journal = self.replicas[node].journal
        start = journal.truncated_from
        if start is None:
            return
        journal.truncated_from = None
        durable = self._durable_logs()
        for index in sorted(i for i in self.checker.committed if i >= start):
            term, command = self.checker.committed[index]
            self.checker.check_still_durable(node, (command, index, term), durable)

    def _durable_logs(self) -> dict[str, Sequence[Item]]:
        logs = {n: r.journal.durable_entries() for n, r in self.replicas.items()}
        logs.update({n: j.durable_entries() for n, j in self.crashed.items()})
        return logs

    def act(self) -> None:
        s, rng = self.settings, self.rng
        if self.replicas and rng.random() < s.propose_p:
            for _ in range(rng.randint(1, 3)):
                self.propose()
        if self.replicas and rng.random() < s.crash_p:
            self.crash(rng.choice(sorted(self.replicas)))
        if self.crashed and rng.random() < s.restart_p:
            self.restart(rng.choice(sorted(self.crashed)))
        if not self.network.cut_links and rng.random() < s.partition_p:
            ids = list(self.ids)
            rng.shuffle(ids)
            cut = rng.randint(1, len(ids) - 1)
            self.network.partition([set(ids[:cut]), set(ids[cut:])])
            self.partitions += 1
            self._event(f"partition {sorted(ids[:cut])} | {sorted(ids[cut:])}")
        elif self.network.cut_links and rng.random() < s.heal_p:
            self.network.heal()
            self._event("heal")
        if rng.random() < s.reset_p:
            a, b = rng.sample(self.ids, 2)
            self.network.reset(a, b)
            self._event(f"connection {a} - {b} reset")

    def propose(self) -> None:
        node = self.rng.choice(sorted(self.replicas))
        self.proposed += 1
        command = f"s{self.seed}-c{self.proposed}".encode()
        self.replicas[node].propose(command)

    # -- the whole run ----------------------------------------------------------------------

    def run(self) -> RunResult:
        s = self.settings
        self.start()
        for _ in range(s.steps):
            self.step(faulty=True)
        self.network.heal()
        self.network.faults = replace(self.network.faults, drop_p=0.0, duplicate_p=0.0, fifo=True)
        for node in sorted(self.crashed):
            self.restart(node)
        self._event("settle: healed, everyone up, clean network")
        converged = False
        for _ in range(s.settle_steps_max):
            self.step(faulty=False)
            if self.converged():
                converged = True
                break
        for node, r in sorted(self.replicas.items()):
            self.checker.check_applied_history(node, r.sm.applied)
        return RunResult(
            seed=self.seed,
            history=self.history.hexdigest(),
            acked=len(self.checker.acked),
            committed=len(self.checker.committed),
            terms=len(self.checker.leaders),
            crashes=self.crashes,
            partitions=self.partitions,
            snapshots_written=self.checker.snapshots_written,
            snapshots_installed=self.checker.snapshots_installed,
            converged=converged,
            network=self.network.stats,
            leader_commits_before_own_fsync=self.leader_commits_before_own_fsync,
        )

    def converged(self) -> bool:
        leaders = [r for r in self.replicas.values() if r.so._isLeader()]
        if len(leaders) != 1:
            return False
        # Logs may still differ past the commit index: hook 3 keeps a follower's unproven
        # suffix until the leader's log reaches it.
        target = leaders[0].so.raftCommitIndex
        return all(r.so.raftLastApplied == target for r in self.replicas.values())

    def trace_text(self) -> str:
        return "last events:\n  " + "\n  ".join(self.trace)

    def _event(self, text: str) -> None:
        line = f"step {self.step_no} t={self.clock.now_s:.2f}: {text}"
        self.trace.append(line)
        self.history.update(line.encode())


def run_seed(seed: int, settings: SimSettings | None = None) -> RunResult:
    """One whole simulated run. A failure names the seed and the step, shows the last events
    and says how to replay it."""
    settings = settings or SimSettings()
    root = _scratch_root()
    cluster = Cluster(seed, settings, root)
    try:
        with simulated(cluster.clock, cluster.raft_rng):
            return cluster.run()
    except SafetyViolation as e:
        raise SafetyViolation(f"{e}\n{cluster.trace_text()}") from None
    except Exception as e:
        raise AssertionError(
            f"seed {seed}, step {cluster.step_no}: the run failed: {type(e).__name__}: {e}\n"
            f"replay: pytest tests/sim --seed {seed}\n{cluster.trace_text()}"
        ) from e
    finally:
        shutil.rmtree(root, ignore_errors=True)
