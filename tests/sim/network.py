"""The in-memory network of the simulation: a seeded ``SimNetwork`` and the pysyncobj
``Transport`` each simulated node speaks through (``SimTransport``).

Every message is pickled when sent and unpickled when delivered, so nodes share no objects and
a duplicate is a copy. A message may be dropped, delayed (latencies are drawn per message, so
later messages overtake earlier ones: reordering) or duplicated. A partition or a crash closes
the connections it cuts, as TCP does: each side is told its peer disconnected, and whatever was
in flight on the old connection is lost; a later connection never delivers an earlier one's
messages.

Two network modes (``Faults.draw``): ``tcp``, what raft/ runs on (each connection in order and
exactly once; messages lost only with their connection), and ``datagram`` (any message may be
dropped, duplicated or overtaken). In both, snapshot chunks keep TCP's guarantees: pysyncobj
appends them to a file in arrival order and has no way to detect a missing or repeated chunk.
"""

from __future__ import annotations

import heapq
import pickle
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pysyncobj.transport import Transport

from raft.outbox import Outbox


@dataclass(frozen=True)
class Faults:
    """Per-message fault probabilities and the latency range of one run."""

    drop_p: float = 0.02
    duplicate_p: float = 0.02
    latency_min_s: float = 0.001
    latency_max_s: float = 0.020
    # True: each connection delivers in order (TCP); False: a later message may overtake.
    fifo: bool = False

    @staticmethod
    def draw(rng: random.Random, mode: str) -> Faults:
        """A run's network. ``tcp``: what raft/ runs on, in order and exactly once per
        connection, messages lost only with their connection (crash, partition, reset), with
        latencies from a LAN to a congested one. ``datagram``: any message may also be
        dropped, duplicated or overtaken by a later one."""
        latency_max_s = rng.choice((0.002, 0.02, 0.08))
        if mode == "tcp":
            return Faults(0.0, 0.0, 0.001, latency_max_s, fifo=True)
        assert mode == "datagram", mode
        return Faults(
            drop_p=rng.choice((0.0, 0.01, 0.05, 0.15)),
            duplicate_p=rng.choice((0.0, 0.02, 0.1)),
            latency_min_s=0.001,
            latency_max_s=latency_max_s,
        )


@dataclass(order=True)
class _InFlight:
    # Ordered by due time, then by link and by the link's own send order: never by the order
    # in which different nodes' sends interleave (pysyncobj iterates sets of nodes, whose
    # order changes with PYTHONHASHSEED).
    due_s: float
    src: str
    dst: str
    seq: int
    epoch: int = field(compare=False)
    payload: bytes = field(compare=False)


def _is_chunk(message: Any) -> bool:
    return isinstance(message, dict) and ("serialized" in message or "transmission" in message)


def _link(a: str, b: str) -> frozenset[str]:
    return frozenset((a, b))


@dataclass
class NetworkStats:
    sent: int = 0
    delivered: int = 0
    dropped: int = 0
    duplicated: int = 0
    lost_with_connection: int = 0


class SimNetwork:
    """Nodes by id; links between them (up, or cut by a partition); messages in flight."""

    def __init__(self, seed: str, clock: Callable[[], float], faults: Faults) -> None:
        self._seed = seed
        # One random stream per directed link: a link's draws follow that link's sends only.
        self._rngs: dict[tuple[str, str], random.Random] = {}
        self._seqs: dict[tuple[str, str], int] = {}
        self._clock = clock
        self.faults = faults
        self._nodes: dict[str, SimTransport] = {}
        self._cut: set[frozenset[str]] = set()
        self._epoch: dict[frozenset[str], int] = {}  # a new connection per epoch
        self._fifo_due: dict[tuple[str, str], float] = {}
        self._queue: list[_InFlight] = []
        self.stats = NetworkStats()

    # -- topology -----------------------------------------------------------------------------

    def connected(self, a: str, b: str) -> bool:
        return a in self._nodes and b in self._nodes and _link(a, b) not in self._cut

    def attach(self, transport: SimTransport) -> None:
        """A node (re)starts: it connects to every peer it can reach."""
        me = transport.self_id
        assert me not in self._nodes, f"{me} is attached twice"
        self._nodes[me] = transport
        for peer in sorted(self._nodes):
            if peer != me and self.connected(me, peer):
                self._open(me, peer)

    def detach(self, node_id: str) -> None:
        """A node crashes: its connections close (peers notice at once, as with a RST)."""
        for peer in sorted(self._nodes):
            if peer != node_id and self.connected(node_id, peer):
                self._close(node_id, peer)
        del self._nodes[node_id]

    def partition(self, groups: list[set[str]]) -> None:
        """Cut every link between two different groups (a node in no group is cut off)."""
        group_of = {n: str(i) for i, g in enumerate(groups) for n in g}
        everyone = sorted(set(group_of) | set(self._nodes))
        for i, a in enumerate(everyone):
            for b in everyone[i + 1 :]:
                if group_of.get(a, "alone:" + a) != group_of.get(b, "alone:" + b):
                    self._cut_link(a, b)

    def reset(self, a: str, b: str) -> None:
        """The connection between ``a`` and ``b`` breaks (what was in flight is lost) and is
        made again at once, as a TCP transport reconnects."""
        if self.connected(a, b):
            self._close(a, b)
            self._open(a, b)

    def heal(self) -> None:
        for link in sorted(self._cut, key=sorted):
            self._cut.discard(link)
            a, b = sorted(link)
            if self.connected(a, b):
                self._open(a, b)

    @property
    def cut_links(self) -> int:
        return len(self._cut)

    def _cut_link(self, a: str, b: str) -> None:
        if _link(a, b) in self._cut:
            return
        if self.connected(a, b):
            self._close(a, b)
        self._cut.add(_link(a, b))

    def _open(self, a: str, b: str) -> None:
        self._nodes[a].peer_connected(b)
        self._nodes[b].peer_connected(a)

    def _close(self, a: str, b: str) -> None:
        link = _link(a, b)
        self._epoch[link] = self._epoch.get(link, 0) + 1
        self._fifo_due.pop((a, b), None)
        self._fifo_due.pop((b, a), None)
        self._nodes[a].peer_disconnected(b)
        self._nodes[b].peer_disconnected(a)

    # -- messages -----------------------------------------------------------------------------

    def send(self, src: str, dst: str, message: Any) -> bool:
        if not self.connected(src, dst):
            return False
        self.stats.sent += 1
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        epoch = self._epoch.get(_link(src, dst), 0)
        rng = self._rngs.get((src, dst))
        if rng is None:
            rng = self._rngs[(src, dst)] = random.Random(f"{self._seed}:{src}>{dst}")
        f = self.faults
        if f.fifo or _is_chunk(message):
            # In order and exactly once within this connection.
            due_s = max(self._arrival(rng), self._fifo_due.get((src, dst), 0.0))
            self._fifo_due[(src, dst)] = due_s
            self._enqueue(due_s, src, dst, epoch, payload)
            return True
        if rng.random() < f.drop_p:
            self.stats.dropped += 1
            return True
        self._enqueue(self._arrival(rng), src, dst, epoch, payload)
        if rng.random() < f.duplicate_p:
            self.stats.duplicated += 1
            self._enqueue(self._arrival(rng), src, dst, epoch, payload)
        return True

    def _arrival(self, rng: random.Random) -> float:
        f = self.faults
        return self._clock() + rng.uniform(f.latency_min_s, f.latency_max_s)

    def _enqueue(self, due_s: float, src: str, dst: str, epoch: int, payload: bytes) -> None:
        seq = self._seqs[(src, dst)] = self._seqs.get((src, dst), 0) + 1
        heapq.heappush(self._queue, _InFlight(due_s, src, dst, seq, epoch, payload))

    def deliver_due(self, messages_max: int = 100_000) -> int:
        """Deliver every message due by now (oldest first); -> how many arrived. The messages a
        node receives in one call are handled as frames read together: its answers leave after
        one flush (raft/outbox.py), as WireTransport sends them."""
        now = self._clock()
        due: list[_InFlight] = []
        while self._queue and self._queue[0].due_s <= now:
            assert len(due) < messages_max, "a delivery storm: more messages than a run sends"
            due.append(heapq.heappop(self._queue))
        by_node: dict[str, list[_InFlight]] = {}
        for m in due:
            by_node.setdefault(m.dst, []).append(m)
        delivered = 0
        for dst, messages in by_node.items():
            transport = self._nodes.get(dst)
            holding = transport.hold() if transport is not None else False
            try:
                for m in messages:
                    if not self._live(m):
                        self.stats.lost_with_connection += 1
                        continue
                    delivered += 1
                    self.stats.delivered += 1
                    self._nodes[m.dst].receive(m.src, pickle.loads(m.payload))
            finally:
                if holding and transport is not None:
                    transport.release()
        return delivered

    def _live(self, m: _InFlight) -> bool:
        """Whether the connection ``m`` was sent on is still the one up between its ends."""
        link = _link(m.src, m.dst)
        return self.connected(m.src, m.dst) and self._epoch.get(link, 0) == m.epoch

    @property
    def in_flight(self) -> int:
        return len(self._queue)


class SimTransport(Transport):  # type: ignore[misc]
    """pysyncobj's transport over a ``SimNetwork``. It sends through raft/'s ``Outbox``, as
    WireTransport does: the journal is durable before any message that promises what this node
    holds (acknowledgement, vote) leaves, and answers to messages received together leave after
    one flush; so the simulation checks the rule the product runs. ``bound_to(network)`` gives
    the class to pass as ``transport_class``."""

    network: ClassVar[SimNetwork]

    @classmethod
    def bound_to(cls, network: SimNetwork) -> type[SimTransport]:
        return type("BoundSimTransport", (cls,), {"network": network})

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self._journal = syncObj._SyncObj__raftLog
        self.self_id: str = selfNode.id
        self._peers: dict[str, Any] = {n.id: n for n in otherNodes}
        self._outbox = Outbox(lambda: self._journal.flush(), self._deliver)

    @property
    def flush_before_send(self) -> bool:
        return self._outbox.flush_before_send

    @flush_before_send.setter
    def flush_before_send(self, value: bool) -> None:
        self._outbox.flush_before_send = value

    def hold(self) -> bool:
        return self._outbox.hold()

    def release(self) -> None:
        self._outbox.release()

    # pysyncobj's Transport interface

    @property
    def ready(self) -> bool:
        return True

    def tryGetReady(self) -> None:
        pass

    def waitReady(self) -> None:
        pass

    def addNode(self, node: Any) -> None:
        if node.id == self.self_id or node.id in self._peers:
            return
        self._peers[node.id] = node
        if self.network.connected(self.self_id, node.id):
            self._onNodeConnected(node)

    def dropNode(self, node: Any) -> None:
        dropped = self._peers.pop(node.id, None)
        if dropped is not None:
            self._onNodeDisconnected(dropped)

    def send(self, node: Any, message: Any) -> bool:
        return self._outbox.send(node, message)

    def _deliver(self, node: Any, message: Any) -> bool:
        return self.network.send(self.self_id, node.id, message)

    def destroy(self) -> None:
        pass  # a simulated node is dropped, never closed: see Cluster.crash

    # driven by the network

    def peer_connected(self, peer_id: str) -> None:
        node = self._peers.get(peer_id)
        if node is not None:
            self._onNodeConnected(node)

    def peer_disconnected(self, peer_id: str) -> None:
        node = self._peers.get(peer_id)
        if node is not None:
            self._onNodeDisconnected(node)

    def receive(self, peer_id: str, message: Any) -> None:
        node = self._peers.get(peer_id)
        if node is not None:
            self._onMessageReceived(node, message)
