"""DigestGate: a node computes one state digest at a time, off the event loop, at most a share of
a core over time, and answers from its cache while the state has not changed."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import pytest

from fluxmq.core.errors import FluxError
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.admin_service import DigestGate


class FakeState:
    """A state whose digest blocks until released (when ``gate`` is set) and names its index."""

    def __init__(self) -> None:
        self.applied = 1
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.calls = 0

    def last_applied_index(self) -> int:
        return self.applied

    def digest(self) -> str:
        self.calls += 1
        self.entered.set()
        assert self.release.wait(10)
        return f"digest-at-{self.applied}"


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def as_state(fake: FakeState) -> QueueStateMachine:
    return cast(QueueStateMachine, fake)


async def digest_under_way() -> tuple[FakeState, DigestGate, asyncio.Task[str]]:
    """A gate whose first digest is being read on a worker thread until ``fake.release``."""
    fake = FakeState()
    fake.release.clear()
    gate = DigestGate()
    first = asyncio.create_task(gate.digest("g1", as_state(fake)))
    await asyncio.to_thread(fake.entered.wait, 10)
    return fake, gate, first


async def test_concurrent_requests_share_one_computation_and_the_loop_stays_responsive() -> None:
    fake, gate, first = await digest_under_way()
    second = asyncio.create_task(gate.digest("g1", as_state(fake)))
    # The event loop runs other work while the digest is being read on a worker thread.
    await asyncio.sleep(0)
    cheap = await asyncio.wait_for(asyncio.to_thread(lambda: "answered"), 10)
    assert cheap == "answered" and not first.done() and not second.done()
    fake.release.set()
    assert await first == await second == "digest-at-1"
    assert fake.calls == 1 and gate.computed == 1


async def test_an_unchanged_state_is_answered_from_the_cache() -> None:
    fake, clock = FakeState(), Clock()
    gate = DigestGate(clock_s=clock)
    assert await gate.digest("g1", as_state(fake)) == "digest-at-1"
    for _ in range(5):
        assert await gate.digest("g1", as_state(fake)) == "digest-at-1"
    assert fake.calls == 1


async def test_a_digest_too_soon_after_an_expensive_one_is_refused_with_retry_info() -> None:
    fake, clock = FakeState(), Clock()
    gate = DigestGate(cpu_share=0.1, wait_max_s=1.0, clock_s=clock)

    def slow_digest() -> str:
        clock.now_s += 20.0  # a 20 s digest: the next may start 180 s after it ends
        return "d1"

    cast(Any, fake).digest = slow_digest
    assert await gate.digest("g1", as_state(fake)) == "d1"
    fake.applied = 2  # the state moved on: the cache no longer answers
    clock.now_s += 10.0
    with pytest.raises(FluxError) as info:
        await gate.digest("g1", as_state(fake))
    err = info.value
    assert err.reason == "DIGEST_BUSY" and err.retriable
    assert err.retry_after_ms == 170_000 and err.metadata["field"] == "skip_digest"
    clock.now_s += 170.0
    assert await gate.digest("g1", as_state(fake)) == "d1"  # its turn came


async def test_a_cancelled_requests_computation_keeps_others_out_until_it_ends() -> None:
    fake, gate, first = await digest_under_way()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    fake.applied = 2
    with pytest.raises(FluxError) as info:
        await gate.digest("g1", as_state(fake))
    assert info.value.reason == "DIGEST_BUSY" and fake.calls == 1
    fake.release.set()


async def test_a_digest_read_while_the_state_moved_is_not_cached() -> None:
    fake, clock = FakeState(), Clock()
    gate = DigestGate(cpu_share=1.0, clock_s=clock)

    def moving_digest() -> str:
        fake.applied += 1  # an apply landed during the read
        return "mixed"

    cast(Any, fake).digest = moving_digest
    await gate.digest("g1", as_state(fake))
    await gate.digest("g1", as_state(fake))
    assert gate.computed == 2
