"""Errors of the FluxMQ SDK: every failed call raises a :class:`FluxMQError` built from the gRPC
status and the ``google.rpc.Status`` details the broker attaches (``ErrorInfo`` reason and
metadata, ``BadRequest`` field violations, ``RetryInfo``), plus the ``x-request-id`` trailer.

Subclasses group the reasons an application usually handles on its own
(``except QueueNotFound:``); anything else is a plain :class:`FluxMQError` with ``code`` and
``reason`` set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

DOMAIN = "fluxmq"
REQUEST_ID_KEY = "x-request-id"


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One bad field of a request (``messages[3].value``) and why."""

    field: str
    description: str


class FluxMQError(Exception):
    """A call failed.

    - ``code``: the gRPC status code;
    - ``reason``: the broker's ``ErrorInfo`` reason (``QUEUE_NOT_FOUND``...); for a failure of
      the connection itself (no broker answered) it is the code's name, e.g. ``UNAVAILABLE``;
    - ``message``: the human explanation;
    - ``retriable``: the broker said a retry can succeed (``ErrorInfo`` metadata
      ``retriable=true``, or RESOURCE_EXHAUSTED with a ``RetryInfo``: RATE_LIMITED), or the
      node could not be reached (UNAVAILABLE without a status);
    - ``retry_after_ms``: the broker's ``RetryInfo`` delay, if any (``retry_after``: the same in
      seconds);
    - ``field_violations``: the offending fields of a bad request;
    - ``request_id``: the ``x-request-id`` of the call (quote it when reporting a problem);
    - ``metadata``: the ``ErrorInfo`` metadata (e.g. ``leader`` for NOT_LEADER);
    - ``from_broker``: whether a FluxMQ broker produced the status (False: the channel failed,
      or the client's own deadline passed).
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        retriable: bool = False,
        retry_after_ms: int | None = None,
        field_violations: tuple[FieldViolation, ...] = (),
        request_id: str = "",
        metadata: dict[str, str] | None = None,
        from_broker: bool = False,
    ) -> None:
        self.code = code
        self.message = message
        self.reason = reason or code.name
        self.retriable = retriable
        self.retry_after_ms = retry_after_ms
        self.field_violations = field_violations
        self.request_id = request_id
        self.metadata = dict(metadata or {})
        self.from_broker = from_broker
        super().__init__(str(self))

    @property
    def retry_after(self) -> float | None:
        """The broker's RetryInfo delay in seconds (None without one)."""
        return None if self.retry_after_ms is None else self.retry_after_ms / 1000

    def __str__(self) -> str:
        text = f"{self.reason}: {self.message}"
        # The broker often says a violation in its message already: said once, not twice.
        untold = [v for v in self.field_violations if v.description not in self.message]
        if untold:
            text += " (" + "; ".join(f"{v.field}: {v.description}" for v in untold) + ")"
        if self.request_id:
            text += f" [request id {self.request_id}]"
        return text

    def __reduce__(self) -> tuple[Any, ...]:  # picklable despite keyword-only arguments
        return (_rebuild, (type(self), self.code, self.message, self.__dict__))


def _rebuild(
    cls: type[FluxMQError], code: grpc.StatusCode, message: str, state: dict[str, Any]
) -> FluxMQError:
    err = cls(code, message)
    err.__dict__.update(state)
    return err


class NotFound(FluxMQError):
    """NOT_FOUND: a queue, group, shard or replication group does not exist."""


class QueueNotFound(NotFound):
    pass


class GroupNotFound(NotFound):
    pass


class AlreadyExists(FluxMQError):
    """ALREADY_EXISTS: a queue or group of that name exists."""


class QueueExists(AlreadyExists):
    pass


class GroupExists(AlreadyExists):
    pass


class InvalidArgument(FluxMQError):
    """INVALID_ARGUMENT: a bad request; ``field_violations`` names the fields."""


class MessageTooLarge(InvalidArgument):
    pass


class StaleGeneration(FluxMQError):
    """ABORTED / STALE_GENERATION: a consumer-group member acted on an assignment it no longer
    holds; heartbeat (or join again) and retry."""


class Unauthenticated(FluxMQError):
    """UNAUTHENTICATED: no API key, or one the broker does not know (or revoked)."""


class PermissionDenied(FluxMQError):
    """PERMISSION_DENIED: the key's role (or environment) does not allow the call."""


class RateLimited(FluxMQError):
    """RESOURCE_EXHAUSTED / RATE_LIMITED: the key is over its rate; ``retry_after`` says when
    to come back (the SDK has already waited and retried within its retry policy)."""


class Unavailable(FluxMQError):
    """UNAVAILABLE: the node is down, shutting down, not the leader, or a replication group has
    no quorum; usually retriable."""


class DeadlineExceeded(FluxMQError):
    """DEADLINE_EXCEEDED: the client's deadline passed, or the broker's ``request_timeout_ms``
    (REQUEST_TIMEOUT: nothing was written)."""


_BY_REASON: dict[str, type[FluxMQError]] = {
    "QUEUE_NOT_FOUND": QueueNotFound,
    "GROUP_NOT_FOUND": GroupNotFound,
    "QUEUE_EXISTS": QueueExists,
    "GROUP_EXISTS": GroupExists,
    "MESSAGE_TOO_LARGE": MessageTooLarge,
    "STALE_GENERATION": StaleGeneration,
    "RATE_LIMITED": RateLimited,
}
_BY_CODE: dict[grpc.StatusCode, type[FluxMQError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
}


_CODES: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}


def error_class(code: grpc.StatusCode, reason: str) -> type[FluxMQError]:
    return _BY_REASON.get(reason) or _BY_CODE.get(code) or FluxMQError


def from_rpc_error(err: grpc.RpcError) -> FluxMQError:
    """The FluxMQError of a failed call (sync or ``grpc.aio``)."""
    code: grpc.StatusCode = err.code()
    message = err.details() or ""
    trailers = err.trailing_metadata() or ()
    request_id = ""
    for key, value in trailers:
        if key == REQUEST_ID_KEY:
            request_id = value if isinstance(value, str) else value.decode()
    try:
        status = rpc_status.from_call(err)
    except ValueError:  # a status whose code or message disagrees with the call's
        status = None
    return from_status(code, message, status, request_id)


def from_request_error(error: Any, field_prefix: str = "") -> FluxMQError:
    """The FluxMQError of one failed request of a stream (a ``RequestError``: its code and the
    serialized google.rpc.Status with the same details as a unary error). ``field_prefix``
    (e.g. ``"publish."``, where the stream's request wraps the unary one) is taken off the
    fields named, so a refusal names the same field whichever way the request went."""
    code = _CODES.get(error.code, grpc.StatusCode.UNKNOWN)
    status = None
    if error.status_details:
        status = status_pb2.Status()
        try:
            status.ParseFromString(error.status_details)
        except Exception:  # a malformed status: the code and message still say what failed
            status = None
    err = from_status(code, error.message, status, "")
    if field_prefix and err.field_violations:
        err.field_violations = tuple(
            FieldViolation(v.field.removeprefix(field_prefix), v.description)
            for v in err.field_violations
        )
        err.args = (str(err),)
    return err


def from_status(code: grpc.StatusCode, message: str, status: Any, request_id: str) -> FluxMQError:
    """A FluxMQError from a status code and, when the broker sent one, its google.rpc.Status
    (ErrorInfo: reason, retriable, metadata; BadRequest: the fields; RetryInfo: the delay)."""
    reason = ""
    retriable = False
    retry_after_ms: int | None = None
    violations: list[FieldViolation] = []
    metadata: dict[str, str] = {}
    from_broker = False
    if status is not None:
        message = status.message or message
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if info.domain == DOMAIN:
                    from_broker = True
                reason = info.reason
                metadata = dict(info.metadata)
                retriable = metadata.get("retriable") == "true"
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations.extend(
                    FieldViolation(v.field, v.description) for v in bad.field_violations
                )
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                retry_after_ms = retry.retry_delay.ToMilliseconds()
    elif code == grpc.StatusCode.UNAVAILABLE:
        retriable = True  # nobody answered: the node is down or unreachable
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and retry_after_ms is not None:
        retriable = True  # turned away for now (RATE_LIMITED...): come back after the delay
    if not request_id:
        request_id = metadata.get("request_id", "")
    cls = error_class(code, reason)
    return cls(
        code,
        message,
        reason=reason,
        retriable=retriable,
        retry_after_ms=retry_after_ms,
        field_violations=tuple(violations),
        request_id=request_id,
        metadata=metadata,
        from_broker=from_broker,
    )
