"""Raft's safety properties, checked while a simulated cluster runs.

- Election safety: at most one leader per term (a history term -> leader, over the whole run).
- Log matching: an entry is named by (index, term); every log that holds it holds the same
  command, and the same term just before it. By induction two logs that share an entry share
  every entry before it. Checked on every append, in every replica's journal, so a divergence is
  caught when it is written, not when it happens to be compared.
- Leader completeness: every committed entry is in the log of every leader of a term after
  the one it was committed in, checked when a leader is first seen and whenever an entry is
  found committed. (An entry is committed in the term of the leader that commits it, which
  may be later than its own term: a leader of a term in between may lack it.)
- Committed entries are durable on a majority: when a leader's commit index moves, each newly
  committed entry is on a majority of durable journals (what a crash of every node keeps).
- Committed entries are never lost: an index, once committed, keeps its term and command; a
  command acknowledged SUCCESS is committed at the index it was applied at.
- State machine safety: each index is applied with one command on every replica, in log order,
  and the state digests are equal at equal applied index.

A violation raises ``SafetyViolation`` (an AssertionError) naming the seed and the step, with
how to replay the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pysyncobj.pickle

from raft.journal import Item

_REGULAR = 0  # pysyncobj's _COMMAND_TYPE.REGULAR: a call of a replicated method


def frame_of(entry_command: bytes) -> bytes | None:
    """The frame a log entry hands to ``fx_apply`` (None for no-ops and membership entries)."""
    if not entry_command or entry_command[0] != _REGULAR:
        return None
    call = pysyncobj.pickle.loads(entry_command[1:])
    _method_id, args = call[0], call[1]
    return bytes(args[0])


class SafetyViolation(AssertionError):
    pass


@dataclass
class _ReplicaView:
    applied_index: int = 0  # last index applied by this incarnation (or restored by snapshot)


@dataclass
class SafetyChecker:
    seed: int
    members: int
    step: int = 0
    leaders: dict[int, str] = field(default_factory=dict)
    entries: dict[tuple[int, int], tuple[bytes, int | None]] = field(default_factory=dict)
    committed: dict[int, tuple[int, bytes]] = field(default_factory=dict)
    digest_at: dict[int, bytes] = field(default_factory=dict)
    applied_at: dict[int, bytes] = field(default_factory=dict)
    acked: dict[bytes, int] = field(default_factory=dict)
    snapshots_written: int = 0
    snapshots_installed: int = 0
    reapplied: int = 0
    _views: dict[str, _ReplicaView] = field(default_factory=dict)

    def fail(self, prop: str, detail: str) -> SafetyViolation:
        return SafetyViolation(
            f"seed {self.seed}, step {self.step}: {prop} violated: {detail}\n"
            f"replay: pytest tests/sim --seed {self.seed}"
        )

    # -- election safety ----------------------------------------------------------------------

    def on_leader(self, term: int, node: str) -> bool:
        """-> True when this is the first time ``node`` is seen leading ``term``."""
        known = self.leaders.get(term)
        if known is None:
            self.leaders[term] = node
            return True
        if known != node:
            raise self.fail("one leader per term", f"term {term} has leaders {known} and {node}")
        return False

    # -- log matching -------------------------------------------------------------------------

    def on_append(self, node: str, item: Item, prev: Item | None) -> None:
        command, index, term = item
        prev_term = prev[2] if prev is not None and prev[1] == index - 1 else None
        key = (index, term)
        known = self.entries.get(key)
        if known is None:
            self.entries[key] = (command, prev_term)
            return
        known_command, known_prev = known
        if known_command != command:
            raise self.fail(
                "log matching",
                f"{node} holds entry (index {index}, term {term}) = {command!r}, "
                f"another log holds {known_command!r}",
            )
        if prev_term is not None and known_prev is not None and prev_term != known_prev:
            raise self.fail(
                "log matching",
                f"{node}: entry (index {index}, term {term}) follows term {prev_term}, "
                f"another log has it after term {known_prev}",
            )
        if known_prev is None and prev_term is not None:
            self.entries[key] = (command, prev_term)

    # -- commitment ---------------------------------------------------------------------------

    def on_commit(
        self,
        node: str,
        item: Item,
        leaders: Iterable[tuple[str, int, Sequence[Item]]],
        committed_by: int | None = None,
    ) -> None:
        """``node`` holds ``item`` as committed; ``leaders`` are (id, term, log) of the live
        leaders, checked for it now. ``committed_by``: a term at or after the one it was
        committed in (the lowest current term of the replicas whose commit index covers it;
        default its own term): live leaders of later terms must hold it. A leader of an
        earlier term may be one still in office, cut off, that lacks an entry of an older
        term which a later leader committed with its own entries."""
        command, index, term = item
        after = term if committed_by is None else max(term, committed_by)
        known = self.committed.get(index)
        if known is not None:
            if known != (term, command):
                raise self.fail(
                    "committed entries never change",
                    f"{node} committed index {index} as (term {term}, {command!r}), "
                    f"earlier it was committed as (term {known[0]}, {known[1]!r})",
                )
            return
        self.committed[index] = (term, command)
        for leader, leader_term, log in leaders:
            if leader_term > after:
                self._leader_has(leader, leader_term, log, index, term, command)

    def check_majority_durable(
        self, leader: str, item: Item, durable_logs: dict[str, Sequence[Item]]
    ) -> None:
        """When ``leader`` commits ``item``, a majority's durable journals hold it (a journal
        compacted past it counts: only applied, committed entries are compacted)."""
        _command, index, term = item
        holders = [n for n, log in durable_logs.items() if _holds_durably(log, index, term)]
        if len(holders) * 2 <= self.members:
            raise self.fail(
                "committed means durable on a majority",
                f"leader {leader} committed (index {index}, term {term}) but only "
                f"{sorted(holders)} of {self.members} have it on disk",
            )

    def check_still_durable(
        self, node: str, item: Item, durable_logs: dict[str, Sequence[Item]]
    ) -> None:
        """After ``node`` deleted entries from its log, committed ``item`` is still on a
        majority's durable journals: otherwise a new majority could elect a leader without it."""
        _command, index, term = item
        holders = [n for n, log in durable_logs.items() if _holds_durably(log, index, term)]
        if len(holders) * 2 <= self.members:
            raise self.fail(
                "committed entries stay durable on a majority",
                f"{node} deleted committed (index {index}, term {term}); only "
                f"{sorted(holders)} of {self.members} still have it on disk",
            )

    def on_new_leader(self, leader: str, term: int, log: Sequence[Item]) -> None:
        for index, (c_term, command) in self.committed.items():
            if c_term < term:
                self._leader_has(leader, term, log, index, c_term, command)

    def _leader_has(
        self, leader: str, term: int, log: Sequence[Item], index: int, c_term: int, command: bytes
    ) -> None:
        if not log or index < log[0][1]:
            return  # compacted into the leader's snapshot
        pos = index - log[0][1]
        if pos >= len(log) or log[pos][2] != c_term or log[pos][0] != command:
            have = log[pos][1:] if pos < len(log) else f"a log ending at {log[-1][1]}"
            raise self.fail(
                "leader completeness",
                f"leader {leader} of term {term} lacks committed entry (index {index}, "
                f"term {c_term}); it has {have}",
            )

    def on_ack(self, node: str, command: bytes, index: int) -> None:
        self.acked[command] = index
        known = self.committed.get(index)
        if known is None or frame_of(known[1]) != command:
            raise self.fail(
                "acknowledged means committed",
                f"{node} acknowledged {command!r} at index {index}, committed there: {known}",
            )

    # -- state machines -----------------------------------------------------------------------

    def on_restart(self, node: str) -> None:
        self._views[node] = _ReplicaView()

    def on_apply(self, node: str, index: int, command: bytes, digest: bytes) -> None:
        view = self._views.setdefault(node, _ReplicaView())
        if index <= view.applied_index:
            raise self.fail(
                "apply in log order, once",
                f"{node} applied index {index} after index {view.applied_index}",
            )
        view.applied_index = index
        self._same("command applied at index", self.applied_at, node, index, command)
        self._same("state digest at applied index", self.digest_at, node, index, digest)

    def on_reapply(self, node: str, index: int, command: bytes) -> None:
        self.reapplied += 1
        self._same("command applied at index", self.applied_at, node, index, command)

    def on_snapshot_installed(
        self, node: str, index: int, last_command: tuple[int, bytes] | None, digest: bytes
    ) -> None:
        """``node`` restored the state at log ``index`` whose last command is ``last_command``:
        that state must be the one every replica had there."""
        self.snapshots_installed += 1
        view = self._views.setdefault(node, _ReplicaView())
        view.applied_index = max(view.applied_index, index)
        if last_command is not None:
            i, command = last_command
            self._same("command applied at index", self.applied_at, node, i, command)
            self._same("state digest at applied index", self.digest_at, node, i, digest)

    def check_applied_history(self, node: str, applied: Sequence[tuple[int, bytes]]) -> None:
        """A replica's whole applied history is the run's, with no index skipped."""
        if not applied:
            return
        last = applied[-1][0]
        expected = [(i, c) for i, c in sorted(self.applied_at.items()) if i <= last]
        if list(applied) != expected:
            mine = dict(applied)
            missing = [i for i, _ in expected if i not in mine][:5]
            raise self.fail(
                "every replica applies every committed command",
                f"{node} applied {len(applied)} commands up to index {last}, the run "
                f"{len(expected)}; first indexes it misses: {missing}",
            )

    def _same(
        self, what: str, table: dict[int, bytes], node: str, index: int, value: bytes
    ) -> None:
        known = table.setdefault(index, value)
        if known != value:
            raise self.fail(
                "state machine safety",
                f"{node}: {what} {index} is {value!r}, another replica had {known!r}",
            )


def _holds_durably(log: Sequence[Item], index: int, term: int) -> bool:
    if not log:
        return False
    first = log[0][1]
    if index < first:
        return True
    pos = index - first
    return pos < len(log) and log[pos][2] == term
