"""What fluxmqctl prints: aligned tables and ``field: value`` blocks for people, one JSON document
per command for scripts (``-o json``, the protobuf JSON mapping with the proto field names; ``-o
jsonl``: the same document on one line, and for ``tail`` and ``consume`` one object per record
as it arrives, fluxmq.cli.record_output), and the small renderings they share (bytes, times,
enums)."""

from __future__ import annotations

import datetime
import json
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from google.protobuf import json_format
from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

FORMATS = ("table", "json", "jsonl")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}
BYTES_SHOWN_MAX = 64  # binary values are shown as hex, cut here
_NUMBER_RE = re.compile(r"^[0-9]+(?:\.[0-9]+)?$")


def message_dict(msg: Message) -> dict[str, Any]:
    """The protobuf JSON mapping of ``msg`` (proto field names, defaults written out)."""
    return json_format.MessageToDict(
        msg, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )


def show_bytes(data: bytes) -> str:
    """Text when it is UTF-8 (control characters escaped), else ``0x`` + hex."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        shown = data[:BYTES_SHOWN_MAX].hex()
        more = f"...({len(data)} bytes)" if len(data) > BYTES_SHOWN_MAX else ""
        return f"0x{shown}{more}"
    if text.isprintable():
        return text
    return "".join(_ESCAPES.get(c, c if c.isprintable() else f"\\x{ord(c):02x}") for c in text)


def show_key(record: Message) -> str:
    """A record's key: ``-`` when it has none (an empty key is ``""``, not "no key")."""
    if not record.HasField("key"):
        return "-"
    key: bytes = getattr(record, "key", b"")
    return show_bytes(key) if key else '""'


def show_headers(headers: Any, *, skip_reserved: bool = False) -> str:
    items = sorted(headers.items())
    shown = [
        f"{k}={show_bytes(v)}" for k, v in items if not (skip_reserved and k.startswith("fluxmq-"))
    ]
    return ",".join(shown) or "-"


def show_time(ms: int) -> str:
    """Milliseconds since the epoch as UTC ISO 8601 (``-`` for 0)."""
    if ms <= 0:
        return "-"
    when = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def enum_short(enum: EnumDescriptor | Any, number: int) -> str:
    """``QUEUE_TYPE_WORK`` -> ``work``: the value's name without the prefix all values share."""
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    names = [v.name for v in enum.values]
    prefix = names[0]
    for name in names[1:]:
        while not name.startswith(prefix):
            prefix = prefix[:-1]
    prefix = prefix[: prefix.rfind("_") + 1]
    return value.name[len(prefix) :].lower()


def flatten(msg: Message, prefix: str = "") -> list[tuple[str, str]]:
    """Every field of ``msg`` (defaults too) as ``(dotted.path, text)``; nested messages are
    flattened, maps become ``k=v,k=v``."""
    out: list[tuple[str, str]] = []
    for fd in msg.DESCRIPTOR.fields:
        path = prefix + fd.name
        value = getattr(msg, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            out.append((path, ",".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"))
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            out.extend(flatten(value, path + "."))
        elif fd.type == FieldDescriptor.TYPE_ENUM:
            out.append((path, enum_short(fd.enum_type, value)))
        elif fd.type == FieldDescriptor.TYPE_BOOL:
            out.append((path, "true" if value else "false"))
        elif fd.type == FieldDescriptor.TYPE_BYTES:
            out.append((path, show_bytes(value)))
        else:
            out.append((path, str(value) if value not in ("", None) else "-"))
    return out


def render_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns aligned on the widest cell; numeric columns (integers and decimals, ``-`` for
    none) right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    numeric = [
        all(c == "-" or _NUMBER_RE.match(c) for c in col) and any(c != "-" for c in col)
        for col in zip(*cells, strict=False)
    ]
    numeric += [False] * (len(headers) - len(numeric))

    def line(row: Sequence[str]) -> str:
        parts = [
            (c.rjust(widths[i]) if numeric[i] else c.ljust(widths[i])) for i, c in enumerate(row)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in cells)])


def render_fields(pairs: Sequence[tuple[str, object]]) -> str:
    width = max((len(k) for k, _ in pairs), default=0) + 1
    return "\n".join(f"{(k + ':').ljust(width)} {v}" for k, v in pairs)


class Printer:
    """Writes a command's result to stdout in the chosen format."""

    def __init__(self, fmt: str, out: TextIO | None = None) -> None:
        self.format = fmt
        self._out = out

    @property
    def out(self) -> TextIO:
        return self._out if self._out is not None else sys.stdout

    @property
    def json(self) -> bool:
        """A JSON document (``-o json``, or ``-o jsonl`` for a command that is not a stream)."""
        return self.format in ("json", "jsonl")

    @property
    def jsonl(self) -> bool:
        """One JSON object per line: streams print each record as it arrives."""
        return self.format == "jsonl"

    def doc(self, value: Any) -> None:
        """The one JSON document of the command (on one line with ``-o jsonl``)."""
        if self.jsonl:
            self.out.write(json.dumps(value, separators=(",", ":")) + "\n")
        else:
            self.out.write(json.dumps(value, indent=2) + "\n")
        self.out.flush()

    def json_line(self, value: Any) -> None:
        """One object of a JSON lines stream, written at once."""
        self.out.write(json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n")
        self.out.flush()

    def raw(self, data: bytes) -> None:
        """Bytes as they are (a ``--format`` rendering: values are written unchanged)."""
        self.out.flush()
        buffer = getattr(self.out, "buffer", None)
        if buffer is None:
            self.out.write(data.decode("utf-8", "replace"))
        else:
            buffer.write(data)
            buffer.flush()

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        self.line(render_table(headers, rows))

    def fields(self, pairs: Sequence[tuple[str, object]]) -> None:
        self.line(render_fields(pairs))

    def flush(self) -> None:
        self.out.flush()


class StreamTable:
    """A table printed row by row as results arrive (consume, tail): the header once, columns at
    least as wide as the header and the first batch."""

    def __init__(self, printer: Printer, headers: Sequence[str]) -> None:
        self._printer = printer
        self._headers = list(headers)
        self._widths: list[int] | None = None

    def rows(self, rows: Sequence[Sequence[object]]) -> None:
        cells = [[str(c) for c in row] for row in rows]
        if not cells:
            return
        if self._widths is None:
            self._widths = [len(h) for h in self._headers]
            for row in cells:
                for i, c in enumerate(row[:-1]):  # the last column is not padded
                    self._widths[i] = max(self._widths[i], len(c))
            self._printer.line(self._render(self._headers))
        for row in cells:
            self._printer.line(self._render(row))
        self._printer.flush()

    def _render(self, row: Sequence[str]) -> str:
        assert self._widths is not None
        last = len(row) - 1
        return "  ".join(c if i == last else c.ljust(self._widths[i]) for i, c in enumerate(row))
