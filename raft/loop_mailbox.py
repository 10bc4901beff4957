"""LoopMailbox: calls from the Raft threads to the event loop, in one wake-up per round.

A round on a shard ends with several things for the loop: the proposals' answers, the
wake-ups of the readers waiting on what was committed (the state machine's commit listener),
sampled stage traces. Each ``loop.call_soon_threadsafe`` writes to the loop's wake-up fd and
takes the GIL back and forth; three of them per round cost three wake-ups where one does.

``post`` queues a call and wakes the loop only if no wake-up is already on its way. ``hold``
lets the thread that applies a round collect everything the round produces, and
``release`` hands it over with one wake-up (or none, when the holder is the loop itself and
runs the calls on the spot: ``release_here``). Calls run in the order they were posted.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

Call = tuple[Callable[..., Any], tuple[Any, ...]]


class LoopMailbox:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._scheduled = False  # a wake-up of the loop is on its way
        self._holds = 0
        self.wakeups = 0  # wake-ups sent, ever (tests and benches count them)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon (any thread)."""
        with self._lock:
            self._calls.append((fn, args))
            if self._scheduled or self._holds:
                return
            self._scheduled = True
        self._wake()

    def hold(self) -> None:
        """Until ``release``, posts wait without waking the loop (any thread)."""
        with self._lock:
            self._holds += 1

    def release(self) -> None:
        """End a hold; what was posted meanwhile goes to the loop in one wake-up."""
        with self._lock:
            assert self._holds > 0
            self._holds -= 1
            if self._holds or self._scheduled or not self._calls:
                return
            self._scheduled = True
        self._wake()

    def release_here(self) -> None:
        """End a hold on the loop's own thread and run what was posted, without a wake-up."""
        with self._lock:
            assert self._holds > 0
            self._holds -= 1
        if not self._holds:
            self._run()

    def _wake(self) -> None:
        self.wakeups += 1
        try:
            self._loop.call_soon_threadsafe(self._run)
        except RuntimeError:
            # The loop is closed (the node is stopping): nobody is left to answer.
            with self._lock:
                self._calls.clear()
                self._scheduled = False

    def _run(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, []
            self._scheduled = False
        for fn, args in calls:
            try:
                fn(*args)
            except Exception as exc:
                # As call_soon_threadsafe would: reported, and the other calls still run.
                self._loop.call_exception_handler(
                    {"message": f"exception in a call posted to the loop: {fn!r}", "exception": exc}
                )
