"""Caller-supplied text made safe to write into a log line or to echo in an error: one line,
printable, bounded. A queue name such as ``"x\\n<forged audit line>"`` must not become two log
lines, and a 4 MiB name must not become 4 MiB of log or of error details."""

from __future__ import annotations

LOG_VALUE_CHARS_MAX = 200  # one caller-supplied value in a log line (a valid queue name fits)
LOG_MESSAGE_CHARS_MAX = 4096  # a whole log message, whatever its call site put in it
ELLIPSIS = "..."


def printable(value: object, max_chars: int = LOG_VALUE_CHARS_MAX) -> str:
    """``value`` as one line of printable text of at most about ``max_chars`` characters:
    control characters, line breaks and other unprintable characters escaped as Python writes
    them (``\\n``, ``\\x00``, ``\\u202e``), anything longer cut with the original length noted."""
    text = value if isinstance(value, str) else str(value)
    # Cut before escaping: escaping a 4 MiB value just to cut it would cost the 4 MiB.
    head = text[:max_chars]
    if not head.isprintable():
        head = "".join(c if c.isprintable() else _escape(c) for c in head)
    if len(text) <= max_chars and len(head) <= max_chars:
        return head
    return f"{head[:max_chars]}{ELLIPSIS}({len(text)} chars)"


def _escape(char: str) -> str:
    return repr(char)[1:-1]


def clip_utf8(text: str, max_bytes: int) -> str:
    """``text`` in at most about ``max_bytes`` UTF-8 bytes: when longer, its head and tail with
    the middle replaced by a note of how much was cut, so that a message that echoes a huge
    value keeps both its start and the rule stated after the value."""
    if len(text) * 4 <= max_bytes:  # fast path: no character takes more than 4 bytes
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return text
    keep = max(0, max_bytes - 40)
    head_bytes = keep * 2 // 3
    head = data[:head_bytes].decode("utf-8", "ignore")
    tail = data[len(data) - (keep - head_bytes) :].decode("utf-8", "ignore") if keep else ""
    return f"{head}{ELLIPSIS}({len(data)} bytes){ELLIPSIS}{tail}"
