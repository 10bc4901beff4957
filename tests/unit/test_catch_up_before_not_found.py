"""Read-your-writes across nodes (issue 19 flake): a replica never answers NOT_FOUND for a queue
whose create another node already acknowledged. Before NOT_FOUND it catches up with the
committed log; when it cannot (no leader known, the catch-up does not come back in time or
fails) the answer is a retriable UNAVAILABLE, never a NOT_FOUND guessed from stale state.

A real Broker and gRPC server, over a shard that holds one committed create it has not applied
yet, as a replica does between a commit and its apply: a follower behind its leader, a leader
just elected that has not applied its predecessor's last commits, a replica that lost its
leader or cannot reach it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.core import commands
from fluxmq.core.queue_config import normalize_new
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.app import build_server
from fluxmq.server.router import Router
from fluxmq.server.shard import proposer as proposer_module
from fluxmq.server.shard.runtime import ShardRuntime
from raft import NotLeaderError, ShardStatus
from storage import MemoryStore

T0 = 1_700_000_000_000
SELF, OTHER = "127.0.0.1:7101", "127.0.0.1:7102"


@dataclass(frozen=True)
class _Entry:
    index: int
    payload: bytes


class LaggingShard:
    """One replica of a 3-member shard whose log holds a committed CreateQueue it has not
    applied: ``barrier`` (an empty entry through the log) applies it, as the real one does once
    the leader answers. ``barrier_fails`` makes it fail (``hang``: never return)."""

    def __init__(self, sm: QueueStateMachine, *, leading: bool, leader: str | None) -> None:
        self.sm = sm
        self.leading = leading
        self.known_leader = leader
        self.barrier_fails: BaseException | str | None = None
        self.barriers = 0
        cfg = normalize_new(pb.QueueConfig(name="orders"))
        create = commands.encode(cpb.CreateQueueCmd(config=cfg, now_ms=T0))
        self.unapplied = [_Entry(sm.last_applied_index() + 1, create)]

    @property
    def shard_id(self) -> str:
        return "g1"

    @property
    def is_leader(self) -> bool:
        return self.leading

    @property
    def leader(self) -> str | None:
        return SELF if self.leading else self.known_leader

    def status(self) -> ShardStatus:
        last = self.sm.last_applied_index()
        return ShardStatus(
            shard_id="g1",
            role="leader" if self.leading else "follower",
            term=2,
            commit_index=last + len(self.unapplied),
            applied_index=last,
            members=(SELF, OTHER, "127.0.0.1:7103"),
            leader=self.leader,
            pending_proposals=0,
        )

    async def barrier(self) -> None:
        self.barriers += 1
        if self.barrier_fails == "hang":
            await asyncio.Event().wait()
        elif isinstance(self.barrier_fails, BaseException):
            raise self.barrier_fails
        self.sm.apply_batch(self.unapplied)
        self.unapplied = []


@dataclass
class Replica:
    shard: LaggingShard
    stub: queue_pb2_grpc.QueueServiceStub


@pytest.fixture
def catch_up_budget(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(proposer_module, "CATCH_UP_TIMEOUT_S", 0.5)
    return 0.5


async def _serve(shard_args: dict[str, object]) -> AsyncIterator[Replica]:
    sm = QueueStateMachine(MemoryStore())
    shard = LaggingShard(sm, **shard_args)  # type: ignore[arg-type]
    broker = ShardRuntime(sm, shard)  # type: ignore[arg-type]
    server, _, port = build_server(Router.of_one(broker), "127.0.0.1:0", request_bytes_max=4 << 20)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Replica(shard, queue_pb2_grpc.QueueServiceStub(channel))
    finally:
        await server.stop(None)


@pytest.fixture
async def follower(catch_up_budget: float) -> AsyncIterator[Replica]:
    async for r in _serve({"leading": False, "leader": OTHER}):
        yield r


@pytest.fixture
async def new_leader(catch_up_budget: float) -> AsyncIterator[Replica]:
    async for r in _serve({"leading": True, "leader": None}):
        yield r


@pytest.fixture
async def leaderless(catch_up_budget: float) -> AsyncIterator[Replica]:
    async for r in _serve({"leading": False, "leader": None}):
        yield r


def _reason(err: grpc.aio.AioRpcError) -> tuple[str, dict[str, str]]:
    raw = dict(err.trailing_metadata() or ()).get("grpc-status-details-bin")
    assert isinstance(raw, bytes), err
    status = status_pb2.Status.FromString(raw)
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason, dict(info.metadata)
    raise AssertionError(f"no ErrorInfo in {status}")


async def _get(replica: Replica, name: str = "orders") -> pb.Queue:
    return await replica.stub.GetQueue(pb.GetQueueRequest(name=name), timeout=10)


async def _retriable_unavailable(replica: Replica) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _get(replica)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE, exc.value.details()
    reason, meta = _reason(exc.value)
    assert reason == "GROUP_UNAVAILABLE" and meta["retriable"] == "true"
    assert meta["group"] == "g1"
    return exc.value.details() or ""


async def test_follower_behind_its_leader_catches_up_and_answers_the_queue(
    follower: Replica,
) -> None:
    assert (await _get(follower)).config.name == "orders"
    assert follower.shard.barriers == 1


async def test_new_leader_applies_its_predecessors_commits_before_answering_not_found(
    new_leader: Replica,
) -> None:
    assert (await _get(new_leader)).config.name == "orders"
    assert new_leader.shard.barriers == 1


async def test_replica_without_a_leader_answers_retriable_unavailable_not_not_found(
    leaderless: Replica,
) -> None:
    details = await _retriable_unavailable(leaderless)
    assert "no leader" in details
    assert leaderless.shard.barriers == 0


async def test_replica_that_learns_its_leader_within_the_budget_answers_the_queue(
    leaderless: Replica,
) -> None:
    async def elected() -> None:
        await asyncio.sleep(0.1)
        leaderless.shard.known_leader = OTHER

    task = asyncio.create_task(elected())
    assert (await _get(leaderless)).config.name == "orders"
    await task


@pytest.mark.parametrize(
    "failure", ["hang", NotLeaderError(None)], ids=["catch-up-times-out", "catch-up-fails"]
)
async def test_follower_that_cannot_catch_up_answers_retriable_unavailable_not_not_found(
    follower: Replica, failure: BaseException | str
) -> None:
    follower.shard.barrier_fails = failure
    await _retriable_unavailable(follower)
    follower.shard.barrier_fails = None  # the leader is back: the retry finds the queue
    assert (await _get(follower)).config.name == "orders"


async def test_a_queue_that_does_not_exist_is_still_not_found_once_caught_up(
    follower: Replica,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _get(follower, "nobody-created-this")
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    assert _reason(exc.value)[0] == "QUEUE_NOT_FOUND"
