"""Forwarding to the node that can answer: what only the leader of a shard knows (heartbeats
live in its memory) goes there over the internal path, once (a forwarded call is never
forwarded again, so a stale directory cannot make calls loop)."""

from __future__ import annotations

from typing import Any

import grpc

from fluxmq._pb.v1 import queue_pb2_grpc

FORWARDED_KEY = "x-fluxmq-forwarded"
FORWARD_TIMEOUT_S = 5.0
CHANNELS_MAX = 64  # one per peer node; a larger directory reuses the oldest slot


def was_forwarded(context: Any) -> bool:
    return any(k == FORWARDED_KEY for k, _ in (context.invocation_metadata() or ()))


class Forwarder:
    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def queue_service(self, address: str) -> queue_pb2_grpc.QueueServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            if len(self._channels) >= CHANNELS_MAX:
                _, oldest = self._channels.popitem()
                # Closing is async; dropping the reference lets gRPC tear it down.
                del oldest
            channel = self._channels[address] = grpc.aio.insecure_channel(address)
        return queue_pb2_grpc.QueueServiceStub(channel)  # type: ignore[no-untyped-call]

    async def forward(self, address: str, method: str, request: Any, context: Any) -> Any:
        """Call ``method`` on ``address``; its failure becomes this call's failure, unchanged
        (the rich status travels in the trailing metadata)."""
        call = getattr(self.queue_service(address), method)
        try:
            return await call(request, metadata=((FORWARDED_KEY, "1"),), timeout=FORWARD_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            await context.abort(err.code(), err.details() or "", err.trailing_metadata())

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
