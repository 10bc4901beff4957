"""A stale append-entries answer, driven step by step on a simulated TCP cluster.

pysyncobj's answer to an append-entries (``next_node_idx``) carried no term. A leader that had
been leader before could count an answer to its older term's append-entries as one to its
current term: the follower held those indexes then, not the entries now at them. The schedule
(A, B, C; every link TCP: each connection in order, nothing lost while it stays up):

1. A leads and commits a few commands everywhere (up to index k).
2. A is cut off and appends four large commands (k+1..k+4, A's term) that reach no one. C is
   elected with B's vote and appends its no-op (k+1, C's term) that reaches no one either.
3. A is elected again with B's vote and sends B its backlog. The commands are large, so they
   travel in two messages ahead of A's new no-op (k+5). B takes k+1..k+4 and answers them
   (success, up to k+4); then the A-B link stalls both ways, still connected (a congested or
   flapping path that heals before TCP gives up): A's no-op, and B's answers, wait on it.
4. C campaigns again: B votes for it (B's last entry is of an older term than C's); C's
   entries (k+1 of its old term, its new no-op at k+2) replace k+1.. on A and on B.
5. A is elected once more, with C's vote; its no-op lands at k+3. C is cut off before it
   receives it. Then the A-B link recovers and delivers B's answers from step 3: success up to
   k+4. Without a term on them A takes that B holds k+3 and commits its no-op on A and B,
   while B holds C's entries and nothing at k+3: "committed means durable on a majority"
   fails (and B and C, which never had it, can elect a leader without it).

Nothing here needs a lost or duplicated message: only a delay on one TCP connection.
"""

from __future__ import annotations

import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj.syncobj import _RAFT_STATE

from tests.sim.checker import SafetyViolation
from tests.sim.clock import simulated
from tests.sim.cluster import Cluster, SimSettings, _scratch_root
from tests.sim.network import Faults, SimNetwork, SimTransport, _InFlight

STEPS_MAX = 1_000  # any phase that waits, at most (10 ms each)
BIG_COMMAND_BYTES = 33_000  # two per append-entries under the simulation's 64 KiB batch

Hold = Callable[[Any], bool]


class StallingNetwork(SimNetwork):
    """A TCP network whose directed links can stall: from the first message ``hold_when``
    matches, every message on that direction waits (in order, on the same connection) until
    ``release``. A connection that closes meanwhile loses them, as TCP does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hold_when: dict[tuple[str, str], Hold] = {}
        self._stalled: set[tuple[str, str]] = set()
        self.held: dict[tuple[str, str], list[_InFlight]] = {}

    def hold_when(self, src: str, dst: str, match: Hold) -> None:
        self._hold_when[(src, dst)] = match

    def stalled(self, src: str, dst: str) -> bool:
        return (src, dst) in self._stalled

    def release(self, src: str, dst: str) -> None:
        self._hold_when.pop((src, dst), None)
        self._stalled.discard((src, dst))
        now = self._clock()
        for m in self.held.pop((src, dst), []):
            self._enqueue(now, m.src, m.dst, m.epoch, m.payload)

    def _live(self, m: _InFlight) -> bool:
        # Called for each due message just before it is handed over, in delivery order (so a
        # hold rule sees what the messages before it did).
        live = super()._live(m)
        link = (m.src, m.dst)
        match = self._hold_when.get(link)
        if (
            live
            and link not in self._stalled
            and match is not None
            and match(pickle.loads(m.payload))
        ):
            self._stalled.add(link)
        if live and link in self._stalled:
            self.held.setdefault(link, []).append(m)
            self.stats.lost_with_connection -= 1  # counted as lost by the caller; it is not
            return False
        return live


class _ScriptedCluster(Cluster):
    """A Cluster whose elections the script decides: before each step, every replica in
    ``quiet`` has its election deadline pushed away, and the ``eager`` one (a follower: not
    while its campaign runs) has it now."""

    quiet: set[str]
    eager: str | None = None

    def step(self, faulty: bool) -> None:
        now = self.clock.now_s
        for node in self.quiet & set(self.replicas):
            self.replicas[node].so._SyncObj__raftElectionDeadline = now + 1_000.0
        eager = self.replicas.get(self.eager or "")
        if eager is not None and eager.so._SyncObj__raftState == _RAFT_STATE.FOLLOWER:
            eager.so._SyncObj__raftElectionDeadline = 0.0
        super().step(faulty)


@dataclass
class StaleAnswerResult:
    stale_answers_held: int  # B's answers from step 3 that the stalled link delivered late
    index: int  # where A's no-op of step 5 is (k+3)
    committed_on_a_alone: bool  # A's commit index passed it before anyone else held it
    converged: bool


def run_stale_answer(seed: int = 0) -> StaleAnswerResult:
    settings = SimSettings(members=3, propose_p=0.0, snapshots=False)
    root = _scratch_root()
    cluster = _ScriptedCluster(seed, settings, root)
    cluster.quiet = set()
    network = StallingNetwork(
        f"{seed}:net", cluster.clock, Faults(0.0, 0.0, 0.001, 0.002, fifo=True)
    )
    cluster.network = network
    cluster.transport_class = SimTransport.bound_to(network)
    try:
        with simulated(cluster.clock, cluster.raft_rng):
            return _run(cluster, network)
    except SafetyViolation as e:
        raise SafetyViolation(f"{e}\n{cluster.trace_text()}") from None
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _step_until(cluster: Cluster, done: Callable[[], bool], what: str) -> None:
    for _ in range(STEPS_MAX):
        cluster.step(faulty=False)
        if done():
            return
    raise AssertionError(f"stale-answer schedule: no {what} within {STEPS_MAX} steps")


def _leads(cluster: Cluster, node: str) -> bool:
    r = cluster.replicas.get(node)
    return r is not None and r.so._isLeader()


def _elect(cluster: _ScriptedCluster, node: str, then: Callable[[], None] | None = None) -> int:
    """Only ``node`` campaigns (again, until it wins); -> its term. ``then`` runs right after
    the step in which it won, before anything it sent as leader arrives."""
    above = max(int(r.so.raftCurrentTerm) for r in cluster.replicas.values())
    cluster.quiet = set(cluster.ids) - {node}
    cluster.eager = node

    def won() -> bool:
        return _leads(cluster, node) and cluster.replicas[node].so.raftCurrentTerm > above

    _step_until(cluster, won, f"{node} elected")
    if then is not None:
        then()
    cluster._event(f"{node} elected (term {cluster.replicas[node].so.raftCurrentTerm})")
    cluster.quiet = set(cluster.ids)
    cluster.eager = None
    return int(cluster.replicas[node].so.raftCurrentTerm)


def _links(cluster: Cluster, network: StallingNetwork, groups: list[set[str]]) -> None:
    """Exactly the links within ``groups`` up: links already up stay as they are (the stalled
    one included), cut ones are made again."""
    network.heal()
    network.partition(groups)
    cluster._event("links: " + " | ".join(",".join(sorted(g)) for g in groups))


def _last(cluster: Cluster, node: str) -> tuple[int, int]:
    j = cluster.replicas[node].journal
    return int(j[-1][1]), int(j[-1][2])


def _run(cluster: _ScriptedCluster, network: StallingNetwork) -> StaleAnswerResult:
    a, b, c = cluster.ids
    cluster.start()
    _step_until(
        cluster,
        lambda: not any(r.so.on_probation for r in cluster.replicas.values()),
        "replica out of probation",
    )
    # 1. A leads; a few commands committed everywhere.
    _elect(cluster, a)
    first = [f"s{cluster.seed}-first-{i}".encode() for i in range(2)]
    for command in first:
        cluster.replicas[a].propose(command)
    _step_until(cluster, lambda: set(first) <= set(cluster.checker.acked), "first commands acked")
    _step_until(cluster, cluster.converged, "convergence on the first commands")
    k = int(cluster.replicas[a].journal.last_index)

    # 2. A, cut off, appends four large commands; C is elected and appends its no-op, alone.
    _links(cluster, network, [{a}, {b, c}])
    for i in range(4):
        cluster.replicas[a].propose(f"s{cluster.seed}-big-{i}-".encode().ljust(BIG_COMMAND_BYTES))
    _step_until(cluster, lambda: cluster.replicas[a].journal.last_index == k + 4, "A's backlog")
    _elect(cluster, c, then=lambda: _links(cluster, network, [{a}, {b}, {c}]))
    assert _last(cluster, c)[0] == k + 1 and _last(cluster, b)[0] == k, "C's no-op reached B"
    _step_until(cluster, lambda: cluster.replicas[c].journal.durable_index == k + 1, "C's flush")

    # 3. A elected again with B's vote; B takes k+1..k+4 and answers; then A-B stalls.
    _links(cluster, network, [{a, b}, {c}])
    b_journal = cluster.replicas[b].journal
    network.hold_when(a, b, lambda m: b_journal.last_index >= k + 4)
    network.hold_when(b, a, lambda m: m.get("type") == "next_node_idx" and m["success"])
    _elect(cluster, a)
    _step_until(cluster, lambda: len(network.held.get((b, a), [])) >= 2, "B's answers held")
    held = [pickle.loads(m.payload) for m in network.held[(b, a)]]
    assert b_journal.last_index == k + 4 and b_journal.durable_index == k + 4
    assert max(m["next_node_idx"] for m in held) == k + 5, held
    cluster._event(f"link {a} - {b} stalled: {len(held)} answers from {b} wait on it")

    # 4. C is elected with B's vote; its entries replace k+1.. on A and B. (A, hearing from
    # no majority, stands down first: a leader of term 3 would keep C busy answering its
    # optimistic appends, and C would never campaign.)
    _step_until(cluster, lambda: not _leads(cluster, a), "A standing down")
    network.heal()
    cluster._event("heal (the stalled link stays as it is)")
    term_c = _elect(cluster, c)
    _step_until(
        cluster,
        lambda: (
            all(_last(cluster, n) == (k + 2, term_c) for n in (a, b, c))
            and cluster.replicas[c].so.raftCommitIndex >= k + 2
        ),
        "C's entries on A and B",
    )

    # 5. A is elected with C's vote; C is cut off before A's no-op reaches it. Then the
    # stalled link delivers B's answers from step 3.
    term_a = _elect(cluster, a, then=lambda: _links(cluster, network, [{a, b}, {c}]))
    noop = k + 3
    assert _last(cluster, a) == (noop, term_a)
    network.release(b, a)
    cluster._event(f"the link {b} -> {a} recovers: B's answers from step 3 arrive")
    committed_on_a_alone = False
    for _ in range(30):
        cluster.step(faulty=False)
        if cluster.replicas[a].so.raftCommitIndex >= noop and _last(cluster, b)[0] < noop:
            committed_on_a_alone = True
    # 6. Everything heals; the cluster must settle with every property intact.
    network.release(a, b)
    network.heal()
    cluster.quiet = set()
    cluster._event("settle: heal everything")
    converged = False
    for _ in range(STEPS_MAX):
        cluster.step(faulty=False)
        if cluster.converged():
            converged = True
            break
    for node, r in sorted(cluster.replicas.items()):
        cluster.checker.check_applied_history(node, r.sm.applied)
    return StaleAnswerResult(len(held), noop, committed_on_a_alone, converged)
