"""The placement controller and the leaders' membership convergence.

- ``PlacementController`` runs on one node at a time (the holder of the ``placement_controller``
  role in the metadata store, a leased key). Each pass reads nodes and groups from the store
  and writes the records ``policy.plan_replacements`` returns: a member missing longer than
  ``node_dead_after_ms`` is replaced by a live node, on a Raft port claimed in the same write.
  It remembers since when a member is missing only while it holds the role (a new holder starts
  counting again: it never replaces sooner than the setting says).
- ``MembershipConverger`` runs in every process that hosts shards: for each shard it leads, it
  makes the Raft membership match the group's record, one change at a time
  (``policy.membership_step``): the dead member out first, then the new one in; the new replica,
  started by its node from the record, joins on probation and is refilled by the leader.

Both are restartable at any point: their state is the store's records and the shards' own
membership, each step is idempotent, and the next pass takes up where the last one stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fluxmq import metrics
from fluxmq.metadata import MetadataError, MetadataStore, NodeInfo, PortTaken, RevisionConflict
from fluxmq.server.placement import node_states
from fluxmq.server.placement.operations import used_raft_ports
from fluxmq.server.placement.policy import (
    membership_step,
    missing_members,
    plan_leaders,
    plan_rebalance,
    plan_replacements,
)
from raft import Shard
from raft.api import ShardError

if TYPE_CHECKING:
    from fluxmq.metadata import ShardRecord

log = logging.getLogger(__name__)

CONTROLLER_ROLE = "placement_controller"


@dataclass(frozen=True, slots=True)
class PlacementSettings:
    node_dead_after_ms: int = 300_000  # a member missing this long is replaced
    moves_max: int = 2  # groups whose records one pass changes, at most
    interval_ms: int = 1_000  # between passes of the controller and of the convergence
    role_ttl_ms: int = 10_000  # a controller that stops renewing loses the role after this
    # After a replica moved, the controller waits this long before it evens replicas out
    # (the moves it made settle first).
    rebalance_pause_ms: int = 10_000
    leader_imbalance_ms: int = 15_000  # leadership this uneven this long is spread
    preference_ttl_ms: int = 30_000  # how long a group's leader heeds a preferred leader


class PlacementController:
    def __init__(
        self,
        store: MetadataStore,
        node_id: str,
        settings: PlacementSettings,
        clock_ms: Callable[[], int],
        unmanaged: Callable[[], frozenset[str]],
    ) -> None:
        """``unmanaged``: the groups whose members come from the nodes' configuration (the
        static home group): reported when under-replicated, never moved."""
        self._store = store
        self._node_id = node_id
        self._settings = settings
        self._clock_ms = clock_ms
        self._unmanaged = unmanaged
        self.leading = False
        self._missing_since_ms: dict[str, int] = {}
        self._reported: frozenset[str] = frozenset()
        self._moved_at_ms = 0  # when this controller last moved a replica
        self._imbalanced_since_ms: int | None = None  # leadership uneven since

    async def controller_routine(self) -> None:
        while True:
            await asyncio.sleep(self._settings.interval_ms / 1000)
            await self.maybe_place()

    async def maybe_place(self) -> None:
        """One pass: hold the role, then replace what has been missing long enough."""
        try:
            holder = await self._store.campaign(
                CONTROLLER_ROLE, self._node_id, self._settings.role_ttl_ms
            )
        except MetadataError as err:
            log.debug("placement controller: cannot campaign: %s", err)
            return
        if holder != self._node_id:
            if self.leading:
                log.info("placement controller: %s holds the role now", holder)
            self.leading = False
            self._missing_since_ms.clear()
            metrics.PLACEMENT_CONTROLLER.set(0)
            return
        if not self.leading:
            log.info("placement controller: this node (%s) holds the role", self._node_id)
        self.leading = True
        metrics.PLACEMENT_CONTROLLER.set(1)
        try:
            await self.ensure_replicas()
        except MetadataError as err:
            log.warning("placement controller: metadata unavailable: %s", err)

    async def ensure_replicas(self) -> None:
        live = {n.node_id: n for n in await self._store.list_nodes()}
        versioned = {v.value.group_id: v for v in await self._store.list_shards()}
        records = {g: v.value for g, v in versioned.items()}
        members = {m for r in records.values() for m in r.members}
        states = await node_states.read_states(self._store, set(live) | members)
        now_ms = self._clock_ms()
        missing = missing_members(records, live)
        for node_id in missing:
            self._missing_since_ms.setdefault(node_id, now_ms)
        for node_id in set(self._missing_since_ms) - missing:
            del self._missing_since_ms[node_id]
        self._report(records, live)
        used = await used_raft_ports(self._store, records.values())
        leaving = node_states.leaving(states)
        plans = plan_replacements(
            records,
            live,
            self._missing_since_ms,
            now_ms,
            self._settings.node_dead_after_ms,
            used,
            self._settings.moves_max,
            self._unmanaged(),
            leaving,
        )
        managed_missing = any(
            any(m not in live for m in r.members)
            for g, r in records.items()
            if g not in self._unmanaged()
        )
        if (
            not plans
            and not managed_missing
            and now_ms - self._moved_at_ms >= self._settings.rebalance_pause_ms
        ):
            plans = plan_rebalance(
                records, live, used, self._settings.moves_max, self._unmanaged(), leaving
            )
        for plan in plans:
            try:
                await self._store.update_shard(plan.record, versioned[plan.group_id].revision)
            except (PortTaken, RevisionConflict) as err:
                log.info("placement controller: %s changed meanwhile (%s)", plan.group_id, err)
                continue
            self._moved_at_ms = now_ms
            metrics.PLACEMENT_MOVES.labels(reason=plan.reason).inc()
            missing_s = (now_ms - self._missing_since_ms.get(plan.dead, now_ms)) // 1000
            why = {
                "dead_node": f"missing for {missing_s} s",
                "drain": states.get(plan.dead, "leaving"),
            }.get(plan.reason, "holds more replicas than others")
            log.warning(
                "placement controller: group %s: member %s %s; moving its replica to %s "
                "(raft port %d)",
                plan.group_id,
                plan.dead,
                why,
                plan.target,
                plan.record.raft_ports[plan.target],
            )
        await self.ensure_leaders(records, live, leaving)

    async def ensure_leaders(
        self,
        records: Mapping[str, ShardRecord],
        live: Mapping[str, NodeInfo],
        leaving: frozenset[str],
    ) -> None:
        """Preferred leaders that spread leadership once a node has led too many groups for
        ``leader_imbalance_ms`` (a transient imbalance, or an operator's own transfers, are left
        alone). A preference holds for ``preference_ttl_ms``: the group's leader hands over to
        the preferred node within that time, once it is caught up, and then forgets it."""
        leaders = {g: n for g, (n, _term) in (await self._store.get_shard_leaders()).items()}
        now_ms = self._clock_ms()
        wanted = plan_leaders(records, leaders, live, self._settings.moves_max, leaving)
        if not wanted:
            self._imbalanced_since_ms = None
            return
        if self._imbalanced_since_ms is None:
            self._imbalanced_since_ms = now_ms
        if now_ms - self._imbalanced_since_ms < self._settings.leader_imbalance_ms:
            return
        expires_ms = now_ms + self._settings.preference_ttl_ms
        for gid, node in sorted(wanted.items()):
            value = node_states.preference_value(node, expires_ms)
            await self._store.put_setting(node_states.preferred_leader_key(gid), value)
            log.info(
                "placement controller: group %s: %s should lead it (leaders spread)", gid, node
            )
        self._imbalanced_since_ms = None

    def _report(self, records: Mapping[str, ShardRecord], live: Mapping[str, NodeInfo]) -> None:
        under = frozenset(g for g, r in records.items() if any(m not in live for m in r.members))
        metrics.UNDER_REPLICATED_GROUPS.set(len(under))
        for g in sorted(under - self._reported):
            gone = sorted(m for m in records[g].members if m not in live)
            log.warning("group %s is under-replicated: %s not live", g, ", ".join(gone))
        for g in sorted(self._reported - under):
            log.info("group %s has all its replicas live again", g)
        self._reported = under


class MembershipConverger:
    """Makes the Raft membership of every shard this process leads match its record."""

    def __init__(
        self,
        shards: Callable[[], Mapping[str, Shard]],
        records: Callable[[], Mapping[str, ShardRecord]],
        nodes: Callable[[], Mapping[str, NodeInfo]],
        settings: PlacementSettings,
        unmanaged: Callable[[], frozenset[str]],
        own_state: Callable[[], str] = lambda: "",
        read_setting: Callable[[str], Awaitable[str | None]] | None = None,
        clock_ms: Callable[[], int] = lambda: 0,
    ) -> None:
        """``own_state``: this node's state (node_states: "" when active); a leaving node
        hands the leadership of every shard it leads over, its home group's too."""
        self._shards = shards
        self._records = records
        self._nodes = nodes
        self._settings = settings
        self._unmanaged = unmanaged
        self._own_state = own_state
        self._read_setting = read_setting
        self._clock_ms = clock_ms

    async def membership_routine(self) -> None:
        while True:
            await asyncio.sleep(self._settings.interval_ms / 1000)
            await self.ensure_raft_members()

    async def ensure_raft_members(self) -> None:
        records, nodes = self._records(), self._nodes()
        leaving = self._own_state() in node_states.STATES
        for group_id, shard in sorted(self._shards().items()):
            record = records.get(group_id)
            if not shard.is_leader:
                continue
            if leaving and len(shard.status().in_sync_members) > 1:
                await self._hand_over(group_id, shard)
                continue
            if record is None:
                continue
            if group_id in self._unmanaged() or not await self.maybe_change(
                group_id, shard, record, nodes
            ):
                await self.maybe_hand_over(group_id, shard, record, nodes)

    async def _hand_over(self, group_id: str, shard: Shard) -> None:
        log.warning(
            "group %s: this node is %s: handing leadership over", group_id, self._own_state()
        )
        try:
            await shard.transfer_leadership(None)
        except ShardError as err:
            log.warning("group %s: leadership transfer failed: %s", group_id, err)

    async def maybe_hand_over(
        self, group_id: str, shard: Shard, record: ShardRecord, nodes: Mapping[str, NodeInfo]
    ) -> None:
        """Hand leadership to the group's preferred leader (the controller spreads leaders)
        once it is a caught-up member."""
        if self._read_setting is None:
            return
        try:
            value = await self._read_setting(node_states.preferred_leader_key(group_id))
        except MetadataError:
            return
        preferred = node_states.live_preference(value, self._clock_ms())
        node = nodes.get(preferred or "")
        if node is None or preferred not in record.members:
            return
        address = f"{node.raft_host}:{record.raft_ports[node.node_id]}"
        status = shard.status()
        if address == status.leader or address not in status.in_sync_members:
            return
        log.info("group %s: handing leadership to %s, its preferred leader", group_id, preferred)
        try:
            await shard.transfer_leadership(address)
        except ShardError as err:
            log.info("group %s: leadership transfer to %s failed: %s", group_id, preferred, err)

    async def maybe_change(
        self, group_id: str, shard: Shard, record: ShardRecord, nodes: Mapping[str, NodeInfo]
    ) -> bool:
        """-> whether a membership change was due (made or tried)."""
        status = shard.status()
        current = set(status.members)
        wanted = {
            f"{nodes[m].raft_host}:{record.raft_ports[m]}" for m in record.members if m in nodes
        }
        # A member of the record that is not live keeps its place until the controller
        # replaces it (its address is known only by its port).
        missing_ports = {record.raft_ports[m] for m in record.members if m not in nodes}
        wanted |= {a for a in current if int(a.rpartition(":")[2]) in missing_ports}
        step = membership_step(
            wanted,
            current,
            set(status.connected),
            set(status.in_sync_members),
            status.leader or "",
        )
        if step is None:
            return False
        op, address = step
        log.warning("group %s: membership %s %s (to match its record)", group_id, op, address)
        try:
            if op == "remove":
                await shard.remove_member(address)
            elif op == "add":
                await shard.add_member(address)
            else:
                await shard.transfer_leadership(address)
        except ShardError as err:
            log.warning("group %s: membership %s %s failed: %s", group_id, op, address, err)
        return True
