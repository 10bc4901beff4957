"""A shard's consumer-group members: join, heartbeat, leave. Heartbeats live in the leader's
memory (``sessions``); only a lapse becomes a command (``timers``)."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from fluxmq import metrics
from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import membership as msh
from fluxmq.core.commands.members import prepare_join, prepare_leave, require_member_id
from fluxmq.core.commands.results import MemberResult, member_view
from fluxmq.core.errors import invalid_argument
from fluxmq.core.reader import QueueReader
from fluxmq.server.shard.proposer import Proposer

RELEASE_HEARTBEAT_MS_MIN = 50  # a member waiting for a release asks at most this often


class Members:
    def __init__(
        self,
        proposer: Proposer,
        reader: QueueReader,
        sessions: msh.SessionTracker,
        clock_ms: Callable[[], int],
    ) -> None:
        self._proposer = proposer
        self._reader = reader
        self._sessions = sessions
        self._clock_ms = clock_ms

    async def join_group(self, req: pb.JoinGroupRequest) -> pb.MemberAssignment:
        entry = self._reader.entry(req.queue)
        g = self._reader.group(entry, req.group)
        now_ms = self._clock_ms()
        cmd = prepare_join(g, entry, req, now_ms, secrets.token_hex(6))
        result = await self._proposer.submit(cmd, MemberResult)
        self._sessions.saw(g.group_id, cmd.member_id, now_ms)
        metrics.GROUP_JOINS.labels(req.queue).inc()
        return assignment(result.member, result.group_generation)

    async def heartbeat(self, req: pb.HeartbeatRequest) -> pb.MemberAssignment:
        """Answered by the leader from its memory; a command only when partitions can move."""
        entry = self._reader.entry(req.queue)
        g = self._reader.group(entry, req.group)
        require_member_id(req.member_id)
        self._proposer.require_leader()
        ms = g.membership
        m = ms.members.get(req.member_id) if ms is not None else None
        if ms is None or m is None:
            return pb.MemberAssignment(
                member_id=req.member_id,
                should_rejoin=True,
                reason="the member is not in the group: its session expired, it left, or the "
                "same consumer joined again",
                heartbeat_interval_ms=msh.heartbeat_interval_ms(msh.SESSION_TIMEOUT_MS_DEFAULT),
                group_generation=ms.group_generation if ms is not None else 0,
            )
        if req.generation_id > m.generation:
            raise invalid_argument(
                "generation_id",
                f"member {m.member_id!r} never had generation {req.generation_id} "
                f"(current {m.generation})",
            )
        now_ms = self._clock_ms()
        self._sessions.saw(g.group_id, m.member_id, now_ms)
        view = member_view(m)
        generation = ms.group_generation
        if self._reader.releasable(entry, req.group, m.member_id, req.generation_id):
            result = await self._proposer.propose(
                cpb.ReleasePartitionsCmd(
                    queue=req.queue,
                    queue_id=entry.queue_id,
                    group=req.group,
                    member_id=m.member_id,
                    generation_id=req.generation_id,
                )
            )
            if isinstance(result, MemberResult):  # (nothing to release any more: no member)
                view, generation = result.member, result.group_generation
        return assignment(view, generation)

    async def leave_group(self, req: pb.LeaveGroupRequest) -> None:
        entry = self._reader.entry(req.queue)
        g = self._reader.group(entry, req.group)
        await self._proposer.propose(prepare_leave(entry, req, self._clock_ms()))
        self._sessions.forget(g.group_id, req.member_id)


def assignment(m: pb.GroupMember, group_generation: int) -> pb.MemberAssignment:
    """What a member is told: its partitions, and when to heartbeat next."""
    interval = msh.heartbeat_interval_ms(m.session_timeout_ms)
    if m.pending:  # waiting for a release: ask again soon
        interval = max(RELEASE_HEARTBEAT_MS_MIN, interval // msh.PENDING_HEARTBEAT_DIVISOR)
    return pb.MemberAssignment(
        member_id=m.member_id,
        generation_id=m.generation_id,
        assigned=m.assigned,
        revoking=m.revoking,
        pending=m.pending,
        heartbeat_interval_ms=interval,
        group_generation=group_generation,
    )
