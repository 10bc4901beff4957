"""Checks of request parameters (pure). Every refusal names the offending field."""

from __future__ import annotations

from fluxmq._pb.v1 import queue_pb2 as pb
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


def group_name(name: str, field_path: str = "group") -> str:
    if not limits.QUEUE_NAME_RE.match(name):
        raise invalid_argument(
            field_path, f"{name!r} is not a group name: 1..200 characters of A-Z a-z 0-9 . _ -"
        )
    return name


def consumer_id(value: str, field_path: str = "consumer_id") -> str:
    if not value or len(value) > limits.CONSUMER_ID_CHARS_MAX:
        raise invalid_argument(field_path, f"1..{limits.CONSUMER_ID_CHARS_MAX} characters")
    return value


def lease_ms(value: int, default_ms: int, field_path: str = "lease_ms") -> int:
    """0 means the queue's lease_timeout."""
    if value == 0:
        return default_ms
    if not limits.LEASE_MS_MIN <= value <= limits.LEASE_MS_MAX:
        raise invalid_argument(
            field_path, f"must be {limits.LEASE_MS_MIN}..{limits.LEASE_MS_MAX} ms (got {value})"
        )
    return value


def lease_batch(value: int, field_path: str = "max_messages", default: int = 1) -> int:
    value = value or default
    if value > limits.LEASE_MESSAGES_MAX:
        raise invalid_argument(
            field_path, f"at most {limits.LEASE_MESSAGES_MAX} per request (got {value})"
        )
    return value


def wait_ms(value: int, field_path: str = "wait_ms") -> int:
    if value > limits.WAIT_MS_MAX:
        raise invalid_argument(field_path, f"at most {limits.WAIT_MS_MAX}")
    return value


def max_in_flight(value: int, field_path: str = "max_in_flight") -> int:
    value = value or 100
    if value > limits.IN_FLIGHT_MAX:
        raise invalid_argument(field_path, f"at most {limits.IN_FLIGHT_MAX}")
    return value


def receipts_count(count: int, field_path: str = "receipts") -> None:
    if not 1 <= count <= limits.RECEIPTS_MAX:
        raise invalid_argument(field_path, f"1..{limits.RECEIPTS_MAX} receipts (got {count})")


def retry_delay_ms(value: int, field_path: str) -> int:
    if value > limits.DELAY_MS_MAX:
        raise invalid_argument(field_path, "at most 7 days")
    return value


def group_filter(f: pb.GroupFilter, field_path: str = "filter") -> None:
    if len(f.header_equals) > limits.FILTER_TERMS_MAX:
        raise invalid_argument(
            f"{field_path}.header_equals", f"at most {limits.FILTER_TERMS_MAX} terms"
        )
    for name in f.header_equals:
        if not name or len(name) > limits.HEADER_NAME_CHARS_MAX:
            raise invalid_argument(f"{field_path}.header_equals", "header names are 1..256 chars")
    if f.HasField("key_prefix") and len(f.key_prefix) > limits.MESSAGE_KEY_BYTES_MAX:
        raise invalid_argument(f"{field_path}.key_prefix", "at most 16 KiB")


def start_position(start: pb.StartPosition, field_path: str = "start") -> None:
    if start.WhichOneof("position") == "timestamp_ms" and start.timestamp_ms < 0:
        raise invalid_argument(f"{field_path}.timestamp_ms", "must be >= 0")
