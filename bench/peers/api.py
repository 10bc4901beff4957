"""What the comparison harness needs of a broker: one adapter per broker, same workloads for all.

Every adapter gives the same durability promise for ``publish``: it returns only once the broker
has confirmed the messages the way that broker confirms a durable write (FluxMQ: Publish OK after
fsync on a majority; RabbitMQ: publisher confirm of a quorum queue, fsync'd on a majority; NATS
JetStream: the PubAck of an R3 file stream with ``sync_interval: always``). ``durability`` says it
in one sentence, and the results print it beside the numbers.

Workloads (``bench.peers.workloads``) only use this interface, so FluxMQ and its peers run the
same code paths on the client side: one asyncio process, the same payloads, the same pacing.

A payload's first 8 bytes are the send time (``time.perf_counter_ns()``, big-endian) so the
end-to-end workload can measure publish -> delivered latency without a side channel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Delivered:
    """One message handed to a consumer: its payload and what ``ack`` needs."""

    payload: bytes
    handle: Any  # adapter-specific: a receipt, a delivery tag, a JetStream message


class Adapter(Protocol):
    name: str  # "fluxmq", "rabbitmq", "nats"
    nodes: int  # 1 or 3
    durability: str  # who fsyncs when, in one sentence

    async def connect(self) -> None:
        """Open the client connection(s) to the running broker."""
        ...

    async def close(self) -> None: ...

    async def create_queue(self, queue: str, groups: Sequence[str]) -> None:
        """A durable, replicated (``nodes``-way) queue and one independent consumer group per
        name in ``groups``: every group gets every message (fan-out), consumers within a group
        compete. Called once per queue before any traffic; the queue is new."""
        ...

    async def publish(self, queue: str, payloads: Sequence[bytes]) -> None:
        """Publish ``payloads`` (one call = one batch; a batch of 1 is one message per call) and
        return when the broker confirmed every one durably. Raises on any refusal."""
        ...

    async def receive(
        self, queue: str, group: str, max_messages: int, wait_ms: int
    ) -> list[Delivered]:
        """Up to ``max_messages`` messages for ``group`` (leased / unacked until ``ack``),
        waiting up to ``wait_ms`` for the first one; [] when none came."""
        ...

    async def ack(self, queue: str, group: str, messages: Sequence[Delivered]) -> None:
        """Settle ``messages`` (received through ``group``); returns when the broker accepted
        the acknowledgement."""
        ...

    def server_pids(self) -> list[int]:
        """The broker's processes (for their CPU time in the results)."""
        ...


@runtime_checkable
class OffsetReader(Protocol):
    """What an adapter adds to take part in ``fanout_offsets``: groups that read a stream and
    keep only their position (Kafka's consumer groups, JetStream's AckNone consumers), with no
    acknowledgement per message. Adapters without it skip that workload."""

    async def create_stream(self, queue: str, groups: Sequence[str]) -> None:
        """A durable, replicated (``nodes``-way) stream and one reading group per name in
        ``groups``: every group reads every message from the start, its position kept by the
        broker or committed in the background; no message is acknowledged on its own."""
        ...

    async def read(self, queue: str, group: str, max_messages: int, wait_ms: int) -> list[bytes]:
        """The next up to ``max_messages`` payloads for ``group``, waiting up to ``wait_ms``
        for the first one; [] when none came."""
        ...


class Cluster(Protocol):
    """A running broker: ``start`` brings up ``nodes`` processes on loopback with fresh data
    directories and returns adapters' connection settings; ``stop`` leaves no process behind."""

    name: str
    nodes: int

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def adapter(self) -> Adapter: ...

    def versions(self) -> dict[str, str]:
        """Server and client library versions, for the results."""
        ...
