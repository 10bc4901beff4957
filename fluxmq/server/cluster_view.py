"""This node's link to the cluster metadata (etcd, or the embedded twin): its registration as a
leased key, the directory of live nodes, the record of who leads each shard it hosts (the home
shard and every extra one, each under its own group id), and queue placement.

Only metadata changes depend on the store: when etcd is away, publishing, leasing and every other
request on existing queues keep working from the Raft shard and the cached directory; creating or
deleting a queue fails with UNAVAILABLE (METADATA_UNAVAILABLE) until it is back. The background
routines converge (``ensure_*``) and retry on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.errors import FieldViolation, FluxError, queue_exists
from fluxmq.metadata import (
    AlreadyExists,
    MetadataCorrupt,
    MetadataError,
    MetadataStore,
    MetadataUnavailable,
    NodeInfo,
    NodeNotRegistered,
    Placement,
    PortTaken,
    ShardRecord,
)
from fluxmq.server.placement import node_states
from fluxmq.server.placement.controller import (
    MembershipConverger,
    PlacementController,
    PlacementSettings,
)
from fluxmq.server.placement.operations import used_raft_ports
from fluxmq.server.placement.policy import free_port
from raft import Shard

log = logging.getLogger(__name__)

DIRECTORY_POLL_MS = 1000  # re-read the directory this often even without watch events
LEADER_CHECK_MS = 100
ROUTINE_RESTART_MS = 1000  # pause before restarting a background routine that failed
CLOSE_STEP_TIMEOUT_S = 2.0
SHARDS_PER_NODE_MAX = 16  # replication groups one node hosts (each is a Raft shard + a store)
PLACEMENT_CACHE_MAX = 100_000
PLACEMENT_PAGE = 1000
GROUP_CREATE_ATTEMPTS = 8
# A placed group whose record dropped this node is stopped after hearing from no leader this
# long (the leader stops replicating to a member once it removed it).
UNHOST_LEADERLESS_MS = 10_000
AUTO_PROVISION_SETTING = "auto_provision_groups"
GROUPS_PER_SIZE_SETTING = "groups_per_size"

HostShard = Callable[[ShardRecord, dict[str, NodeInfo]], Awaitable[bool]]
UnhostShard = Callable[[str], Awaitable[bool]]


def metadata_unavailable(what: str, err: MetadataError) -> FluxError:
    return FluxError(
        "METADATA_UNAVAILABLE",
        f"{what} needs the cluster metadata store, which cannot be reached ({err}); "
        "requests on existing queues keep working; retry when it is back",
        retriable=True,
        retry_after_ms=1000,
    )


def invalid_setting(key: str, problem: str, example: str = "true") -> FluxError:
    """A cluster setting in etcd that cannot be used: the operator's to fix, so the request
    that needs it fails naming the key (a retry cannot help until the value is fixed)."""
    return FluxError(
        "INVALID_CLUSTER_SETTING",
        f"the cluster setting {key} (etcd key <prefix>settings/{key}) is invalid: {problem}; "
        f"fix it, e.g. etcdctl put <prefix>settings/{key} {example}",
        metadata={"setting": key},
    )


def setting_bool(key: str, value: str) -> bool:
    """``true``/``false`` in any case, as the README writes them; anything else is refused
    (a typo must not silently mean false)."""
    lowered = value.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    shown = value if len(value) <= 40 else value[:40] + "..."
    raise invalid_setting(key, f"{shown!r} is not true or false")


async def _supervised(name: str, routine: Callable[[], Awaitable[None]]) -> None:
    """Runs a background routine for the node's life. The routines handle what they expect
    (metadata errors); anything else is a bug that must be seen, but must not leave the node
    blind to directory, group and placement changes until it restarts: log it, pause, restart."""
    while True:
        try:
            await routine()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("cluster %s routine failed; restarting it", name)
            await asyncio.sleep(ROUTINE_RESTART_MS / 1000)


class ClusterView:
    def __init__(
        self,
        store: MetadataStore,
        node: NodeInfo,
        shard: Shard | None,
        shard_id: str,
        *,
        node_ttl_ms: int,
        clock_ms: Callable[[], int],
        peers: tuple[str, ...] = (),
        auto_provision_groups: bool = False,
        groups_per_size: int = 1,
        owns: Callable[[str], bool] = lambda group_id: True,
        placement: PlacementSettings | None = None,
        registers: bool | None = None,
    ) -> None:
        """``shard``: the home shard (None: a process that hosts only the placed groups
        ``owns`` gives it). ``registers``: this process registers the node and may run the
        placement controller (default: it has the home shard; a node that joined without a
        home group registers from its first shard process). ``placement``: the placement
        controller's settings (None: groups are never moved)."""
        self.store = store
        self.node = node
        self._shard_id = shard_id
        self._ttl_ms = node_ttl_ms
        self._clock_ms = clock_ms
        self.nodes: dict[str, NodeInfo] = {node.node_id: node}  # last directory read
        self.metadata_error = ""  # why the last metadata call failed ("" = it worked)
        self._registered = False
        self.joined = False  # registered once: the node is part of the cluster from then on
        self._start_state_checked = False  # a leaving state of the stop before this start
        # Every shard this node runs a replica of (group id -> shard): each publishes its leader.
        self._shards: dict[str, Shard] = {} if shard is None else {shard_id: shard}
        # The node's registration: one process of the node (the home shard's, when it has one).
        self.registers = shard is not None if registers is None else registers
        # The home group's record: written by its members only.
        self._hosts_home = shard is not None
        self._owns = owns
        self._published_terms: dict[str, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._peers = peers  # raft addresses of the home group's other members
        self._auto_provision = auto_provision_groups
        self._groups_per_size = groups_per_size
        self.shard_records: dict[str, ShardRecord] = {}  # last read of every replication group
        self.leaders: dict[str, tuple[str, int]] = {}  # group -> (node id, term)
        self._placements: dict[str, str] = {}  # queue -> group, as read or written
        self.hosted: set[str] = {shard_id}  # groups this node runs a shard of
        self._hosting = asyncio.Lock()
        # Set by the composition root: starts this node's replica of a group (-> started),
        # and stops one placement moved away (-> it was running).
        self.host_shard: HostShard | None = None
        self.unhost_shard: UnhostShard | None = None
        # Placed group -> since when its record no longer lists this node and it has no leader.
        self._unlisted_since_ms: dict[str, int] = {}
        self._placement = placement
        unmanaged = lambda: frozenset({self._shard_id})  # noqa: E731 - the static home group
        self.controller = (
            PlacementController(store, node.node_id, placement, clock_ms, unmanaged)
            if placement is not None and self.registers
            else None
        )
        self.converger = (
            MembershipConverger(
                lambda: dict(self._shards),
                lambda: self.shard_records,
                lambda: self.nodes,
                placement,
                unmanaged,
                lambda: self.own_state,
                store.get_setting,
                clock_ms,
            )
            if placement is not None
            else None
        )
        self.own_state = ""  # this node's state (placement.node_states), as last read

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Registers at once when the store answers; otherwise the routine keeps trying while
        the node serves (a node must start even while etcd is away)."""
        await self.maybe_register()
        routines = [("directory", self.directory_routine), ("leader_record", self.leader_routine)]
        if self.registers:
            routines.append(("register", self.register_routine))
        if self.controller is not None:
            routines.append(("placement_controller", self.controller.controller_routine))
        if self.converger is not None:
            routines.append(("membership", self.converger.membership_routine))
        for name, routine in routines:
            self._tasks.append(asyncio.create_task(_supervised(name, routine), name=name))

    async def close(self) -> None:
        """Bounded: a metadata store that does not answer must not hold up a shutdown."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=CLOSE_STEP_TIMEOUT_S)
        with contextlib.suppress(MetadataError, TimeoutError):
            # A clean stop leaves the directory at once instead of after the TTL.
            if self.registers:
                await asyncio.wait_for(
                    self.store.deregister_node(self.node.node_id), CLOSE_STEP_TIMEOUT_S
                )
        with contextlib.suppress(MetadataError, TimeoutError):
            await asyncio.wait_for(self.store.close(), CLOSE_STEP_TIMEOUT_S)

    @property
    def placement_moves_max(self) -> int:
        return self._placement.moves_max if self._placement is not None else 1

    @property
    def home_shard_id(self) -> str:
        """The group this node was configured with (--peers): placement leaves it alone."""
        return self._shard_id

    @property
    def session_up(self) -> bool:
        """Registered under a live etcd lease, and etcd answered the last call."""
        return self._registered and not self.metadata_error

    def _failed(self, what: str, err: MetadataError) -> None:
        if not self.metadata_error:
            log.warning("cluster metadata unavailable (%s): %s", what, err)
        self.metadata_error = f"{what}: {err}"

    def _worked(self) -> None:
        if self.metadata_error:
            log.info("cluster metadata reachable again")
        self.metadata_error = ""

    # -- registration -----------------------------------------------------------------------

    async def maybe_register(self) -> None:
        if not self.registers:  # the node's first shard process registers it
            await self.ensure_directory()
            return
        try:
            if self._registered:
                await self.store.refresh_node(self.node.node_id)
            else:
                await self.store.register_node(self.node, self._ttl_ms)
                self._registered = True
                self.joined = True
            if not self._start_state_checked:
                # Once per start: a "leaving" written by the stop before it ends here, one
                # written by a stop of this run (later) stays.
                if await node_states.ensure_not_leaving(self.store, self.node.node_id):
                    log.warning(
                        "%s was leaving (drained by its own stop): active again",
                        self.node.node_id,
                    )
                self._start_state_checked = True
            self._worked()
        except NodeNotRegistered:
            # The lease lapsed (etcd was away longer than the TTL): register again.
            self._registered = False
        except MetadataError as err:
            self._failed("node registration", err)

    async def register_routine(self) -> None:
        while True:
            await asyncio.sleep(self._ttl_ms / 3 / 1000)
            await self.maybe_register()

    # -- directory --------------------------------------------------------------------------

    async def ensure_directory(self) -> None:
        try:
            nodes = await self.store.list_nodes()
        except MetadataError as err:
            self._failed("node directory", err)
            return
        self.nodes = {n.node_id: n for n in nodes}
        self.nodes.setdefault(self.node.node_id, self.node)
        if not self.registers:  # joined once etcd answers (the first shard process registers)
            self._registered = self.joined = True
            self._worked()

    async def directory_routine(self) -> None:
        """Re-read on every watch event, and on a timer (the watch is only a hint)."""
        while True:
            await self.ensure_directory()
            await self.ensure_shards()
            await self.ensure_placements()
            try:
                watch = self.store.watch()
                try:
                    while True:
                        event = await asyncio.wait_for(anext(watch), DIRECTORY_POLL_MS / 1000)
                        if event.kind == "node":
                            await self.ensure_directory()
                        elif event.kind in ("group", "leader"):
                            await self.ensure_shards()
                        elif event.kind == "placement":
                            if event.resync:
                                await self.ensure_placements()
                            elif event.group_id:
                                self._remember(event.key, event.group_id)
                            else:
                                await self.maybe_refresh_placement(event.key, event.deleted)
                except (TimeoutError, StopAsyncIteration):
                    pass
                finally:
                    await watch.aclose()
            except MetadataError as err:
                self._failed("directory watch", err)
                await asyncio.sleep(DIRECTORY_POLL_MS / 1000)

    # -- replication groups -----------------------------------------------------------------

    async def ensure_shards(self) -> None:
        """Converge: the group records and leaders are fresh, the home group is recorded, and
        this node runs a replica of every group that lists it."""
        try:
            groups = {v.value.group_id: v.value for v in await self.store.list_shards()}
            self.leaders = await self.store.get_shard_leaders()
        except MetadataError as err:
            self._failed("replication groups", err)
            return
        self.shard_records = groups
        with contextlib.suppress(MetadataError):
            self.own_state = (await node_states.read_states(self.store, [self.node.node_id])).get(
                self.node.node_id, ""
            )
        if self._shard_id not in groups and self._hosts_home:
            await self.maybe_record_home_shard()
        async with self._hosting:  # two passes at once would open a group's store twice
            await self._maybe_unhost(groups)
            for gid, group in sorted(groups.items()):
                if gid in self.hosted or self.node.node_id not in group.members:
                    continue
                if not self._owns(gid):
                    continue  # another shard process of this node runs it
                if self.host_shard is None or len(self.hosted) >= SHARDS_PER_NODE_MAX:
                    continue
                if await self.host_shard(group, dict(self.nodes)):
                    self.hosted.add(gid)

    async def _maybe_unhost(self, groups: dict[str, ShardRecord]) -> None:
        """Stop the placed groups whose record no longer lists this node once this replica has
        been cut off for UNHOST_LEADERLESS_MS: no leader, or connected to no other member. The
        leader stops replicating to a member it removed and the members drop its links
        (pysyncobj does not tell the member; a member connected to nobody never campaigns, so
        it keeps naming its old leader), while a member still counted hears from the leader.
        Before that, the leader may still need this replica."""
        if self.unhost_shard is None:
            return
        me, now_ms = self.node.node_id, self._clock_ms()
        for gid in sorted(self.hosted - {self._shard_id}):
            group = groups.get(gid)
            shard = self._shards.get(gid)
            if group is not None and shard is not None and me in group.members:
                wanted = f"{self.node.raft_host}:{group.raft_ports[me]}"
                if shard.status().members[0] != wanted:
                    # Placed here again, on another port, before the replica that left was
                    # stopped: that one is no member any more (its leader removes it as a dead
                    # one); it makes way for the new replica, which starts from nothing.
                    if await self.unhost_shard(gid):
                        self.hosted.discard(gid)
                    continue
            if group is None or me in group.members or shard is None:
                self._unlisted_since_ms.pop(gid, None)
                continue
            if shard.leader is not None and len(shard.status().connected) > 1:
                self._unlisted_since_ms.pop(gid, None)
                continue
            since = self._unlisted_since_ms.setdefault(gid, now_ms)
            if now_ms - since < UNHOST_LEADERLESS_MS:
                continue
            if await self.unhost_shard(gid):
                self.hosted.discard(gid)
                self._unlisted_since_ms.pop(gid, None)

    def remove_shard(self, group_id: str) -> None:
        """A shard stopped on this node: its leader is no longer published."""
        self._shards.pop(group_id, None)
        self._published_terms.pop(group_id, None)

    async def maybe_record_home_shard(self) -> None:
        """The static group this node started with goes into the metadata once every member
        is in the directory (so that it has node ids)."""
        by_raft = {f"{n.raft_host}:{n.raft_port_base}": n for n in self.nodes.values()}
        own = f"{self.node.raft_host}:{self.node.raft_port_base}"
        members = [by_raft.get(a) for a in (own, *self._peers)]
        if any(m is None for m in members):
            return  # a member is not registered yet: the next pass tries again
        known = [m for m in members if m is not None]
        group = ShardRecord(
            group_id=self._shard_id,
            members=tuple(sorted(m.node_id for m in known)),
            raft_ports={m.node_id: m.raft_port_base for m in known},
            factor=len(known),
            created_ms=self._clock_ms(),
        )
        try:
            await self.store.create_shard(group)
        except AlreadyExists:
            pass
        except MetadataError as err:
            self._failed("recording the home group", err)
            return
        self.shard_records[group.group_id] = group

    def is_member(self, group_id: str) -> bool:
        """Whether this node runs a replica of ``group_id`` (as the last read of the groups
        says)."""
        group = self.shard_records.get(group_id)
        return group is not None and self.node.node_id in group.members

    def address_for_shard(self, group_id: str) -> str | None:
        """A node that serves ``group_id``: its leader when known and alive, else a member."""
        leader = self.leaders.get(group_id)
        if leader is not None and leader[0] in self.nodes:
            return self.nodes[leader[0]].grpc_address
        group = self.shard_records.get(group_id)
        for member in group.members if group is not None else ():
            if member in self.nodes and member != self.node.node_id:
                return self.nodes[member].grpc_address
        return None

    async def shard_of(self, queue: str) -> str | None:
        """The group a queue is placed on (None: placed nowhere)."""
        cached = self._placements.get(queue)
        if cached is not None:
            return cached
        try:
            placement = await self.store.get_placement(queue)
            self._worked()
        except MetadataUnavailable as err:
            self._failed("queue placement", err)
            raise metadata_unavailable(
                f"a request for queue {queue!r} (not hosted on this node)", err
            ) from None
        if placement is None:
            return None
        self._remember(queue, placement.group_id)
        return placement.group_id

    async def ensure_placements(self) -> None:
        """The whole placement table, read page by page (bounded): routing and the load counts
        of least-loaded placement use it; watch events keep it fresh."""
        table: dict[str, str] = {}
        after = ""
        try:
            for _ in range(PLACEMENT_CACHE_MAX // PLACEMENT_PAGE + 1):
                page = await self.store.list_placements("", after, PLACEMENT_PAGE)
                table.update((p.queue, p.group_id) for p in page)
                if len(page) < PLACEMENT_PAGE or len(table) >= PLACEMENT_CACHE_MAX:
                    break
                after = page[-1].queue
        except MetadataError as err:
            self._failed("queue placements", err)
            return
        self._placements = table

    async def maybe_refresh_placement(self, queue: str, deleted: bool) -> None:
        if deleted:
            self._placements.pop(queue, None)
            return
        try:
            placement = await self.store.get_placement(queue)
        except MetadataError:
            self._placements.pop(queue, None)  # re-read on demand
            return
        if placement is not None:
            self._remember(queue, placement.group_id)

    def _remember(self, queue: str, group_id: str) -> None:
        if queue not in self._placements and len(self._placements) >= PLACEMENT_CACHE_MAX:
            return  # past the bound: looked up in the store on demand
        self._placements[queue] = group_id

    def grpc_address_of(self, raft_address: str | None) -> str | None:
        """The gRPC address of the node serving ``raft_address``, the Raft endpoint of its home
        shard or of any group it is a member of (None: not in the directory)."""
        if not raft_address:
            return None
        for n in self.nodes.values():
            if f"{n.raft_host}:{n.raft_port_base}" == raft_address:
                return n.grpc_address
        for group in self.shard_records.values():
            for node_id, port in group.raft_ports.items():
                member = self.nodes.get(node_id)
                if member is not None and f"{member.raft_host}:{port}" == raft_address:
                    return member.grpc_address
        return None

    # -- the shards' leader records -------------------------------------------------------------

    def add_shard(self, group_id: str, shard: Shard) -> None:
        """A shard started on this node: its leader is published under ``group_id`` too."""
        self._shards[group_id] = shard

    async def maybe_publish_leader(self) -> None:
        """Every shard this node leads records (this node, term) under its own group id, so
        that nodes outside a group forward to the group's leader, not to the home shard's."""
        for group_id, shard in list(self._shards.items()):
            if not shard.is_leader:
                continue
            term = shard.status().term
            if term == self._published_terms.get(group_id):
                continue
            try:
                await self.store.set_shard_leader(group_id, self.node.node_id, term)
                self._published_terms[group_id] = term
            except MetadataError as err:
                self._failed("leader record", err)
                return

    async def leader_routine(self) -> None:
        while True:
            await asyncio.sleep(LEADER_CHECK_MS / 1000)
            await self.maybe_publish_leader()

    # -- placement --------------------------------------------------------------------------

    async def place_queue(
        self, config: pb.QueueConfig, exists_in: Callable[[str], bool | None]
    ) -> str:
        """Choose the queue's group and record it with an atomic create-if-absent, so two
        nodes racing to create a queue cannot both pass (the group's log orders the rest).
        ``exists_in(group)``: whether a hosted group's state has the queue (None: not hosted).
        -> the group id the queue is placed on."""
        name = config.name
        try:
            existing = await self.store.get_placement(name)
            if existing is None:
                group_id = await self._choose_shard(config)
                try:
                    await self.store.create_placement(Placement(name, group_id, self._clock_ms()))
                except AlreadyExists:
                    existing = await self.store.get_placement(name)
            if existing is not None:
                group_id = existing.group_id
                if exists_in(group_id):
                    raise queue_exists(name)
                # Placed, but not in the group's state (yet): a create racing with ours, or one
                # that failed after placing. Go on: the group's log applies exactly one
                # CreateQueue for the name and refuses the other with QUEUE_EXISTS.
            self._worked()
        except MetadataUnavailable as err:
            self._failed("queue placement", err)
            raise metadata_unavailable("CreateQueue", err) from None
        self._remember(name, group_id)
        return group_id

    async def _choose_shard(self, config: pb.QueueConfig) -> str:
        """Explicit ``replication.group``; else the least loaded group of the right size; else
        a new group when auto-provisioning is on. The group table is the one the watch keeps
        fresh; it is re-read only when it does not know what the request names."""
        explicit = config.replication.group
        if not self.shard_records or (explicit and explicit not in self.shard_records):
            await self.ensure_shards()
        if not self.shard_records:
            return self._shard_id  # the home group is not recorded yet: it is the only one
        factor = config.replication.factor
        if explicit:
            group = self.shard_records.get(explicit)
            if group is None:
                raise FluxError(
                    "REPLICATION_GROUP_NOT_FOUND",
                    f"no replication group {explicit!r} (groups: "
                    f"{', '.join(sorted(self.shard_records))})",
                    violations=(
                        FieldViolation("config.replication.group", "not a replication group"),
                    ),
                )
            if factor and factor != len(group.members):
                raise FluxError(
                    "REPLICATION_UNSATISFIABLE",
                    f"group {explicit!r} has {len(group.members)} replicas, not {factor}",
                    violations=(
                        FieldViolation("config.replication.factor", "differs from the group's"),
                    ),
                )
            return explicit
        size = factor or len(
            self.shard_records.get(
                self._shard_id, self.shard_records[min(self.shard_records)]
            ).members
        )
        fitting = sorted(g for g, info in self.shard_records.items() if len(info.members) == size)
        if not fitting:
            await self.ensure_shards()  # maybe one was made a moment ago elsewhere
            fitting = sorted(
                g for g, info in self.shard_records.items() if len(info.members) == size
            )
        if (
            fitting
            and len(fitting) < await self._groups_wanted()
            and await self._auto_provisioning()
        ):
            # Fewer groups of this size than wanted: a new one, so that queues of one factor
            # spread over several groups (and each node's shard processes).
            return await self._provision_shard(size)
        if fitting:
            load = {g: 0 for g in fitting}
            for placed in self._placement_counts().items():
                if placed[0] in load:
                    load[placed[0]] = placed[1]
            return min(fitting, key=lambda g: (load[g], g))
        if await self._auto_provisioning():
            return await self._provision_shard(size)
        raise FluxError(
            "REPLICATION_UNSATISFIABLE",
            f"no replication group has {size} replicas (sizes: "
            f"{sorted({len(g.members) for g in self.shard_records.values()})}); enable the cluster "
            f"setting {AUTO_PROVISION_SETTING} or pick a factor of an existing group",
            violations=(FieldViolation("config.replication.factor", "no group of that size"),),
        )

    def _placement_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for group_id in self._placements.values():
            counts[group_id] = counts.get(group_id, 0) + 1
        return counts

    async def _groups_wanted(self) -> int:
        """How many groups of one size auto-provisioning makes before it reuses them."""
        try:
            value = await self.store.get_setting(GROUPS_PER_SIZE_SETTING)
        except MetadataCorrupt as err:
            raise invalid_setting(GROUPS_PER_SIZE_SETTING, str(err)) from None
        if value is None:
            return self._groups_per_size
        text = value.strip()
        if not text.isdigit() or not 1 <= int(text) <= SHARDS_PER_NODE_MAX:
            shown = value if len(value) <= 40 else value[:40] + "..."
            raise invalid_setting(
                GROUPS_PER_SIZE_SETTING, f"{shown!r} is not a number of groups 1..16", "2"
            )
        return int(text)

    async def _auto_provisioning(self) -> bool:
        try:
            value = await self.store.get_setting(AUTO_PROVISION_SETTING)
        except MetadataCorrupt as err:
            raise invalid_setting(AUTO_PROVISION_SETTING, str(err)) from None
        return (
            self._auto_provision if value is None else setting_bool(AUTO_PROVISION_SETTING, value)
        )

    async def _provision_shard(self, size: int) -> str:
        """A new group of ``size`` live nodes that host the fewest groups, on distinct nodes."""
        live = sorted(self.nodes.values(), key=lambda n: n.node_id)
        if len(live) < size:
            raise FluxError(
                "REPLICATION_UNSATISFIABLE",
                f"a group of {size} replicas needs {size} live nodes; {len(live)} are up",
                retriable=True,
            )
        hosting = {n.node_id: 0 for n in live}
        for g in self.shard_records.values():
            for m in g.members:
                if m in hosting:
                    hosting[m] += 1
        members = sorted(live, key=lambda n: (hosting[n.node_id], n.node_id))[:size]
        numbers = [int(g[1:]) for g in self.shard_records if g[:1] == "g" and g[1:].isdigit()]
        number = max(numbers, default=0) + 1
        for _ in range(GROUP_CREATE_ATTEMPTS):
            # Ports come from the claims in the store, which the create below makes atomically
            # with the record: a node provisioning at the same time cannot take the same one.
            used = await used_raft_ports(self.store, self.shard_records.values())
            ports = {n.node_id: free_port(n, used.get(n.node_id, set())) for n in members}
            group = ShardRecord(
                group_id=f"g{number}",
                members=tuple(sorted(n.node_id for n in members)),
                raft_ports=ports,
                factor=size,
                created_ms=self._clock_ms(),
            )
            try:
                await self.store.create_shard(group)
            except PortTaken as taken:
                log.info("provisioning %s: %s; choosing again", group.group_id, taken)
                continue
            except AlreadyExists:
                number += 1
                continue
            log.info("provisioned replication group %s on %s", group.group_id, group.members)
            self.shard_records[group.group_id] = group
            return group.group_id
        raise FluxError(
            "GROUP_UNAVAILABLE", "could not provision a replication group", retriable=True
        )

    async def place_dead_letter_queue(self, dlq: str, group_id: str) -> None:
        """A DLQ is created on demand by its origin's group, so it is placed there too."""
        try:
            try:
                await self.store.create_placement(Placement(dlq, group_id, self._clock_ms()))
            except AlreadyExists:
                existing = await self.store.get_placement(dlq)
                if existing is not None and existing.group_id != group_id:
                    raise FluxError(
                        "REPLICATION_UNSATISFIABLE",
                        f"dead_letter_queue {dlq!r} lives on group {existing.group_id!r}; a "
                        f"queue on {group_id!r} needs its DLQ in the same group",
                        violations=(
                            FieldViolation("config.dead_letter_queue", "on another group"),
                        ),
                    ) from None
        except MetadataUnavailable as err:
            self._failed("queue placement", err)
            raise metadata_unavailable("CreateQueue", err) from None
        self._remember(dlq, group_id)

    async def ensure_reachable(self, what: str) -> None:
        """Fail a metadata change before touching the shard when the store is away."""
        try:
            with contextlib.suppress(MetadataCorrupt):  # a reachability probe: any answer will do
                await self.store.get_setting("cluster_name")
            self._worked()
        except MetadataUnavailable as err:
            self._failed(what, err)
            raise metadata_unavailable(what, err) from None

    async def unplace_queue(self, name: str) -> None:
        try:
            await self.store.delete_placement(name)
        except MetadataError as err:
            log.warning("queue %r deleted but its placement record stays: %s", name, err)
