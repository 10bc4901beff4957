"""Validation and normalisation of queue configuration (pure functions).

A config is validated once, at the edge, and stored normalised (defaults filled in), so that
apply on every replica sees the same, already-checked values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import limits
from fluxmq.core.errors import invalid_argument
from fluxmq.core.namespaces import STORED_QUEUE_NAME_RE
from fluxmq.core.units import parse_bytes, parse_duration_ms

MUTABLE_PATHS = frozenset(
    {
        "partitions",
        "retention",
        "retention.max_age",
        "retention.max_messages",
        "retention.max_bytes",
        "dedup_window",
        "max_message_bytes",
        "labels",
        "lease_timeout",
        "max_attempts",
        "retry_backoff",
        "retry_backoff.base",
        "retry_backoff.max",
        "message_ttl",
        "delivery_delay",
        "dead_letter_queue",
        "dead_letter_disabled",
        "retain_until_consumed",
        "dead_letter_alert_threshold",
        "replication",
        "replication.min_in_sync",
        "replication.ack_timeout",
    }
)
_ALL_MUTABLE = frozenset(p for p in MUTABLE_PATHS if "." not in p)


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """The numbers a stored config stands for, parsed once."""

    partitions: int
    max_age_ms: int  # 0 = unlimited
    max_messages: int  # 0 = unlimited
    max_bytes: int  # 0 = unlimited
    dedup_window_ms: int
    max_message_bytes: int
    lease_ms: int = 30_000
    max_attempts: int = 0  # 0 = unlimited
    backoff_base_ms: int = 1000
    backoff_max_ms: int = 300_000
    message_ttl_ms: int = 0  # 0 = none
    delivery_delay_ms: int = 0
    dead_letter_queue: str | None = None  # None: dead messages are dropped (and counted)
    retain_until_consumed: bool = False
    dead_letter_alert_threshold: int = 0
    replication_factor: int = 0  # 0 = every replica of the shard
    min_in_sync: int = 0  # 0 = a majority
    ack_timeout_ms: int = 10_000
    replication_async: bool = False

    def retry_delay_ms(self, attempt: int) -> int:
        """Backoff before the retry that follows delivery ``attempt`` (1-based).

        Example: base 1s, max 5m -> attempt 1: 1000, 2: 2000, 3: 4000, ... capped at 300000.
        """
        exponent = min(max(attempt - 1, 0), 40)
        return min(self.backoff_max_ms, self.backoff_base_ms << exponent)

    @property
    def has_retention(self) -> bool:
        return bool(self.max_age_ms or self.max_messages or self.max_bytes)


GROUP_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")


def validate_name(name: str, field_path: str = "name") -> None:
    """A queue name as stored: a caller's name, optionally under its environment's scope
    (``core.namespaces``); the edge checks what callers write."""
    if not STORED_QUEUE_NAME_RE.match(name):
        raise invalid_argument(
            field_path, f"{name!r} is not a queue name: 1..200 characters of A-Z a-z 0-9 . _ -"
        )


def policy_of(config: pb.QueueConfig, prefix: str = "config") -> QueuePolicy:
    """Parse and range-check every numeric field; raises FluxError(INVALID_ARGUMENT).

    Fields are checked in a fixed order (sizes and retention, delivery, dead letters,
    replication), so a config with several faults always names the same one first."""
    sizes = _sizes(config, prefix)
    delivery = _delivery(config, prefix)
    dlq = _dead_letter_queue(config, prefix)
    rep = config.replication
    return QueuePolicy(
        replication_factor=rep.factor,
        min_in_sync=rep.min_in_sync,
        ack_timeout_ms=_replication_ack_timeout_ms(rep, prefix),
        replication_async=rep.mode == pb.REPLICATION_MODE_ASYNC,
        lease_ms=delivery.lease_ms,
        max_attempts=config.max_attempts,
        backoff_base_ms=delivery.backoff_base_ms,
        backoff_max_ms=delivery.backoff_max_ms,
        message_ttl_ms=delivery.message_ttl_ms,
        delivery_delay_ms=delivery.delivery_delay_ms,
        dead_letter_queue=dlq,
        retain_until_consumed=config.retain_until_consumed,
        dead_letter_alert_threshold=config.dead_letter_alert_threshold,
        partitions=sizes.partitions,
        max_age_ms=sizes.max_age_ms,
        max_messages=config.retention.max_messages,
        max_bytes=sizes.max_bytes,
        dedup_window_ms=sizes.dedup_window_ms,
        max_message_bytes=sizes.max_message_bytes,
    )


class _Sizes(NamedTuple):
    partitions: int
    max_message_bytes: int
    dedup_window_ms: int
    max_age_ms: int
    max_bytes: int


def _sizes(config: pb.QueueConfig, prefix: str) -> _Sizes:
    r = config.retention
    max_age_ms = parse_duration_ms(r.max_age, f"{prefix}.retention.max_age") if r.max_age else 0
    max_bytes = parse_bytes(r.max_bytes, f"{prefix}.retention.max_bytes") if r.max_bytes else 0
    dedup_ms = parse_duration_ms(
        config.dedup_window or limits.DEDUP_WINDOW_DEFAULT, f"{prefix}.dedup_window"
    )
    if dedup_ms > limits.DEDUP_WINDOW_MS_MAX:
        raise invalid_argument(f"{prefix}.dedup_window", "at most 7d")
    partitions = config.partitions or 1
    if not 1 <= partitions <= limits.PARTITIONS_MAX:
        raise invalid_argument(f"{prefix}.partitions", f"must be 1..{limits.PARTITIONS_MAX}")
    max_message_bytes = config.max_message_bytes or limits.MESSAGE_BYTES_DEFAULT
    if max_message_bytes > limits.MESSAGE_BYTES_MAX:
        raise invalid_argument(f"{prefix}.max_message_bytes", f"at most {limits.MESSAGE_BYTES_MAX}")
    if r.max_age and max_age_ms == 0:
        raise invalid_argument(
            f"{prefix}.retention.max_age", "must be positive (empty = unlimited)"
        )
    if r.max_bytes and max_bytes == 0:
        raise invalid_argument(
            f"{prefix}.retention.max_bytes", "must be positive (empty = unlimited)"
        )
    return _Sizes(partitions, max_message_bytes, dedup_ms, max_age_ms, max_bytes)


class _Delivery(NamedTuple):
    lease_ms: int
    backoff_base_ms: int
    backoff_max_ms: int
    message_ttl_ms: int
    delivery_delay_ms: int


def _delivery(config: pb.QueueConfig, prefix: str) -> _Delivery:
    lease_ms = _duration(
        config.lease_timeout or limits.LEASE_TIMEOUT_DEFAULT,
        f"{prefix}.lease_timeout",
        limits.LEASE_MS_MIN,
        limits.LEASE_MS_MAX,
    )
    if config.max_attempts > limits.MAX_ATTEMPTS_MAX:
        raise invalid_argument(f"{prefix}.max_attempts", f"at most {limits.MAX_ATTEMPTS_MAX}")
    rb = config.retry_backoff
    base_ms = _duration(
        rb.base or limits.RETRY_BACKOFF_BASE_DEFAULT,
        f"{prefix}.retry_backoff.base",
        0,
        limits.DELAY_MS_MAX,
    )
    backoff_max_ms = _duration(
        rb.max or limits.RETRY_BACKOFF_MAX_DEFAULT,
        f"{prefix}.retry_backoff.max",
        0,
        limits.DELAY_MS_MAX,
    )
    if backoff_max_ms < base_ms:
        raise invalid_argument(f"{prefix}.retry_backoff.max", "must be >= retry_backoff.base")
    ttl_ms = (
        _duration(config.message_ttl, f"{prefix}.message_ttl", 1, limits.MESSAGE_TTL_MS_MAX)
        if config.message_ttl
        else 0
    )
    delay_ms = (
        _duration(config.delivery_delay, f"{prefix}.delivery_delay", 0, limits.DELAY_MS_MAX)
        if config.delivery_delay
        else 0
    )
    return _Delivery(lease_ms, base_ms, backoff_max_ms, ttl_ms, delay_ms)


def _dead_letter_queue(config: pb.QueueConfig, prefix: str) -> str | None:
    if config.dead_letter_disabled:
        return None
    dlq = config.dead_letter_queue or f"{config.name}.dlq"
    validate_name(dlq, f"{prefix}.dead_letter_queue")
    if dlq == config.name:
        raise invalid_argument(f"{prefix}.dead_letter_queue", "a queue cannot be its own DLQ")
    return dlq


def _replication_ack_timeout_ms(rep: pb.Replication, prefix: str) -> int:
    """Checks the replication settings; -> the ack timeout."""
    if rep.factor > limits.REPLICATION_FACTOR_MAX:
        raise invalid_argument(
            f"{prefix}.replication.factor", f"at most {limits.REPLICATION_FACTOR_MAX}"
        )
    if rep.factor and rep.min_in_sync > rep.factor:
        raise invalid_argument(
            f"{prefix}.replication.min_in_sync", "cannot exceed replication.factor"
        )
    if rep.min_in_sync > limits.REPLICATION_FACTOR_MAX:
        raise invalid_argument(
            f"{prefix}.replication.min_in_sync", f"at most {limits.REPLICATION_FACTOR_MAX}"
        )
    if rep.group and not GROUP_ID_RE.fullmatch(rep.group):
        raise invalid_argument(f"{prefix}.replication.group", "1-64 of A-Z a-z 0-9 . _ -")
    if rep.mode not in (
        pb.REPLICATION_MODE_UNSPECIFIED,
        pb.REPLICATION_MODE_SYNC,
        pb.REPLICATION_MODE_ASYNC,
    ):
        raise invalid_argument(f"{prefix}.replication.mode", f"unknown mode {rep.mode}")
    return _duration(
        rep.ack_timeout or limits.ACK_TIMEOUT_DEFAULT,
        f"{prefix}.replication.ack_timeout",
        limits.ACK_TIMEOUT_MS_MIN,
        limits.ACK_TIMEOUT_MS_MAX,
    )


def _duration(text: str, field_path: str, low_ms: int, high_ms: int) -> int:
    ms = parse_duration_ms(text, field_path)
    if not low_ms <= ms <= high_ms:
        raise invalid_argument(field_path, f"must be between {low_ms}ms and {high_ms}ms")
    return ms


def _validate_labels(labels: Iterable[tuple[str, str]], prefix: str) -> None:
    items = list(labels)
    if len(items) > limits.LABELS_MAX:
        raise invalid_argument(f"{prefix}.labels", f"at most {limits.LABELS_MAX} labels")
    for key, value in items:
        if not limits.LABEL_KEY_RE.match(key):
            raise invalid_argument(
                f"{prefix}.labels[{key}]", "label keys are 1..63 of A-Z a-z 0-9 . _ / -"
            )
        if len(value) > limits.LABEL_VALUE_CHARS_MAX:
            raise invalid_argument(
                f"{prefix}.labels[{key}]", "label values are at most 256 characters"
            )


def normalize_new(config: pb.QueueConfig, prefix: str = "config") -> pb.QueueConfig:
    """A validated copy of ``config`` with every default written out."""
    validate_name(config.name, f"{prefix}.name")
    if config.type not in (pb.QUEUE_TYPE_UNSPECIFIED, pb.QUEUE_TYPE_STREAM, pb.QUEUE_TYPE_WORK):
        raise invalid_argument(f"{prefix}.type", f"unknown queue type {config.type}")
    policy_of(config, prefix)
    _validate_labels(config.labels.items(), prefix)
    if config.environment not in ("", "development", "staging", "production"):
        raise invalid_argument(
            f"{prefix}.environment",
            "development, staging or production (the broker sets it from the API key)",
        )
    out = pb.QueueConfig()
    out.CopyFrom(config)
    out.partitions = config.partitions or 1
    out.type = config.type or pb.QUEUE_TYPE_STREAM
    out.dedup_window = config.dedup_window or limits.DEDUP_WINDOW_DEFAULT
    out.max_message_bytes = config.max_message_bytes or limits.MESSAGE_BYTES_DEFAULT
    out.lease_timeout = config.lease_timeout or limits.LEASE_TIMEOUT_DEFAULT
    out.retry_backoff.base = config.retry_backoff.base or limits.RETRY_BACKOFF_BASE_DEFAULT
    out.retry_backoff.max = config.retry_backoff.max or limits.RETRY_BACKOFF_MAX_DEFAULT
    out.replication.mode = config.replication.mode or pb.REPLICATION_MODE_SYNC
    out.replication.ack_timeout = config.replication.ack_timeout or limits.ACK_TIMEOUT_DEFAULT
    if config.dead_letter_disabled:
        out.dead_letter_queue = ""
    else:
        out.dead_letter_queue = config.dead_letter_queue or f"{config.name}.dlq"
    return out


def merge_update(
    current: pb.QueueConfig, patch: pb.QueueConfig, paths: list[str], prefix: str = "config"
) -> pb.QueueConfig:
    """Apply the fields of ``patch`` named by ``paths`` (all mutable fields when empty) to
    ``current``; validate the result. Partitions may grow, never shrink; the type never changes."""
    for path in paths:
        if path not in MUTABLE_PATHS:
            if path in ("name", "type"):
                raise invalid_argument(f"update_mask.paths[{path}]", f"{path} cannot be changed")
            raise invalid_argument(
                f"update_mask.paths[{path}]", f"unknown or immutable field {path!r}"
            )
    chosen = set(paths) if paths else set(_ALL_MUTABLE)
    if patch.environment not in ("", current.environment):
        raise invalid_argument(
            f"{prefix}.environment", "a queue cannot move to another environment"
        )
    if not paths and patch.type not in (pb.QUEUE_TYPE_UNSPECIFIED, current.type):
        raise invalid_argument(f"{prefix}.type", "the queue type cannot be changed")
    new = pb.QueueConfig()
    new.CopyFrom(current)
    if "partitions" in chosen and patch.partitions:
        if patch.partitions < current.partitions:
            raise invalid_argument(
                f"{prefix}.partitions",
                f"partitions can grow but never shrink (now {current.partitions})",
            )
        new.partitions = patch.partitions
    if "retention" in chosen:
        new.retention.CopyFrom(patch.retention)
    for sub in ("max_age", "max_messages", "max_bytes"):
        if f"retention.{sub}" in chosen:
            setattr(new.retention, sub, getattr(patch.retention, sub))
    if "dedup_window" in chosen:
        new.dedup_window = patch.dedup_window or limits.DEDUP_WINDOW_DEFAULT
    if "max_message_bytes" in chosen:
        new.max_message_bytes = patch.max_message_bytes or limits.MESSAGE_BYTES_DEFAULT
    if "labels" in chosen:
        new.labels.clear()
        new.labels.update(patch.labels)
    for name in (
        "lease_timeout",
        "max_attempts",
        "message_ttl",
        "delivery_delay",
        "dead_letter_queue",
        "dead_letter_disabled",
        "retain_until_consumed",
        "dead_letter_alert_threshold",
    ):
        if name in chosen:
            setattr(new, name, getattr(patch, name))
    if "replication" in chosen:
        if patch.replication.factor not in (0, current.replication.factor):
            raise invalid_argument(
                f"{prefix}.replication.factor", "the replication factor cannot be changed"
            )
        if patch.replication.group not in ("", current.replication.group):
            raise invalid_argument(
                f"{prefix}.replication.group", "a queue cannot move to another group"
            )
        factor = current.replication.factor
        new.replication.CopyFrom(patch.replication)
        new.replication.factor = factor
        new.replication.group = current.replication.group
    for sub in ("min_in_sync", "ack_timeout"):
        if f"replication.{sub}" in chosen:
            setattr(new.replication, sub, getattr(patch.replication, sub))
    if "retry_backoff" in chosen:
        new.retry_backoff.CopyFrom(patch.retry_backoff)
    for sub in ("base", "max"):
        if f"retry_backoff.{sub}" in chosen:
            setattr(new.retry_backoff, sub, getattr(patch.retry_backoff, sub))
    return normalize_new(new, prefix)


def labels_match(labels: Mapping[str, str], selector: list[tuple[str, str]]) -> bool:
    return all(labels.get(k) == v for k, v in selector)


def parse_label_selector(text: str, field_path: str = "label_selector") -> list[tuple[str, str]]:
    """``"team=payments,env=prod"`` -> [("team", "payments"), ("env", "prod")]."""
    terms: list[tuple[str, str]] = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = raw.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not limits.LABEL_KEY_RE.match(key):
            raise invalid_argument(field_path, f"{raw!r} is not a key=value term")
        terms.append((key, value))
    return terms
