"""SimWriter: the journal writer thread of raft/pysyncobj_shard.py, simulated.

A leader's flush runs on its own thread (``LmdbJournal.flush_async``) while the driver goes on;
here it runs when the seeded driver says (``run_some``), or at once when someone waits for it
(a synchronous flush, as ``future.result()`` waits for the thread). A crash before it ran loses
it: the crashed replica's writer is simply dropped, and its journal keeps only what was flushed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import random
from collections.abc import Callable
from typing import Any


class _SimFuture(concurrent.futures.Future[Any]):
    def __init__(self, run: Callable[[], None]) -> None:
        super().__init__()
        self._run = run

    def result(self, timeout: float | None = None) -> Any:
        if not self.done():
            self._run()  # waiting for the write is what lets it happen
        return super().result(timeout)


class SimWriter(concurrent.futures.Executor):
    """One thread's worth of writes, in submission order."""

    def __init__(self) -> None:
        self._queue: collections.deque[tuple[_SimFuture, Callable[..., Any], tuple[Any, ...]]]
        self._queue = collections.deque()
        self.ran = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> _SimFuture:
        assert not kwargs
        future = _SimFuture(lambda: self._run_through(future))
        self._queue.append((future, fn, args))
        return future

    def run_some(self, rng: random.Random, p: float = 0.5) -> None:
        """Each waiting write runs now with probability ``p`` (in order: one thread)."""
        while self._queue and rng.random() < p:
            self._run_one()

    def _run_through(self, target: _SimFuture) -> None:
        while not target.done():
            self._run_one()

    def _run_one(self) -> None:
        future, fn, args = self._queue.popleft()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)
        self.ran += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._queue.clear()
