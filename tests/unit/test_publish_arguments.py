"""The SDK refuses a message argument its PublishMessage field cannot hold (a negative partition,
a delay past uint32, a non-integer) with InvalidArgument naming the argument, before anything is
sent; protobuf alone raised ``ValueError: Value out of range: -1``, naming neither."""

from __future__ import annotations

import doctest
from typing import Any

import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client import producer
from fluxmq.client.codecs import BytesCodec
from fluxmq.client.errors import InvalidArgument
from fluxmq.client.producer import IdempotencyKeys, fill


def filled(**arguments: Any) -> pb.PublishMessage:
    m = pb.PublishMessage()
    fill(m, BytesCodec(), IdempotencyKeys(), b"v", idempotent=False, **arguments)
    return m


@pytest.mark.parametrize(
    ("argument", "value", "why"),
    [
        ("partition", -1, "out of range"),
        ("partition", 1 << 32, "out of range"),
        ("partition", "1", "not an integer"),
        ("partition", True, "not an integer"),
        ("partition", 1.0, "not an integer"),
        ("delay_ms", -5, "out of range"),
        ("delay_ms", 1 << 32, "out of range"),
        ("deliver_at_ms", 1 << 63, "out of range"),
        ("deliver_at_ms", "soon", "not an integer"),
    ],
)
def test_a_value_its_field_cannot_hold_is_invalid_argument_naming_the_argument(
    argument: str, value: Any, why: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        filled(**{argument: value})
    err = info.value
    assert err.reason == "INVALID_ARGUMENT" and not err.from_broker and not err.retriable
    assert [(v.field, v.description) for v in err.field_violations] == [(argument, why)]
    assert argument in err.message and repr(value) in err.message


def test_values_at_the_edges_of_their_fields_are_kept() -> None:
    m = filled(partition=0, delay_ms=(1 << 32) - 1, key=b"k")
    assert m.HasField("partition") and m.partition == 0 and m.delay_ms == (1 << 32) - 1
    assert filled(partition=(1 << 32) - 1).partition == (1 << 32) - 1
    assert filled(deliver_at_ms=-(1 << 63)).deliver_at_ms == -(1 << 63)  # the broker judges it


def test_the_checks_example_holds() -> None:
    assert doctest.testmod(producer).failed == 0
