"""Transact: acks and publishes of a shard's queues, applied all or nothing in one command."""

from __future__ import annotations

from collections.abc import Callable

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import validation
from fluxmq.core.commands.results import TransactResult
from fluxmq.core.commands.transact import prepare_transact
from fluxmq.core.errors import invalid_argument
from fluxmq.core.reader import QueueReader
from fluxmq.server.shard.proposer import Proposer

TRANSACT_PUBLISHES_MAX = 16
TRANSACT_ACKS_MAX = 16


class Transactions:
    def __init__(
        self, proposer: Proposer, reader: QueueReader, clock_ms: Callable[[], int]
    ) -> None:
        self._proposer = proposer
        self._reader = reader
        self._clock_ms = clock_ms

    async def transact(self, req: pb.TransactRequest) -> TransactResult:
        if not req.acks and not req.publishes:
            raise invalid_argument("acks", "a transaction carries at least one ack or publish")
        if len(req.acks) > TRANSACT_ACKS_MAX:
            raise invalid_argument("acks", f"at most {TRANSACT_ACKS_MAX} ack requests")
        if len(req.publishes) > TRANSACT_PUBLISHES_MAX:
            raise invalid_argument("publishes", f"at most {TRANSACT_PUBLISHES_MAX} publishes")
        timeout_ms = validation.request_timeout_ms(req.request_timeout_ms)
        cmd = prepare_transact(self._reader.view, req, self._clock_ms())
        return await self._proposer.submit(cmd, TransactResult, timeout_ms)
