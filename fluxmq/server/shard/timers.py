"""Every timer of a shard's leader, in one place: retention, lease and TTL expiry, member
expiry, dead-letter alerts, and recording this node's gRPC address in the shard.

Each pass is a ``maybe_*`` that looks read-only first (the published view and an LMDB read
transaction) and proposes a command only when it would change something; each ``*_routine``
runs one pass per interval while this replica leads, and logs failures through
``TimerFailures`` (quiet through a failover, loud on a real fault).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from fluxmq import metrics
from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq.core import membership as msh
from fluxmq.core.commands.checkout import checkin_cmd
from fluxmq.core.commands.results import ExpireResult, RetentionResult
from fluxmq.core.commands.retention import retention_due
from fluxmq.core.reader import QueueReader
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.shard.dead_letters import DeadLetters
from fluxmq.server.shard.proposer import Proposer
from fluxmq.server.timer_failures import TimerFailures

log = logging.getLogger(__name__)

EXPIRE_INTERVAL_MS = 100  # how often the leader looks for expired leases, TTLs and sessions
ALERT_INTERVAL_MS = 1000  # how often dead-letter depths are held against their thresholds
ADDRESS_CHECK_MS = 100  # how soon a new leader records its gRPC address in the shard
ADDRESS_RETRY_MS = 1000  # after a failed attempt (no majority, say): calmer


class LeaderTimers:
    def __init__(
        self,
        proposer: Proposer,
        state: QueueStateMachine,
        reader: QueueReader,
        sessions: msh.SessionTracker,
        dead_letters: DeadLetters,
        clock_ms: Callable[[], int],
        *,
        retention_interval_ms: int,
        live_sessions: Callable[[], set[int]] = set,
    ) -> None:
        self._proposer = proposer
        self._state = state
        self._reader = reader
        self._sessions = sessions
        self._dead_letters = dead_letters
        self._clock_ms = clock_ms
        self._retention_interval_ms = retention_interval_ms
        self._live_sessions = live_sessions  # of the Consume streams open on this node
        self._was_leader = False
        # Kept across restarts of a routine: a streak of failures is reported once.
        self._retention_failures = TimerFailures("retention pass", log)
        self._expiry_failures = TimerFailures("lease expiry pass", log)
        self._alert_failures = TimerFailures("dead-letter alert check", log)
        self._address_failures = TimerFailures(
            f"shard {proposer.shard_id}: recording the gRPC address", log
        )

    def start(self) -> list[asyncio.Task[None]]:
        """Every routine of this shard, as named tasks (the owner cancels them)."""
        tasks = [
            asyncio.create_task(self.retention_routine(), name="retention"),
            asyncio.create_task(self.expire_routine(), name="expire_leases"),
            asyncio.create_task(self.alert_routine(), name="dead_letter_alerts"),
        ]
        if self._proposer.advertised is not None:
            tasks.append(asyncio.create_task(self.address_routine(), name="node_address"))
        return tasks

    # -- passes -----------------------------------------------------------------------------

    async def maybe_apply_retention(self) -> RetentionResult | None:
        """Propose ApplyRetention when it would change something (checked read-only first)."""
        now_ms = self._clock_ms()
        view = self._state.view
        with self._state.store.read() as txn:
            if not retention_due(txn, view.catalog, now_ms, view.consumed_floor):
                return None
        cmd = cpb.ApplyRetentionCmd(now_ms=now_ms)
        result = await self._proposer.submit(cmd, RetentionResult)
        if result.removed_records:
            metrics.RETENTION_REMOVED_MESSAGES.inc(result.removed_records)
        return result

    async def maybe_expire(self) -> ExpireResult | None:
        """Propose ExpireLeases when a lease deadline or a TTL has passed (checked first)."""
        now_ms = self._clock_ms()
        view = self._state.view
        deadline = view.delivery.next_deadline_ms()
        due = deadline is not None and deadline <= now_ms
        if not due:
            # Messages made ready by no command (a retry or a delay came due, offsets reset)
            # reach checked-out consumers through this command's apply.
            due = self._reader.checkouts_ready(now_ms)
        if not due:
            policies = {e.queue_id: e.policy for e in view.catalog.values()}
            if any(p.message_ttl_ms for p in policies.values()):
                with self._state.store.read() as txn:
                    due = view.delivery.ttl_due(txn, policies, now_ms)
        if not due:
            return None
        result = await self._proposer.submit(cpb.ExpireLeasesCmd(now_ms=now_ms), ExpireResult)
        if result.expired_leases:
            metrics.EXPIRED_LEASES.inc(result.expired_leases)
        return result

    async def maybe_checkin_orphans(self) -> int:
        """Leader only: check in the consumers whose Consume stream is not open here (it was
        on a former leader, or on this node before a restart): applies would go on assigning
        them messages nobody sends. -> how many were proposed."""
        if not self._proposer.is_leader:
            return 0
        view = self._state.view
        live = self._live_sessions()
        ends: dict[int, list[tuple[str, str, int]]] = {}
        for g in view.delivery.all_groups():
            for consumer_id, co in g.checkouts.items():
                if co.session_id not in live:
                    ends.setdefault(g.queue_id, []).append((g.name, consumer_id, co.session_id))
        if not ends:
            return 0
        catalog = {e.queue_id: e for e in view.catalog.values()}
        proposed = 0
        for queue_id, of_queue in sorted(ends.items()):
            entry = catalog.get(queue_id)
            if entry is None:
                continue
            await self._proposer.propose(checkin_cmd(entry, of_queue))
            proposed += len(of_queue)
        log.info("checked in %d consumer(s) whose Consume stream is gone", proposed)
        return proposed

    async def maybe_expire_members(self) -> int:
        """Propose ExpireMembers for the sessions that lapsed (leader only)."""
        now_ms = self._clock_ms()
        lapsed = self._sessions.lapsed(self._reader.memberships(), now_ms)
        if not lapsed:
            return 0
        cmd = cpb.ExpireMembersCmd(now_ms=now_ms)
        for group_id, member_id in lapsed[: msh.EXPIRES_PER_PASS_MAX]:
            cmd.members.add(group_id=group_id, member_id=member_id)
        result = await self._proposer.submit(cmd, int)
        if result:
            log.info("expired %d group member(s) whose session lapsed", result)
            metrics.EXPIRED_MEMBERS.inc(result)
        return result

    async def maybe_record_address(self) -> bool:
        """Leader only: record this node's gRPC address in the shard unless it already is.
        -> whether a command was proposed.

        Every replica of every shard can then turn the Raft leader it knows into a gRPC
        address, with or without etcd (the Raft log is the one channel every replica of the
        shard already trusts, and a restarted node with another gRPC port corrects the record
        the first time it leads)."""
        advertised = self._proposer.advertised
        if advertised is None or not self._proposer.is_leader:
            return False
        if self._state.node_address(advertised.raft_address) == advertised.grpc_address:
            return False
        await self._proposer.propose(
            cpb.RecordNodeAddressCmd(
                raft_address=advertised.raft_address, grpc_address=advertised.grpc_address
            )
        )
        return True

    # -- routines ---------------------------------------------------------------------------

    async def retention_routine(self) -> None:
        failures = self._retention_failures
        while True:
            await asyncio.sleep(self._retention_interval_ms / 1000)
            if not self._proposer.is_leader:
                failures.stand_down()
                continue
            await _pass(failures, self.maybe_apply_retention)

    async def expire_routine(self) -> None:
        failures = self._expiry_failures
        while True:
            await asyncio.sleep(EXPIRE_INTERVAL_MS / 1000)
            if not self._proposer.is_leader:
                self._was_leader = False
                failures.stand_down()
                continue
            if not self._was_leader:
                # Heartbeats went to the old leader: every member gets a full session from now.
                self._sessions.reset()
                self._was_leader = True
            await _pass(failures, self._expire_both)

    async def _expire_both(self) -> None:
        await self.maybe_checkin_orphans()
        await self.maybe_expire()
        await self.maybe_expire_members()

    async def alert_routine(self) -> None:
        failures = self._alert_failures

        async def check() -> None:
            self._dead_letters.maybe_alert()

        while True:
            await asyncio.sleep(ALERT_INTERVAL_MS / 1000)
            await _pass(failures, check)

    async def address_routine(self) -> None:
        # Any failure is logged and retried: a task that died here would leave every replica
        # naming no gRPC leader (no redirect, no trailer) for the rest of the process.
        failures = self._address_failures
        failing = False
        while True:
            await asyncio.sleep((ADDRESS_RETRY_MS if failing else ADDRESS_CHECK_MS) / 1000)
            failing = not await _pass(failures, self.maybe_record_address)


async def _pass(failures: TimerFailures, step: Callable[[], Awaitable[object]]) -> bool:
    """Run one pass; -> whether it worked (a failure is logged, never raised)."""
    try:
        await step()
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        failures.failed(exc)
        return False
    failures.succeeded()
    return True
