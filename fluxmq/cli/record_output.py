"""Records as ``tail`` and ``consume`` print them one at a time, as they arrive: ``-o jsonl``
(one JSON object per line) and kcat-style ``--format`` strings.

JSON lines carry text where the bytes are UTF-8 and base64 where they are not, and say which
(``value_encoding``, ``key_encoding``, ``headers_base64``), so a script never guesses::

    >>> line = json_line(pb.Record(partition=1, offset=7, value=b"hi", key=b"\\xff"))
    >>> line["value"], line["value_encoding"], line["key"], line["key_encoding"]
    ('hi', 'utf-8', '/w==', 'base64')

``--format`` takes kcat's tokens: ``%s`` value, ``%k`` key, ``%p`` partition, ``%o`` offset,
``%T`` timestamp (ms), ``%t`` queue, ``%h`` headers (``k=v,k=v``), ``%a`` attempt (consume),
``%S`` value size, ``%%`` a percent sign; ``\\n``, ``\\t``, ``\\r`` and ``\\\\`` are escapes. Values
and keys are written as their bytes, as kcat does::

    >>> RecordFormat("%p:%o %k=%s\\\\n").render(pb.Record(partition=1, offset=7, value=b"v"), "q")
    b'1:7 =v\\n'
"""

from __future__ import annotations

import base64
import re
from typing import Any

from fluxmq._pb.v1 import queue_pb2 as pb

TOKENS = "skpoTthaS%"
_TOKEN_RE = re.compile(r"%(.)|\\(.)", re.S)
_ESCAPES = {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\"}


def _text_or_base64(data: bytes) -> tuple[str, str]:
    """(the bytes as text, "utf-8") when they are UTF-8, else (base64, "base64")."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def json_line(record: pb.Record, queue: str = "", attempt: int = 0) -> dict[str, Any]:
    """One record as the object of a JSON line."""
    value, value_encoding = _text_or_base64(record.value)
    out: dict[str, Any] = {
        "queue": queue,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "value": value,
        "value_encoding": value_encoding,
    }
    if not queue:
        del out["queue"]
    if record.HasField("key"):
        out["key"], out["key_encoding"] = _text_or_base64(record.key)
    headers: dict[str, str] = {}
    encoded: list[str] = []
    for name, raw in sorted(record.headers.items()):
        headers[name], encoding = _text_or_base64(raw)
        if encoding == "base64":
            encoded.append(name)
    out["headers"] = headers
    if encoded:
        out["headers_base64"] = encoded
    if attempt:
        out["attempt"] = attempt
    return out


class FormatError(ValueError):
    """A ``--format`` string with a token kcat's set does not have."""


class RecordFormat:
    """A parsed ``--format`` string; ``render`` gives the bytes of one record."""

    def __init__(self, text: str) -> None:
        self.parts: list[bytes | str] = []  # literal bytes, or a token letter
        pos = 0
        for m in _TOKEN_RE.finditer(text):
            if m.start() > pos:
                self.parts.append(text[pos : m.start()].encode())
            token, escape = m.group(1), m.group(2)
            if token is not None:
                if token not in TOKENS:
                    raise FormatError(
                        f"%{token} is not a token (tokens: {', '.join('%' + t for t in TOKENS)})"
                    )
                self.parts.append(b"%" if token == "%" else token)
            else:
                self.parts.append(_ESCAPES.get(escape, ("\\" + escape).encode()))
            pos = m.end()
        if pos < len(text):
            self.parts.append(text[pos:].encode())

    def render(self, record: pb.Record, queue: str, attempt: int = 0) -> bytes:
        out = bytearray()
        for part in self.parts:
            if isinstance(part, bytes):
                out += part
            elif part == "s":
                out += record.value
            elif part == "k":
                out += record.key
            elif part == "p":
                out += str(record.partition).encode()
            elif part == "o":
                out += str(record.offset).encode()
            elif part == "T":
                out += str(record.timestamp_ms).encode()
            elif part == "t":
                out += queue.encode()
            elif part == "h":
                out += b",".join(k.encode() + b"=" + v for k, v in sorted(record.headers.items()))
            elif part == "a":
                out += str(attempt).encode()
            elif part == "S":
                out += str(len(record.value)).encode()
        return bytes(out)
