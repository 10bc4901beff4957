"""Human-friendly durations ("500ms", "30s", "2m", "12h", "7d") and sizes ("64KiB", "10MB")."""

from __future__ import annotations

import re

from fluxmq.core.errors import invalid_argument

_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_SIZE = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}  # fmt: skip
_DURATION_RE = re.compile(r"^\s*(\d{1,12})\s*(ms|s|m|h|d)\s*$")
_SIZE_RE = re.compile(r"^\s*(\d{1,15})\s*([kmgt]i?b|b)?\s*$", re.I)


def parse_duration_ms(text: str, field_path: str) -> int:
    """``"2m"`` -> 120000. A bare number is refused: the unit is part of the value.

    >>> parse_duration_ms("1500ms", "x")
    1500
    """
    m = _DURATION_RE.match(text)
    if not m:
        raise invalid_argument(
            field_path, f"{text!r} is not a duration: use a whole number with ms, s, m, h or d"
        )
    return int(m.group(1)) * _DURATION_MS[m.group(2)]


def parse_bytes(text: str, field_path: str) -> int:
    """``"10MiB"`` -> 10485760; ``"10MB"`` -> 10000000; ``"512"`` -> 512."""
    m = _SIZE_RE.match(text)
    if not m:
        raise invalid_argument(
            field_path,
            f"{text!r} is not a size: use a whole number with B, KB, MB, GB, KiB, MiB, GiB",
        )
    return int(m.group(1)) * _SIZE[(m.group(2) or "").lower()]
