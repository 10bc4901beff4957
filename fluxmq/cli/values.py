"""Parsing of argument values: ``k=v`` pairs, start positions, ``--set field=value`` on a
QueueConfig (by its descriptor, so every scalar field of the proto works)."""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.cli.conn import UsageError

POSITIONS = "earliest | latest | offset:N | time:MS (or time:ISO-8601)"
_INT_TYPES = (
    FieldDescriptor.CPPTYPE_INT32,
    FieldDescriptor.CPPTYPE_INT64,
    FieldDescriptor.CPPTYPE_UINT32,
    FieldDescriptor.CPPTYPE_UINT64,
)
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def key_value(text: str) -> tuple[str, str]:
    """argparse type for ``k=v``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value")
    return key, value


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def positive(text: str) -> int:
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def start_position(text: str) -> pb.StartPosition:
    """argparse type: ``earliest``, ``latest``, ``offset:N``, ``time:MS`` / ``time:ISO``."""
    kind, _, arg = text.partition(":")
    if kind == "earliest" and not arg:
        return pb.StartPosition(earliest=True)
    if kind == "latest" and not arg:
        return pb.StartPosition(latest=True)
    if kind == "offset":
        return pb.StartPosition(offset=non_negative(arg))
    if kind == "time" and arg:
        if arg.lstrip("-").isdigit():
            return pb.StartPosition(timestamp_ms=int(arg))
        try:
            when = datetime.datetime.fromisoformat(arg.replace("Z", "+00:00"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{arg!r} is neither milliseconds nor ISO-8601"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return pb.StartPosition(timestamp_ms=int(when.timestamp() * 1000))
    raise argparse.ArgumentTypeError(f"{text!r}: expected {POSITIONS}")


def show_position(pos: pb.StartPosition) -> str:
    which = pos.WhichOneof("position")
    if which is None or which == "earliest":
        return "earliest"
    if which == "latest":
        return "latest"
    if which == "offset":
        return f"offset:{pos.offset}"
    return f"time:{pos.timestamp_ms}"


def set_field(msg: Message, path: str, raw: str) -> None:
    """``msg.<path> = raw`` converted to the field's type; maps take ``k=v,k=v`` (replacing
    every entry; empty clears)."""
    parts = path.split(".")
    target = msg
    for i, name in enumerate(parts):
        fd = target.DESCRIPTOR.fields_by_name.get(name)
        if fd is None:
            known = ", ".join(f.name for f in target.DESCRIPTOR.fields)
            where = ".".join(parts[:i]) or target.DESCRIPTOR.name
            raise UsageError(f"--set {path}: {where} has no field {name!r} (fields: {known})")
        last = i == len(parts) - 1
        is_map = fd.message_type is not None and fd.message_type.GetOptions().map_entry
        if is_map:
            if not last:
                raise UsageError(f"--set {path}: set the whole map, e.g. {name}=k=v,k2=v2")
            entries = getattr(target, name)
            entries.clear()
            for item in filter(None, raw.split(",")):
                try:
                    k, v = key_value(item)
                except argparse.ArgumentTypeError as err:
                    raise UsageError(f"--set {path}: {err}") from None
                entries[k] = v
            return
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if last:
                subs = ", ".join(f"{path}.{f.name}" for f in getattr(fd.message_type, "fields", ()))
                raise UsageError(f"--set {path}: set its fields ({subs})")
            target = getattr(target, name)
            continue
        if not last:
            raise UsageError(f"--set {path}: {name} is not a message")
        setattr(target, name, _convert(fd, raw, path))
        return


def _convert(fd: FieldDescriptor | Any, raw: str, path: str) -> object:
    if fd.cpp_type in _INT_TYPES:
        try:
            return int(raw)
        except ValueError:
            raise UsageError(f"--set {path}: {raw!r} is not an integer") from None
    if fd.cpp_type == FieldDescriptor.CPPTYPE_BOOL:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise UsageError(f"--set {path}: {raw!r} is not true/false")
    if fd.cpp_type == FieldDescriptor.CPPTYPE_ENUM and fd.enum_type is not None:
        names = {v.name.lower(): v.number for v in fd.enum_type.values}
        for name, number in names.items():
            if name == raw.lower() or name.endswith("_" + raw.lower()):
                return number
        raise UsageError(f"--set {path}: {raw!r} is not one of {', '.join(names)}")
    if fd.cpp_type == FieldDescriptor.CPPTYPE_STRING:
        return raw.encode() if fd.type == FieldDescriptor.TYPE_BYTES else raw
    raise UsageError(f"--set {path}: fields of this type cannot be set here")
