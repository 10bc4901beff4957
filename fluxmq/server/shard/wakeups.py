"""Wake-ups of the calls that wait for a shard's data: long polls, tails and Consume streams.

Keys: a partition's log id (it grew), ``queue_key`` (some partition of the queue grew) and
``group_key`` (a consumer group changed). The apply side reports each commit's logs and groups;
``committed`` turns them into wake-ups on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable, Sequence

from fluxmq.core import keys
from fluxmq.server.errors import node_shutting_down


def queue_key(queue_id: int) -> Hashable:
    return ("queue", queue_id)


def group_key(group_id: int) -> Hashable:
    return ("group", group_id)


class Wakeups:
    """An event exists only while somebody waits on it, so memory is bounded by the number of
    waiters.

    ``drain()`` (SIGTERM) ends every wait through ``wait`` with NODE_SHUTTING_DOWN, and every
    wait after it at once: a client learns within a moment that it should go to another node,
    instead of holding a call the grace period would cancel. Writes never wait here, so they
    go on."""

    def __init__(self) -> None:
        self._events: dict[Hashable, asyncio.Event] = {}
        self._draining = asyncio.Event()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def drain(self) -> None:
        self._draining.set()

    async def until_draining(self) -> None:
        """Returns once the node drains (SIGTERM)."""
        await self._draining.wait()

    def check_open(self) -> None:
        """Raises NODE_SHUTTING_DOWN once the node drains: for calls about to wait or lease."""
        if self._draining.is_set():
            raise node_shutting_down()

    async def wait(self, events: Sequence[asyncio.Event], timeout_s: float) -> None:
        """Until one of ``events`` is set or ``timeout_s`` passes; raises NODE_SHUTTING_DOWN
        when the node drains before or meanwhile."""
        self.check_open()
        waiters = [asyncio.ensure_future(ev.wait()) for ev in (*events, self._draining)]
        try:
            await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        self.check_open()

    @property
    def waiting(self) -> bool:
        """Somebody waits for some key (read from the apply side, lock-free). Every waiter takes
        its event before it reads the state, and the apply side publishes the state before it
        asks: a commit that sees nobody waiting is seen by whoever starts waiting after."""
        return bool(self._events)

    def event(self, key: Hashable) -> asyncio.Event:
        ev = self._events.get(key)
        if ev is None:
            ev = self._events[key] = asyncio.Event()
        return ev

    def notify(self, keys_: Iterable[Hashable]) -> None:
        for key in keys_:
            ev = self._events.pop(key, None)
            if ev is not None:
                ev.set()

    def committed(self, log_ids: Sequence[int], group_ids: Sequence[int]) -> None:
        self.notify(log_ids)
        self.notify({queue_key(log_id >> keys.PARTITION_BITS) for log_id in log_ids})
        self.notify(group_key(g) for g in group_ids)
