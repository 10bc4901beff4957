"""The latency budget: where the time of one proposal goes, stage by stage.

A proposal on the leader passes, in order::

    received   the gRPC call arrived (the edge stamps it; absent for internal proposals)
    queued     the broker called ``propose``
    handed     the driver thread handed its frame to pysyncobj
    appended   pysyncobj appended the frame's entry to the log
    sent       the entry left for a follower for the first time (before the leader's fsync:
               raft/wire_transport.py lets the leader's disk write overlap its followers')
    durable    the leader's journal flush that holds the entry finished (its fsync)
    acked      a follower first acknowledged holding it (it fsync'd first: flush before send)
    committed  the commit index reached it
    applied    the state machine applied it (one state transaction and its fsync)
    resolved   the event loop saw the result
    answered   the gRPC handler returned its answer (the edge stamps it)

A stage's duration is the time from the previous stamp to its own, so the durations of one
proposal add up to its latency. ``STAGES`` names them by where they end.

Stamps are ``time.perf_counter()`` values taken on the thread where each event happens. Entries
are stamped by log index (``EntryTimeline``), proposals by frame; only sampled frames are
observed (at most one per ``SAMPLE_INTERVAL_S``), so tracing costs a few dictionary operations
per entry and nothing per message.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field

STAGES = (
    "queued",
    "handed",
    "appended",
    "sent",
    "durable",
    "acked",
    "committed",
    "applied",
    "resolved",
    "answered",
)
# Log-index stamps, in the order entries reach them on the leader.
ENTRY_STAMPS = ("appended", "sent", "durable", "acked", "committed")
SAMPLE_INTERVAL_S = 0.005
ENTRIES_TRACKED_MAX = 1 << 16

_APPENDED = 0
_STAMP_POSITION = {kind: k for k, kind in enumerate(ENTRY_STAMPS)}


class EntryTimeline:
    """When each log index reached each entry stamp on this replica.

    Stamps move forward by ranges (``stamp(kind, upto, t)`` stamps every tracked index up to
    ``upto`` that kind has not reached yet), because each of them is a watermark: the durable
    index, the first send, a follower's match index, the commit index.

    >>> t = EntryTimeline()
    >>> t.appended(5, 1.0); t.appended(6, 1.5)
    >>> t.stamp("durable", 6, 2.0); t.stamp("committed", 5, 3.0)
    >>> t.take(5)
    [1.0, None, 2.0, None, 3.0]
    >>> t.take(5) is None
    True
    """

    def __init__(self, entries_max: int = ENTRIES_TRACKED_MAX) -> None:
        assert entries_max > 0
        self._entries_max = entries_max
        self._stamps: dict[int, list[float | None]] = {}
        self._next = [0] * len(ENTRY_STAMPS)  # per kind: the lowest index not stamped yet

    def __len__(self) -> int:
        return len(self._stamps)

    def appended(self, index: int, now_s: float) -> None:
        if len(self._stamps) >= self._entries_max:
            self.reset()  # entries nobody took (not ours, or lost in a leader change)
        stamps: list[float | None] = [None] * len(ENTRY_STAMPS)
        stamps[_APPENDED] = now_s
        self._stamps[index] = stamps

    def stamp(self, kind: str, upto: int, now_s: float) -> None:
        k = _STAMP_POSITION[kind]
        first = self._next[k]
        if upto < first:
            return
        if upto - first > len(self._stamps):  # a long jump (start, catch-up): skip the gap
            for index, stamps in self._stamps.items():
                if first <= index <= upto and stamps[k] is None:
                    stamps[k] = now_s
        else:
            for index in range(first, upto + 1):
                found = self._stamps.get(index)
                if found is not None and found[k] is None:
                    found[k] = now_s
        self._next[k] = upto + 1

    def truncated(self, first_gone: int) -> None:
        """The log lost every index from ``first_gone`` on (a new leader overwrote them)."""
        for index in [i for i in self._stamps if i >= first_gone]:
            del self._stamps[index]
        self._next = [min(n, first_gone) for n in self._next]

    def take(self, index: int) -> list[float | None] | None:
        """The stamps of ``index``, forgotten here (None if it was not tracked)."""
        return self._stamps.pop(index, None)

    def forget_upto(self, index: int) -> None:
        for i in [i for i in self._stamps if i <= index]:
            del self._stamps[i]

    def reset(self) -> None:
        self._stamps.clear()


@dataclass(slots=True)
class CallTrace:
    """One gRPC call's edge stamps, shared with the proposals it makes (through
    ``CURRENT_CALL``): the edge sets ``received_s``; the shard sets ``resolved_s`` and
    ``stages`` when one of the call's proposals was sampled; the edge then adds "answered"."""

    received_s: float
    resolved_s: float | None = None
    stages: dict[str, float] = field(default_factory=dict)


CURRENT_CALL: contextvars.ContextVar[CallTrace | None] = contextvars.ContextVar(
    "fluxmq_raft_call_trace", default=None
)


@dataclass(slots=True)
class FrameTrace:
    """A sampled frame: its proposals' first stamps, then everything up to "applied"."""

    queued_s: float
    received_s: float | None
    handed_s: float
    entry: list[float | None] | None = None
    applied_s: float | None = None
    calls: list[CallTrace] = field(default_factory=list)


def durations(trace: FrameTrace, resolved_s: float) -> dict[str, float]:
    """Seconds spent in each stage, by the stage that ends it; a stage whose stamps are missing
    (an entry nobody sent, e.g. on a single replica) is left out, and its time counted in the
    next stage that has both ends. Stages that overlap (a follower may acknowledge before the
    leader's own fsync ends) count only the time past the latest earlier stamp.

    >>> t = FrameTrace(queued_s=1.0, received_s=0.5, handed_s=1.5,
    ...                entry=[2.0, 2.1, 3.0, 2.9, 3.5], applied_s=5.0)
    >>> d = durations(t, 5.5)
    >>> [round(d[k], 9) for k in ("durable", "acked", "committed", "resolved")]
    [0.9, 0.0, 0.5, 0.5]
    >>> round(sum(d.values()), 9)
    5.0
    """
    points: list[tuple[str, float | None]] = [
        ("queued", trace.queued_s if trace.received_s is not None else None),
        ("handed", trace.handed_s),
    ]
    entry = trace.entry or [None] * len(ENTRY_STAMPS)
    points += list(zip(ENTRY_STAMPS, entry, strict=True))
    points += [("applied", trace.applied_s), ("resolved", resolved_s)]
    out: dict[str, float] = {}
    previous = trace.received_s if trace.received_s is not None else trace.queued_s
    for name, when in points:
        if when is None:
            continue
        out[name] = max(0.0, when - previous)
        previous = max(previous, when)
    return out


class Sampler:
    """At most one sample per ``interval_s`` (time is an input)."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._last_s = float("-inf")

    def take(self, now_s: float) -> bool:
        if now_s - self._last_s < self._interval_s:
            return False
        self._last_s = now_s
        return True


StageObserver = Callable[[str, float], None]
