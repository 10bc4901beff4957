"""This node's link to the cluster metadata (etcd, or the embedded twin): its registration as a
leased key, the directory of live nodes, the record of who leads its shard, and queue placement.

Only metadata changes depend on the store: when etcd is away, publishing, leasing and every other
request on existing queues keep working from the Raft shard and the cached directory; creating or
deleting a queue fails with UNAVAILABLE (METADATA_UNAVAILABLE) until it is back. The background
routines converge (``ensure_*``) and retry on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from fluxmq.cluster import (
    AlreadyExists,
    MetadataError,
    MetadataStore,
    MetadataUnavailable,
    NodeInfo,
    NodeNotRegistered,
    Placement,
)
from fluxmq.core.errors import FluxError, queue_exists
from raft import Shard

log = logging.getLogger(__name__)

DIRECTORY_POLL_MS = 1000  # re-read the directory this often even without watch events
LEADER_CHECK_MS = 100
CLOSE_STEP_TIMEOUT_S = 2.0


def metadata_unavailable(what: str, err: MetadataError) -> FluxError:
    return FluxError(
        "METADATA_UNAVAILABLE",
        f"{what} needs the cluster metadata store, which cannot be reached ({err}); "
        "requests on existing queues keep working; retry when it is back",
        retriable=True,
        retry_after_ms=1000,
    )


class ClusterView:
    def __init__(
        self,
        store: MetadataStore,
        node: NodeInfo,
        shard: Shard,
        shard_id: str,
        *,
        node_ttl_ms: int,
        clock_ms: Callable[[], int],
    ) -> None:
        self.store = store
        self.node = node
        self._shard = shard
        self._shard_id = shard_id
        self._ttl_ms = node_ttl_ms
        self._clock_ms = clock_ms
        self.nodes: dict[str, NodeInfo] = {node.node_id: node}  # last directory read
        self.metadata_error = ""  # why the last metadata call failed ("" = it worked)
        self._registered = False
        self._published_term = -1
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Registers at once when the store answers; otherwise the routine keeps trying while
        the node serves (a node must start even while etcd is away)."""
        await self.maybe_register()
        for name, routine in (
            ("register", self.register_routine),
            ("directory", self.directory_routine),
            ("leader_record", self.leader_routine),
        ):
            self._tasks.append(asyncio.create_task(routine(), name=name))

    async def close(self) -> None:
        """Bounded: a metadata store that does not answer must not hold up a shutdown."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=CLOSE_STEP_TIMEOUT_S)
        with contextlib.suppress(MetadataError, TimeoutError):
            # A clean stop leaves the directory at once instead of after the TTL.
            await asyncio.wait_for(
                self.store.deregister_node(self.node.node_id), CLOSE_STEP_TIMEOUT_S
            )
        with contextlib.suppress(MetadataError, TimeoutError):
            await asyncio.wait_for(self.store.close(), CLOSE_STEP_TIMEOUT_S)

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
        try:
            if self._registered:
                await self.store.refresh_node(self.node.node_id)
            else:
                await self.store.register_node(self.node, self._ttl_ms)
                self._registered = True
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

    async def directory_routine(self) -> None:
        """Re-read on every watch event, and on a timer (the watch is only a hint)."""
        while True:
            await self.ensure_directory()
            try:
                watch = self.store.watch()
                try:
                    while True:
                        event = await asyncio.wait_for(anext(watch), DIRECTORY_POLL_MS / 1000)
                        if event.kind == "node":
                            await self.ensure_directory()
                except (TimeoutError, StopAsyncIteration):
                    pass
                finally:
                    await watch.aclose()
            except MetadataError as err:
                self._failed("directory watch", err)
                await asyncio.sleep(DIRECTORY_POLL_MS / 1000)

    def grpc_address_of(self, raft_address: str | None) -> str | None:
        """The gRPC address of the node serving ``raft_address`` (None: not in the directory)."""
        if not raft_address:
            return None
        for n in self.nodes.values():
            if f"{n.raft_host}:{n.raft_port_base}" == raft_address:
                return n.grpc_address
        return None

    def leader_grpc_address(self) -> str | None:
        if self._shard.is_leader:
            return self.node.grpc_address
        return self.grpc_address_of(self._shard.leader)

    # -- the shard's leader record ------------------------------------------------------------

    async def maybe_publish_leader(self) -> None:
        if not self._shard.is_leader:
            return
        term = self._shard.status().term
        if term == self._published_term:
            return
        try:
            await self.store.set_group_leader(self._shard_id, self.node.node_id, term)
            self._published_term = term
        except MetadataError as err:
            self._failed("leader record", err)

    async def leader_routine(self) -> None:
        while True:
            await asyncio.sleep(LEADER_CHECK_MS / 1000)
            await self.maybe_publish_leader()

    # -- placement --------------------------------------------------------------------------

    async def place_queue(self, name: str, exists_locally: Callable[[], bool]) -> None:
        """Record that ``name`` lives on this node's shard: an atomic create-if-absent, so two
        nodes racing to create a queue cannot both pass (the shard's log orders the rest)."""
        try:
            await self.store.create_placement(Placement(name, self._shard_id, self._clock_ms()))
            self._worked()
        except AlreadyExists:
            if exists_locally():
                raise queue_exists(name) from None
            # Placed, but the queue is not in the shard's state (yet): a create racing with
            # ours, or one that failed after placing. Propose anyway: the shard applies exactly
            # one CreateQueue for the name and refuses the other with QUEUE_EXISTS.
        except MetadataUnavailable as err:
            self._failed("queue placement", err)
            raise metadata_unavailable("CreateQueue", err) from None

    async def ensure_reachable(self, what: str) -> None:
        """Fail a metadata change before touching the shard when the store is away."""
        try:
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
