"""Domain errors. Each carries a stable ``reason`` (the ErrorInfo reason on the wire), whether a
retry can help, and for bad input the offending fields. The gRPC edge maps reasons to status
codes in one table (fluxmq/server/errors.py); nothing here knows about gRPC."""

from __future__ import annotations

from dataclasses import dataclass, field

from fluxmq.core.text import clip_utf8

# What an error may echo of its input: a 1 MiB queue name must not come back as a 1 MiB message
# (nor as metadata and field violations that repeat it), which would also exceed the 8 KiB of
# trailing metadata a default gRPC client accepts. A valid name (200 characters) fits whole.
MESSAGE_BYTES_MAX = 1024
DETAIL_BYTES_MAX = 256  # each ErrorInfo metadata value, violation field and description


@dataclass(frozen=True, slots=True)
class FieldViolation:
    field: str
    description: str


@dataclass(eq=False)
class FluxError(Exception):
    reason: str
    message: str
    retriable: bool = False
    violations: tuple[FieldViolation, ...] = ()
    retry_after_ms: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Bounded where every error is made: the status on the wire, a stream's error response
        # and a log line quoting the error all see the clipped text.
        self.message = clip_utf8(self.message, MESSAGE_BYTES_MAX)
        if any(len(v) > DETAIL_BYTES_MAX // 4 for v in self.metadata.values()):
            self.metadata = {k: clip_utf8(v, DETAIL_BYTES_MAX) for k, v in self.metadata.items()}
        if self.violations:
            self.violations = tuple(_clipped(v) for v in self.violations)
        Exception.__init__(self, f"{self.reason}: {self.message}")

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


def _clipped(v: FieldViolation) -> FieldViolation:
    field_path = clip_utf8(v.field, DETAIL_BYTES_MAX)
    description = clip_utf8(v.description, DETAIL_BYTES_MAX)
    if field_path is v.field and description is v.description:
        return v
    return FieldViolation(field_path, description)


def invalid_argument(field_path: str, description: str) -> FluxError:
    return FluxError(
        "INVALID_ARGUMENT",
        f"{field_path}: {description}",
        violations=(FieldViolation(field_path, description),),
        metadata={"field": field_path},
    )


def nested(prefix: str, err: FluxError) -> FluxError:
    """``err``, raised while checking the part of a request at ``prefix`` (``publishes[1]``),
    with every field path it names completed (``publishes[1].messages[0].value``): in its
    violations (BadRequest), its ``field`` metadata (ErrorInfo) and its text, so that the three
    agree and a client can find the offending field of a nested request. An error that names no
    field (a missing queue, a lost leadership) is returned as it is."""
    field_path = err.metadata.get("field") or (err.violations[0].field if err.violations else "")
    if not field_path:
        return err
    full = f"{prefix}.{field_path}"
    if err.message.startswith(field_path):
        message = full + err.message[len(field_path) :]
    else:
        message = f"{full}: {err.message}"
    metadata = dict(err.metadata)
    if "field" in metadata:
        metadata["field"] = full
    return FluxError(
        err.reason,
        message,
        retriable=err.retriable,
        violations=tuple(
            FieldViolation(f"{prefix}.{v.field}", v.description) for v in err.violations
        ),
        retry_after_ms=err.retry_after_ms,
        metadata=metadata,
    )


def queue_not_found(name: str) -> FluxError:
    return FluxError("QUEUE_NOT_FOUND", f"queue {name!r} does not exist", metadata={"queue": name})


def queue_exists(name: str) -> FluxError:
    return FluxError("QUEUE_EXISTS", f"queue {name!r} already exists", metadata={"queue": name})


def partition_out_of_range(
    name: str, partition: int, partitions: int, field_path: str
) -> FluxError:
    return FluxError(
        "PARTITION_OUT_OF_RANGE",
        f"queue {name!r} has partitions 0..{partitions - 1}; got {partition}",
        violations=(FieldViolation(field_path, f"must be < {partitions}"),),
        metadata={"queue": name, "field": field_path},
    )


def offset_out_of_range(name: str, partition: int, offset: int, low: int, high: int) -> FluxError:
    return FluxError(
        "OFFSET_OUT_OF_RANGE",
        f"offset {offset} of {name!r}/{partition} is outside [{low}, {high}]"
        + (" (removed by retention or purge)" if offset < low else ""),
        metadata={"queue": name, "low_watermark": str(low), "high_watermark": str(high)},
    )


def message_too_large(field_path: str, size: int, limit: int) -> FluxError:
    return FluxError(
        "MESSAGE_TOO_LARGE",
        f"{field_path} is {size} bytes; the queue allows {limit}",
        violations=(FieldViolation(field_path, f"at most {limit} bytes"),),
        metadata={"field": field_path, "limit_bytes": str(limit)},
    )


def failed_precondition(reason: str, message: str) -> FluxError:
    return FluxError(reason, message)
