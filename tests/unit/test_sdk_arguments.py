"""The SDK refuses an integer argument its protobuf field cannot hold (a negative partition, a
delay past uint32, a non-integer) with InvalidArgument naming the argument, before anything is
sent: a message's fields, a Fetch's, a queue's config. Protobuf alone raised ``ValueError: Value
out of range: -1``, naming neither; the admin calls likewise. Errors say what is wrong once,
and name the argument."""

from __future__ import annotations

import doctest
from typing import Any

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client import AsyncClient, arguments
from fluxmq.client.admin import queue_config
from fluxmq.client.codecs import BytesCodec
from fluxmq.client.errors import FieldViolation, InvalidArgument
from fluxmq.client.producer import fill


def filled(**arguments: Any) -> pb.PublishMessage:
    m = pb.PublishMessage()
    fill(m, BytesCodec(), b"v", **arguments)
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


def test_the_checks_examples_hold() -> None:
    assert doctest.testmod(arguments).failed == 0


@pytest.mark.parametrize(
    ("argument", "value"),
    [("partition", -1), ("offset", 1 << 63), ("max_messages", -1), ("max_bytes", -1),
     ("wait_ms", 0.5)],
)  # fmt: skip
async def test_a_fetch_argument_its_field_cannot_hold_fails_before_any_call(
    argument: str, value: Any
) -> None:
    client = AsyncClient("127.0.0.1:1")  # nobody listens: a call would fail otherwise
    try:
        with pytest.raises(InvalidArgument) as info:
            await client.fetch("q", **{argument: value})
        assert [v.field for v in info.value.field_violations] == [argument]
    finally:
        await client.close()


def test_a_queue_config_integer_its_field_cannot_hold_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument) as info:
        queue_config("q", {"partitions": -1, "type": "work"})
    assert [v.field for v in info.value.field_violations] == ["partitions"]
    config = queue_config("q", {"partitions": 4, "type": "work", "labels": {"team": "pay"}})
    assert config.partitions == 4 and config.labels["team"] == "pay"


def test_an_error_says_each_violation_once() -> None:
    told = InvalidArgument(
        grpc.StatusCode.INVALID_ARGUMENT,
        "publish.messages[0].delay_ms: at most 7 days",
        field_violations=(FieldViolation("messages[0].delay_ms", "at most 7 days"),),
        request_id="r1",
    )
    assert (
        str(told)
        == "INVALID_ARGUMENT: publish.messages[0].delay_ms: at most 7 days [request id r1]"
    )
    untold = InvalidArgument(
        grpc.StatusCode.INVALID_ARGUMENT,
        "queue 'q' has partitions 0..2; got 9",
        reason="PARTITION_OUT_OF_RANGE",
        field_violations=(FieldViolation("partition", "must be < 3"),),
    )
    assert str(untold) == (
        "PARTITION_OUT_OF_RANGE: queue 'q' has partitions 0..2; got 9 (partition: must be < 3)"
    )


def test_a_key_or_header_of_another_type_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match=r"^key must be str or bytes, not int$"):
        filled(key=123)
    with pytest.raises(TypeError, match=r"^header 'trace' must be str or bytes, not float$"):
        filled(headers={"trace": 1.5})


ADMIN_CALLS = {
    "commit_offsets": (lambda a: a.commit_offsets("q", "g", {0: 3, 1: -5}), "offsets[1]"),
    "commit_offsets key": (lambda a: a.commit_offsets("q", "g", {-1: 3}), "offsets key -1"),
    "reset_offsets": (lambda a: a.reset_offsets("q", "g", "earliest", partitions=[0, -2]),
                      "partitions[1]"),
    "seek": (lambda a: a.seek("q", "g", offset=-1), "offset"),
    "offset_for_timestamp": (lambda a: a.offset_for_timestamp("q", -1, 0), "partition"),
    "list_dead_letters": (lambda a: a.list_dead_letters("q", page_size=-1).__anext__(),
                          "page_size"),
    "list_queues": (lambda a: a.list_queues(page_size=1.5).__anext__(), "page_size"),
    "replay_dead_letters": (lambda a: a.replay_dead_letters("q", ids=[7, -7]), "ids[1]"),
    "purge_dead_letters": (lambda a: a.purge_dead_letters("q", ids=iter([-1])), "ids[0]"),
}  # fmt: skip


@pytest.mark.parametrize("call", sorted(ADMIN_CALLS))
async def test_an_admin_argument_its_field_cannot_hold_fails_before_any_call(call: str) -> None:
    make, field = ADMIN_CALLS[call]
    client = AsyncClient("127.0.0.1:1")  # nobody listens: a call would fail otherwise
    try:
        with pytest.raises(InvalidArgument) as info:
            await make(client.admin)
        assert [v.field for v in info.value.field_violations] == [field]
    finally:
        await client.close()


async def test_an_unknown_purge_scope_names_the_scopes() -> None:
    client = AsyncClient("127.0.0.1:1")
    try:
        with pytest.raises(
            ValueError, match=r"scope must be one of \['all', 'ready', 'scheduled'\]"
        ):
            await client.admin.purge_queue("q", scope="some")
    finally:
        await client.close()
