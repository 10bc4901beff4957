"""What an operator asks of placement (AdminService ListNodes, DrainNode, DecommissionNode,
MoveReplica; ``fluxmqctl node ...`` and ``fluxmqctl shard move``), checked against the records
in the metadata store, then written there: the controller and the groups' leaders do the rest.

A request that would leave a group waiting on a replica that is not there is refused with the
reason (FAILED_PRECONDITION, MOVE_REFUSED): a move adds the new replica before it removes the
old one when the old one is live, so every other member must be live, or the group would have
to wait for the newcomer to catch up before it commits again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from fluxmq.core.errors import FieldViolation, FluxError
from fluxmq.metadata import (
    MetadataError,
    MetadataStore,
    MetadataUnavailable,
    NodeInfo,
    PortTaken,
    RevisionConflict,
    ShardRecord,
)
from fluxmq.server.placement import node_states
from fluxmq.server.placement.policy import Replacement, free_port, moved, plan_rebalance

REBALANCE_PLAN_MAX = 256  # moves one rebalance plan shows at most

ACTIVE, DRAINED = "active", "drained"


@dataclass(frozen=True, slots=True)
class NodeSummary:
    node_id: str
    live: bool
    state: str  # active | draining | drained | decommissioned
    groups: tuple[str, ...]  # managed groups whose record lists it
    leading: tuple[str, ...]  # groups whose leader record names it
    grpc_address: str = ""


@dataclass
class _Cluster:
    live: dict[str, NodeInfo]
    records: dict[str, tuple[ShardRecord, int]]
    leaders: dict[str, tuple[str, int]]
    states: dict[str, str] = field(default_factory=dict)


async def used_raft_ports(
    store: MetadataStore, records: Iterable[ShardRecord]
) -> dict[str, set[int]]:
    """Every node's Raft ports in use: claimed in the store, or named by a group record
    (records written before ports were claimed have no claims)."""
    used: dict[str, set[int]] = {n: set(p) for n, p in (await store.list_raft_ports()).items()}
    for record in records:
        for m, port in record.raft_ports.items():
            used.setdefault(m, set()).add(port)
    return used


def refused(message: str, field_path: str = "") -> FluxError:
    violations = (FieldViolation(field_path, message),) if field_path else ()
    return FluxError("MOVE_REFUSED", message, violations=violations)


async def _read(store: MetadataStore) -> _Cluster:
    try:
        live = {n.node_id: n for n in await store.list_nodes()}
        records = {v.value.group_id: (v.value, v.revision) for v in await store.list_shards()}
        leaders = await store.get_shard_leaders()
        members = {m for r, _ in records.values() for m in r.members}
        states = await node_states.read_states(store, set(live) | members)
    except MetadataUnavailable as err:
        raise FluxError(
            "METADATA_UNAVAILABLE",
            f"placement needs the cluster metadata store, which cannot be reached ({err})",
            retriable=True,
            retry_after_ms=1000,
        ) from None
    return _Cluster(live, records, leaders, states)


def _summaries(c: _Cluster, unmanaged: frozenset[str]) -> list[NodeSummary]:
    known = set(c.live) | {m for r, _ in c.records.values() for m in r.members} | set(c.states)
    out = []
    for node_id in sorted(known):
        groups = tuple(
            sorted(
                g for g, (r, _) in c.records.items() if node_id in r.members and g not in unmanaged
            )
        )
        leading = tuple(sorted(g for g, (n, _) in c.leaders.items() if n == node_id))
        state = c.states.get(node_id, ACTIVE)
        draining = state in (node_states.DRAINING, node_states.LEAVING)
        if draining and not groups and not (set(leading) - unmanaged):
            state = DRAINED
        node = c.live.get(node_id)
        out.append(
            NodeSummary(
                node_id,
                node is not None,
                state,
                groups,
                leading,
                node.grpc_address if node is not None else "",
            )
        )
    return out


async def list_nodes(store: MetadataStore, unmanaged: frozenset[str]) -> list[NodeSummary]:
    return _summaries(await _read(store), unmanaged)


def _summary_of(c: _Cluster, node_id: str, unmanaged: frozenset[str]) -> NodeSummary:
    return next(s for s in _summaries(c, unmanaged) if s.node_id == node_id)


def _check_drainable(c: _Cluster, node_id: str, unmanaged: frozenset[str]) -> None:
    known = set(c.live) | {m for r, _ in c.records.values() for m in r.members}
    if node_id not in known:
        raise FluxError(
            "NODE_NOT_FOUND",
            f"no node {node_id!r} in the directory or in any group (nodes: "
            f"{', '.join(sorted(known)) or 'none'})",
            violations=(FieldViolation("node_id", "not a node of this cluster"),),
        )
    for group_id, (record, _) in sorted(c.records.items()):
        if node_id not in record.members or group_id in unmanaged:
            continue
        others_missing = sorted(m for m in record.members if m != node_id and m not in c.live)
        if others_missing and node_id in c.live:
            raise refused(
                f"group {group_id} also has {', '.join(others_missing)} missing: moving "
                f"{node_id}'s replica now would leave it waiting for the new one to catch up; "
                "let the controller replace the missing member first (or bring it back)",
                "node_id",
            )
        if not any(
            n not in record.members and c.states.get(n) not in node_states.STATES for n in c.live
        ):
            raise refused(
                f"group {group_id} has no live node to move to (each of its replicas needs "
                "its own node): add a node first",
                "node_id",
            )


async def drain_node(
    store: MetadataStore,
    node_id: str,
    unmanaged: frozenset[str],
    decommission: bool = False,
    until_restart: bool = False,
) -> NodeSummary:
    """Marks ``node_id`` draining (``until_restart``: leaving, which the node clears when it
    starts again; ``decommission``: for good): the controller moves its replicas away, the
    node hands over the leadership of what it leads. -> its summary now."""
    c = await _read(store)
    if c.states.get(node_id) != node_states.DECOMMISSIONED:
        _check_drainable(c, node_id, unmanaged)
    state = node_states.DRAINING
    if decommission:
        state = node_states.DECOMMISSIONED
    elif until_restart:
        state = node_states.LEAVING
    # An operator's drain is not weakened into a leave, nor a decommission into anything.
    kept = c.states.get(node_id) == node_states.DECOMMISSIONED or (
        state == node_states.LEAVING and c.states.get(node_id) == node_states.DRAINING
    )
    if decommission or not kept:
        await node_states.set_state(store, node_id, state)
        c.states[node_id] = state
    return _summary_of(c, node_id, unmanaged)


async def undrain_node(
    store: MetadataStore, node_id: str, unmanaged: frozenset[str]
) -> NodeSummary:
    """A draining, leaving or drained node is active again: placement may give it replicas
    (the rebalance after a join) and leadership. A decommissioned node stays out."""
    c = await _read(store)
    known = set(c.live) | {m for r, _ in c.records.values() for m in r.members} | set(c.states)
    if node_id not in known:
        raise FluxError(
            "NODE_NOT_FOUND",
            f"no node {node_id!r} in the directory, in any group or with a state",
            violations=(FieldViolation("node_id", "not a node of this cluster"),),
        )
    if c.states.get(node_id) == node_states.DECOMMISSIONED:
        raise refused(
            f"{node_id} is decommissioned: it is never placed on again (give the machine a "
            "new node id to bring it back)",
            "node_id",
        )
    if node_id in c.states:
        await node_states.set_state(store, node_id, node_states.ACTIVE)
        del c.states[node_id]
    return _summary_of(c, node_id, unmanaged)


async def move_replica(
    store: MetadataStore,
    group_id: str,
    from_node: str,
    to_node: str,
    unmanaged: frozenset[str],
) -> ShardRecord:
    """Writes ``group_id``'s record with ``to_node`` in ``from_node``'s place, on a Raft port
    of ``to_node`` claimed in the same write. -> the new record."""
    c = await _read(store)
    found = c.records.get(group_id)
    if found is None:
        raise FluxError(
            "REPLICATION_GROUP_NOT_FOUND",
            f"no replication group {group_id!r} (groups: {', '.join(sorted(c.records))})",
            violations=(FieldViolation("shard_id", "not a replication group"),),
        )
    record, revision = found
    if group_id in unmanaged:
        raise refused(
            f"group {group_id} is the nodes' home group: its members come from their "
            "configuration (--peers), not from placement",
            "shard_id",
        )
    if from_node not in record.members:
        raise refused(
            f"{from_node} holds no replica of {group_id} (members: {', '.join(record.members)})",
            "from_node",
        )
    if to_node in record.members:
        raise refused(f"{to_node} already holds a replica of {group_id}", "to_node")
    target = c.live.get(to_node)
    if target is None:
        raise refused(f"{to_node} is not live (not in the directory)", "to_node")
    if c.states.get(to_node) in node_states.STATES:
        raise refused(f"{to_node} is {c.states[to_node]}: nothing is placed on it", "to_node")
    missing = sorted(m for m in record.members if m != from_node and m not in c.live)
    if missing and from_node in c.live:
        raise refused(
            f"group {group_id} also has {', '.join(missing)} missing: moving a live replica "
            "now would leave it waiting for the new one to catch up; move the missing one "
            "first",
            "from_node",
        )
    used = await used_raft_ports(store, (r for r, _ in c.records.values()))
    record = moved(record, from_node, to_node, free_port(target, used.get(to_node, set())))
    await _write(store, record, revision)
    return record


async def _write(store: MetadataStore, record: ShardRecord, revision: int) -> None:
    """``record`` over the one read at ``revision``; a change meanwhile is CONCURRENT_UPDATE."""
    try:
        await store.update_shard(record, revision)
    except (RevisionConflict, PortTaken) as err:
        raise FluxError(
            "CONCURRENT_UPDATE",
            f"group {record.group_id} changed while the move was prepared ({err}); retry",
            retriable=True,
        ) from None
    except MetadataError as err:
        raise FluxError(
            "METADATA_UNAVAILABLE", f"the move was not written: {err}", retriable=True
        ) from None


async def rebalance(
    store: MetadataStore, unmanaged: frozenset[str], dry_run: bool, moves_max: int
) -> list[tuple[Replacement, bool]]:
    """The moves that even replicas out, each with whether it was written (the first
    ``moves_max`` unless ``dry_run``)."""
    c = await _read(store)
    records = {g: r for g, (r, _) in c.records.items()}
    used = await used_raft_ports(store, records.values())
    leaving = node_states.leaving(c.states)
    plan: list[Replacement] = []
    while len(plan) < REBALANCE_PLAN_MAX:
        step = plan_rebalance(records, c.live, used, 1, unmanaged, leaving)
        if not step:
            break
        plan.append(step[0])
        records[step[0].group_id] = step[0].record
        used.setdefault(step[0].target, set()).add(step[0].record.raft_ports[step[0].target])
    out: list[tuple[Replacement, bool]] = []
    seen: set[str] = set()  # a group's later moves build on its first: only the first is written
    written = 0
    for move in plan:
        write = not dry_run and written < moves_max and move.group_id not in seen
        seen.add(move.group_id)
        if write:
            await _write(store, move.record, c.records[move.group_id][1])
            written += 1
        out.append((move, write))
    return out
