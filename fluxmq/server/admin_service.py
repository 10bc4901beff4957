"""AdminService: status and administration of the replication groups ("shards") of a node.

Errors are raised as exceptions, like in QueueService: the EdgeInterceptor maps them (FluxError,
and the shard errors through the one table of fluxmq/server/errors.py) to rich statuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from fluxmq._pb.v1 import admin_pb2 as pb
from fluxmq._pb.v1 import admin_pb2_grpc as pb_grpc
from fluxmq.core.errors import FieldViolation, FluxError, invalid_argument
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.metadata import MetadataStore
from fluxmq.server import node_stats
from fluxmq.server.forwarding import was_targeted
from fluxmq.server.guard import Identity, current_identity
from fluxmq.server.key_admin import KeyAdmin
from fluxmq.server.placement import operations
from fluxmq.server.router import Router
from fluxmq.server.scoping import stored_names
from fluxmq.server.shard.proposer import not_leader
from fluxmq.server.shard.runtime import ShardRuntime
from raft import NotLeaderError, Shard, ShardStatus

SHARD_ID_CHARS_MAX = 200
# A state digest reads the whole store (about 20 s of a core at 1.4 GB): digests may take at
# most this share of one core over time, and a request that would wait longer than
# DIGEST_WAIT_MAX_S for its turn is refused with RetryInfo instead of held.
DIGEST_CPU_SHARE = 0.1
DIGEST_WAIT_MAX_S = 1.0
ADDRESS_CHARS_MAX = 300
# host:port; the host is a name, an IPv4 address or a bracketed IPv6 address.
_NODE_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_ADDRESS_RE = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})$")


def shard_not_found(shard_id: str, field_path: str = "shard_id") -> FluxError:
    return FluxError(
        "SHARD_NOT_FOUND",
        f"this node hosts no shard {shard_id!r}",
        violations=(FieldViolation(field_path, "not a shard of this node"),),
        metadata={"shard_id": shard_id, "field": field_path},
    )


def validate_shard_id(shard_id: str, field_path: str = "shard_id") -> str:
    if not shard_id:
        raise invalid_argument(field_path, "required")
    if len(shard_id) > SHARD_ID_CHARS_MAX:
        raise invalid_argument(field_path, f"at most {SHARD_ID_CHARS_MAX} characters")
    return shard_id


def validate_address(address: str, field_path: str) -> str:
    """``host:port`` with a port in 1..65535."""
    match = _ADDRESS_RE.match(address) if len(address) <= ADDRESS_CHARS_MAX else None
    if match is None or not 1 <= int(match.group(1)) <= 65535:
        raise invalid_argument(field_path, f"{address!r} is not host:port (port 1..65535)")
    return address


def _shard_info(status: ShardStatus, digest: str, queues: list[str]) -> pb.ShardInfo:
    return pb.ShardInfo(
        shard_id=status.shard_id,
        role=status.role,
        term=status.term,
        commit_index=status.commit_index,
        applied_index=status.applied_index,
        members=list(status.members),
        leader=status.leader or "",
        pending_proposals=status.pending_proposals,
        digest=digest,
        queues=queues,
        in_sync_replicas=status.in_sync,
        on_probation=status.on_probation,
    )


def validate_node_id(node_id: str, field_path: str = "node_id") -> str:
    if not _NODE_ID_RE.fullmatch(node_id):
        raise invalid_argument(
            field_path, f"{node_id[:80]!r} is not a node id (1-64 of A-Z a-z 0-9 . _ -)"
        )
    return node_id


def _node_summary(n: operations.NodeSummary) -> pb.NodeSummary:
    return pb.NodeSummary(
        node_id=n.node_id,
        live=n.live,
        state=n.state,
        groups=list(n.groups),
        leading=list(n.leading),
        grpc_address=n.grpc_address,
    )


def _queue_status(shard_id: str, row: node_stats.QueueRow) -> pb.QueueStatus:
    return pb.QueueStatus(
        name=row.name,
        shard_id=shard_id,
        partitions=row.partitions,
        published_messages=row.published,
        stored_messages=row.stored,
        stored_bytes=row.stored_bytes,
        dead_letter_queue=row.dead_letter_queue,
        dead_letters=row.dead_letters,
        dead_letter_alert=row.alert,
        groups=[
            pb.ConsumerGroupStatus(
                name=g.group,
                lag=g.lag,
                in_flight=g.in_flight,
                scheduled=g.scheduled,
                dead_lettered=g.dead,
                filtered=g.filtered,
                skipped_by_retention=g.skipped_by_retention,
            )
            for g in row.groups
        ],
    )


def _rpc_stats(row: node_stats.RpcRow) -> pb.RpcMethodStats:
    return pb.RpcMethodStats(
        method=row.method,
        calls=row.calls,
        errors_by_code=row.errors_by_code,
        p50_ms=row.p50_s * 1000,
        p99_ms=row.p99_s * 1000,
        seconds_sum=row.seconds_sum,
    )


log = logging.getLogger(__name__)


def merge_sibling_status(out: pb.ClusterStatus, part: pb.ClusterStatus) -> None:
    """Another shard process's part of this node's status: its shards, queues and counters,
    and its calls (per method: counts and time summed, quantiles the larger of the two)."""
    out.shards.extend(part.shards)
    out.shards.sort(key=lambda s: s.shard_id)
    out.queues.extend(part.queues)
    out.queues.sort(key=lambda q: q.name)
    out.queue_counters.extend(part.queue_counters)
    out.queue_counters.sort(key=lambda c: c.queue)
    rpcs = {r.method: r for r in out.rpcs}
    for theirs in part.rpcs:
        mine = rpcs.get(theirs.method)
        if mine is None:
            rpcs[theirs.method] = mine = pb.RpcMethodStats(method=theirs.method)
        mine.calls += theirs.calls
        for code, count in theirs.errors_by_code.items():
            mine.errors_by_code[code] += count
        mine.p50_ms = max(mine.p50_ms, theirs.p50_ms)
        mine.p99_ms = max(mine.p99_ms, theirs.p99_ms)
        mine.seconds_sum += theirs.seconds_sum
    del out.rpcs[:]
    out.rpcs.extend(rpcs[m] for m in sorted(rpcs))


def _traffic(
    runtimes: list[ShardRuntime],
) -> tuple[list[pb.QueueStatus], list[pb.QueueCounters]]:
    """Queues of the groups this node leads (state), and counters of every hosted queue (this
    process's). Reads LMDB: run off the event loop."""
    queues: list[pb.QueueStatus] = []
    hosted: set[str] = set()
    for runtime in runtimes:
        hosted.update(runtime.state.catalog)
        if runtime.shard.is_leader:
            shard_id = runtime.shard_id
            queues.extend(_queue_status(shard_id, r) for r in node_stats.queue_rows(runtime))
    counters = [
        pb.QueueCounters(queue=q, **values)
        for q, values in sorted(node_stats.queue_counters(hosted).items())
    ]
    queues.sort(key=lambda q: q.name)
    return queues, counters


def digest_busy(retry_after_s: float, why: str) -> FluxError:
    retry_after_ms = max(1, math.ceil(retry_after_s * 1000))
    return FluxError(
        "DIGEST_BUSY",
        f"{why}: retry in {retry_after_ms} ms, or ask with skip_digest = true",
        retriable=True,
        retry_after_ms=retry_after_ms,
        metadata={"field": "skip_digest"},
    )


def digest_denied(role: str) -> FluxError:
    return FluxError(
        "PERMISSION_DENIED",
        f"the state digest (skip_digest = false) reads the whole store: it takes an admin key, "
        f"not a {role} key; ask with skip_digest = true",
        violations=(FieldViolation("skip_digest", "false needs an admin key"),),
        metadata={"field": "skip_digest", "role": role},
    )


@dataclass(slots=True)
class _Digest:
    applied_index: int  # the state's own applied index, unchanged while the digest was read
    digest: str


class DigestGate:
    """The node's state digests: one computation at a time (off the event loop), at most
    ``cpu_share`` of a core over time, and free while a shard's state has not changed since
    its last digest (the cached digest belongs to the state's applied index).

    A request waits for a computation under way (and then usually finds its result), waits
    for its turn when that comes within ``wait_max_s``, and is refused with DIGEST_BUSY and
    RetryInfo when it would wait longer."""

    def __init__(
        self,
        cpu_share: float = DIGEST_CPU_SHARE,
        wait_max_s: float = DIGEST_WAIT_MAX_S,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cpu_share = cpu_share
        self._wait_max_s = wait_max_s
        self._clock_s = clock_s
        self._lock = asyncio.Lock()
        self._cache: dict[str, _Digest] = {}
        self._next_start_s = -math.inf  # inf while a computation runs
        self._last_took_s = 0.0
        self.computed = 0  # digests computed

    async def digest(self, shard_id: str, state: QueueStateMachine) -> str:
        async with self._lock:
            cached = self._cache.get(shard_id)
            if cached is not None and cached.applied_index == state.last_applied_index():
                return cached.digest
            if self._next_start_s == math.inf:  # a cancelled request's computation still runs
                raise digest_busy(max(self._last_took_s, self._wait_max_s), "a digest is running")
            wait_s = self._next_start_s - self._clock_s()
            if wait_s > self._wait_max_s:
                raise digest_busy(wait_s, "state digests are rate limited on this node")
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            self._next_start_s = math.inf
            # Shielded: a caller that goes away does not stop the thread, whose end sets the
            # next start itself.
            return await asyncio.shield(asyncio.to_thread(self._compute, shard_id, state))

    def _compute(self, shard_id: str, state: QueueStateMachine) -> str:
        """On a worker thread: the digest reads one LMDB read transaction, not the state lock."""
        before = state.last_applied_index()
        started_s = self._clock_s()
        try:
            digest = state.digest()
        finally:
            ended_s = self._clock_s()
            self._last_took_s = ended_s - started_s
            self._next_start_s = ended_s + self._last_took_s * (1 / self._cpu_share - 1)
        self.computed += 1
        if state.last_applied_index() == before:
            self._cache[shard_id] = _Digest(before, digest)
        else:
            self._cache.pop(shard_id, None)
        return digest


class AdminService(pb_grpc.AdminServiceServicer):
    def __init__(self, router: Router, node_id: str, digests: DigestGate | None = None) -> None:
        self._router = router
        self._node_id = node_id
        self.digests = digests or DigestGate()

    def _runtimes(self) -> dict[str, ShardRuntime]:
        """Every shard this node hosts, by shard id (each with its own state)."""
        return dict(self._router.shards)

    def _shards(self) -> Mapping[str, Shard]:
        return {sid: r.shard for sid, r in self._runtimes().items()}

    def _shard(self, shard_id: str) -> Shard:
        shard = self._shards().get(shard_id)
        if shard is None:
            raise shard_not_found(shard_id)
        return shard

    @contextlib.contextmanager
    def _on_leader(self, shard_id: str) -> Iterator[None]:
        """A shard operation sent to a follower fails with NOT_LEADER naming the leader's gRPC
        address (the shard itself only knows its Raft address)."""
        try:
            yield
        except NotLeaderError:
            runtime = self._runtimes()[shard_id]
            raise not_leader(
                f"this node does not lead replication group {shard_id!r}: send shard "
                "operations to its leader",
                runtime.proposer.leader_address(),
            ) from None

    def _queues(self, shard: Shard) -> list[str]:
        runtime = self._runtimes().get(shard.shard_id)
        return [] if runtime is None else sorted(runtime.state.catalog)

    def _info(self, shard: Shard) -> pb.ShardInfo:
        """Without digest: reading the whole state is left to GetClusterStatus."""
        return _shard_info(shard.status(), "", self._queues(shard))

    async def GetClusterStatus(
        self, request: pb.GetClusterStatusRequest, context: Any
    ) -> pb.ClusterStatus:
        if not request.skip_digest:
            identity = current_identity.get()
            if identity is not None and identity.role != "admin":
                raise digest_denied(identity.role)
        out = pb.ClusterStatus(node_id=self._node_id)
        runtimes = sorted(self._runtimes().items())
        for shard_id, runtime in runtimes:
            status, digest = runtime.shard.status(), ""
            if not request.skip_digest:
                digest = await self.digests.digest(shard_id, runtime.state)
            out.shards.append(_shard_info(status, digest, sorted(runtime.state.catalog)))
        out.sampled_ms = int(time.time() * 1000)
        queues, counters = await asyncio.to_thread(_traffic, [r for _, r in runtimes])
        out.queues.extend(queues)
        out.queue_counters.extend(counters)
        out.rpcs.extend(_rpc_stats(r) for r in node_stats.rpc_rows())
        out.readiness = node_stats.readiness()
        parts = await self._ask_siblings("GetClusterStatus", request, context)
        if parts:
            guard, identity = self._router.guard, current_identity.get()
            scope = guard.scope_of(identity) if guard is not None and identity else None
            for index, part in parts:
                if isinstance(part, pb.ClusterStatus):
                    stored_names(part, scope)  # shown in the caller's words by the edge, once
                    merge_sibling_status(out, part)
                else:  # restarting, or stuck: the rest of the status still answers
                    log.warning("shard process %d left out of the status: %s", index, part)
                    out.readiness = "not_ready"
        view = self._router.view
        if view is not None:
            await view.ensure_directory()  # fresh when the store answers; else the last seen
            await view.ensure_shards()
            out.metadata_error = view.metadata_error
            out.etcd_session = "up" if view.session_up else "down"
            for group_id, group in sorted(view.shard_records.items()):
                leader, term = view.leaders.get(group_id, ("", 0))
                out.groups.add(
                    group_id=group_id, members=list(group.members), leader=leader, term=term
                )
            for node_id, n in sorted(view.nodes.items()):
                out.nodes.add(
                    node_id=node_id,
                    grpc_address=n.grpc_address,
                    raft_address=f"{n.raft_host}:{n.raft_port_base}",
                    started_ms=n.started_ms,
                )
        return out

    async def TransferLeadership(
        self, request: pb.TransferLeadershipRequest, context: Any
    ) -> pb.TransferLeadershipResponse:
        shard_id = validate_shard_id(request.shard_id)
        target = validate_address(request.target, "target") if request.target else None
        shard = self._shard(shard_id)
        with self._on_leader(shard_id):
            chosen = await shard.transfer_leadership(target)
        return pb.TransferLeadershipResponse(target=chosen, leader=shard.leader or "")

    async def AddReplica(self, request: pb.AddReplicaRequest, context: Any) -> pb.ShardInfo:
        shard_id = validate_shard_id(request.shard_id)
        address = validate_address(request.address, "address")
        shard = self._shard(shard_id)
        with self._on_leader(shard_id):
            await shard.add_member(address)
        return self._info(shard)

    async def RemoveReplica(self, request: pb.RemoveReplicaRequest, context: Any) -> pb.ShardInfo:
        shard_id = validate_shard_id(request.shard_id)
        address = validate_address(request.address, "address")
        shard = self._shard(shard_id)
        with self._on_leader(shard_id):
            await shard.remove_member(address)
        return self._info(shard)

    # -- placement ----------------------------------------------------------------------------

    def _placement(self) -> tuple[MetadataStore, frozenset[str]]:
        """The metadata store and the groups placement leaves alone (the home group)."""
        view = self._router.view
        if view is None:
            raise FluxError(
                "NEEDS_METADATA_STORE",
                "placement needs a cluster with etcd (this node runs without --etcd: its "
                "replication group comes from --peers)",
            )
        return view.store, frozenset({view.home_shard_id})

    async def ListNodes(self, request: pb.ListNodesRequest, context: Any) -> pb.ListNodesResponse:
        store, unmanaged = self._placement()
        nodes = await operations.list_nodes(store, unmanaged)
        return pb.ListNodesResponse(nodes=[_node_summary(n) for n in nodes])

    async def DrainNode(self, request: pb.DrainNodeRequest, context: Any) -> pb.NodeSummary:
        node_id = validate_node_id(request.node_id)
        store, unmanaged = self._placement()
        summary = await operations.drain_node(
            store, node_id, unmanaged, until_restart=request.until_restart
        )
        return _node_summary(summary)

    async def UndrainNode(self, request: pb.UndrainNodeRequest, context: Any) -> pb.NodeSummary:
        node_id = validate_node_id(request.node_id)
        store, unmanaged = self._placement()
        return _node_summary(await operations.undrain_node(store, node_id, unmanaged))

    async def DecommissionNode(
        self, request: pb.DecommissionNodeRequest, context: Any
    ) -> pb.NodeSummary:
        node_id = validate_node_id(request.node_id)
        store, unmanaged = self._placement()
        summary = await operations.drain_node(store, node_id, unmanaged, decommission=True)
        return _node_summary(summary)

    async def MoveReplica(
        self, request: pb.MoveReplicaRequest, context: Any
    ) -> pb.MoveReplicaResponse:
        shard_id = validate_shard_id(request.shard_id)
        from_node = validate_node_id(request.from_node, "from_node")
        to_node = validate_node_id(request.to_node, "to_node")
        if from_node == to_node:
            raise invalid_argument("to_node", "is from_node: a replica moves to another node")
        store, unmanaged = self._placement()
        moved = await operations.move_replica(store, shard_id, from_node, to_node, unmanaged)
        return pb.MoveReplicaResponse(
            shard_id=shard_id, members=list(moved.members), raft_port=moved.raft_ports[to_node]
        )

    async def RebalanceShards(
        self, request: pb.RebalanceShardsRequest, context: Any
    ) -> pb.RebalanceShardsResponse:
        store, unmanaged = self._placement()
        view = self._router.view
        moves_max = view.placement_moves_max if view is not None else 1
        plan = await operations.rebalance(store, unmanaged, request.dry_run, moves_max)
        return pb.RebalanceShardsResponse(
            moves=[
                pb.PlannedMove(
                    shard_id=m.group_id, from_node=m.dead, to_node=m.target, written=written
                )
                for m, written in plan
            ]
        )

    # -- API keys -----------------------------------------------------------------------------

    def _key_admin(self) -> tuple[KeyAdmin, Identity]:
        admin = self._router.key_admin
        identity = current_identity.get()
        if admin is None or identity is None:
            raise FluxError(
                "REQUEST_DENIED",
                "authentication is off on this node (auth = off): there are no API keys",
            )
        return admin, identity

    async def CreateApiKey(
        self, request: pb.CreateApiKeyRequest, context: Any
    ) -> pb.CreateApiKeyResponse:
        admin, identity = self._key_admin()
        return await admin.create(identity, request)

    async def ListApiKeys(
        self, request: pb.ListApiKeysRequest, context: Any
    ) -> pb.ListApiKeysResponse:
        admin, identity = self._key_admin()
        return await admin.list(identity, request)

    async def RevokeApiKey(self, request: pb.RevokeApiKeyRequest, context: Any) -> pb.ApiKeyInfo:
        admin, identity = self._key_admin()
        revoked = await admin.revoke(identity, request)
        # The node's other shard processes drop the key before the caller hears it is revoked
        # (their watches would take up to half a second): revoking again is a no-op in the
        # store that refreshes each one's cache.
        for index, result in await self._ask_siblings("RevokeApiKey", request, context):
            if isinstance(result, BaseException):  # it loads the key fresh when it needs it
                log.info("shard process %d did not take the revocation: %s", index, result)
        return revoked

    async def _ask_siblings(
        self, method: str, request: Any, context: Any
    ) -> list[tuple[int, object]]:
        """``method`` on each other shard process of this node, at once: (its number, its
        answer or the exception it failed with); none when this call came from one of them."""
        siblings = self._router.siblings
        if siblings is None or was_targeted(context):
            return []
        answers = await asyncio.gather(
            *(
                self._router.forwarder.forward_admin(
                    siblings.address_of(index), method, request, context
                )
                for index in siblings.others()
            ),
            return_exceptions=True,
        )
        return list(zip(siblings.others(), answers, strict=True))


def register(server: grpc.aio.Server, router: Router, node_id: str) -> None:
    pb_grpc.add_AdminServiceServicer_to_server(  # type: ignore[no-untyped-call]
        AdminService(router, node_id), server
    )
