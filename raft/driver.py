"""RaftDriver: the one thread that drives every pysyncobj shard of a process.

pysyncobj with ``autoTick`` runs one thread per SyncObj; a node hosting many shards would run many
threads fighting over the GIL. Instead all shards share one poller (sockets of every shard) and
this thread loops: let each shard hand over new proposals, tick it, flush what it applied, then
wait on the shared poller until a socket, a wake-up or the next timer (each shard names its own:
``next_wake_s``; at most ``idle_wait_ms``), so an idle node wakes a few times a second.
Results cross into asyncio only through ``loop.call_soon_threadsafe`` (in the shard).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from raft._pysyncobj import PipeNotifier, create_poller
from raft.os_thread import set_os_thread_name

log = logging.getLogger("raft.driver")
T = TypeVar("T")
# Never a busy loop: a timer that is already due is served after at most this pause.
WAIT_MIN_S = 0.0005


class Driven(Protocol):
    def step(self) -> bool:
        """One round on the driver thread; True when it has more work right away."""
        ...

    def next_wake_s(self) -> float:
        """Seconds until the shard's next timed action (a heartbeat, an election deadline, a
        handshake deadline): the driver sleeps no longer, unless a socket or a wake-up comes
        first."""
        ...


class RaftDriver:
    def __init__(self, *, idle_wait_ms: int = 200, name: str = "raft-driver") -> None:
        assert idle_wait_ms >= 1
        self._idle_wait_s = idle_wait_ms / 1000
        self.poller: Any = create_poller()
        self._notifier = PipeNotifier(self.poller, self._woken)
        self._shards: list[Driven] = []
        self._calls: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()
        self._stopping = False
        self._thread = threading.Thread(target=self._routine, name=name, daemon=True)
        self._started = False
        self._lock = threading.Lock()
        # A wake-up is on its way (the pipe holds a byte the poller has not taken yet): more
        # wakers need not write another. Cleared when the poller drains the pipe (whichever
        # poll does: pysyncobj's tick polls too), so a waker after the drain writes again.
        self._wake_pending = False
        self.rounds = 0
        self.wakeups = 0  # bytes written to the wake-up pipe, ever

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                self._thread.start()

    def _woken(self) -> None:
        self._wake_pending = False

    def wake(self) -> None:
        """Cut the current wait short (any thread); one write per round however many call."""
        if self._wake_pending:
            return
        self._wake_pending = True
        self.wakeups += 1
        try:
            self._notifier.notify()
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is already pending

    def call(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn`` on the driver thread (pysyncobj objects are not thread-safe)."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._calls.append((fn, fut))
        self.start()
        self.wake()
        return fut

    def attach(self, shard: Driven) -> None:
        """Driver thread only (use ``call``)."""
        assert threading.current_thread() is self._thread
        self._shards.append(shard)

    def detach(self, shard: Driven) -> None:
        assert threading.current_thread() is self._thread
        if shard in self._shards:
            self._shards.remove(shard)

    def stop(self) -> None:
        self._stopping = True
        self.wake()
        if self._started:
            self._thread.join(timeout=10)

    def _run_calls(self) -> None:
        while self._calls:
            fn, fut = self._calls.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

    def _routine(self) -> None:
        set_os_thread_name(self._thread.name)
        while not self._stopping:
            self._run_calls()
            busy = False
            for shard in list(self._shards):
                try:
                    busy |= shard.step()
                except Exception:
                    # A shard's bug must not stop the others; it is logged and retried.
                    log.exception("raft shard step failed")
            self.rounds += 1
            if busy or self._calls:
                wait_s = 0.0
            else:
                wait_s = self._idle_wait_s
                for shard in self._shards:
                    wait_s = min(wait_s, shard.next_wake_s())
                wait_s = max(WAIT_MIN_S, wait_s)
            self.poller.poll(wait_s)
        self._run_calls()
