"""Channels to the broker nodes, per-call deadlines, retries and failover, the leader cache.

One :class:`Transport` per client. It keeps one ``grpc.aio`` channel per node address (opened
on first use) and sends each unary call:

- to the cached leader of the call's queue, if a previous answer named one (successful
  responses carry the gRPC address of the queue's group leader in the trailing metadata
  ``x-fluxmq-leader``; any node also works, it forwards), else to the current seed;
- with a deadline (``timeout_s`` per attempt);
- again, after an exponential backoff with full jitter (at least the broker's ``RetryInfo``
  delay), only when the error is retriable *and* repeating the call cannot change the outcome:
  the broker marked it retriable (``ErrorInfo`` metadata ``retriable=true``; for calls that are
  not idempotent, not when the outcome is unknown), or the node could not be reached
  (UNAVAILABLE without a status; a call that is not idempotent only when the connection was
  refused, so nothing was sent), or the client's deadline passed on an idempotent call;
- to the leader a NOT_LEADER answer names (``ErrorInfo`` metadata ``leader``: its gRPC
  address), at once and remembered as the queue's leader, rather than to the same node again;
  a NOT_LEADER that names no leader (an election is on) is retried after the advised delay;
- to the next address after UNAVAILABLE or a passed deadline (failover), forgetting a cached
  leader that failed;
- to another node at once after NODE_SHUTTING_DOWN (the node got SIGTERM and ended the call
  before it leased or read anything); that node is then skipped, as seed, cached or
  redirected leader, for ``SHUTTING_DOWN_AVOID_S``;
- after the advised delay when the broker refused the call for now (RESOURCE_EXHAUSTED with a
  ``RetryInfo``, e.g. RATE_LIMITED: nothing was done, so any call may repeat), within the same
  attempt budget; a delay longer than ``RetryPolicy.max_retry_delay_s`` is not waited for (the
  error is raised, its ``retry_after_ms`` says when to come back).

Every call carries the client's metadata (``authorization: Bearer <key>`` with an API key), and
every channel — seeds, discovered nodes, leaders — is opened with the client's credentials (TLS
when configured); see :mod:`fluxmq.client._security`.

Idempotent ("safe") calls: reads, acks, nacks, lease extensions, membership calls, and
publishes whose messages all have idempotency keys (the SDK sets them).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import grpc

from fluxmq._pb.v1 import admin_pb2_grpc, queue_pb2_grpc
from fluxmq.client._security import Credentials
from fluxmq.client.errors import FluxMQError, from_rpc_error

log = logging.getLogger("fluxmq.client")

LEADER_KEY = "x-fluxmq-leader"
# Outcome unknown: the request may have been applied; only idempotent calls repeat it.
MAYBE_APPLIED = frozenset({"OUTCOME_UNKNOWN", "REPLICATION_TIMEOUT"})
SHUTTING_DOWN = "NODE_SHUTTING_DOWN"
# A node that answered NODE_SHUTTING_DOWN is gone or restarted well within this; until then it
# only ends calls, even if it still leads a group for a moment during its hand-over.
SHUTTING_DOWN_AVOID_S = 10.0
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # A restarted node is found again within a second (gRPC's default backoff grows to 2 min).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

Service = Literal["queue", "admin"]


NODES_TIMED_MAX = 256


@dataclass
class NodeLatency:
    """Calls to one node as the client timed them (each attempt, answered or failed)."""

    calls: int = 0
    errors: int = 0
    seconds_total: float = 0.0
    seconds_max: float = 0.0

    @property
    def mean_ms(self) -> float:
        return 1000 * self.seconds_total / self.calls if self.calls else 0.0

    def observe(self, seconds: float, ok: bool) -> None:
        self.calls += 1
        self.errors += 0 if ok else 1
        self.seconds_total += seconds
        self.seconds_max = max(self.seconds_max, seconds)


@dataclass
class PublishCounters:
    """Every publish pipeline of one client adds to these (``AsyncClient.stats()``)."""

    requests_sent: int = 0
    messages_sent: int = 0
    bytes_sent: int = 0
    requests_split: int = 0
    requests_streamed: int = 0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts per call (the first included) and the backoff between them: attempt ``n``
    (from 1) waits a uniformly random time in ``[0, min(max_backoff_s, initial_backoff_s *
    multiplier ** (n - 1))]`` ("full jitter"), or the broker's RetryInfo delay if longer; a
    RetryInfo delay over ``max_retry_delay_s`` ends the retries (the error is raised).
    The defaults ride out a node restart or a leader election (~5 s of retries)."""

    max_attempts: int = 10
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    max_retry_delay_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0 or self.multiplier < 1:
            raise ValueError("backoffs must be >= 0 and multiplier >= 1")
        if self.max_retry_delay_s < 0:
            raise ValueError("max_retry_delay_s must be >= 0")

    def backoff_s(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1 = the first retry)."""
        cap = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (retry - 1))
        return random.uniform(0, cap)


NO_RETRY = RetryPolicy(max_attempts=1)


def refused_for_now(err: FluxMQError) -> bool:
    """RESOURCE_EXHAUSTED with a RetryInfo (RATE_LIMITED...): the call was turned away before
    anything was done, and may come back after the advised delay."""
    return err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.retry_after_ms is not None


def should_retry(err: FluxMQError, safe: bool) -> bool:
    """Whether repeating the call can help and cannot do harm."""
    if refused_for_now(err):
        return True
    if err.from_broker:
        return err.retriable and (safe or err.reason not in MAYBE_APPLIED)
    if err.code == grpc.StatusCode.UNAVAILABLE:
        # Connection refused: the request never left this process.
        return safe or "failed to connect" in err.message.lower()
    if err.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return safe
    return err.retriable and safe


def fails_over(err: FluxMQError) -> bool:
    """Whether the next attempt should go to another node."""
    return err.code == grpc.StatusCode.UNAVAILABLE or (
        err.code == grpc.StatusCode.DEADLINE_EXCEEDED and not err.from_broker
    )


class _Node:
    __slots__ = ("address", "admin", "channel", "queue")

    def __init__(self, address: str, credentials: Credentials) -> None:
        self.address = address
        self.channel = credentials.channel(address, CHANNEL_OPTIONS)
        self.queue = queue_pb2_grpc.QueueServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)  # type: ignore[no-untyped-call]


class Transport:
    def __init__(
        self,
        addresses: str | Iterable[str],
        *,
        timeout_s: float,
        retry: RetryPolicy,
        credentials: Credentials | None = None,
    ) -> None:
        seeds = [addresses] if isinstance(addresses, str) else list(addresses)
        seeds = [a.strip() for s in seeds for a in s.split(",") if a.strip()]
        if not seeds:
            raise ValueError("at least one broker address is needed")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.addresses: list[str] = list(dict.fromkeys(seeds))
        self.timeout_s = timeout_s
        self.retry = retry
        self._current = 0  # index into addresses: where calls without a known leader go
        self._leaders: dict[str, str] = {}  # queue -> gRPC address of its group's leader
        self._avoid: dict[str, float] = {}  # shutting-down address -> monotonic time to forget
        self._nodes: dict[str, _Node] = {}
        self.closed = False
        self.retries = 0  # attempts after a failure, over the client's life (for monitoring)
        self.latency: dict[str, NodeLatency] = {}  # address -> its calls, as timed here
        self.published = PublishCounters()  # every pipeline's, over the client's life
        # No key from the environment here: the clients resolve FLUXMQ_API_KEY themselves.
        self.credentials = credentials or Credentials(api_key="")
        self._metadata = self.credentials.metadata

    def __repr__(self) -> str:
        return f"Transport(addresses={self.addresses!r}, credentials={self.credentials!r})"

    @property
    def current(self) -> str:
        return self.addresses[self._current]

    def leader_of(self, queue: str) -> str | None:
        return self._leaders.get(queue)

    def add_addresses(self, addresses: Iterable[str]) -> None:
        for a in addresses:
            if a and a not in self.addresses:
                self.addresses.append(a)

    def _node(self, address: str) -> _Node:
        node = self._nodes.get(address)
        if node is None:
            if self.closed:
                raise RuntimeError("the client is closed")
            node = self._nodes[address] = _Node(address, self.credentials)
        return node

    def target(self, queue: str | None) -> str:
        """Where a call about ``queue`` goes now: its cached leader, else the current seed."""
        return self._target(queue)

    def publish_stream(self, address: str) -> Any:
        """A PublishStream call to ``address``, with the client's metadata; the caller writes,
        reads and ends it (no deadline: it lives as long as the caller keeps it)."""
        return self._node(address).queue.PublishStream(metadata=self._metadata)

    def server_stream(self, method: str, request: Any, *, queue: str) -> tuple[str, Any]:
        """-> (the address, a server-streaming call of ``method`` there: the queue's cached
        leader, else the current seed). No deadline: the caller reads it and cancels it; after
        a failure it reports the error to ``stream_failed`` and opens another."""
        target = self._target(queue)
        call = getattr(self._node(target).queue, method)(request, metadata=self._metadata)
        return target, call

    def stream_failed(self, err: FluxMQError, target: str, queue: str) -> bool:
        """A stream to ``target`` about ``queue`` failed with ``err``: learn from it as a
        unary call does (a named leader, a node shutting down, a node gone). -> whether the
        next stream goes to another node at once (no reason to wait)."""
        if self._redirect(err, target, queue) is not None:
            return True
        if err.reason == SHUTTING_DOWN:
            return self._shutting_down(target, queue) != target
        if fails_over(err):
            self._failover(target, queue)
        return False

    def _avoided(self, address: str) -> bool:
        until = self._avoid.get(address)
        if until is not None and time.monotonic() >= until:
            del self._avoid[address]
            return False
        return until is not None

    def _seed(self) -> str:
        """The current address, or the next one that is not shutting down (if any is not)."""
        n = len(self.addresses)
        for i in range(n):
            j = (self._current + i) % n
            if not self._avoided(self.addresses[j]):
                self._current = j
                break
        return self.addresses[self._current]

    def _target(self, queue: str | None) -> str:
        if queue is not None:
            leader = self._leaders.get(queue)
            if leader is not None and not self._avoided(leader):
                return leader
        return self._seed()

    def _shutting_down(self, address: str, queue: str | None) -> str:
        """``address`` answered NODE_SHUTTING_DOWN: skip it for a while. -> the next target."""
        self._avoid[address] = time.monotonic() + SHUTTING_DOWN_AVOID_S
        target = self._failover(address, queue)
        log.info("fluxmq: %s is shutting down, going on with %s", address, target)
        return target

    def _failover(self, failed: str, queue: str | None) -> str:
        if queue is not None and self._leaders.get(queue) == failed:
            del self._leaders[queue]
        else:
            for q in [q for q, a in self._leaders.items() if a == failed]:
                del self._leaders[q]
        if self.addresses[self._current] == failed and len(self.addresses) > 1:
            self._current = (self._current + 1) % len(self.addresses)
            log.info("fluxmq: %s failed, trying %s", failed, self.addresses[self._current])
        return self._target(queue)

    def _redirect(self, err: FluxMQError, failed: str, queue: str | None) -> str | None:
        """The leader a NOT_LEADER answer names, remembered for ``queue`` (None: no redirect,
        because the answer names no leader or names the node that answered)."""
        leader = err.metadata.get("leader", "") if err.reason == "NOT_LEADER" else ""
        if not leader or leader == failed:
            return None
        if queue is not None:
            self._leaders[queue] = leader
        self.add_addresses([leader])
        log.info("fluxmq: %s does not lead; redirected to %s", failed, leader)
        return leader

    def _remember_leader(self, queue: str, trailers: Any) -> None:
        for key, value in trailers or ():
            if key == LEADER_KEY:
                leader = value if isinstance(value, str) else value.decode()
                if self._avoided(leader):
                    return  # it still leads during its hand-over, but is about to stop
                if leader and self._leaders.get(queue) != leader:
                    self._leaders[queue] = leader
                    self.add_addresses([leader])
                return

    async def unary(
        self,
        service: Service,
        method: str,
        request: Any,
        *,
        safe: bool,
        queue: str | None = None,
        timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
        address: str | None = None,
        give_up: Callable[[FluxMQError], bool] | None = None,
    ) -> Any:
        """Sends one unary call (see the module docstring); raises FluxMQError.

        ``queue``: the queue the call is about (leader cache); ``address``: this node only (no
        failover); ``timeout_s``: the deadline of each attempt (default the client's);
        ``give_up``: errors the caller handles itself rather than have retried."""
        policy = retry or self.retry
        timeout = self.timeout_s if timeout_s is None else timeout_s
        target = address or self._target(queue)
        redirected: set[str] = set()  # leaders NOT_LEADER answers sent this call to
        attempt = 0
        while True:
            attempt += 1
            stub = getattr(self._node(target), service)
            call = getattr(stub, method)(request, timeout=timeout, metadata=self._metadata)
            t0 = time.monotonic()
            try:
                response = await call
            except grpc.aio.AioRpcError as rpc_err:
                self.observe(target, time.monotonic() - t0, ok=False)
                err = from_rpc_error(rpc_err)
                if (
                    attempt >= policy.max_attempts
                    or self.closed
                    or not should_retry(err, safe)
                    or (give_up is not None and give_up(err))
                ):
                    raise err from None
                redirect = self._redirect(err, target, queue) if address is None else None
                if redirect is not None and redirect not in redirected:
                    # Another node: no reason to wait, unless two nodes keep naming each other.
                    redirected.add(redirect)
                    target = redirect
                    self.retries += 1
                    continue
                if address is None and err.reason == SHUTTING_DOWN:
                    moved = self._shutting_down(target, queue)
                    if moved != target:
                        target = moved  # another node: no reason to wait
                        self.retries += 1
                        continue
                if address is None and fails_over(err):
                    target = self._failover(target, queue)
                delay = policy.backoff_s(attempt)
                if err.retry_after_ms:
                    if err.retry_after_ms / 1000 > policy.max_retry_delay_s:
                        raise err from None
                    delay = max(delay, err.retry_after_ms / 1000)
                log.debug("fluxmq: %s failed (%s), retry %d in %.3fs", method, err, attempt, delay)
                self.retries += 1
                await asyncio.sleep(delay)
                continue
            self.observe(target, time.monotonic() - t0, ok=True)
            if queue is not None:
                self._remember_leader(queue, await call.trailing_metadata())
            return response

    def observe(self, address: str, seconds: float, ok: bool) -> None:
        """One call to ``address`` took ``seconds`` (stream requests are told here too)."""
        node = self.latency.get(address)
        if node is None:
            if len(self.latency) >= NODES_TIMED_MAX:
                return  # a bound: a client given many addresses keeps the first ones
            node = self.latency[address] = NodeLatency()
        node.observe(seconds, ok)

    async def close(self) -> None:
        self.closed = True
        nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            await node.channel.close()
