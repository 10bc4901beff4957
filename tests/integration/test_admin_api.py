"""AdminService: against a real single-node `fluxmq serve` process, and, for what a single node
cannot produce (a follower, a lost answer, a membership change), an in-process server whose
shard is a stand-in."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq._pb.v1 import admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import commands
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.admin_service import AdminService
from fluxmq.server.app import build_server
from fluxmq.server.router import Router
from fluxmq.server.shard.runtime import ShardRuntime
from raft import Entry, NotLeaderError, OutcomeUnknownError, ShardRequestDeniedError, ShardStatus
from storage import MemoryStore

from .conftest import Node
from .rpc_helpers import RichError, rich_error

Admin = admin_pb2_grpc.AdminServiceStub
HEX64 = re.compile(r"^[0-9a-f]{64}$")


@pytest.fixture
def admin(node: Node) -> Iterator[Admin]:
    with node.channel() as ch:
        yield admin_pb2_grpc.AdminServiceStub(ch)


def status(admin: Admin) -> apb.ShardInfo:
    resp = admin.GetClusterStatus(apb.GetClusterStatusRequest())
    assert len(resp.shards) == 1
    return resp.shards[0]


def failure(call: Callable[[], object]) -> RichError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return rich_error(info.value)


def publish(stub: queue_pb2_grpc.QueueServiceStub, queue: str, n: int) -> None:
    stub.Publish(pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(value=b"v")] * n))


# -- a real single-node broker ------------------------------------------------------------------


def test_every_admin_service_rpc_is_implemented() -> None:
    rpcs = apb.DESCRIPTOR.services_by_name["AdminService"].methods_by_name
    base = admin_pb2_grpc.AdminServiceServicer
    missing = [name for name in rpcs if getattr(AdminService, name) is getattr(base, name)]
    assert not missing, f"RPCs without an implementation: {missing}"


def test_a_single_node_reports_one_local_shard_it_leads(node: Node, admin: Admin) -> None:
    resp = admin.GetClusterStatus(apb.GetClusterStatusRequest())
    assert resp.node_id == "local"
    [shard] = resp.shards
    assert shard.shard_id == "local" and shard.role == "leader" and shard.leader == "local"
    assert list(shard.members) == ["local"]
    assert shard.term >= 1 and shard.commit_index == shard.applied_index
    assert shard.pending_proposals == 0 and list(shard.queues) == []
    assert HEX64.match(shard.digest), shard.digest


def test_a_publish_advances_the_applied_index_and_changes_the_digest(
    node: Node, admin: Admin, stub: queue_pb2_grpc.QueueServiceStub
) -> None:
    empty = status(admin)
    stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="orders")))
    created = status(admin)
    assert created.applied_index > empty.applied_index and list(created.queues) == ["orders"]
    assert created.digest != empty.digest
    publish(stub, "orders", 3)
    published = status(admin)
    assert published.applied_index > created.applied_index
    assert published.commit_index == published.applied_index
    assert HEX64.match(published.digest) and published.digest != created.digest


def test_the_digest_is_stable_while_nothing_is_written(
    node: Node, admin: Admin, stub: queue_pb2_grpc.QueueServiceStub
) -> None:
    stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="orders", partitions=2)))
    publish(stub, "orders", 5)
    first = status(admin)
    for _ in range(3):
        again = status(admin)
        assert (again.applied_index, again.digest) == (first.applied_index, first.digest)


def test_the_digest_survives_a_restart(
    node: Node, admin: Admin, stub: queue_pb2_grpc.QueueServiceStub
) -> None:
    stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="orders")))
    publish(stub, "orders", 4)
    before = status(admin)
    assert node.stop() == 0
    node.start()
    with node.channel() as ch:
        after = status(admin_pb2_grpc.AdminServiceStub(ch))
    assert (after.applied_index, after.digest) == (before.applied_index, before.digest)


DENIED: list[tuple[str, Callable[[Admin], object]]] = [
    ("transfer to the most caught-up member",
     lambda a: a.TransferLeadership(apb.TransferLeadershipRequest(shard_id="local"))),
    ("transfer to a named member",
     lambda a: a.TransferLeadership(
         apb.TransferLeadershipRequest(shard_id="local", target="127.0.0.1:7101"))),
    ("add a replica",
     lambda a: a.AddReplica(apb.AddReplicaRequest(shard_id="local", address="127.0.0.1:7101"))),
    ("remove a replica",
     lambda a: a.RemoveReplica(
         apb.RemoveReplicaRequest(shard_id="local", address="127.0.0.1:7101"))),
]  # fmt: skip


@pytest.mark.parametrize("call", [c for _, c in DENIED], ids=[n for n, _ in DENIED])
def test_a_single_node_denies_leadership_and_membership_changes(
    admin: Admin, call: Callable[[Admin], object]
) -> None:
    before = status(admin)
    err = failure(lambda: call(admin))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "REQUEST_DENIED"
    assert err.metadata["retriable"] == "false" and err.retry_delay_ms is None
    assert err.request_id and err.metadata["request_id"] == err.request_id
    after = status(admin)
    assert (after.role, list(after.members)) == (before.role, list(before.members))


def test_an_unknown_shard_is_not_found_naming_the_field(admin: Admin) -> None:
    for call in (
        lambda: admin.TransferLeadership(apb.TransferLeadershipRequest(shard_id="nope")),
        lambda: admin.AddReplica(apb.AddReplicaRequest(shard_id="nope", address="h:7100")),
        lambda: admin.RemoveReplica(apb.RemoveReplicaRequest(shard_id="nope", address="h:7100")),
    ):
        err = failure(call)
        assert err.code == grpc.StatusCode.NOT_FOUND and err.reason == "SHARD_NOT_FOUND"
        assert err.fields == ["shard_id"] and err.metadata["shard_id"] == "nope"


BAD_INPUT: list[tuple[str, Callable[[Admin], object], str]] = [
    ("empty shard id", lambda a: a.TransferLeadership(apb.TransferLeadershipRequest()),
     "shard_id"),
    ("empty shard id on add",
     lambda a: a.AddReplica(apb.AddReplicaRequest(address="127.0.0.1:7101")), "shard_id"),
    ("empty address", lambda a: a.AddReplica(apb.AddReplicaRequest(shard_id="local")),
     "address"),
    ("address without port",
     lambda a: a.AddReplica(apb.AddReplicaRequest(shard_id="local", address="node2")),
     "address"),
    ("address without host",
     lambda a: a.AddReplica(apb.AddReplicaRequest(shard_id="local", address=":7101")),
     "address"),
    ("port out of range",
     lambda a: a.RemoveReplica(apb.RemoveReplicaRequest(shard_id="local", address="h:70000")),
     "address"),
    ("port not a number",
     lambda a: a.RemoveReplica(apb.RemoveReplicaRequest(shard_id="local", address="h:raft")),
     "address"),
    ("space in host",
     lambda a: a.AddReplica(apb.AddReplicaRequest(shard_id="local", address="a b:7101")),
     "address"),
    ("target not host:port",
     lambda a: a.TransferLeadership(
         apb.TransferLeadershipRequest(shard_id="local", target="node2")), "target"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "field_path"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT]
)
def test_bad_admin_input_is_invalid_argument_naming_the_field(
    admin: Admin, call: Callable[[Admin], object], field_path: str
) -> None:
    err = failure(lambda: call(admin))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.reason == "INVALID_ARGUMENT"
    assert err.fields == [field_path] and err.metadata["retriable"] == "false"


@pytest.mark.parametrize("address", ["[::1]:7101", "node-2.example.com:7101", "10.0.0.2:1"])
def test_ipv6_and_host_name_addresses_pass_validation(admin: Admin, address: str) -> None:
    # Well-formed: the single node then denies the change itself.
    err = failure(
        lambda: admin.AddReplica(apb.AddReplicaRequest(shard_id="local", address=address))
    )
    assert err.reason == "REQUEST_DENIED"


def test_health_and_reflection_list_the_admin_service(node: Node) -> None:
    with node.channel() as ch:
        health = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="fluxmq.v1.AdminService")
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(ch)
        resp = next(
            iter(
                reflection.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")])
                )
            )
        )
    assert "fluxmq.v1.AdminService" in {s.name for s in resp.list_services_response.service}


# -- an in-process server with a stand-in shard ---------------------------------------------------


@dataclass
class StandInShard:
    """A replica of a three-member shard; each admin call raises ``error`` if set."""

    shard_id: str = "s1"
    members: list[str] = field(default_factory=lambda: ["10.0.0.1:7100", "10.0.0.2:7100"])
    leader: str | None = "10.0.0.1:7100"
    error: Exception | None = None
    transfers: list[str | None] = field(default_factory=list)
    leading: bool = True

    @property
    def is_leader(self) -> bool:
        return self.leading

    def status(self) -> ShardStatus:
        return ShardStatus(
            shard_id=self.shard_id,
            role="leader",
            term=7,
            commit_index=12,
            applied_index=11,
            members=tuple(self.members),
            leader=self.leader,
            pending_proposals=2,
        )

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    async def transfer_leadership(self, target: str | None = None) -> str:
        self._check()
        self.transfers.append(target)
        chosen = target or self.members[1]
        self.leader = chosen
        return chosen

    async def add_member(self, address: str) -> None:
        self._check()
        self.members.append(address)

    async def remove_member(self, address: str) -> None:
        self._check()
        self.members.remove(address)

    async def propose(self, payload: bytes, deadline: float | None = None) -> object:
        raise AssertionError("not used")

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


@dataclass
class InProcess:
    shard: StandInShard
    admin: Admin
    broker: ShardRuntime

    async def call(self, rpc: Callable[[Admin], Any]) -> Any:
        # The synchronous client in a thread: the server runs on this event loop.
        return await asyncio.to_thread(rpc, self.admin)

    async def failure(self, rpc: Callable[[Admin], object]) -> RichError:
        return await asyncio.to_thread(failure, lambda: rpc(self.admin))


@pytest.fixture
async def in_process() -> AsyncIterator[InProcess]:
    shard = StandInShard()
    broker = ShardRuntime(QueueStateMachine(MemoryStore()), shard)
    server, _health, port = build_server(
        Router.of_one(broker), "127.0.0.1:0", request_bytes_max=1 << 20, node_id="node-a"
    )
    await server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            yield InProcess(shard, admin_pb2_grpc.AdminServiceStub(ch), broker)
    finally:
        await server.stop(None)


async def test_status_carries_the_node_id_and_every_field_of_the_shard(
    in_process: InProcess,
) -> None:
    resp = await in_process.call(lambda a: a.GetClusterStatus(apb.GetClusterStatusRequest()))
    assert resp.node_id == "node-a"
    [shard] = resp.shards
    assert (shard.shard_id, shard.role, shard.term) == ("s1", "leader", 7)
    assert (shard.commit_index, shard.applied_index, shard.pending_proposals) == (12, 11, 2)
    assert list(shard.members) == ["10.0.0.1:7100", "10.0.0.2:7100"]
    assert shard.leader == "10.0.0.1:7100" and HEX64.match(shard.digest)


async def test_an_unknown_leader_is_reported_as_empty(in_process: InProcess) -> None:
    in_process.shard.leader = None
    resp = await in_process.call(lambda a: a.GetClusterStatus(apb.GetClusterStatusRequest()))
    assert resp.shards[0].leader == ""


async def test_membership_changes_answer_with_the_shard_after_the_change(
    in_process: InProcess,
) -> None:
    added = await in_process.call(
        lambda a: a.AddReplica(apb.AddReplicaRequest(shard_id="s1", address="10.0.0.3:7100"))
    )
    assert list(added.members) == ["10.0.0.1:7100", "10.0.0.2:7100", "10.0.0.3:7100"]
    assert added.shard_id == "s1" and added.digest == ""
    removed = await in_process.call(
        lambda a: a.RemoveReplica(apb.RemoveReplicaRequest(shard_id="s1", address="10.0.0.2:7100"))
    )
    assert list(removed.members) == ["10.0.0.1:7100", "10.0.0.3:7100"]


async def test_an_empty_transfer_target_lets_the_shard_choose(in_process: InProcess) -> None:
    chosen = await in_process.call(
        lambda a: a.TransferLeadership(apb.TransferLeadershipRequest(shard_id="s1"))
    )
    assert (chosen.target, chosen.leader) == ("10.0.0.2:7100", "10.0.0.2:7100")
    named = await in_process.call(
        lambda a: a.TransferLeadership(
            apb.TransferLeadershipRequest(shard_id="s1", target="10.0.0.1:7100")
        )
    )
    assert named.target == "10.0.0.1:7100"
    assert in_process.shard.transfers == [None, "10.0.0.1:7100"]


async def test_a_follower_answers_not_leader_naming_the_leader(in_process: InProcess) -> None:
    in_process.shard.leading, in_process.shard.leader = False, "10.0.0.2:7100"
    in_process.shard.error = NotLeaderError("10.0.0.2:7100")
    # The leader recorded where it serves gRPC (RecordNodeAddress): that is what a client dials.
    record = cpb.RecordNodeAddressCmd(raft_address="10.0.0.2:7100", grpc_address="10.0.0.2:7070")
    in_process.broker.state.apply_batch([Entry(1, commands.encode(record))])
    err = await in_process.failure(
        lambda a: a.AddReplica(apb.AddReplicaRequest(shard_id="s1", address="10.0.0.3:7100"))
    )
    assert err.code == grpc.StatusCode.UNAVAILABLE and err.reason == "NOT_LEADER"
    assert err.metadata["leader"] == "10.0.0.2:7070" and err.metadata["retriable"] == "true"


async def test_a_lost_answer_is_unavailable_outcome_unknown_and_retriable(
    in_process: InProcess,
) -> None:
    in_process.shard.error = OutcomeUnknownError("leader changed before the change committed")
    err = await in_process.failure(
        lambda a: a.RemoveReplica(apb.RemoveReplicaRequest(shard_id="s1", address="10.0.0.2:7100"))
    )
    assert err.code == grpc.StatusCode.UNAVAILABLE and err.reason == "OUTCOME_UNKNOWN"
    assert err.metadata["retriable"] == "true" and err.retry_delay_ms is not None
    assert "may or may not" in err.message


async def test_a_denied_request_is_failed_precondition_and_not_retriable(
    in_process: InProcess,
) -> None:
    in_process.shard.error = ShardRequestDeniedError("10.0.0.2:7100 is 500 entries behind")
    err = await in_process.failure(
        lambda a: a.TransferLeadership(
            apb.TransferLeadershipRequest(shard_id="s1", target="10.0.0.2:7100")
        )
    )
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "REQUEST_DENIED"
    assert err.metadata["retriable"] == "false" and "500 entries behind" in err.message
