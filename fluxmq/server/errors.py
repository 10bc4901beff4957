"""The one table that maps domain errors to gRPC status codes, and the rich status on the wire:
google.rpc.Status with ErrorInfo (domain "fluxmq", reason, metadata incl. "retriable"),
BadRequest field violations, RetryInfo when a retry can help; the request id travels in the
trailing metadata ``x-request-id``."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from fluxmq.core.errors import FluxError, invalid_argument
from fluxmq.metadata.metadata import InvalidArgument as MetadataInvalidArgument
from raft import (
    NotLeaderError,
    OutcomeUnknownError,
    ProposalTimeoutError,
    ShardBusyError,
    ShardClosedError,
    ShardRequestDeniedError,
)
from storage import CorruptRecordError, StorageBusyError, StorageFullError
from storage.record_batch import CorruptBatchError

DOMAIN = "fluxmq"

STATUS_BY_REASON: dict[str, grpc.StatusCode] = {
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    # A request body that is not the method's message (bytes that do not parse).
    "MALFORMED_REQUEST": grpc.StatusCode.INVALID_ARGUMENT,
    "MESSAGE_TOO_LARGE": grpc.StatusCode.INVALID_ARGUMENT,
    "PARTITION_OUT_OF_RANGE": grpc.StatusCode.INVALID_ARGUMENT,
    # Producer sessions (core/producers.py): a gap in a partition's sequence (an earlier request
    # is not stored yet: retriable); a session the queue does not know (never started, expired);
    # an epoch superseded by a newer InitProducer of the same name; a name out of epochs.
    "OUT_OF_ORDER_SEQUENCE": grpc.StatusCode.FAILED_PRECONDITION,
    "UNKNOWN_PRODUCER": grpc.StatusCode.FAILED_PRECONDITION,
    "PRODUCER_FENCED": grpc.StatusCode.FAILED_PRECONDITION,
    "PRODUCER_EPOCH_EXHAUSTED": grpc.StatusCode.FAILED_PRECONDITION,
    "QUEUE_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "QUEUE_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
    "QUEUE_LIMIT": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "OFFSET_OUT_OF_RANGE": grpc.StatusCode.OUT_OF_RANGE,
    "CONCURRENT_UPDATE": grpc.StatusCode.ABORTED,
    "GROUP_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "GROUP_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
    "GROUP_LIMIT": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "CHECKOUT_LIMIT": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "RECEIPT_MISMATCH": grpc.StatusCode.INVALID_ARGUMENT,
    "CONSUMER_BUSY": grpc.StatusCode.FAILED_PRECONDITION,
    "NO_DEAD_LETTER_QUEUE": grpc.StatusCode.FAILED_PRECONDITION,
    # A queue named as a DLQ that holds messages or has a DLQ of its own; a DLQ given a DLQ.
    "DEAD_LETTER_QUEUE_CONFLICT": grpc.StatusCode.FAILED_PRECONDITION,
    "NOT_A_STREAM_QUEUE": grpc.StatusCode.FAILED_PRECONDITION,
    "LEASE_NOT_HELD": grpc.StatusCode.FAILED_PRECONDITION,
    "NOT_LEADER": grpc.StatusCode.UNAVAILABLE,
    # Membership: a request from an assignment the member no longer holds; heartbeat or join
    # again, then retry (ABORTED: a concurrency conflict the client resolves, not a bad request).
    "STALE_GENERATION": grpc.StatusCode.ABORTED,
    "METADATA_UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "GROUP_UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "REPLICATION_GROUP_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "TRANSACTION_SPANS_GROUPS": grpc.StatusCode.FAILED_PRECONDITION,
    "MEMBER_REQUIRED": grpc.StatusCode.FAILED_PRECONDITION,
    "GROUP_FULL": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "SHARD_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "NODE_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "MOVE_REFUSED": grpc.StatusCode.FAILED_PRECONDITION,
    "NEEDS_METADATA_STORE": grpc.StatusCode.FAILED_PRECONDITION,
    "REQUEST_DENIED": grpc.StatusCode.FAILED_PRECONDITION,
    "OUTCOME_UNKNOWN": grpc.StatusCode.UNAVAILABLE,
    "REPLICATION_TIMEOUT": grpc.StatusCode.UNAVAILABLE,
    "NOT_ENOUGH_REPLICAS": grpc.StatusCode.UNAVAILABLE,
    "REPLICATION_UNSATISFIABLE": grpc.StatusCode.FAILED_PRECONDITION,
    "SHARD_BUSY": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "SHUTTING_DOWN": grpc.StatusCode.UNAVAILABLE,
    # SIGTERM: the node ends its waiting calls (long polls, Consume, Tail) so that clients move
    # to another node at once; retriable there, not here.
    "NODE_SHUTTING_DOWN": grpc.StatusCode.UNAVAILABLE,
    "REQUEST_TIMEOUT": grpc.StatusCode.DEADLINE_EXCEEDED,
    "STORAGE_FULL": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "DATA_CORRUPTED": grpc.StatusCode.DATA_LOSS,
    "INTERNAL": grpc.StatusCode.INTERNAL,
    # Security: a missing, malformed, unknown or revoked key; a role or environment violation;
    # a key over its rate (RetryInfo says when to come back); a third active key per role.
    # A cluster setting in etcd the operator wrote in a form the node cannot use (names the key).
    "INVALID_CLUSTER_SETTING": grpc.StatusCode.FAILED_PRECONDITION,
    # Resource bounds of a node: concurrent streams (streams_max), LMDB readers (retriable).
    "TOO_MANY_STREAMS": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "STORAGE_BUSY": grpc.StatusCode.RESOURCE_EXHAUSTED,
    # gRPC refused a message between two nodes over a size limit (not retriable).
    "SIZE_LIMIT_EXCEEDED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    # A state digest asked for while one is computed or too soon after (RetryInfo says when).
    "DIGEST_BUSY": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "INVALID_API_KEY": grpc.StatusCode.UNAUTHENTICATED,
    "PERMISSION_DENIED": grpc.StatusCode.PERMISSION_DENIED,
    "RATE_LIMITED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    # The node's in-flight byte budget (inflight_bytes_max) is spent (RetryInfo says when).
    "NODE_BUSY": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "KEY_LIMIT_REACHED": grpc.StatusCode.FAILED_PRECONDITION,
    "API_KEY_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
}


def domain_error(exc: BaseException) -> FluxError | None:
    """The FluxError an exception of a lower layer stands for (None: not ours, a bug)."""
    if isinstance(exc, FluxError):
        return exc
    if isinstance(exc, MetadataInvalidArgument):
        # The edge checks names before any lookup; this answers for a path it does not cover.
        return invalid_argument(exc.what, exc.detail)
    if isinstance(exc, NotLeaderError):
        return FluxError(
            "NOT_LEADER", str(exc), retriable=True, metadata={"leader": exc.leader or ""}
        )
    if isinstance(exc, ShardBusyError):
        return FluxError("SHARD_BUSY", str(exc), retriable=True, retry_after_ms=50)
    if isinstance(exc, ShardClosedError):
        return FluxError("SHUTTING_DOWN", str(exc), retriable=True, retry_after_ms=500)
    if isinstance(exc, ShardRequestDeniedError):
        return FluxError("REQUEST_DENIED", str(exc), retriable=False)
    if isinstance(exc, OutcomeUnknownError):
        return FluxError(
            "OUTCOME_UNKNOWN",
            f"{exc}; the request may or may not have been applied: retry with the same "
            "idempotency key, or check the state first",
            retriable=True,
            retry_after_ms=500,
        )
    if isinstance(exc, ProposalTimeoutError):
        return FluxError(
            "REQUEST_TIMEOUT",
            "request_timeout_ms passed before the request was written; nothing was written",
            retriable=True,
        )
    if isinstance(exc, StorageFullError):
        return FluxError("STORAGE_FULL", str(exc), retriable=False)
    if isinstance(exc, StorageBusyError):
        return FluxError(
            "STORAGE_BUSY",
            f"{exc}; nothing was read or written: retry in a moment",
            retriable=True,
            retry_after_ms=100,
        )
    if isinstance(exc, CorruptRecordError):
        metadata = {"log_id": str(exc.log_id), "offset": str(exc.offset)}
        if isinstance(exc, CorruptBatchError):
            # The batch failed as a whole (its crc): every offset it holds is in doubt.
            metadata["first_offset"] = str(exc.first_offset)
            metadata["last_offset"] = str(exc.last_offset)
        return FluxError("DATA_CORRUPTED", str(exc), metadata=metadata)
    return None


def status_code(err: FluxError) -> grpc.StatusCode:
    return STATUS_BY_REASON.get(err.reason, grpc.StatusCode.FAILED_PRECONDITION)


def to_rpc_status(err: FluxError, request_id: str) -> status_pb2.Status:
    code = status_code(err)
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=DOMAIN)
    info.metadata.update(err.metadata)
    info.metadata["retriable"] = "true" if err.retriable else "false"
    info.metadata["request_id"] = request_id
    details = [info]
    if err.violations:
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=v.field, description=v.description
                    )
                    for v in err.violations
                ]
            )
        )
    if err.retry_after_ms is not None:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(err.retry_after_ms)
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    packed = []
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        packed.append(a)
    return status_pb2.Status(code=code.value[0], message=err.message, details=packed)


def to_grpc_status(err: FluxError, request_id: str) -> grpc.Status:
    status = rpc_status.to_status(to_rpc_status(err, request_id))
    # Keep the request id in the trailers of failed calls too.
    return _WithTrailers(status, (("x-request-id", request_id),))


class _WithTrailers(grpc.Status):  # type: ignore[misc]
    def __init__(self, status: grpc.Status, extra: tuple[tuple[str, str], ...]) -> None:
        self.code = status.code
        self.details = status.details
        self.trailing_metadata = tuple(status.trailing_metadata) + extra


def node_shutting_down() -> FluxError:
    """A call that waits (or would) on a node that got SIGTERM: nothing was leased or read by
    it, so it may go to another node at once (no RetryInfo: no reason to wait)."""
    return FluxError(
        "NODE_SHUTTING_DOWN",
        "this node is shutting down and ends the calls that wait for messages (long polls, "
        "Consume, Tail); retry on another node",
        retriable=True,
    )


def internal_error(request_id: str) -> FluxError:
    return FluxError(
        "INTERNAL", f"internal error (request id {request_id}); the broker logged the details"
    )
