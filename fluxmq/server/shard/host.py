"""ShardHost: starting and stopping the shards this node runs, one way for all of them.

The node's first shard (from its configuration) and the shards placement assigns to it later
are built alike: a ``ShardRuntime`` over a shard and its state machine, started, then handed
to the router (and to the directory, which publishes each shard's leader). What a placed shard
needs to restart (its Raft address and peers) is kept in a spec file next to its store, so a
restarted node serves its shards even while etcd is away.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.shard.proposer import Advertised
from fluxmq.server.shard.runtime import ShardRuntime
from raft import Shard

if TYPE_CHECKING:
    from fluxmq.metadata.metadata import NodeInfo, ShardRecord
    from fluxmq.server.cluster_view import ClusterView
    from fluxmq.server.router import Router

log = logging.getLogger(__name__)

SPEC_FILE = "group.json"  # on-disk name kept from when shards were called groups


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """What a placed shard needs to start: its id, this node's Raft address in it, its peers."""

    shard_id: str
    raft_address: str
    peers: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"group_id": self.shard_id, "self": self.raft_address, "peers": list(self.peers)}

    @classmethod
    def from_json(cls, spec: dict[str, Any]) -> ShardSpec:
        return cls(str(spec["group_id"]), str(spec["self"]), tuple(spec["peers"]))


@dataclass(frozen=True, slots=True)
class OpenedShard:
    """A placed shard's pieces, opened but not started; ``close`` releases its store."""

    state: QueueStateMachine
    shard: Shard
    close: Callable[[], None]


# Opens the store and the Raft shard of a placed shard (None: it cannot, and said why).
OpenShard = Callable[[ShardSpec, str], "OpenedShard | None"]


def write_spec(directory: str, spec: ShardSpec) -> None:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, SPEC_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(spec.to_json(), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def _set_aside(directory: str, aside: str) -> bool:
    if not os.path.isdir(directory):
        return False
    os.makedirs(os.path.dirname(aside), exist_ok=True)
    os.replace(directory, aside)
    return True


def read_specs(root: str) -> list[ShardSpec]:
    out = []
    for shard_id in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        path = os.path.join(root, shard_id, SPEC_FILE)
        if os.path.exists(path):
            with open(path) as f:
                spec = ShardSpec.from_json(json.load(f))
            assert spec.shard_id == shard_id, (path, spec)
            out.append(spec)
    return out


class ShardHost:
    def __init__(
        self,
        router: Router,
        *,
        clock_ms: Callable[[], int],
        retention_interval_ms: int,
        grpc_address: str | None,
        directory: ClusterView | None,
        shards_dir: str,
        open_shard: OpenShard | None,
        owns: Callable[[str], bool] = lambda shard_id: True,
    ) -> None:
        """``owns``: whether this process runs a placed shard (a node's shard processes share
        its placed shards out; each restores only its own)."""
        self._router = router
        self._clock_ms = clock_ms
        self._retention_interval_ms = retention_interval_ms
        self._grpc_address = grpc_address
        self._directory = directory
        self._shards_dir = shards_dir
        self._open_shard = open_shard
        self._owns = owns
        self.running: list[tuple[ShardRuntime, Callable[[], None]]] = []

    def build(
        self, state: QueueStateMachine, shard: Shard, raft_address: str | None
    ) -> ShardRuntime:
        """The runtime of ``shard``, not started (the one way to build a shard's runtime)."""
        advertised = None
        if self._grpc_address is not None and raft_address is not None:
            # Each shard answers and records its own leader (not the first shard's).
            advertised = Advertised(self._grpc_address, raft_address)
        return ShardRuntime(
            state,
            shard,
            clock_ms=self._clock_ms,
            retention_interval_ms=self._retention_interval_ms,
            advertised=advertised,
            directory=self._directory,
        )

    async def run(self, runtime: ShardRuntime, close: Callable[[], None] = lambda: None) -> None:
        """Start ``runtime``, then register it with the directory and the router; ``close``
        releases what was opened for it, after it stops."""
        await runtime.start()
        self.running.append((runtime, close))
        # Registered once it runs: a shard that failed to start publishes no leader record.
        if self._directory is not None:
            self._directory.add_shard(runtime.shard_id, runtime.shard)
        self._router.add_shard(runtime)

    # -- placed shards ----------------------------------------------------------------------

    def _dir(self, shard_id: str) -> str:
        return os.path.join(self._shards_dir, shard_id)

    async def host(self, group: ShardRecord, nodes: dict[str, NodeInfo]) -> bool:
        """Placement made this node a member of ``group``'s shard: start it (-> started)."""
        assert self._directory is not None
        me = self._directory.node
        peers = []
        for member in group.members:
            if member == me.node_id:
                continue
            node = nodes.get(member)
            if node is None:
                return False  # not in the directory yet: the next pass tries again
            peers.append(f"{node.raft_host}:{group.raft_ports[member]}")
        spec = ShardSpec(
            group.group_id, f"{me.raft_host}:{group.raft_ports[me.node_id]}", tuple(sorted(peers))
        )
        write_spec(self._dir(spec.shard_id), spec)
        return await self._start_placed(spec)

    async def restore(self) -> None:
        """Start the placed shards this node ran before it stopped."""
        for spec in read_specs(self._shards_dir):
            if not self._owns(spec.shard_id):
                continue
            if await self._start_placed(spec) and self._directory is not None:
                self._directory.hosted.add(spec.shard_id)

    async def _start_placed(self, spec: ShardSpec) -> bool:
        if self._open_shard is None:
            return False
        opened = self._open_shard(spec, self._dir(spec.shard_id))
        if opened is None:
            return False
        await self.run(self.build(opened.state, opened.shard, spec.raft_address), opened.close)
        log.info(
            "hosting replication group %s (raft %s, peers %s)",
            spec.shard_id,
            spec.raft_address,
            ",".join(spec.peers) or "none",
        )
        return True

    async def unhost(self, shard_id: str) -> bool:
        """Placement moved ``shard_id``'s replica off this node (its record no longer lists
        the node, and its Raft membership dropped it): stop it and set its data aside, named
        by the time, so that a restart neither serves it nor loses it (-> it was running)."""
        found = [(r, c) for r, c in self.running if r.shard_id == shard_id]
        if not found:
            return False
        runtime, close = found[0]
        self.running.remove(found[0])
        self._router.remove_shard(shard_id)
        if self._directory is not None:
            self._directory.remove_shard(shard_id)
        await runtime.close()
        close()
        directory = self._dir(shard_id)
        # Outside the specs' directory, which restore() reads.
        aside = os.path.join(f"{self._shards_dir}.removed", f"{shard_id}-{self._clock_ms()}")
        if await asyncio.to_thread(_set_aside, directory, aside):
            log.warning(
                "replication group %s moved off this node: stopped; its data is kept in %s "
                "(delete it once the group is whole elsewhere)",
                shard_id,
                aside,
            )
        return True

    async def close(self) -> None:
        """Stop every shard, the last started first."""
        for runtime, close in reversed(self.running):
            await runtime.close()
            close()
        self.running.clear()
