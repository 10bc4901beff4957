"""Transact: acks and publishes of a shard's queues, applied all or nothing in one command."""

from __future__ import annotations

from collections.abc import Callable

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import validation
from fluxmq.core.errors import FluxError, invalid_argument, nested
from fluxmq.core.partitioner import prepare_append
from fluxmq.core.reader import QueueReader
from fluxmq.core.state_machine import TransactResult
from fluxmq.server.shard.delivery import GroupDelivery
from fluxmq.server.shard.proposer import Proposer

TRANSACT_PUBLISHES_MAX = 16
TRANSACT_ACKS_MAX = 16


class Transactions:
    def __init__(
        self,
        proposer: Proposer,
        reader: QueueReader,
        delivery: GroupDelivery,
        clock_ms: Callable[[], int],
    ) -> None:
        self._proposer = proposer
        self._reader = reader
        self._delivery = delivery
        self._clock_ms = clock_ms

    async def transact(self, req: pb.TransactRequest) -> TransactResult:
        if not req.acks and not req.publishes:
            raise invalid_argument("acks", "a transaction carries at least one ack or publish")
        if len(req.acks) > TRANSACT_ACKS_MAX:
            raise invalid_argument("acks", f"at most {TRANSACT_ACKS_MAX} ack requests")
        if len(req.publishes) > TRANSACT_PUBLISHES_MAX:
            raise invalid_argument("publishes", f"at most {TRANSACT_PUBLISHES_MAX} publishes")
        timeout_ms = validation.request_timeout_ms(req.request_timeout_ms)
        # Every queue of the transaction lives in this one shard (the router saw to that), so
        # any mix of them can share it.
        cmd = cpb.TransactCmd()
        now_ms = self._clock_ms()
        for i, ack in enumerate(req.acks):
            try:
                cmd.acks.append(self._delivery.ack_command(ack, now_ms))
            except FluxError as err:
                raise nested(f"acks[{i}]", err) from None
        for i, pub in enumerate(req.publishes):
            cmd.appends.append(self._append_command(i, pub, now_ms))
        return await self._proposer.submit(cmd, TransactResult, timeout_ms)

    def _append_command(self, i: int, pub: pb.PublishRequest, now_ms: int) -> cpb.AppendCmd:
        if pub.HasField("producer"):
            raise invalid_argument(
                f"publishes[{i}].producer",
                "a transaction is all or nothing already; producer sessions are for Publish",
            )
        if pub.HasField("encoded"):
            raise invalid_argument(
                f"publishes[{i}].encoded",
                "a transaction's publishes carry messages; encoded records are for Publish",
            )
        try:
            entry = self._reader.entry(pub.queue)
            prepared = prepare_append(
                pub.queue, entry.queue_id, entry.policy, pub.messages, i, now_ms
            )
        except FluxError as err:
            raise nested(f"publishes[{i}]", err) from None
        return prepared.command
