"""Helpers to read FluxMQ's rich errors off a failed call."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2
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


def rich_error(err: grpc.RpcError) -> RichError:
    assert isinstance(err, grpc.Call)
    status = rpc_status.from_call(err)
    assert status is not None, f"no rich status on {err.code()}: {err.details()}"
    reason, fields, meta, retry = "", [], {}, None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            assert info.domain == "fluxmq"
            reason, meta = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            detail.Unpack(br)
            fields = [v.field for v in br.field_violations]
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            ri = error_details_pb2.RetryInfo()
            detail.Unpack(ri)
            retry = ri.retry_delay.ToMilliseconds()
    rid = dict(err.trailing_metadata() or ()).get("x-request-id")
    return RichError(err.code(), err.details() or "", reason, fields, meta, rid, retry)
