"""The shared partitioning test vector (proto/fluxmq/v1/key_partition_vector.json): the SDK and
the broker put every key in the same partition."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import crc32c
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client import partitioning
from fluxmq.core import partitioner
from fluxmq.core.queue_config import normalize_new, policy_of

VECTOR = Path(__file__).parents[2] / "proto" / "fluxmq" / "v1" / "key_partition_vector.json"


def cases() -> list[dict[str, Any]]:
    doc = json.loads(VECTOR.read_text())
    assert len(doc["cases"]) >= 300
    return list(doc["cases"])


def test_vector_hash_is_standard_crc32c() -> None:
    check = json.loads(VECTOR.read_text())["check"]
    assert int(crc32c.crc32c(bytes.fromhex(check["input_hex"]))) == check["crc32c"] == 0xE3069283


def test_sdk_puts_every_vector_key_in_its_partition() -> None:
    for case in cases():
        key = bytes.fromhex(case["key_hex"])
        assert partitioning.key_partition(key, case["partitions"]) == case["partition"], case
        pmap = partitioning.PartitionMap(None, "q")  # type: ignore[arg-type]
        msg = pb.PublishMessage(value=b"v", key=key)
        assert pmap.partition_of(msg, case["partitions"]) == case["partition"], case


def test_broker_puts_every_vector_key_in_its_partition() -> None:
    by_count: dict[int, list[dict[str, Any]]] = {}
    for case in cases():
        by_count.setdefault(case["partitions"], []).append(case)
    for count, group in by_count.items():
        policy = policy_of(normalize_new(pb.QueueConfig(name="q", partitions=count)))
        msgs = [pb.PublishMessage(value=b"v", key=bytes.fromhex(c["key_hex"])) for c in group]
        for start in range(0, len(msgs), 1000):
            prepared = partitioner.prepare_append("q", 1, policy, msgs[start : start + 1000], 0, 1)
            expected = [c["partition"] for c in group[start : start + 1000]]
            assert list(prepared.command.partitions) == expected
        for c in group:
            assert partitioner.key_partition(bytes.fromhex(c["key_hex"]), count) == c["partition"]


def test_sdk_refuses_a_partition_count_below_one() -> None:
    with pytest.raises(ValueError):
        partitioning.key_partition(b"k", 0)


def test_keyless_messages_stick_to_a_partition_until_a_request_leaves() -> None:
    pmap = partitioning.PartitionMap(None, "q")  # type: ignore[arg-type]
    pmap._partitions = 3
    keyless = pb.PublishMessage(value=b"v")
    assert [pmap.partition_of(keyless, 3) for _ in range(3)] == [0, 0, 0]
    pmap.request_formed(0)
    assert pmap.partition_of(keyless, 3) == 1
    pmap.request_formed(2)  # another partition's request does not move it
    assert pmap.partition_of(keyless, 3) == 1
    explicit = pb.PublishMessage(value=b"v", partition=2, key=b"a")
    assert pmap.partition_of(explicit, 3) == 2
