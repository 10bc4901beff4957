"""Simulated time and randomness for pysyncobj: a run depends on its seed alone.

pysyncobj reads the clock through the name ``monotonicTime`` bound in each of its modules (and
in raft/_pysyncobj.py), sleeps through ``time.sleep`` and draws election timeouts from the
module ``random``. ``simulated()`` rebinds those names for the length of a run and always puts
the originals back, even when the run fails."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from types import SimpleNamespace

import pysyncobj.dns_resolver
import pysyncobj.syncobj
import pysyncobj.tcp_connection
import pysyncobj.transport

import raft._pysyncobj

# Those of them that bind a name are rebound (raft/ binds none of them today).
_CLOCK_MODULES = (
    pysyncobj.syncobj,
    pysyncobj.transport,
    pysyncobj.tcp_connection,
    pysyncobj.dns_resolver,
    raft._pysyncobj,
)
_RANDOM_MODULES = (pysyncobj.syncobj, pysyncobj.transport, pysyncobj.dns_resolver)


class SimClock:
    """Seconds since the start of a run; moves only when the driver advances it."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.now_s += seconds


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
        rebind(pysyncobj.syncobj, "time", fake_time)
        # The pipe only wakes a sleeping poller; simulated nodes never sleep in one, and each
        # pipe would hold two file descriptors for as long as a crashed node's object lives.
        rebind(pysyncobj.syncobj, "PIPE_NOTIFIER_ENABLED", False)
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)
