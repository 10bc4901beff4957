"""Leader gRPC addresses through the Raft log (issue 19, item 3): a shard's new leader records
(its Raft address -> its gRPC address) with RecordNodeAddress (op code 23), so every replica can
name the leader's gRPC address without a metadata store. The record is replicated state: durable,
in snapshots and in the digest; the broker proposes it only when it is missing or out of date,
and NOT_LEADER names the gRPC address, never the Raft one."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq.core import commands
from fluxmq.core.errors import FluxError
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.shard.proposer import Advertised
from fluxmq.server.shard.runtime import ShardRuntime
from raft import NotLeaderError, ShardStatus
from storage import LmdbStore, Store
from tests.unit.test_state_machine import Driver, E
from tests.unit.test_state_machine import store as store  # the fixture: memory and LMDB

RAFT_A, GRPC_A = "10.0.0.1:7102", "10.0.0.1:7070"
RAFT_B, GRPC_B = "10.0.0.2:7102", "10.0.0.2:7070"


def record(raft: str, grpc_address: str) -> cpb.RecordNodeAddressCmd:
    return cpb.RecordNodeAddressCmd(raft_address=raft, grpc_address=grpc_address)


def test_record_node_address_has_its_own_op_code() -> None:
    raw = commands.encode(record(RAFT_A, GRPC_A))
    assert raw[0] == 23 == commands.Op.RECORD_NODE_ADDRESS
    assert commands.decode(raw) == (commands.Op.RECORD_NODE_ADDRESS, record(RAFT_A, GRPC_A))


def test_recorded_node_address_is_read_back_and_replaced(store: Store) -> None:
    d = Driver(store)
    assert d.sm.node_address(RAFT_A) is None
    assert d.run(record(RAFT_A, GRPC_A), record(RAFT_B, GRPC_B)) == [None, None]
    assert (d.sm.node_address(RAFT_A), d.sm.node_address(RAFT_B)) == (GRPC_A, GRPC_B)
    d.one(record(RAFT_A, "10.0.0.1:9999"))  # the node came back on another port
    assert d.sm.node_address(RAFT_A) == "10.0.0.1:9999"


def test_recorded_node_address_survives_a_restart_and_travels_in_snapshots(
    tmp_path: Path,
) -> None:
    first = LmdbStore(str(tmp_path / "a"), sync=False)
    d = Driver(first)
    d.one(record(RAFT_A, GRPC_A))
    # Another replica that applied the same log holds the same state (digest included).
    other = LmdbStore(str(tmp_path / "b"), sync=False)
    replica = QueueStateMachine(other)
    replica.apply_batch([E(1, commands.encode(record(RAFT_A, GRPC_A)))])
    assert replica.digest() == d.sm.digest()
    first.close()
    reopened = LmdbStore(str(tmp_path / "a"), sync=False)
    restarted = QueueStateMachine(reopened)
    assert restarted.node_address(RAFT_A) == GRPC_A
    restarted.write_snapshot(str(tmp_path / "snap"))
    fresh = LmdbStore(str(tmp_path / "c"), sync=False)
    installed = QueueStateMachine(fresh)
    installed.install_snapshot(str(tmp_path / "snap"))
    assert installed.node_address(RAFT_A) == GRPC_A
    for s in (reopened, other, fresh):
        s.close()


@dataclass
class FakeShard:
    """A replica of a 2-node shard: ``leading`` or following ``leader_raft``; proposals are
    applied at once (as a committed entry) to the state machine."""

    sm: QueueStateMachine
    leading: bool = False
    leader_raft: str | None = None
    proposed: list[bytes] = field(default_factory=list)
    shard_id: str = "g1"

    @property
    def is_leader(self) -> bool:
        return self.leading

    @property
    def leader(self) -> str | None:
        return RAFT_A if self.leading else self.leader_raft

    def status(self) -> ShardStatus:
        return ShardStatus(self.shard_id, "leader", 1, 0, 0, (RAFT_A, RAFT_B), self.leader, 0)

    async def propose(
        self, payload: bytes, deadline: float | None = None, *, on_append: bool = False
    ) -> object:
        if not self.leading:
            raise NotLeaderError(self.leader_raft)
        self.proposed.append(payload)
        index = self.sm.last_applied_index() + 1
        return self.sm.apply_batch([E(index, payload)])[0]


def broker_on(store: Store, **shard: object) -> tuple[ShardRuntime, FakeShard]:
    sm = QueueStateMachine(store)
    fake = FakeShard(sm, **shard)  # type: ignore[arg-type]
    broker = ShardRuntime(sm, fake, advertised=Advertised(GRPC_A, RAFT_A))  # type: ignore[arg-type]
    return broker, fake


async def test_a_leader_records_its_grpc_address_once(store: Store) -> None:
    broker, shard = broker_on(store, leading=True)
    assert await broker.timers.maybe_record_address() is True
    assert broker.state.node_address(RAFT_A) == GRPC_A
    assert await broker.timers.maybe_record_address() is False  # already there: no log entry
    assert len(shard.proposed) == 1
    assert broker.proposer.leader_address() == GRPC_A


async def test_a_follower_names_the_leader_by_its_grpc_address(store: Store) -> None:
    broker, _ = broker_on(store, leader_raft=RAFT_B)
    assert await broker.timers.maybe_record_address() is False  # only a leader records
    assert broker.proposer.leader_address() is None  # the leader has not recorded itself yet
    with pytest.raises(FluxError) as err:
        broker.proposer.require_leader()
    assert err.value.reason == "NOT_LEADER" and err.value.metadata["leader"] == ""
    assert RAFT_B not in err.value.message

    broker.state.apply_batch([E(1, commands.encode(record(RAFT_B, GRPC_B)))])
    assert broker.proposer.leader_address() == GRPC_B
    with pytest.raises(FluxError) as err:
        broker.proposer.require_leader()
    assert err.value.reason == "NOT_LEADER" and err.value.metadata["leader"] == GRPC_B
    # A proposal the shard refuses (NotLeaderError carries the Raft address) says the same.
    with pytest.raises(FluxError) as err:
        await broker.proposer.propose(record(RAFT_A, GRPC_A))
    assert err.value.reason == "NOT_LEADER" and err.value.metadata["leader"] == GRPC_B
    assert RAFT_B not in err.value.message
