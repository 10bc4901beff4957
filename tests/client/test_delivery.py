"""SDK consumers against a real broker: retries and dead letters, lease renewal, graceful stop."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from fluxmq.client import AsyncClient, ConsumerStats, Message, OutgoingMessage
from tests.integration.conftest import Node

pytestmark = pytest.mark.slow


async def wait_for(predicate, timeout_s: float, interval_s: float = 0.05):  # type: ignore[no-untyped-def]
    """Polls an async predicate until it returns something truthy (bounded in time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = await predicate()
        if result:
            return result
        await asyncio.sleep(interval_s)
    raise AssertionError(f"not true within {timeout_s} s")


@pytest.mark.parametrize("mode", ["poll", "push"])
async def test_handler_exception_redelivers_then_dead_letters_after_max_attempts(
    broker: Node, mode: str
) -> None:
    poison = f"poison-{mode}"
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue(
            poison, type="work", max_attempts=2, retry_backoff={"base": "100ms", "max": "100ms"}
        )
        await client.publish(poison, b"bad input", key="k")
        await client.publish(poison, b"fine")
        deliveries: list[tuple[bytes, int]] = []

        async def handle(msg: Message) -> None:
            deliveries.append((msg.value, msg.attempt))
            if msg.value == b"bad input":
                raise ValueError("cannot parse")

        stop = asyncio.Event()
        run = asyncio.ensure_future(
            client.consume(
                poison, "g", handle, stop=stop, create_group=True, wait_ms=200, mode=mode
            )
        )

        async def dead_letters():  # type: ignore[no-untyped-def]
            return [d async for d in client.admin.list_dead_letters(poison)]

        dead = await wait_for(dead_letters, 15)
        stop.set()
        stats = await asyncio.wait_for(run, 10)
        assert sorted(deliveries) == [(b"bad input", 1), (b"bad input", 2), (b"fine", 1)]
        assert len(dead) == 1
        assert (dead[0].record.value, dead[0].record.key) == (b"bad input", b"k")
        assert (dead[0].group, dead[0].reason, dead[0].attempts) == ("g", "max_attempts", 2)
        assert (stats.acked, stats.nacked, stats.dead_lettered) == (1, 1, 1)
        assert stats.handler_errors == 2
        # the dead letter can be replayed to the group and handled this time
        assert await client.admin.replay_dead_letters(poison, all=True) == 1
        got: list[bytes] = []
        stop = asyncio.Event()

        async def fixed(msg: Message) -> None:
            got.append(msg.value)
            stop.set()

        await asyncio.wait_for(
            client.consume(poison, "g", fixed, stop=stop, wait_ms=200, mode=mode), 10
        )
        assert got == [b"bad input"]


async def test_long_handler_keeps_its_lease(broker: Node) -> None:
    """lease_ms=1000, the handler takes 3 s: renewals keep the lease; a second consumer of
    the group polling all along never gets the message; delivered once, attempt 1."""
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("slow", type="work")
        await client.admin.create_group("slow", "g")
        calls: list[tuple[str, int]] = []
        done = asyncio.Event()

        def handler(consumer_id: str):  # type: ignore[no-untyped-def]
            async def handle(msg: Message) -> None:
                calls.append((consumer_id, msg.attempt))
                await asyncio.sleep(3)
                done.set()

            return handle

        stop = asyncio.Event()
        runs = [
            asyncio.ensure_future(
                client.consume(
                    "slow", "g", handler(cid), consumer_id=cid, lease_ms=1000, wait_ms=200,
                    stop=stop,
                )
            )
            for cid in ("a", "b")
        ]  # fmt: skip
        await asyncio.sleep(0.3)  # both are polling
        await client.publish("slow", b"takes a while")
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(1.5)  # longer than a lease: a lapsed lease would redeliver now
        stop.set()
        stats = await asyncio.wait_for(asyncio.gather(*runs), 10)
        assert len(calls) == 1 and calls[0][1] == 1
        assert sum(s.extended for s in stats) >= 3
        assert sum(s.acked for s in stats) == 1 and sum(s.stale for s in stats) == 0
        part = (await client.admin.describe_group("slow", "g")).partitions[0]
        assert (part.acked, part.in_flight, part.lag) == (1, 0, 0)


async def test_graceful_shutdown_loses_nothing(broker: Node) -> None:
    """A consumer stopped mid-stream finishes and acks what it leased; a second run gets
    exactly the rest: every message handled once, none lost, none redelivered."""
    n = 400
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("graceful", type="work", partitions=2)
        await client.admin.create_group("graceful", "g")
        await client.publish_batch("graceful", [f"m{i}".encode() for i in range(n)])
        first: list[bytes] = []
        stop = asyncio.Event()

        async def slow(msg: Message) -> None:
            await asyncio.sleep(0.002)
            first.append(msg.value)
            if len(first) == 100:
                stop.set()  # mid-consume: leased messages are still in flight

        stats1 = await asyncio.wait_for(
            client.consume("graceful", "g", slow, concurrency=4, batch=20, stop=stop), 20
        )
        assert len(first) >= 100 and stats1.acked == len(first) == stats1.leased
        assert stats1.stale == 0 and stats1.released == 0
        desc = await client.admin.describe_group("graceful", "g")
        assert sum(p.in_flight for p in desc.partitions) == 0
        assert not desc.members  # the member left

        second: list[tuple[bytes, int]] = []
        stop = asyncio.Event()

        async def rest(msg: Message) -> None:
            second.append((msg.value, msg.attempt))
            if len(first) + len(second) >= n:
                stop.set()

        await asyncio.wait_for(
            client.consume("graceful", "g", rest, concurrency=4, stop=stop, wait_ms=200), 20
        )
        everything = Counter(first) + Counter(v for v, _ in second)
        assert everything == Counter(f"m{i}".encode() for i in range(n))
        assert all(attempt == 1 for _, attempt in second)
        desc = await client.admin.describe_group("graceful", "g")
        assert sum(p.acked for p in desc.partitions) == n
        assert sum(p.lag for p in desc.partitions) == 0


async def test_leaving_the_iteration_early_gives_leased_messages_back(broker: Node) -> None:
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("early", type="work")
        await client.admin.create_group("early", "g")
        await client.publish_batch("early", [f"m{i}".encode() for i in range(50)])
        async with client.consumer("early", "g", batch=20) as consumer:
            async for msg in consumer:
                if msg.offset == 4:
                    break  # m0..m4 acked (auto_ack), the other leased ones are released
        assert consumer.stats.acked == 5 and consumer.stats.released == 15
        seen: list[tuple[int, int]] = []
        async with asyncio.timeout(10):
            async with client.consumer("early", "g", batch=100, wait_ms=200) as consumer:
                async for msg in consumer:
                    seen.append((msg.offset, msg.attempt))
                    if len(seen) == 45:
                        break
        assert sorted(o for o, _ in seen) == list(range(5, 50))
        assert {o for o, a in seen if a == 2} == set(range(5, 20))  # released: attempt 2


@pytest.mark.parametrize("mode", ["poll", "push"])
async def test_ordered_group_hands_partitions_to_a_new_member_in_order(
    broker: Node, mode: str
) -> None:
    """Ordered group, 4 partitions: a second member joins mid-stream; the first finishes what
    it holds of the revoked partitions and releases them at once. Every message is handled
    once (attempt 1), and each partition in offset order across both members. The rebalance
    callbacks say it: a is assigned all 4, then told which it loses only after it handled
    the last of their messages it held; b is assigned those."""
    n = 400
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue(f"ordered-{mode}", type="work", partitions=4)
        await client.admin.create_group(f"ordered-{mode}", "g", mode="ordered")
        await client.publish_batch(
            f"ordered-{mode}", [OutgoingMessage(f"m{i}", key=f"k{i % 8}") for i in range(n)]
        )
        handled: list[tuple[str, int, int, int]] = []
        events: list[tuple[str, str, frozenset[int]]] = []  # (member, what, partitions)
        stop = asyncio.Event()
        b_started = asyncio.Event()

        def told(cid: str, what: str):  # type: ignore[no-untyped-def]
            async def callback(partitions: frozenset[int]) -> None:
                events.append((cid, what, partitions))

            return callback

        def handler(cid: str):  # type: ignore[no-untyped-def]
            async def handle(msg: Message) -> None:
                events.append((cid, f"handled {msg.offset}", frozenset({msg.partition})))
                handled.append((cid, msg.partition, msg.offset, msg.attempt))
                await asyncio.sleep(0.004)
                if len(handled) >= 60:
                    b_started.set()
                if len(handled) >= n:
                    stop.set()

            return handle

        def member(cid: str) -> asyncio.Future[ConsumerStats]:
            return asyncio.ensure_future(
                client.consume(
                    f"ordered-{mode}", "g", handler(cid), consumer_id=cid, batch=10, wait_ms=200,
                    mode=mode,
                    session_timeout_ms=1500, concurrency=2, stop=stop,
                    on_assigned=told(cid, "assigned"), on_revoked=told(cid, "revoked"),
                )
            )  # fmt: skip

        a = member("a")
        await asyncio.wait_for(b_started.wait(), 20)
        b = member("b")
        stats = await asyncio.wait_for(asyncio.gather(a, b), 30)
        assert sum(s.acked for s in stats) == n and sum(s.stale for s in stats) == 0
        positions = [(p, o) for _, p, o, _ in handled]
        assert len(positions) == n and len(set(positions)) == n
        assert all(attempt == 1 for *_, attempt in handled)
        for p in range(4):
            offsets = [o for _, q, o, _ in handled if q == p]
            assert offsets == sorted(offsets), p
        assert {cid for cid, *_ in handled} == {"a", "b"}
        told_events = [(cid, what, ps) for cid, what, ps in events if what in TOLD]
        assert told_events[0] == ("a", "assigned", frozenset(range(4))), told_events
        revoked = [(i, ps) for i, (cid, what, ps) in enumerate(events) if (cid, what) == (
            "a", "revoked")]  # fmt: skip
        assert revoked, told_events
        # b gained while a was running only what a was told it lost (the rest once a left);
        # a, leaving, was told it lost what it still had.
        first_lost = revoked[0][1]
        b_first = next(ps for cid, what, ps in told_events if (cid, what) == ("b", "assigned"))
        assert first_lost != frozenset(range(4)) and b_first <= first_lost, told_events
        lost = frozenset().union(*(ps for _, ps in revoked))
        assert lost == frozenset(range(4)), told_events
        for i, ps in revoked:  # a handled nothing of a partition after it was told it lost it
            assert not [e for e in events[i:] if e[0] == "a" and e[1].startswith("handled")
                        and e[2] <= ps], (ps, events[i:i + 5])  # fmt: skip


TOLD = ("assigned", "revoked")


async def test_push_consumers_handle_every_message_once_while_it_is_published(
    broker: Node,
) -> None:
    """Two consumers on Consume streams (mode="push") of one shared group, messages published
    while they run: every message handled once, on its first attempt, all acked."""
    n = 300
    async with AsyncClient(broker.address) as client:
        await client.admin.create_queue("pushed", type="work", partitions=2)
        await client.admin.create_group("pushed", "g")
        handled: Counter[bytes] = Counter()
        attempts: list[int] = []
        stop = asyncio.Event()

        async def handle(msg: Message) -> None:
            handled[msg.value] += 1
            attempts.append(msg.attempt)
            if sum(handled.values()) >= n:
                stop.set()

        runs = [
            asyncio.ensure_future(
                client.consume(
                    "pushed",
                    "g",
                    handle,
                    consumer_id=cid,
                    batch=20,
                    concurrency=4,
                    mode="push",
                    stop=stop,
                )
            )
            for cid in ("a", "b")
        ]
        for i in range(0, n, 30):
            await client.publish_batch("pushed", [f"m{j}".encode() for j in range(i, i + 30)])
        stats = await asyncio.wait_for(asyncio.gather(*runs), 30)
        assert handled == Counter({f"m{j}".encode(): 1 for j in range(n)})
        assert set(attempts) == {1} and sum(s.acked for s in stats) == n
        desc = await client.admin.describe_group("pushed", "g")
        assert sum(p.in_flight for p in desc.partitions) == 0


async def test_client_close_stops_a_running_consume_gracefully(broker: Node) -> None:
    client = AsyncClient(broker.address)
    await client.admin.create_queue("closing", type="work")
    await client.publish_batch("closing", [f"m{i}".encode() for i in range(100)])
    handled: list[bytes] = []

    async def handle(msg: Message) -> None:
        await asyncio.sleep(0.01)
        handled.append(msg.value)

    running = asyncio.ensure_future(
        client.consume("closing", "g", handle, create_group=True, batch=10, concurrency=2)
    )

    async def some_handled() -> bool:
        return len(handled) >= 5

    await wait_for(some_handled, 10)
    await asyncio.wait_for(client.close(), 10)  # flushes producers, stops consumers gracefully
    stats = await asyncio.wait_for(running, 10)
    assert stats.acked == len(handled) == stats.leased and stats.stale == 0
    async with AsyncClient(broker.address) as other:
        part = (await other.admin.describe_group("closing", "g")).partitions[0]
        assert (part.acked, part.in_flight) == (len(handled), 0)
