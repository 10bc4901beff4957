"""Choosing a partition for each published message (pure).

Rules, in order: an explicit ``partition``; else the key's stable hash, ``crc32c(key) %
partitions`` (crc32c, Castagnoli, initial value 0 — the same function every client can compute);
else round-robin over keyless messages, continuing from ``cursor``.

Example: 3 partitions, cursor 7, messages [key=b"a", no key, partition=2, no key]:
crc32c(b"a") = 0xC1D04330 -> 3251651376 % 3 = 0; then 7 % 3 = 1; then 2; then 8 % 3 = 2.
Result ([0, 1, 2, 2], cursor 9).
"""

from __future__ import annotations

from collections.abc import Sequence

import crc32c

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.errors import partition_out_of_range


def key_partition(key: bytes, partitions: int) -> int:
    return int(crc32c.crc32c(key)) % partitions


def choose_partitions(
    queue: str, messages: Sequence[pb.PublishMessage], partitions: int, cursor: int
) -> tuple[list[int], int]:
    """-> (one partition per message, the new round-robin cursor)."""
    out: list[int] = []
    for i, msg in enumerate(messages):
        if msg.HasField("partition"):
            if msg.partition >= partitions:
                raise partition_out_of_range(
                    queue, msg.partition, partitions, f"messages[{i}].partition"
                )
            out.append(msg.partition)
        elif msg.HasField("key"):
            out.append(key_partition(msg.key, partitions))
        else:
            out.append(cursor % partitions)
            cursor += 1
    return out, cursor
