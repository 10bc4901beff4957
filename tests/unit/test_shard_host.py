"""The shard runtime: every shard a node runs is built and started one way (ShardHost), its
parts wired through constructors, and its proposer hands back typed results."""

from __future__ import annotations

from pathlib import Path

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.errors import FluxError
from fluxmq.core.queue_config import normalize_new
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.router import Router
from fluxmq.server.shard.host import OpenedShard, ShardHost, ShardSpec, read_specs, write_spec
from fluxmq.server.shard.proposer import Proposer
from raft import LocalShard
from storage import MemoryStore

T0 = 1_700_000_000_000


def local(shard_id: str) -> tuple[QueueStateMachine, LocalShard]:
    state = QueueStateMachine(MemoryStore())
    return state, LocalShard(state, shard_id=shard_id)


class Opener:
    """Opens placed shards in memory; remembers what it opened and what was closed."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.opened: list[str] = []
        self.closed: list[str] = []

    def __call__(self, spec: ShardSpec, directory: str) -> OpenedShard | None:
        if self.refuse:
            return None
        state, shard = local(spec.shard_id)
        self.opened.append(spec.shard_id)
        return OpenedShard(state, shard, lambda: self.closed.append(spec.shard_id))


def host_of(router: Router, opener: Opener, tmp_path: Path) -> ShardHost:
    return ShardHost(
        router,
        clock_ms=lambda: T0,
        retention_interval_ms=1000,
        grpc_address=None,
        directory=None,
        shards_dir=str(tmp_path / "groups"),
        open_shard=opener,
    )


async def test_the_first_shard_and_a_placed_one_are_built_and_run_alike(tmp_path: Path) -> None:
    router, opener = Router("g1"), Opener()
    host = host_of(router, opener, tmp_path)
    home = host.build(*local("g1"), raft_address=None)
    router.add_shard(home)
    await host.run(home)
    spec = ShardSpec("g2", "127.0.0.1:1", ())
    write_spec(str(tmp_path / "groups" / "g2"), spec)
    await host.restore()
    assert opener.opened == ["g2"]
    assert sorted(router.shards) == ["g1", "g2"]
    for runtime in router.shards.values():
        config = normalize_new(pb.QueueConfig(name=f"q-{runtime.shard_id}"))
        queue = await runtime.queues.create_queue(config)
        assert runtime.reader.entry(queue.config.name).queue_id == queue.queue_id
        assert {t.get_name() for t in runtime._tasks} == {
            "retention",
            "expire_leases",
            "dead_letter_alerts",
        }
    await host.close()
    assert opener.closed == ["g2"]
    assert not home.shard.is_leader, "the first shard stopped too"


async def test_a_placed_shard_that_cannot_open_is_not_registered(tmp_path: Path) -> None:
    router = Router("g1")
    host = host_of(router, Opener(refuse=True), tmp_path)
    write_spec(str(tmp_path / "groups" / "g2"), ShardSpec("g2", "127.0.0.1:1", ()))
    await host.restore()
    assert router.shards == {}
    await host.close()


async def test_a_shard_started_while_the_node_drains_drains_too(tmp_path: Path) -> None:
    router = Router("g1")
    host = host_of(router, Opener(), tmp_path)
    router.drain()
    runtime = host.build(*local("g1"), raft_address=None)
    await host.run(runtime)
    assert runtime.wakeups.draining
    await host.close()


def test_placed_shard_specs_survive_a_restart(tmp_path: Path) -> None:
    specs = [ShardSpec("g2", "10.0.0.1:7100", ("10.0.0.2:7100",)), ShardSpec("g3", "h:1", ())]
    for spec in specs:
        write_spec(str(tmp_path / spec.shard_id), spec)
    assert read_specs(str(tmp_path)) == specs


class AnsweringShard:
    """A leading shard whose every proposal is answered with ``answer``."""

    shard_id = "g1"
    is_leader = True
    leader = None

    def __init__(self, answer: object) -> None:
        self.answer = answer

    async def propose(
        self, payload: bytes, deadline: float | None = None, *, on_append: bool = False
    ) -> object:
        return self.answer


def proposer(answer: object) -> Proposer:
    state = QueueStateMachine(MemoryStore())
    return Proposer(AnsweringShard(answer), state, advertised=None, directory=None)  # type: ignore[arg-type]


async def test_a_result_of_another_type_than_the_command_gives_is_a_bug_not_a_value() -> None:
    with pytest.raises(AssertionError, match="CreateQueueCmd answered int"):
        await proposer(5).submit(cpb.CreateQueueCmd(), pb.Queue)


async def test_a_refusal_comes_back_raised_never_as_a_value() -> None:
    refusal = FluxError("QUEUE_NOT_FOUND", "no queue 'q'")
    with pytest.raises(FluxError) as err:
        await proposer(refusal).submit(cpb.CreateQueueCmd(), pb.Queue)
    assert err.value is refusal
