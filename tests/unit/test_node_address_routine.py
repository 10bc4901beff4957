"""The leader timer that records this node's gRPC address in its shard survives any failure:
an unexpected exception (not a FluxError) is logged with its traceback and the record is tried
again, instead of ending the task silently and leaving every replica without the leader's gRPC
address (no NOT_LEADER redirect, no x-fluxmq-leader trailer) until the process restarts."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from storage import Store
from tests.unit.test_node_addresses import GRPC_A, RAFT_A, broker_on
from tests.unit.test_state_machine import store as store  # the fixture: memory and LMDB


async def test_address_routine_logs_an_unexpected_failure_and_keeps_recording(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    broker, shard = broker_on(store, leading=True)
    real = broker.timers.maybe_record_address
    calls = 0

    async def flaky() -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in a new code path")
        return await real()

    broker.timers.maybe_record_address = flaky  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, logger="fluxmq")
    task = asyncio.create_task(broker.timers.address_routine())
    try:
        async with asyncio.timeout(10):
            while broker.state.node_address(RAFT_A) != GRPC_A:
                assert not task.done(), task
                await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert calls >= 2
    assert len(shard.proposed) == 1
    failed = [r for r in caplog.records if "recording the gRPC address" in r.getMessage()]
    assert failed and failed[0].levelno == logging.ERROR, caplog.text
    assert failed[0].exc_info is not None  # the traceback, to find the bug
