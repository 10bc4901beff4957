"""Simulated time and randomness for pysyncobj: a run depends on its seed alone.

pysyncobj reads the clock through the name ``monotonicTime`` bound in each of its modules (and
in raft/_pysyncobj.py), sleeps through ``time.sleep`` and draws election timeouts from the
module ``random``. ``simulated()`` rebinds those names for the length of a run and always puts
the originals back, even when the run fails."""

from __future__ import annotations

import contextlib
import random
import zlib
from collections.abc import Iterator
from types import SimpleNamespace

import pysyncobj.dns_resolver
import pysyncobj.node
import pysyncobj.syncobj
import pysyncobj.tcp_connection
import pysyncobj.transport

import raft._pysyncobj

# Those of them that bind the name are rebound.
_CLOCK_MODULES = (
    pysyncobj.syncobj,
    pysyncobj.transport,
    pysyncobj.tcp_connection,
    pysyncobj.dns_resolver,
    raft._pysyncobj,
)
_RANDOM_MODULES = (
    pysyncobj.syncobj,
    pysyncobj.transport,
    pysyncobj.dns_resolver,
    raft._pysyncobj,  # hook 5 draws the fast election after the leader's connection closes
)


# Reads of the clock within one tick after which time starts to pass (see SimClock).
RUNAWAY_READS = 2000
RUNAWAY_STEP_S = 0.001


class SimClock:
    """Seconds since the start of a run; moves when the driver advances it, and on its own
    only in a runaway loop.

    pysyncobj bounds some loops by time, not by work: ``__sendAppendEntries`` keeps sending
    ``serialized: None`` to a follower that needs a snapshot while a snapshot is being written
    (until ``appendEntriesPeriod`` has passed). With time frozen inside a tick such a loop would
    never end, so after RUNAWAY_READS reads within one tick each read costs RUNAWAY_STEP_S: the
    loop ends after about as many rounds as the period allows. Normal ticks read the clock a
    few dozen times and never get there."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s
        self.reads_in_tick = 0
        self.runaway_ticks = 0

    def __call__(self) -> float:
        self.reads_in_tick += 1
        if self.reads_in_tick > RUNAWAY_READS:
            if self.reads_in_tick == RUNAWAY_READS + 1:
                self.runaway_ticks += 1
            self.now_s += RUNAWAY_STEP_S
        return self.now_s

    def new_tick(self) -> None:
        self.reads_in_tick = 0

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.now_s += seconds


def _stable_node_hash(node: pysyncobj.node.Node) -> int:
    # pysyncobj iterates sets of nodes (who is sent to first, who is served before a time
    # budget runs out); hashing the id with hash() would make that order, and the whole run,
    # depend on PYTHONHASHSEED.
    return zlib.crc32(str(node.id).encode())


def _no_sleep(seconds: float) -> None:
    # A simulated node never waits on the wall clock; a sleep means pysyncobj took a path
    # (transport not ready) that the simulation does not model.
    raise AssertionError(f"pysyncobj tried to sleep {seconds}s inside the simulation")


@contextlib.contextmanager
def simulated(clock: SimClock, rng: random.Random) -> Iterator[None]:
    """pysyncobj on ``clock`` and ``rng`` inside the block; the real ones again after it."""
    fake_time = SimpleNamespace(time=clock, monotonic=clock, sleep=_no_sleep)
    saved: list[tuple[object, str, object]] = []

    def rebind(module: object, name: str, value: object) -> None:
        if not hasattr(module, name):
            return
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    try:
        for module in _CLOCK_MODULES:
            rebind(module, "monotonicTime", clock)
        for module in _RANDOM_MODULES:
            rebind(module, "random", rng)
        rebind(pysyncobj.node.Node, "__hash__", _stable_node_hash)
        rebind(pysyncobj.syncobj, "time", fake_time)
        # The pipe only wakes a sleeping poller; simulated nodes never sleep in one, and each
        # pipe would hold two file descriptors for as long as a crashed node's object lives.
        rebind(pysyncobj.syncobj, "PIPE_NOTIFIER_ENABLED", False)
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)
