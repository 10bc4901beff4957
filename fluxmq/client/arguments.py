"""Integer arguments checked against the protobuf field they fill, before a request is sent.

Protobuf refuses a value its field cannot hold with ``ValueError: Value out of range: -1``,
naming neither the field nor the range. The SDK raises InvalidArgument instead, naming the
argument as the caller wrote it, like the broker's own refusals (``field_violations``). Only
what the field's type decides is checked here; the broker judges the rest (a partition the queue
has, a delay of at most 7 days), so the limits live in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from fluxmq.client.errors import FieldViolation, InvalidArgument

# [low, end) of each integer type protobuf has.
INTEGER_RANGES: dict[int, tuple[int, int]] = {
    FieldDescriptor.CPPTYPE_INT32: (-(1 << 31), 1 << 31),
    FieldDescriptor.CPPTYPE_UINT32: (0, 1 << 32),
    FieldDescriptor.CPPTYPE_INT64: (-(1 << 63), 1 << 63),
    FieldDescriptor.CPPTYPE_UINT64: (0, 1 << 64),
}


def integer_argument(message: type[Message], field: str, value: Any) -> int:
    """``value`` when the integer ``field`` of ``message`` (a message class) can hold it;
    otherwise InvalidArgument naming ``field``.

    >>> from fluxmq._pb.v1 import queue_pb2 as pb
    >>> integer_argument(pb.PublishMessage, "partition", 2)
    2
    >>> try:
    ...     integer_argument(pb.PublishMessage, "partition", -1)
    ... except InvalidArgument as err:
    ...     print(err.message)
    ...     print(err.field_violations)
    partition must be an integer from 0 to 4294967295; got -1
    (FieldViolation(field='partition', description='out of range'),)
    """
    low, end = INTEGER_RANGES[message.DESCRIPTOR.fields_by_name[field].cpp_type]
    if isinstance(value, bool) or not isinstance(value, int):
        why = "not an integer"
    elif not low <= value < end:
        why = "out of range"
    else:
        return value
    raise InvalidArgument(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{field} must be an integer from {low} to {end - 1}; got {value!r}",
        field_violations=(FieldViolation(field, why),),
    )


def check_integers(message: type[Message], values: Mapping[str, Any]) -> None:
    """Every value of ``values`` that fills an integer field of ``message`` (names it does not
    have, and fields of other types, are left to protobuf).

    >>> from fluxmq._pb.v1 import queue_pb2 as pb
    >>> check_integers(pb.QueueConfig, {"partitions": 3, "type": "work"})
    >>> try:
    ...     check_integers(pb.QueueConfig, {"partitions": -3})
    ... except InvalidArgument as err:
    ...     print(err.field_violations)
    (FieldViolation(field='partitions', description='out of range'),)
    """
    for name, value in values.items():
        field = message.DESCRIPTOR.fields_by_name.get(name)
        if field is not None and field.cpp_type in INTEGER_RANGES and not field.is_repeated:
            integer_argument(message, name, value)
