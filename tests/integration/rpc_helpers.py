"""Helpers to read FluxMQ's rich errors off a failed call."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status


@dataclass
class RichError:
    code: grpc.StatusCode
    message: str
    reason: str
    fields: list[str]
    metadata: dict[str, str]
    request_id: str | None
    retry_delay_ms: int | None


@dataclass
class StatusDetails:
    """What a google.rpc.Status carries in its details (ErrorInfo, BadRequest, RetryInfo)."""

    reason: str = ""
    domain: str | None = None  # None: no ErrorInfo
    fields: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    retry_delay_ms: int | None = None


def status_details(status: status_pb2.Status) -> StatusDetails:
    out = StatusDetails()
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            out.reason, out.domain, out.metadata = info.reason, info.domain, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            detail.Unpack(br)
            out.fields = [v.field for v in br.field_violations]
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            ri = error_details_pb2.RetryInfo()
            detail.Unpack(ri)
            out.retry_delay_ms = ri.retry_delay.ToMilliseconds()
    return out


def rich_error(err: grpc.RpcError) -> RichError:
    assert isinstance(err, grpc.Call)
    status = rpc_status.from_call(err)
    assert status is not None, f"no rich status on {err.code()}: {err.details()}"
    d = status_details(status)
    assert d.domain in (None, "fluxmq"), d.domain
    rid = dict(err.trailing_metadata() or ()).get("x-request-id")
    return RichError(
        err.code(), err.details() or "", d.reason, d.fields, d.metadata, rid, d.retry_delay_ms
    )
