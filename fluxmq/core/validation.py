"""Checks of request parameters (pure). Every refusal names the offending field."""

from __future__ import annotations

from fluxmq.core import limits
from fluxmq.core.errors import invalid_argument


def request_timeout_ms(value: int, field_path: str = "request_timeout_ms") -> int:
    """0 means the default; otherwise the value must lie in the documented range."""
    if value == 0:
        return limits.REQUEST_TIMEOUT_MS_DEFAULT
    if not limits.REQUEST_TIMEOUT_MS_MIN <= value <= limits.REQUEST_TIMEOUT_MS_MAX:
        raise invalid_argument(
            field_path,
            f"must be {limits.REQUEST_TIMEOUT_MS_MIN}..{limits.REQUEST_TIMEOUT_MS_MAX} ms"
            f" (got {value})",
        )
    return value


def fetch_limits(max_messages: int, max_bytes: int, wait_ms: int) -> tuple[int, int, int]:
    max_messages = max_messages or limits.FETCH_MESSAGES_DEFAULT
    if max_messages > limits.FETCH_MESSAGES_MAX:
        raise invalid_argument("max_messages", f"at most {limits.FETCH_MESSAGES_MAX}")
    max_bytes = max_bytes or limits.FETCH_BYTES_DEFAULT
    if max_bytes > limits.FETCH_BYTES_MAX:
        raise invalid_argument("max_bytes", f"at most {limits.FETCH_BYTES_MAX}")
    if wait_ms > limits.WAIT_MS_MAX:
        raise invalid_argument("wait_ms", f"at most {limits.WAIT_MS_MAX}")
    return max_messages, max_bytes, wait_ms


def list_limit(limit: int) -> int:
    limit = limit or limits.LIST_LIMIT_DEFAULT
    if limit > limits.LIST_LIMIT_MAX:
        raise invalid_argument("limit", f"at most {limits.LIST_LIMIT_MAX}")
    return limit
