"""Concurrent ``publish()`` calls against a real broker: they share Publish requests
(fluxmq/client/pipeline.py), and each caller still gets its own position or its own error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fluxmq.client import AsyncClient, InvalidArgument
from tests.integration.conftest import Node

pytestmark = pytest.mark.slow

CALLERS = 50


def count_publish_requests(client: AsyncClient, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """-> a list that gets the message count of every Publish request the client sends."""
    sizes: list[int] = []
    real_unary = client.transport.unary

    async def unary(service: str, method: str, request: Any, **kw: Any) -> Any:
        if method == "Publish":
            sizes.append(len(request.messages))
        return await real_unary(service, method, request, **kw)

    monkeypatch.setattr(client.transport, "unary", unary)
    return sizes


async def test_concurrent_publishes_share_requests_and_each_caller_gets_its_own_offset(
    broker: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("coalesced", type="work", partitions=1)
        sizes = count_publish_requests(client, monkeypatch)
        values = [f"v{i}" for i in range(CALLERS)]
        results = await asyncio.gather(*(client.publish("coalesced", v) for v in values))
        assert sorted(r.offset for r in results) == list(range(CALLERS))
        assert sum(sizes) == CALLERS and len(sizes) < CALLERS / 2, sizes
        fetched = await client.fetch("coalesced", 0, 0, max_messages=CALLERS)
        by_offset = {r.offset: r.value.decode() for r in fetched.records}
        # Each caller's result names the offset where its own value is stored.
        assert {by_offset[r.offset] for r in results} == set(values)
        assert all(by_offset[r.offset] == v for r, v in zip(results, values, strict=True))


async def test_a_message_the_broker_refuses_fails_only_its_own_publish(broker: Node) -> None:
    week_and_a_day_ms = 8 * 24 * 3600 * 1000
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("one-bad", type="work", partitions=1)
        calls = [client.publish("one-bad", f"ok{i}") for i in range(10)]
        calls.insert(3, client.publish("one-bad", "late", delay_ms=week_and_a_day_ms))
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        refused = outcomes.pop(3)
        assert isinstance(refused, InvalidArgument), refused
        assert not any(isinstance(o, BaseException) for o in outcomes), outcomes
        fetched = await client.fetch("one-bad", 0, 0, max_messages=100)
        assert sorted(r.value.decode() for r in fetched.records) == sorted(
            f"ok{i}" for i in range(10)
        )


async def test_one_caller_publishing_in_turn_keeps_its_order(broker: Node) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("in-turn", type="work", partitions=1)
        offsets = [(await client.publish("in-turn", f"n{i}")).offset for i in range(20)]
        assert offsets == list(range(20))
