"""Which replication group, and which node, serves a request.

Every queue lives in one replication group. A request for a queue is served by this node when
it hosts the queue's shard (the shard's runtime goes into ``current_shard`` for the servicer) and
forwarded, once, to a node that hosts it otherwise (a forwarded call is never forwarded again).
A node without a metadata store has one group, its own, and serves everything itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.errors import FluxError, queue_not_found
from fluxmq.core.namespaces import scope_of_name
from fluxmq.core.ratelimit import INFLIGHT_BYTES_MAX_DEFAULT, InflightBudget
from fluxmq.server.errors import node_shutting_down
from fluxmq.server.forwarding import (
    Forwarder,
    is_remote_shutting_down,
    was_forwarded,
    was_targeted,
)

if TYPE_CHECKING:
    from fluxmq.core.catalog import QueueEntry
    from fluxmq.server.cluster_view import ClusterView
    from fluxmq.server.guard import Guard
    from fluxmq.server.key_admin import KeyAdmin
    from fluxmq.server.shard.runtime import ShardRuntime
    from fluxmq.server.shard_process.siblings import Siblings

QUEUE_SERVICE = pb.DESCRIPTOR.services_by_name["QueueService"].full_name
# The servicer routes these itself: placement picks the group, a listing spans every group, a
# stream carries requests for any queue.
SERVICER_ROUTED = frozenset({"CreateQueue", "ListQueues", "PublishStream"})
CATCH_UP_SHARDS_MAX = 64
NEW_SHARD_LEADER_WAIT_S = 10.0  # a group started a moment ago elects its first leader
# Relayed calls that wait for messages: ended at once when this node drains (SIGTERM).
WAITING_UNARY = frozenset({"Lease", "Fetch"})

T = TypeVar("T")

current_shard: ContextVar[ShardRuntime | None] = ContextVar("current_shard", default=None)
# The gRPC address of the leader of the group a call went to, for the x-fluxmq-leader trailer
# that EdgeInterceptor adds (set inside the call's task, read after the handler returned).
call_leader: ContextVar[str | None] = ContextVar("call_leader", default=None)


def queue_of(request: Any) -> str | None:
    """The queue a request is about (None: none, or not one queue)."""
    if isinstance(request, pb.TransactRequest):
        names = {a.queue for a in request.acks} | {p.queue for p in request.publishes}
        return min(names) if names else None
    fields = request.DESCRIPTOR.fields_by_name
    if "queue" in fields and fields["queue"].type == fields["queue"].TYPE_STRING:
        return str(request.queue)
    if "name" in fields:
        return str(request.name)
    if "config" in fields:
        return str(request.config.name)
    return None


def names_held(catalog: Mapping[str, QueueEntry]) -> set[str]:
    """A shard's queues and the dead-letter queues they name (created on demand in the same
    shard, so their names are that shard's even before they exist)."""
    return {*catalog, *(str(e.queue.config.dead_letter_queue) for e in catalog.values())} - {""}


def shard_unreachable(group_id: str) -> FluxError:
    return FluxError(
        "GROUP_UNAVAILABLE",
        f"no live node of replication group {group_id!r} is known to this node; retry",
        retriable=True,
        retry_after_ms=500,
        metadata={"group": group_id},
    )


class Router:
    def __init__(self, home_shard_id: str, forwarder: Forwarder | None = None) -> None:
        self.home_shard_id = home_shard_id
        # The metadata store's view once the node has one (set when it is built: it needs the
        # port the server bound, and the server needs this router).
        self.view: ClusterView | None = None
        self.shards: dict[str, ShardRuntime] = {}
        self.forwarder = forwarder or Forwarder()  # plaintext unless given a TLS one
        # Set by the composition root when authentication is on (before build_server).
        self.guard: Guard | None = None
        # Bytes of calls in progress (the composition root sizes it from inflight_bytes_max).
        self.inflight = InflightBudget(INFLIGHT_BYTES_MAX_DEFAULT, INFLIGHT_BYTES_MAX_DEFAULT // 2)
        self.key_admin: KeyAdmin | None = None
        # One of a single node's several shard processes: where the others' queues are.
        self.siblings: Siblings | None = None
        self._draining = asyncio.Event()

    # -- draining (SIGTERM) ---------------------------------------------------------------

    def drain(self) -> None:
        """SIGTERM: every hosted shard ends its waiting calls (``ShardRuntime.drain``), and so
        do the waiting calls this node only relays to another node (long polls, Consume, Tail),
        with NODE_SHUTTING_DOWN: their clients go to another node now, not when the grace
        period cancels them. Relayed writes go on."""
        self._draining.set()
        for runtime in list(self.shards.values()):
            runtime.drain()

    async def until_drained(self, awaitable: Awaitable[T]) -> T:
        """``awaitable``'s result, unless this node drains first: then it is cancelled and
        NODE_SHUTTING_DOWN raised (a relayed long poll cancelled before it answered; a lease
        the other node made meanwhile comes back when it expires, as with any lost answer)."""
        if self._draining.is_set():
            close = getattr(awaitable, "close", None)
            if close is not None:
                close()  # a coroutine that never runs: nothing was sent
            raise node_shutting_down()
        call = asyncio.ensure_future(awaitable)
        drained = asyncio.ensure_future(self._draining.wait())
        try:
            await asyncio.wait((call, drained), return_when=asyncio.FIRST_COMPLETED)
        finally:
            drained.cancel()
            if not call.done():
                call.cancel()
                await asyncio.wait((call,))  # its clean-up (cancelling the forwarded call) runs
        if call.cancelled() and self._draining.is_set():
            raise node_shutting_down()
        return call.result()

    async def other_replica(self, queue: str, failed: str) -> str | None:
        """The gRPC address of another live node of ``queue``'s group than ``failed`` (its
        leader first), for a relayed call that ``failed`` refused because it shuts down."""
        view = self.view
        group_id = await view.shard_of(queue) if view is not None else None
        if view is None or group_id is None:
            return None
        group = view.shard_records.get(group_id)
        leader = view.leaders.get(group_id)
        members = [leader[0]] if leader is not None else []
        members += list(group.members) if group is not None else []
        for member in members:
            node = view.nodes.get(member)
            if node is not None and member != view.node.node_id and node.grpc_address != failed:
                return node.grpc_address
        return None

    def queue_environment(self, queue: str) -> str | None:
        """The environment in the config of ``queue`` on a group this node hosts (None: none)."""
        for runtime in self.shards.values():
            entry = runtime.state.catalog.get(queue)
            if entry is not None:
                return str(entry.queue.config.environment)
        return None

    def unscoped_queues_of_other_environments(self, operators: str) -> list[str]:
        """Queues of another environment than the operators' stored under a name of the
        operators' namespace: created before environments were namespaces. Their environment
        no longer reaches them by name (see the README, Security)."""
        out = []
        for runtime in self.shards.values():
            for name, entry in runtime.state.catalog.items():
                env = str(entry.queue.config.environment)
                if env not in ("", operators) and not scope_of_name(name):
                    out.append(name)
        return sorted(out)

    @classmethod
    def of_one(cls, runtime: ShardRuntime) -> Router:
        """The router of a node that runs ``runtime`` alone, without a metadata store."""
        router = cls(runtime.shard_id)
        router.add_shard(runtime)
        return router

    @property
    def home(self) -> ShardRuntime:
        """The node's first shard: it answers for what no other shard holds."""
        return self.shards[self.home_shard_id]

    def add_shard(self, runtime: ShardRuntime) -> None:
        self.shards[runtime.shard_id] = runtime
        if self._draining.is_set():  # started during the shutdown: it drains as the others
            runtime.drain()

    def remove_shard(self, shard_id: str) -> ShardRuntime | None:
        """A shard this node stops hosting (its group moved away): no more requests reach it."""
        return self.shards.pop(shard_id, None)

    def local(self, queue: str) -> ShardRuntime | None:
        """The hosted shard whose state has ``queue`` (replicas serve reads themselves)."""
        for runtime in self.shards.values():
            if queue in runtime.state.catalog:
                return runtime
        return None

    def holds_name(self, name: str) -> bool:
        """Whether a hosted shard has queue ``name`` or reserves it as a DLQ of its own."""
        return any(name in names_held(r.state.catalog) for r in self.shards.values())

    async def locate(
        self, queue: str, *, forwarded: bool = False, targeted: bool = False
    ) -> ShardRuntime | str:
        """The local runtime of the shard that serves ``queue``, or the gRPC address of a node
        (or of another shard process of this node) that does. ``forwarded``: by another node
        (never forwarded to a third); ``targeted``: by another shard process of this node
        (never forwarded again)."""
        runtime = self.local(queue)
        if runtime is not None:
            return runtime
        siblings = self.siblings
        if siblings is not None and not targeted:
            owner = siblings.owner(queue)
            if owner is not None:
                return siblings.address_of(owner[0])
        if self.view is None:
            return self.answering(queue)
        group_id = await self.view.shard_of(queue)
        if group_id is None:
            return self.answering(queue)  # not placed anywhere: QUEUE_NOT_FOUND
        hosted = await self.ensure_hosted(group_id)
        if hosted is not None:
            return hosted  # placed here, not applied yet on this replica: it catches up
        sibling = self.sibling_of_group(group_id)
        if sibling is not None and not targeted:
            return sibling  # another shard process of this node runs it
        if forwarded or targeted:
            return self.answering(queue)  # never forward twice
        address = self.view.address_for_shard(group_id)
        if address is None:
            raise shard_unreachable(group_id)
        return address

    def sibling_of_group(self, group_id: str) -> str | None:
        """The address of the other shard process of this node that runs ``group_id`` (None:
        this one does, or this node is not a member)."""
        siblings, view = self.siblings, self.view
        if siblings is None or view is None or not view.is_member(group_id):
            return None
        index = siblings.process_of_group(group_id)
        return None if index == siblings.index else siblings.address_of(index)

    def answering(self, queue: str) -> ShardRuntime:
        """The runtime that answers for ``queue`` where no hosted shard has it (QUEUE_NOT_FOUND,
        after catching up): the home shard, or in a shard process without it any it runs."""
        runtime = self.shards.get(self.home_shard_id)
        if runtime is None and self.shards:
            runtime = next(iter(self.shards.values()))
        if runtime is None:
            raise queue_not_found(queue)
        return runtime

    async def ensure_hosted(self, group_id: str) -> ShardRuntime | None:
        """The local runtime of shard ``group_id`` if this node is (or just became) one of its
        members, once the shard has a leader: one provisioned a moment ago is started here
        first."""
        runtime = self.shards.get(group_id)
        view = self.view
        if runtime is None and view is not None:
            group = view.shard_records.get(group_id)
            if group is None or view.node.node_id in group.members:
                await view.ensure_shards()
            runtime = self.shards.get(group_id)
        if runtime is not None:
            await runtime.proposer.wait_for_leader(NEW_SHARD_LEADER_WAIT_S)
        return runtime

    def shard_id_of(self, queue: str) -> str | None:
        """The id of the shard that holds ``queue`` on this node (any of its shard processes;
        None: none)."""
        runtime = self.local(queue)
        if runtime is not None:
            return runtime.shard_id
        owner = self.siblings.owner(queue) if self.siblings is not None else None
        return None if owner is None else owner[1]

    async def check_one_shard(self, request: pb.TransactRequest) -> None:
        names = sorted({a.queue for a in request.acks} | {p.queue for p in request.publishes})
        if len(names) < 2 or (self.view is None and self.siblings is None):
            return
        if self.view is None:
            groups = {n: self.shard_id_of(n) for n in names}
        else:
            groups = {n: await self.view.shard_of(n) for n in names}
        if len({g for g in groups.values() if g is not None}) > 1:
            raise FluxError(
                "TRANSACTION_SPANS_GROUPS",
                "a transaction's queues must share one replication group (placement: "
                + ", ".join(f"{n} -> {g}" for n, g in groups.items())
                + "); create them with the same replication.group",
                metadata={"queues": ",".join(names)},
            )

    async def catch_up(self) -> bool:
        """On NOT_FOUND: every hosted group applies what is committed, then the call reruns.
        A group that cannot catch up raises its retriable error: the name may be one of its
        own, so NOT_FOUND could deny a write it acknowledged (the others caught up meanwhile,
        so the client's retry finds what they hold)."""
        runtimes = list(self.shards.values())[:CATCH_UP_SHARDS_MAX]
        results = await asyncio.gather(
            *(r.proposer.catch_up() for r in runtimes), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return any(results)

    def leader_address(self) -> str | None:
        runtime = current_shard.get() or self.shards.get(self.home_shard_id)
        return call_leader.get() or (runtime.proposer.leader_address() if runtime else None)

    async def close(self) -> None:
        await self.forwarder.close()


class RoutingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Sits inside EdgeInterceptor (which maps errors): resolves each QueueService call's queue
    to a local shard runtime or forwards the call."""

    def __init__(self, router: Router) -> None:
        self._router = router

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        service, _, method = details.method.lstrip("/").rpartition("/")
        if handler is None or service != QUEUE_SERVICE or method in SERVICER_ROUTED:
            return handler
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    async def _target(self, request: Any, context: Any) -> ShardRuntime | str:
        if isinstance(request, pb.TransactRequest):
            await self._router.check_one_shard(request)
        queue = queue_of(request)
        if not queue:
            return self._router.answering("")
        return await self._router.locate(
            queue, forwarded=was_forwarded(context), targeted=was_targeted(context)
        )

    def _unary(
        self, method: str, behavior: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        async def wrapper(request: Any, context: Any) -> Any:
            target = await self._target(request, context)
            if isinstance(target, str):
                return await self._forward(target, method, request, context)
            call_leader.set(target.proposer.leader_address())
            token = current_shard.set(target)
            try:
                return await behavior(request, context)
            finally:
                current_shard.reset(token)

        return wrapper

    async def _forward(self, address: str, method: str, request: Any, context: Any) -> Any:
        """To ``address`` (the group's leader when the directory knows it); when that node no
        longer leads (the directory lags a leadership change), once more to the leader its
        NOT_LEADER names: NOT_LEADER means nothing was done, and the callee never forwards.
        A long poll that ``address`` refuses because it shuts down goes once to another node
        of the group (nothing was leased or read); one still waiting when this node drains
        ends with NODE_SHUTTING_DOWN."""
        waits = method in WAITING_UNARY and int(getattr(request, "wait_ms", 0)) > 0
        try:
            return await self._forward_once(address, method, request, context, waits)
        except FluxError as err:
            if not (waits and is_remote_shutting_down(err)):
                raise
            other = await self._router.other_replica(queue_of(request) or "", address)
            if other is None:
                raise
        return await self._forward_once(other, method, request, context, waits)

    async def _forward_once(
        self, address: str, method: str, request: Any, context: Any, waits: bool
    ) -> Any:
        call_leader.set(address)
        forwarder = self._router.forwarder
        relay = self._router.until_drained if waits else _at_once
        try:
            return await relay(forwarder.forward(address, method, request, context))
        except FluxError as err:
            leader = err.metadata.get("leader", "") if err.reason == "NOT_LEADER" else ""
            if not leader or leader == address:
                raise
        call_leader.set(leader)
        return await relay(forwarder.forward(leader, method, request, context))

    def _stream(
        self, method: str, behavior: Callable[..., AsyncIterator[Any]]
    ) -> Callable[..., AsyncIterator[Any]]:
        async def wrapper(request: Any, context: Any) -> AsyncIterator[Any]:
            target = await self._target(request, context)
            if isinstance(target, str):
                async for item in self._relay_stream(target, method, request, context):
                    yield item
                return
            token = current_shard.set(target)
            try:
                async for item in behavior(request, context):
                    yield item
            finally:
                with contextlib.suppress(ValueError):  # closed from another context
                    current_shard.reset(token)

        return wrapper

    async def _relay_stream(
        self, address: str, method: str, request: Any, context: Any
    ) -> AsyncIterator[Any]:
        """A stream (Consume, Tail) relayed from ``address`` until it ends or this node drains
        (then NODE_SHUTTING_DOWN, as the streams this node serves itself)."""
        stream = self._router.forwarder.forward_stream(address, method, request, context)
        try:
            while True:
                try:
                    item = await self._router.until_drained(anext(stream))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            await stream.aclose()


async def _at_once(awaitable: Awaitable[T]) -> T:
    return await awaitable
