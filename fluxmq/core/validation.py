"""Checks of client input that need no state beyond a queue's policy (pure).

Every refusal names the offending field (``messages[3].value``) so that a client can tell what to
fix; nothing is written for a refused request.
"""

from __future__ import annotations

from collections.abc import Sequence

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import limits
from fluxmq.core.errors import invalid_argument, message_too_large
from fluxmq.core.queue_config import QueuePolicy


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


def publish_messages(messages: Sequence[pb.PublishMessage], policy: QueuePolicy) -> int:
    """Validate a publish batch; returns its payload bytes."""
    count = len(messages)
    if count == 0:
        raise invalid_argument("messages", "a publish carries 1..1000 messages; got none")
    if count > limits.PUBLISH_MESSAGES_MAX:
        raise invalid_argument(
            "messages", f"a publish carries 1..{limits.PUBLISH_MESSAGES_MAX} messages; got {count}"
        )
    limit = policy.max_message_bytes
    total = 0
    for i, msg in enumerate(messages):
        size = len(msg.value)
        if msg.HasField("key"):
            if len(msg.key) > limits.MESSAGE_KEY_BYTES_MAX:
                raise message_too_large(
                    f"messages[{i}].key", len(msg.key), limits.MESSAGE_KEY_BYTES_MAX
                )
            size += len(msg.key)
        headers = msg.headers
        if headers:
            if len(headers) > limits.MESSAGE_HEADERS_MAX:
                raise invalid_argument(
                    f"messages[{i}].headers", f"at most {limits.MESSAGE_HEADERS_MAX} headers"
                )
            for name, value in headers.items():
                if not name or len(name) > limits.HEADER_NAME_CHARS_MAX:
                    raise invalid_argument(
                        f"messages[{i}].headers", "header names are 1..256 characters"
                    )
                size += len(name) + len(value)
        if size > limit:
            raise message_too_large(f"messages[{i}].value", size, limit)
        idem = msg.idempotency_key
        if idem and len(idem.encode()) > limits.IDEMPOTENCY_KEY_BYTES_MAX:
            raise invalid_argument(f"messages[{i}].idempotency_key", "at most 256 bytes")
        total += size
    return total


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
