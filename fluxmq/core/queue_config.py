"""Validation and normalisation of queue configuration (pure functions).

A config is validated once, at the edge, and stored normalised (defaults filled in), so that
apply on every replica sees the same, already-checked values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import limits
from fluxmq.core.errors import invalid_argument
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
    }
)


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """The numbers a stored config stands for, parsed once."""

    partitions: int
    max_age_ms: int  # 0 = unlimited
    max_messages: int  # 0 = unlimited
    max_bytes: int  # 0 = unlimited
    dedup_window_ms: int
    max_message_bytes: int

    @property
    def has_retention(self) -> bool:
        return bool(self.max_age_ms or self.max_messages or self.max_bytes)


def validate_name(name: str, field_path: str = "name") -> None:
    if not limits.QUEUE_NAME_RE.match(name):
        raise invalid_argument(
            field_path, f"{name!r} is not a queue name: 1..200 characters of A-Z a-z 0-9 . _ -"
        )


def policy_of(config: pb.QueueConfig, prefix: str = "config") -> QueuePolicy:
    """Parse and range-check every numeric field; raises FluxError(INVALID_ARGUMENT)."""
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
    return QueuePolicy(
        partitions=partitions,
        max_age_ms=max_age_ms,
        max_messages=r.max_messages,
        max_bytes=max_bytes,
        dedup_window_ms=dedup_ms,
        max_message_bytes=max_message_bytes,
    )


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
    out = pb.QueueConfig()
    out.CopyFrom(config)
    out.partitions = config.partitions or 1
    out.type = config.type or pb.QUEUE_TYPE_STREAM
    out.dedup_window = config.dedup_window or limits.DEDUP_WINDOW_DEFAULT
    out.max_message_bytes = config.max_message_bytes or limits.MESSAGE_BYTES_DEFAULT
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
    chosen = (
        set(paths)
        if paths
        else {"partitions", "retention", "dedup_window", "max_message_bytes", "labels"}
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
