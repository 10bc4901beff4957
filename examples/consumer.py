"""Handles the orders of ``examples/producer.py`` in the consumer group ``billing``.

Runs until Ctrl-C / SIGTERM (or ``--max`` messages), then stops gracefully: the orders being
handled are finished and acked, and the member leaves the group.

    .venv/bin/python examples/consumer.py [--concurrency 4] [--max 0]
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from fluxmq.client import AsyncClient, Message


async def main(concurrency: int, max_messages: int) -> None:
    stop = asyncio.Event()
    handled = 0

    async def bill(msg: Message) -> None:
        nonlocal handled
        order = msg.data  # decoded from JSON
        if order.get("qty", 1) > 100:
            raise ValueError("suspicious quantity")  # nacked: retried later, then dead-lettered
        await asyncio.sleep(0.01)  # the work
        print(f"billed order {order['order']} (partition {msg.partition}, attempt {msg.attempt})")
        handled += 1
        if max_messages and handled >= max_messages:
            stop.set()
        # returning normally acks the message

    async with AsyncClient(codec="json") as client:
        await client.admin.create_queue("orders", type="work", partitions=3, exist_ok=True)
        stats = await client.consume(
            "orders",
            "billing",
            bill,
            concurrency=concurrency,
            create_group=True,
            stop=stop,
            stop_signals=(signal.SIGINT, signal.SIGTERM),
        )
    print(f"stopped: {stats.acked} acked, {stats.nacked} nacked, {stats.dead_lettered} dead")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max", type=int, default=0, help="stop after this many (0: never)")
    args = parser.parse_args()
    asyncio.run(main(args.concurrency, args.max))
