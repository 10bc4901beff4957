"""Leader timers (lease expiry, retention, dead-letter alerts) log what an operator should act
on: a pass that fails because the leader lost its majority or its leadership (an expected,
retried condition of every failover) is one WARNING line per streak, without a traceback; a
real bug is still an ERROR with its traceback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.errors import FluxError
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.shard.runtime import ShardRuntime
from fluxmq.server.timer_failures import TimerFailures
from raft import NotLeaderError, OutcomeUnknownError, ProposalTimeoutError, ShardStatus
from storage import MemoryStore
from tests.unit.test_state_machine import E

T0_MS = 1_700_000_000_000
LOGGERS = ("fluxmq.server.shard.timers",)


@dataclass
class FailingShard:
    """A leading single-replica shard that applies proposals at once, until ``failure`` is set:
    then every proposal raises it (as a leader that lost its majority does)."""

    sm: QueueStateMachine
    failure: Callable[[], BaseException] | None = None
    proposals: int = 0
    shard_id: str = "g1"
    is_leader: bool = True
    leader: str | None = "127.0.0.1:1"
    proposed: list[bytes] = field(default_factory=list)

    def status(self) -> ShardStatus:
        return ShardStatus(self.shard_id, "leader", 1, 0, 0, ("127.0.0.1:1",), self.leader, 0)

    async def propose(
        self, payload: bytes, deadline: float | None = None, *, on_append: bool = False
    ) -> object:
        self.proposals += 1
        if self.failure is not None:
            raise self.failure()
        return self.sm.apply_batch([E(self.sm.last_applied_index() + 1, payload)])[0]


class Clock:
    def __init__(self) -> None:
        self.now_ms = T0_MS

    def __call__(self) -> int:
        return self.now_ms


async def broker_with_an_expired_lease() -> tuple[ShardRuntime, FailingShard, Clock]:
    sm = QueueStateMachine(MemoryStore())
    shard = FailingShard(sm)
    clock = Clock()
    broker = ShardRuntime(sm, shard, clock_ms=clock)  # type: ignore[arg-type]
    await broker.queues.create_queue(pb.QueueConfig(name="q", type=pb.QUEUE_TYPE_WORK))
    await broker.delivery.create_group(pb.CreateGroupRequest(queue="q", group="g"))
    await broker.queues.publish("q", [pb.PublishMessage(value=b"m")], 5_000)
    leased = await broker.delivery.lease(
        pb.LeaseRequest(queue="q", group="g", consumer_id="c", lease_ms=1_000)
    )
    assert len(leased.deliveries) == 1
    clock.now_ms += 2_000  # the lease is past its deadline: every tick proposes ExpireLeases
    return broker, shard, clock


async def run_for(routine: Callable[[], object], seconds: float) -> None:
    task = asyncio.ensure_future(routine())  # type: ignore[call-overload]
    await asyncio.sleep(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def timer_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name in LOGGERS]


@pytest.mark.parametrize(
    "failure",
    [
        lambda: OutcomeUnknownError("leadership lost before the entry committed"),
        lambda: NotLeaderError("127.0.0.1:2"),
        lambda: ProposalTimeoutError("no majority"),
    ],
    ids=["outcome-unknown", "not-leader", "timeout"],
)
async def test_lease_expiry_on_a_leader_without_majority_logs_one_warning_no_traceback(
    caplog: pytest.LogCaptureFixture, failure: Callable[[], BaseException]
) -> None:
    caplog.set_level(logging.INFO)
    broker, shard, _ = await broker_with_an_expired_lease()
    shard.failure = failure
    before = shard.proposals
    await run_for(broker.timers.expire_routine, 0.65)
    assert shard.proposals - before >= 4, "every tick retried the expiry"
    records = timer_records(caplog)
    assert [r.levelno for r in records] == [logging.WARNING], [r.getMessage() for r in records]
    (warning,) = records
    assert warning.exc_info is None and "lease expiry pass failed" in warning.getMessage()
    # Once the shard works again the pass succeeds, and the streak's end is said once.
    caplog.clear()
    shard.failure = None
    await run_for(broker.timers.expire_routine, 0.35)
    assert [(r.levelno, "works again" in r.getMessage()) for r in timer_records(caplog)] == [
        (logging.INFO, True)
    ]
    stats = broker.reader.group_partitions(broker.reader.entry("q"), "g", broker.now_ms())
    assert sum(p.in_flight for p in stats) == 0


async def test_a_bug_in_the_lease_expiry_pass_is_an_error_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    broker, shard, _ = await broker_with_an_expired_lease()
    shard.failure = lambda: KeyError("a bug")
    await run_for(broker.timers.expire_routine, 0.35)
    records = timer_records(caplog)
    assert records and all(r.levelno == logging.ERROR for r in records)
    assert all(r.exc_info is not None for r in records), "a bug keeps its traceback"


async def test_retention_on_a_leader_without_majority_logs_one_warning_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    sm = QueueStateMachine(MemoryStore())
    shard = FailingShard(sm)
    broker = ShardRuntime(sm, shard, clock_ms=Clock(), retention_interval_ms=50)  # type: ignore[arg-type]
    config = pb.QueueConfig(name="r", retention=pb.Retention(max_messages=1))
    await broker.queues.create_queue(config)
    await broker.queues.publish("r", [pb.PublishMessage(value=b"m") for _ in range(3)], 5_000)
    shard.failure = lambda: OutcomeUnknownError("leadership lost")
    before = shard.proposals
    await run_for(broker.timers.retention_routine, 0.4)
    assert shard.proposals - before >= 3
    records = timer_records(caplog)
    assert [(r.levelno, r.exc_info) for r in records] == [(logging.WARNING, None)]
    assert "retention pass failed" in records[0].getMessage()


def test_expected_failures_repeat_at_most_once_per_interval_with_their_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="timers")
    now = [0.0]
    failures = TimerFailures("x pass", logging.getLogger("timers"), 10.0, lambda: now[0])
    lost = FluxError("OUTCOME_UNKNOWN", "lost", retriable=True)
    for _ in range(5):
        failures.failed(lost)
        now[0] += 1.0
    now[0] = 11.0
    failures.failed(lost)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(lines) == 2 and all(level == "WARNING" for level, _ in lines)
    assert "5 times since the last line" in lines[1][1]
    # Not leading any more: the streak ends quietly, and a new one starts with a line.
    failures.stand_down()
    failures.failed(lost)
    assert len(caplog.records) == 3
    # A non-retriable failure is never rate-limited, and logged with its traceback.
    failures.failed(FluxError("STORAGE_FULL", "disk full"))
    failures.failed(FluxError("STORAGE_FULL", "disk full"))
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and all(r.exc_info is not None for r in errors)
