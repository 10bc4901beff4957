"""Layout of the state machine's rows in the store's key/value table.

Every key starts with a one-letter table tag and a slash. Integers are big-endian so that key
order is numeric order (scans by queue, then by time, are sequential).
"""

from __future__ import annotations

import struct

APPLIED = b"M/applied"  # u64: last applied log index (same transaction as the effects)
NEXT_QUEUE_ID = b"M/next_queue_id"  # u64
QUEUE = b"Q/"  # + name -> fluxmq.v1.Queue
DEDUP = b"D/"  # + queue_id u64 + idempotency key -> partition u32, offset u64, timestamp i64
DEDUP_EXPIRY = b"X/"  # + queue_id u64 + timestamp u64 + idempotency key -> b""
TRASH = b"T/"  # + log_id u64 -> b"": logs of deleted queues, dropped in chunks by retention
NEXT_GROUP_ID = b"M/next_group_id"  # u64
NEXT_LEASE_ID = b"M/next_lease_id"  # u64
GROUP = b"C/"  # + queue_id u64 + group name -> fluxmq.v1.Group
GROUP_PARTITION = b"P/"  # + group_id u64 + partition u32 -> PARTITION_VALUE
# Pending deliveries as runs (delivery.py): consecutive offsets of one group partition that are
# alike (same kind, attempt, due time and member; lease ids counting up by one when leased) are
# one row, keyed by the run's last offset: + group_id u64 + partition u32 + last offset u64 ->
# SLOT_RUN_VALUE + member (utf-8). Leasing and acking 100 in-order records costs one row.
SLOT_RUN = b"U/"
# Rows of stores written before runs: one per offset, + group_id u64 + partition u32 + offset u64
# -> SLOT_VALUE + member. Read on open and rewritten as runs (delivery.DeliveryState.load).
SLOT = b"S/"
DEAD_GONE = b"L/"  # + dlq queue_id u64 + offset u64 -> b"": dead letters replayed or purged
# + dlq queue_id u64 + origin name length u8 + origin name + offset u64 -> b"": the live dead
# letters of each origin queue (several queues may share one DLQ), removed on replay and purge
DEAD_ORIGIN = b"O/"
# + dlq queue_id u64 -> u64: DEAD_ORIGIN indexes the DLQ's dead letters from this offset on; those
# below it were written before the index and are read by their fluxmq-original-queue header
DEAD_INDEXED = b"I/"
# + dlq queue_id u64 + origin name length u8 + origin name -> u64: DEAD_ORIGIN rows of that origin
# (the depth without a scan; rows below the DLQ's low watermark are subtracted by readers)
DEAD_ORIGIN_COUNT = b"K/"
CHECKOUT = b"H/"  # + group_id u64 + consumer id (utf-8) -> fluxmq.internal.CheckoutState
MEMBERSHIP = b"G/"  # + group_id u64 -> fluxmq.internal.MembershipState (groups with members)
NODE_ADDRESS = b"N/"  # + raft address (utf-8) -> gRPC address (utf-8) of that node
# Idempotent producer sessions (core/producers.py): + queue_id u64 + producer_id u64 -> epoch,
# touched_ms, name; the same + partition u32 -> epoch, touched_ms, the last requests' ranges
PRODUCER = b"R/"
PRODUCER_NAME = b"W/"  # + queue_id u64 + producer name (utf-8) -> producer_id u64
NEXT_PRODUCER_ID = b"M/next_producer_id"  # u64
PRODUCER_SCAN = b"M/producer_scan"  # the producer key the next expiry pass starts at

U64 = struct.Struct(">Q")
DEDUP_VALUE = struct.Struct(">IQq")
# committed, next (delivery frontier), acked, dead, filtered, skipped_by_retention, purged,
# base (signed; see delivery.PartState.base)
PARTITION_VALUE = struct.Struct(">QQQQQQQq")
SLOT_VALUE = struct.Struct(">BIqQ")  # kind, attempt, due_ms (deadline or ready time), lease_id
# kind, attempt, due_ms, lease id of the first offset (0 when not leased), first offset
SLOT_RUN_VALUE = struct.Struct(">BIqQQ")
U32 = struct.Struct(">I")
PARTITION_BITS = 20  # log_id = queue_id << 20 | partition; partitions are < 1024


def log_id(queue_id: int, partition: int) -> int:
    assert 0 <= partition < (1 << PARTITION_BITS)
    return (queue_id << PARTITION_BITS) | partition


def producer_key(queue_id: int, producer_id: int) -> bytes:
    return PRODUCER + U64.pack(queue_id) + U64.pack(producer_id)


def producer_partition_key(queue_id: int, producer_id: int, partition: int) -> bytes:
    return PRODUCER + U64.pack(queue_id) + U64.pack(producer_id) + U32.pack(partition)


def producer_name_key(queue_id: int, name: str) -> bytes:
    return PRODUCER_NAME + U64.pack(queue_id) + name.encode()


def queue_key(name: str) -> bytes:
    return QUEUE + name.encode()


def dedup_key(queue_id: int, idempotency_key: str) -> bytes:
    return DEDUP + U64.pack(queue_id) + idempotency_key.encode()


def dedup_expiry_key(queue_id: int, timestamp_ms: int, idempotency_key: str) -> bytes:
    return (
        DEDUP_EXPIRY
        + U64.pack(queue_id)
        + U64.pack(max(timestamp_ms, 0))
        + idempotency_key.encode()
    )


def split_dedup_expiry_key(key: bytes) -> tuple[int, int, str]:
    """-> (queue_id, timestamp_ms, idempotency_key)"""
    n = len(DEDUP_EXPIRY)
    return (
        U64.unpack_from(key, n)[0],
        U64.unpack_from(key, n + 8)[0],
        key[n + 16 :].decode(),
    )


def group_key(queue_id: int, name: str) -> bytes:
    return GROUP + U64.pack(queue_id) + name.encode()


def group_partition_key(group_id: int, partition: int) -> bytes:
    return GROUP_PARTITION + U64.pack(group_id) + U32.pack(partition)


def slot_key(group_id: int, partition: int, offset: int) -> bytes:
    return SLOT + U64.pack(group_id) + U32.pack(partition) + U64.pack(offset)


def split_slot_key(key: bytes) -> tuple[int, int, int]:
    """-> (group_id, partition, offset) of a SLOT or SLOT_RUN key (the same shape)."""
    n = len(SLOT)
    return (
        U64.unpack_from(key, n)[0],
        U32.unpack_from(key, n + 8)[0],
        U64.unpack_from(key, n + 12)[0],
    )


def slot_run_prefix(group_id: int) -> bytes:
    return SLOT_RUN + U64.pack(group_id)


def slot_run_key(group_id: int, partition: int, last_offset: int) -> bytes:
    return SLOT_RUN + U64.pack(group_id) + U32.pack(partition) + U64.pack(last_offset)


def checkout_prefix(group_id: int) -> bytes:
    return CHECKOUT + U64.pack(group_id)


def checkout_key(group_id: int, consumer_id: str) -> bytes:
    return checkout_prefix(group_id) + consumer_id.encode()


def membership_key(group_id: int) -> bytes:
    return MEMBERSHIP + U64.pack(group_id)


def dead_gone_key(dlq_queue_id: int, offset: int) -> bytes:
    return DEAD_GONE + U64.pack(dlq_queue_id) + U64.pack(offset)


def dead_origin_prefix(dlq_queue_id: int, origin: str) -> bytes:
    name = origin.encode()
    assert len(name) < 256  # queue names are at most 200 ASCII characters
    return DEAD_ORIGIN + U64.pack(dlq_queue_id) + bytes((len(name),)) + name


def dead_origin_key(dlq_queue_id: int, origin: str, offset: int) -> bytes:
    return dead_origin_prefix(dlq_queue_id, origin) + U64.pack(offset)


def dead_indexed_key(dlq_queue_id: int) -> bytes:
    return DEAD_INDEXED + U64.pack(dlq_queue_id)


def dead_origin_count_key(dlq_queue_id: int, origin: str) -> bytes:
    return DEAD_ORIGIN_COUNT + dead_origin_prefix(dlq_queue_id, origin)[len(DEAD_ORIGIN) :]
