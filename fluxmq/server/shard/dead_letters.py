"""A shard's dead letters: replay and purge (chunked into bounded commands), and the alerts
when a queue's own dead letters pass its threshold."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import limits, validation
from fluxmq.core.errors import invalid_argument
from fluxmq.core.reader import QueueReader
from fluxmq.server.shard.proposer import Proposer

log = logging.getLogger(__name__)

DEAD_LETTER_IDS_MAX = 100_000  # ids one request may name
COMMANDS_PER_REQUEST_MAX = 10_000  # commands one replay or purge request may take


class DeadLetters:
    def __init__(
        self, proposer: Proposer, reader: QueueReader, clock_ms: Callable[[], int]
    ) -> None:
        self._proposer = proposer
        self._reader = reader
        self._clock_ms = clock_ms
        self.alerts: dict[str, int] = {}  # queue -> depth when the alert was raised

    async def replay(self, req: pb.ReplayDeadLettersRequest) -> int:
        entry = self._reader.entry(req.queue)
        _check_ids(req.ids, req.all)
        if req.group:
            validation.group_name(req.group)
        total = 0
        ids = list(req.ids)
        # One command replays at most REPLAY_PER_COMMAND_MAX; "all" takes as many as needed.
        for _ in range(COMMANDS_PER_REQUEST_MAX):
            chunk = ids[: limits.REPLAY_PER_COMMAND_MAX]
            ids = ids[limits.REPLAY_PER_COMMAND_MAX :]
            cmd = cpb.ReplayDeadLettersCmd(
                queue=req.queue,
                queue_id=entry.queue_id,
                ids=chunk,
                all=req.all,
                group=req.group,
                now_ms=self._clock_ms(),
            )
            n = await self._proposer.submit(cmd, int)
            total += n
            if (req.all and n < limits.REPLAY_PER_COMMAND_MAX) or (not req.all and not ids):
                break
        return total

    async def purge(self, req: pb.PurgeDeadLettersRequest) -> int:
        entry = self._reader.entry(req.queue)
        _check_ids(req.ids, req.all)
        total = 0
        # "all" deletes the queue's own letters one by one (a shared DLQ is never truncated
        # wholesale), at most PURGE_DEAD_LETTERS_PER_COMMAND_MAX per command.
        for _ in range(COMMANDS_PER_REQUEST_MAX):
            cmd = cpb.PurgeDeadLettersCmd(
                queue=req.queue, queue_id=entry.queue_id, ids=req.ids, all=req.all
            )
            n = await self._proposer.submit(cmd, int)
            total += n
            if not req.all or n < limits.PURGE_DEAD_LETTERS_PER_COMMAND_MAX:
                break
        return total

    def maybe_alert(self) -> None:
        """Log once when a queue's own dead letters (in a shared DLQ: only its own) grow past its
        threshold; clear when they drop back."""
        for entry in list(self._reader.catalog.values()):
            threshold = entry.policy.dead_letter_alert_threshold
            if not threshold:
                self.alerts.pop(entry.name, None)
                continue
            depth = self._reader.dead_letter_depth(entry)
            if depth > threshold and entry.name not in self.alerts:
                self.alerts[entry.name] = depth
                log.warning(
                    "queue %r has %d dead letters in %r (alert threshold %d)",
                    entry.name,
                    depth,
                    entry.policy.dead_letter_queue,
                    threshold,
                )
            elif depth <= threshold and entry.name in self.alerts:
                del self.alerts[entry.name]
                log.info("queue %r is back to %d dead letters", entry.name, depth)


def _check_ids(ids: Sequence[int], all_: bool) -> None:
    if all_ and ids:
        raise invalid_argument("ids", "give ids or all, not both")
    if not all_ and not ids:
        raise invalid_argument("ids", "give the ids of the dead letters, or all=true")
    if len(ids) > DEAD_LETTER_IDS_MAX:
        raise invalid_argument("ids", f"at most {DEAD_LETTER_IDS_MAX} ids")
