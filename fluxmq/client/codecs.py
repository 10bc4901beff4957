"""Value codecs: what ``publish`` turns a value into and what a consumer's ``msg.data`` is.

- ``"bytes"``: bytes-like values as they are; ``data`` is the raw bytes;
- ``"str"``: UTF-8 text;
- ``"json"``: ``json.dumps`` (compact, UTF-8) / ``json.loads``;
- ``"auto"`` (the client's default): bytes-like as they are, ``str`` as UTF-8, anything else
  as JSON; decoding gives the raw bytes.

Any object with ``encode(value) -> bytes`` and ``decode(bytes) -> value`` works as a codec.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Codec(Protocol):
    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


def _as_bytes(value: Any) -> bytes | None:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return None


class BytesCodec:
    name = "bytes"

    def encode(self, value: Any) -> bytes:
        raw = _as_bytes(value)
        if raw is None:
            raise TypeError(f"the bytes codec takes bytes, not {type(value).__name__}")
        return raw

    def decode(self, data: bytes) -> bytes:
        return data


class StrCodec:
    name = "str"

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise TypeError(f"the str codec takes str, not {type(value).__name__}")
        return value.encode()

    def decode(self, data: bytes) -> str:
        return data.decode()


class JsonCodec:
    name = "json"

    def encode(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()

    def decode(self, data: bytes) -> Any:
        return json.loads(data)


class AutoCodec:
    name = "auto"

    def encode(self, value: Any) -> bytes:
        raw = _as_bytes(value)
        if raw is not None:
            return raw
        if isinstance(value, str):
            return value.encode()
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()

    def decode(self, data: bytes) -> bytes:
        return data


CODECS: dict[str, Codec] = {
    "bytes": BytesCodec(),
    "str": StrCodec(),
    "json": JsonCodec(),
    "auto": AutoCodec(),
}


def get_codec(codec: str | Codec) -> Codec:
    """A codec by name (``bytes``, ``str``, ``json``, ``auto``) or the object itself."""
    if isinstance(codec, str):
        try:
            return CODECS[codec]
        except KeyError:
            raise ValueError(f"unknown codec {codec!r}; use one of {sorted(CODECS)}") from None
    if not isinstance(codec, Codec):
        raise TypeError("a codec needs encode(value) -> bytes and decode(bytes)")
    return codec


def to_bytes(
    value: str | bytes | bytearray | memoryview,
    what: str = "a key or header",
    name: str | None = None,
) -> bytes:
    """Keys and header values: str as UTF-8, bytes-like as they are; ``what`` (and ``name``, a
    header's) name the argument in the TypeError of any other type, formatted only then."""
    if isinstance(value, str):
        return value.encode()
    raw = _as_bytes(value)
    if raw is None:
        named = what if name is None else f"{what} {name!r}"
        raise TypeError(f"{named} must be str or bytes, not {type(value).__name__}")
    return raw


def encode_each(codec: Codec, values: list[Any]) -> list[bytes]:
    """``codec.encode`` of each of ``values``; values that are all ``bytes`` pass as they are
    through the codecs that keep bytes unchanged (no call per value: a batch of 1000)."""
    if isinstance(codec, AutoCodec | BytesCodec) and set(map(type, values)) <= {bytes}:
        return list(values)
    return list(map(codec.encode, values))
