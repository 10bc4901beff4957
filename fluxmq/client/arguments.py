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


def integer_argument(
    message: type[Message], field: str, value: Any, argument: str | None = None
) -> int:
    """``value`` when the integer ``field`` of ``message`` (a message class) can hold it;
    otherwise InvalidArgument naming ``argument`` (default: the field).

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
    return _integer(argument or field, message.DESCRIPTOR.fields_by_name[field].cpp_type, value)


def check_integers(message: type[Message], values: Mapping[str, Any]) -> None:
    """Every value of ``values`` that fills an integer field of ``message``: a single one, each
    of a repeated one (``partitions[2]``), each key and value of a map (``offsets[7]``). Names
    the message does not have, and fields of other types, are left to protobuf.

    >>> from fluxmq._pb.v1 import queue_pb2 as pb
    >>> check_integers(pb.QueueConfig, {"partitions": 3, "type": "work"})
    >>> def refusal(message, values):
    ...     try:
    ...         check_integers(message, values)
    ...     except InvalidArgument as err:
    ...         return err.field_violations
    >>> refusal(pb.QueueConfig, {"partitions": -3})
    (FieldViolation(field='partitions', description='out of range'),)
    >>> refusal(pb.ResetOffsetsRequest, {"partitions": [0, 1, -2]})
    (FieldViolation(field='partitions[2]', description='out of range'),)
    >>> refusal(pb.CommitOffsetsRequest, {"offsets": {0: 10, 1: -5}})
    (FieldViolation(field='offsets[1]', description='out of range'),)
    >>> refusal(pb.CommitOffsetsRequest, {"offsets": {-1: 10}})
    (FieldViolation(field='offsets key -1', description='out of range'),)
    """
    for name, value in values.items():
        field = message.DESCRIPTOR.fields_by_name.get(name)
        if field is None:
            continue
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            key_field, value_field = entry.fields_by_name["key"], entry.fields_by_name["value"]
            for k, v in dict(value).items():
                if key_field.cpp_type in INTEGER_RANGES:
                    _integer(f"{name} key {k!r}", key_field.cpp_type, k)
                if value_field.cpp_type in INTEGER_RANGES:
                    _integer(f"{name}[{k!r}]", value_field.cpp_type, v)
        elif field.cpp_type not in INTEGER_RANGES:
            continue
        elif field.is_repeated:
            for i, item in enumerate(value):
                _integer(f"{name}[{i}]", field.cpp_type, item)
        else:
            _integer(name, field.cpp_type, value)


def _integer(argument: str, cpp_type: int, value: Any) -> int:
    low, end = INTEGER_RANGES[cpp_type]
    if isinstance(value, bool) or not isinstance(value, int):
        why = "not an integer"
    elif not low <= value < end:
        why = "out of range"
    else:
        return value
    raise InvalidArgument(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{argument} must be an integer from {low} to {end - 1}; got {value!r}",
        field_violations=(FieldViolation(argument, why),),
    )
