"""Forwarding to the node that can answer: what only the leader of a shard knows (heartbeats
live in its memory) goes there over the internal path, once (a forwarded call is never
forwarded again, so a stale directory cannot make calls loop).

A forwarded call carries the caller's ``authorization`` metadata unchanged (the node that
answers authenticates the caller again) and its request id. With TLS the channels to other nodes
verify them with ``tls_ca_file`` and present this node's certificate (peers may require mTLS)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fluxmq._pb.v1 import admin_pb2_grpc, queue_pb2_grpc
from fluxmq.core.errors import FieldViolation, FluxError
from fluxmq.server.interceptors import REQUEST_ID_KEY, request_id_var
from fluxmq.server.shard_process.siblings import TARGET_PROCESS_KEY, split_address
from fluxmq.server.stream_slots import StreamSlots
from fluxmq.server.tls import TlsConfig

FORWARDED_KEY = "x-fluxmq-forwarded"
AUTHORIZATION_KEY = "authorization"
FORWARD_TIMEOUT_S = 5.0
# Metadata ``cause`` of the error a relay answers when the node it forwarded to is shutting down.
REMOTE_SHUTTING_DOWN = "NODE_SHUTTING_DOWN"
CHANNELS_MAX = 64  # one per peer node; a larger directory reuses the oldest slot
# The largest answer a node sends (its server's max_send_message_length): a channel to another
# node must receive as much, or a call through a non-hosting node fails where a direct one works.
RESPONSE_BYTES_MAX = 64 * 1024 * 1024
REQUEST_BYTES_MAX_DEFAULT = 64 * 1024 * 1024  # the request_bytes_max setting's default


def describe(address: str) -> str:
    """An address as error messages give it (another shard process by its number, not by its
    internal socket's path)."""
    _, process = split_address(address)
    return address if process is None else f"shard process {process} of this node"


def remote_error(err: grpc.aio.AioRpcError, address: str) -> FluxError:
    """The FluxError the other node answered with (its ErrorInfo), so the caller gets the same
    status; a call that never reached a broker (connection refused, reset, timeout) is
    GROUP_UNAVAILABLE, retriable: the group may be electing or its node restarting."""
    reason, metadata = "", {}
    violations: list[FieldViolation] = []
    retry_after_ms: int | None = None
    address = describe(address)
    status = rpc_status.from_call(err)
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, metadata = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations = [FieldViolation(v.field, v.description) for v in bad.field_violations]
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_after_ms = retry.retry_delay.ToMilliseconds()
    if not reason and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return size_limit_exceeded(err, address)
    if not reason:
        return FluxError(
            "GROUP_UNAVAILABLE",
            f"the node serving this queue ({address}) did not answer: {err.details()}; retry",
            retriable=True,
            retry_after_ms=500,
            metadata={"node": address},
        )
    if reason == REMOTE_SHUTTING_DOWN:
        return remote_shutting_down(address)
    retriable = metadata.pop("retriable", "false") == "true"
    metadata.pop("request_id", None)
    return FluxError(
        reason,
        err.details() or reason,
        retriable=retriable,
        violations=tuple(violations),
        retry_after_ms=retry_after_ms,
        metadata=metadata,
    )


def size_limit_exceeded(err: grpc.aio.AioRpcError, address: str) -> FluxError:
    """gRPC's own refusal of a message over a size limit between two nodes (their
    request_bytes_max differ, or an answer beyond RESPONSE_BYTES_MAX): the same call fails the
    same way every time, so it is not retriable and says which limit."""
    return FluxError(
        "SIZE_LIMIT_EXCEEDED",
        f"a message between this node and {address} exceeds a gRPC size limit "
        f"({err.details()}): answers are at most {RESPONSE_BYTES_MAX} bytes and requests at most "
        "request_bytes_max (give every node the same); ask for less (max_bytes, fewer messages)",
        retriable=False,
        metadata={"node": address},
    )


def remote_shutting_down(address: str) -> FluxError:
    """What a relay answers when the node it forwarded to said NODE_SHUTTING_DOWN: the same
    retriable UNAVAILABLE, under another reason, because it is that node that stops, not this
    one (a client skips a node that says NODE_SHUTTING_DOWN for a while). Nothing was leased
    or read there, so the call may go anywhere at once."""
    return FluxError(
        "GROUP_UNAVAILABLE",
        f"the node serving this queue ({address}) is shutting down; retry",
        retriable=True,
        metadata={"node": address, "cause": REMOTE_SHUTTING_DOWN},
    )


def is_remote_shutting_down(err: FluxError) -> bool:
    return err.reason == "GROUP_UNAVAILABLE" and err.metadata.get("cause") == REMOTE_SHUTTING_DOWN


def call_timeout_s(request: Any) -> float:
    """How long a forwarded call may take: a long poll (Lease, Fetch) its ``wait_ms`` more,
    or a forwarded poll longer than FORWARD_TIMEOUT_S would fail instead of waiting."""
    fields = request.DESCRIPTOR.fields_by_name if hasattr(request, "DESCRIPTOR") else {}
    wait_ms = int(request.wait_ms) if "wait_ms" in fields else 0
    return FORWARD_TIMEOUT_S + max(wait_ms, 0) / 1000


def was_forwarded(context: Any) -> bool:
    return any(k == FORWARDED_KEY for k, _ in (context.invocation_metadata() or ()))


def was_targeted(context: Any) -> bool:
    """Sent by another shard process of this node to this one by name (through the front end's
    internal socket): served here, never forwarded again."""
    return any(k == TARGET_PROCESS_KEY for k, _ in (context.invocation_metadata() or ()))


def forwarded_metadata(context: Any) -> tuple[tuple[str, str], ...]:
    """The metadata of a call forwarded on behalf of ``context``'s caller: the forwarded mark,
    the caller's credentials (``authorization``, unchanged) and the request id."""
    out = [(FORWARDED_KEY, "1")]
    for key, value in context.invocation_metadata() or ():
        if key == AUTHORIZATION_KEY and isinstance(value, str):
            out.append((key, value))
    request_id = request_id_var.get()
    if request_id != "-":
        out.append((REQUEST_ID_KEY, request_id))
    return tuple(out)


def _metadata_for(address: str, context: Any) -> tuple[tuple[str, str], ...]:
    """``forwarded_metadata``, and for another shard process of this node, which one."""
    _, process = split_address(address)
    out = forwarded_metadata(context)
    return out if process is None else (*out, (TARGET_PROCESS_KEY, str(process)))


async def _unary(call: Any, address: str, request: Any, context: Any, timeout_s: float) -> Any:
    try:
        return await call(request, metadata=_metadata_for(address, context), timeout=timeout_s)
    except grpc.aio.AioRpcError as err:
        raise remote_error(err, address) from None


class Forwarder:
    """Channels to the other nodes (plaintext, or TLS with ``tls``), with the size limits of
    this node's server, so a call relayed here passes exactly when a direct one would: a
    request up to ``request_bytes_max``, an answer up to RESPONSE_BYTES_MAX. ``streams`` is the
    node's bound on concurrent streams, shared with QueueService: a relayed stream holds a slot
    here (and one on the node that serves it)."""

    def __init__(
        self,
        tls: TlsConfig | None = None,
        *,
        request_bytes_max: int = REQUEST_BYTES_MAX_DEFAULT,
        streams: StreamSlots | None = None,
    ) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._credentials = None if tls is None else tls.channel_credentials()
        self.streams = streams or StreamSlots()
        self.channel_options: tuple[tuple[str, int], ...] = (
            ("grpc.max_send_message_length", request_bytes_max),
            ("grpc.max_receive_message_length", RESPONSE_BYTES_MAX),
        )

    def _open(self, target: str) -> grpc.aio.Channel:
        options = self.channel_options
        if self._credentials is None or target.startswith("unix:"):
            # The front end's internal socket (another shard process of this node): plaintext,
            # it never leaves the machine.
            return grpc.aio.insecure_channel(target, options=options)
        return grpc.aio.secure_channel(target, self._credentials, options=options)

    def _channel(self, address: str) -> grpc.aio.Channel:
        target, _ = split_address(address)
        channel = self._channels.get(target)
        if channel is None:
            if len(self._channels) >= CHANNELS_MAX:
                _, oldest = self._channels.popitem()
                # Closing is async; dropping the reference lets gRPC tear it down.
                del oldest
            channel = self._channels[target] = self._open(target)
        return channel

    def queue_service(self, address: str) -> queue_pb2_grpc.QueueServiceStub:
        return queue_pb2_grpc.QueueServiceStub(self._channel(address))  # type: ignore[no-untyped-call]

    def admin_service(self, address: str) -> admin_pb2_grpc.AdminServiceStub:
        return admin_pb2_grpc.AdminServiceStub(self._channel(address))  # type: ignore[no-untyped-call]

    async def forward_admin(self, address: str, method: str, request: Any, context: Any) -> Any:
        """An AdminService call, as ``forward`` (another shard process's part of an answer)."""
        call = getattr(self.admin_service(address), method)
        return await _unary(call, address, request, context, FORWARD_TIMEOUT_S)

    async def forward(self, address: str, method: str, request: Any, context: Any) -> Any:
        """Call ``method`` on ``address``; its failure becomes this call's failure, unchanged
        (the rich status travels in the trailing metadata)."""
        call = getattr(self.queue_service(address), method)
        return await _unary(call, address, request, context, call_timeout_s(request))

    async def forward_unary(self, address: str, method: str, request: Any, context: Any) -> Any:
        """Like ``forward`` for a caller that reports errors itself (a PublishStream answers
        each request): a failure comes back as the FluxError the other node sent. ``context``
        is the caller's (its credentials go along)."""
        return await self.forward(address, method, request, context)

    async def forward_stream(
        self, address: str, method: str, request: Any, context: Any
    ) -> AsyncGenerator[Any, None]:
        """A server stream (Tail, Consume) relayed from ``address`` for as long as it runs;
        it holds one of this node's stream slots (TOO_MANY_STREAMS when none is free)."""
        with self.streams.hold():
            call = getattr(self.queue_service(address), method)(
                request, metadata=_metadata_for(address, context)
            )
            try:
                async for item in call:
                    yield item
            except grpc.aio.AioRpcError as err:
                raise remote_error(err, address) from None
            finally:
                call.cancel()

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
