"""Publishes orders to the work queue ``orders`` through a buffering producer.

make run                       # a broker on 127.0.0.1:7070 (FLUXMQ_ADDR to use another)
.venv/bin/python examples/producer.py [--count 100]
"""

from __future__ import annotations

import argparse
import asyncio

from fluxmq.client import AsyncClient


async def main(count: int) -> None:
    async with AsyncClient(codec="json") as client:  # $FLUXMQ_ADDR or 127.0.0.1:7070
        await client.admin.create_queue(
            "orders", type="work", partitions=3, max_attempts=5, exist_ok=True
        )
        # One message, waited for: durable once publish() returns.
        first = await client.publish("orders", {"order": 0, "item": "book"}, key="user-0")
        print(f"order 0 -> partition {first.partition} offset {first.offset}")

        # Many messages: batched (100 per request, or every 10 ms), sent in the background.
        async with client.producer("orders", max_messages=100, linger_ms=10) as producer:
            futures = [
                await producer.send(
                    {"order": i, "item": "pen", "qty": i % 5 + 1},
                    key=f"user-{i % 7}",  # one user's orders stay in order, in one partition
                    headers={"source": "examples/producer.py"},
                )
                for i in range(1, count)
            ]
        # Leaving the block flushed everything; each future holds its message's position.
        last = await futures[-1] if futures else first
        print(
            f"published {count} orders; the last at partition {last.partition} offset {last.offset}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=100)
    asyncio.run(main(parser.parse_args().count))
