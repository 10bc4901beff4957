"""The gRPC edge every call passes through: request id, error mapping, RPC metrics, bodies that
do not parse, queue names.

The request id comes from the client's ``x-request-id`` metadata or is generated; it is in the
trailing metadata of every response (OK or not) and in the ErrorInfo of every error, and log
lines of the call carry it.

grpc.aio parses a request before any handler or interceptor runs, and answers a body that does
not parse with UNKNOWN and a traceback in the log per call (before authentication). The edge
therefore wraps every method's request deserializer: bytes that are not the message become an
``_Undecodable`` stand-in, which the call answers with INVALID_ARGUMENT (MALFORMED_REQUEST)
after checking the caller's key, and nothing is logged for it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from fluxmq import metrics
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.auth import METHOD_ACTIONS, Action, KeyRecord
from fluxmq.core.errors import FluxError
from fluxmq.core.limits import FETCH_BYTES_DEFAULT, FETCH_BYTES_MAX
from fluxmq.core.ratelimit import InflightBudget
from fluxmq.core.text import printable
from fluxmq.server.client_streams import let_client_finish_writing
from fluxmq.server.errors import domain_error, internal_error, status_code, to_grpc_status
from fluxmq.server.guard import (
    Guard,
    Identity,
    UnknownApiKey,
    audit,
    current_identity,
    queues_of,
)
from fluxmq.server.scoping import Scope, caller_error, caller_response, scope_request
from raft.stages import CURRENT_CALL, CallTrace

log = logging.getLogger(__name__)
access_log = logging.getLogger("fluxmq.access")
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
REQUEST_ID_KEY = "x-request-id"


def _request_id(context: grpc.aio.ServicerContext) -> str:
    """The client's id when it is 1..128 printable ASCII characters without spaces (it goes
    into every log line of the call), else a new one."""
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_KEY and isinstance(value, str) and _REQUEST_ID_RE.fullmatch(value):
            return value
    return uuid.uuid4().hex


_REQUEST_ID_RE = re.compile(r"[!-~]{1,128}")


class _Call:
    """Book-keeping of one call: request id, timing, outcome."""

    def __init__(self, method: str, context: grpc.aio.ServicerContext) -> None:
        self.method = method
        self.context = context
        self.request_id = _request_id(context)
        self.token = request_id_var.set(self.request_id)
        self.started = time.perf_counter()
        # The latency budget: proposals this call makes note when they were resolved.
        self.trace = CallTrace(received_s=self.started)
        self.trace_token = CURRENT_CALL.set(self.trace)
        self.code = "OK"
        self.scope: Scope = None  # the caller's namespace, once known

    async def handle(self, exc: BaseException) -> None:
        """Turn ``exc`` into the call's status: an abort raised by the servicer passes through,
        an error becomes a rich status (abort raises), anything else (cancellation) is
        counted as CANCELLED and re-raised by the caller."""
        if _is_abort(exc):
            return
        if isinstance(exc, Exception):
            await self.fail(exc)
        self.code = "CANCELLED"

    async def fail(self, exc: Exception) -> None:
        err = domain_error(exc)
        if err is None:
            log.exception("unexpected error in %s (request id %s)", self.method, self.request_id)
            err = internal_error(self.request_id)
        caller_error(err, self.scope)
        self.code = status_code(err).name
        await self.context.abort_with_status(to_grpc_status(err, self.request_id))

    def ok(self, leader: str | None = None) -> None:
        trailers = [(REQUEST_ID_KEY, self.request_id)]
        if leader:
            trailers.append((LEADER_KEY, leader))
        self.context.set_trailing_metadata(tuple(trailers))

    def finish(self) -> None:
        now_s = time.perf_counter()
        elapsed_s = now_s - self.started
        metrics.RPC_DURATION.labels(self.method, self.code).observe(elapsed_s)
        if self.trace.resolved_s is not None and self.code == "OK":
            metrics.observe_raft_stage("answered", now_s - self.trace.resolved_s)
        if access_log.isEnabledFor(logging.DEBUG):  # one line per call: debug level only
            access_log.debug("%s %s %.1f ms", self.method, self.code, elapsed_s * 1000)
        with contextlib.suppress(ValueError):  # a stream closed from another context
            request_id_var.reset(self.token)
        with contextlib.suppress(ValueError):
            CURRENT_CALL.reset(self.trace_token)


def _is_abort(exc: BaseException) -> bool:
    # context.abort*() raises an internal exception type that must propagate untouched.
    return type(exc).__name__ == "AbortError"


# A replica that is behind (restarted, or just caught up by snapshot) may not know a queue or
# group yet. Before answering NOT_FOUND it catches up once and retries: NOT_FOUND is raised by
# lookups, before anything is written, so running the call again is safe.
STALE_REASONS = frozenset({"QUEUE_NOT_FOUND", "GROUP_NOT_FOUND"})
CatchUp = Callable[[], Awaitable[bool]]
# Where the leader of the node's shard serves gRPC, when known: returned in the trailing
# metadata of successful calls so that a client can go straight to it next time.
LEADER_KEY = "x-fluxmq-leader"
LeaderAddress = Callable[[], "str | None"]


ADMIN_ACTIONS = frozenset({Action.MANAGE, Action.CLUSTER})


def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, Any], ...]:
    return tuple(context.invocation_metadata() or ())


def _audit_target(request: Any) -> str:
    """What an admin call is about, for the audit line (which escapes and cuts it)."""
    if request is None:
        return "-"
    if isinstance(request, _Undecodable):
        return "a request body that does not parse"
    names = queues_of(request)
    if names:
        return "queue " + ",".join(names)
    for field_name in ("key_id", "shard_id", "name"):
        if field_name in request.DESCRIPTOR.fields_by_name:
            value = getattr(request, field_name)
            if value:
                return f"{field_name} {value}"
    return "-"


class EdgeInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self,
        catch_up: CatchUp | None = None,
        leader: LeaderAddress | None = None,
        guard: Callable[[], Guard | None] | None = None,
        inflight: Callable[[], InflightBudget | None] | None = None,
    ) -> None:
        self._catch_up = catch_up
        self._leader = leader
        # Read when a call starts: the composition root sets it up after building the server.
        self._guard = guard or (lambda: None)
        self._inflight = inflight or (lambda: None)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        # Health checks and reflection stay open (probes carry no key); the API needs one.
        api = details.method.startswith("/fluxmq.v1.")
        guard = self._guard() if api else None
        decode = _tolerant(handler.request_deserializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _unary(
                    method,
                    handler.unary_unary,
                    self._catch_up,
                    self._leader,
                    guard,
                    self._inflight() if api else None,
                ),
                request_deserializer=decode,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _streaming(method, handler.unary_stream, guard, per_message=False),
                request_deserializer=decode,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(
                _streaming(method, handler.stream_stream, guard, per_message=True),
                request_deserializer=decode,
                response_serializer=handler.response_serializer,
            )
        return handler


class _Undecodable:
    """Stands for a request body that is not the method's message."""

    __slots__ = ("message_type", "parser_says")

    def __init__(self, message_type: str, parser_says: str) -> None:
        self.message_type = message_type
        self.parser_says = parser_says

    def error(self) -> FluxError:
        return FluxError(
            "MALFORMED_REQUEST",
            f"the request body is not a valid {self.message_type}: {self.parser_says}",
            metadata={"message_type": self.message_type},
        )


Deserializer = Callable[[bytes], Any]


def _tolerant(deserializer: Deserializer | None) -> Deserializer | None:
    """``deserializer``, answering bytes it cannot parse with an ``_Undecodable``."""
    if deserializer is None:
        return None
    message_class = getattr(deserializer, "__self__", None)  # Message.FromString is bound
    descriptor = getattr(message_class, "DESCRIPTOR", None)
    message_type = str(getattr(descriptor, "full_name", "request message"))

    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as err:  # DecodeError, and whatever a parser raises on foreign bytes
            # The parser's words name the message type and the flaw, never the bytes; the
            # type is said separately, so keep the flaw alone.
            says = str(err).rpartition("': ")[2] or type(err).__name__
            return _Undecodable(message_type, printable(says, 120))

    return decode


async def _key_holder(guard: Guard | None, md: tuple[tuple[str, Any], ...]) -> Identity | None:
    """The caller of a call whose body does not parse, checked before MALFORMED_REQUEST is
    answered: a caller without a valid key learns nothing, not even that its bytes do not
    parse (UNAUTHENTICATED). None with auth off."""
    return None if guard is None else _identity(await _authenticate(guard, md))


def _unary(
    method: str,
    behavior: Callable[..., Awaitable[Any]],
    catch_up: CatchUp | None = None,
    leader: LeaderAddress | None = None,
    guard: Guard | None = None,
    inflight: InflightBudget | None = None,
) -> Callable[..., Awaitable[Any]]:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
        call = _Call(method, context)
        identity: Identity | None = None
        held = _Held()
        try:
            if isinstance(request, _Undecodable):
                identity = await _key_holder(guard, _metadata(context))
                raise request.error()
            if guard is not None:
                identity = await _admit(guard, method, request, _metadata(context))
                current_identity.set(identity)
                call.scope = guard.scope_of(identity)
            else:
                scope_request(request, None)
            if inflight is not None:
                held.take(inflight, identity.key_id if identity is not None else None, request)
            try:
                response = await behavior(request, context)
            except FluxError as err:
                if catch_up is None or err.reason not in STALE_REASONS or not await catch_up():
                    raise
                if guard is not None and identity is not None:
                    # The queue was unknown when admitted (so unchecked): check it now.
                    guard.check_environment(identity, method, request)
                response = await behavior(request, context)
            if guard is not None and identity is not None:
                response = guard.filter_response(identity, method, response)
                response = caller_response(response, call.scope)
            call.ok(leader() if leader is not None else None)
            return response
        except BaseException as exc:
            await call.handle(exc)
            raise
        finally:
            held.release()
            call.finish()
            if METHOD_ACTIONS.get(method) in ADMIN_ACTIONS:
                _audit(guard, identity, method, call, request)

    return wrapper


# Under pressure a Fetch gets a smaller max_bytes rather than a refusal, down to this much
# (a read returns at least one record whatever its max_bytes, so a consumer still advances).
FETCH_BYTES_UNDER_PRESSURE_MIN = 64 * 1024
NODE_BUSY_RETRY_AFTER_MS = 200


def node_busy(budget: InflightBudget, size_bytes: int) -> FluxError:
    return FluxError(
        "NODE_BUSY",
        f"this node is working on {budget.in_use} bytes of calls and this one needs "
        f"{size_bytes} more (inflight_bytes_max {budget.node_bytes_max}, at most "
        f"{budget.key_bytes_max} per API key); retry shortly or on another node",
        retriable=True,
        retry_after_ms=NODE_BUSY_RETRY_AFTER_MS,
        metadata={"inflight_bytes_max": str(budget.node_bytes_max), "size": str(size_bytes)},
    )


class _Held:
    """The bytes one unary call holds of the node's in-flight budget, from admission until the
    call ends (answered, failed or cancelled)."""

    __slots__ = ("budget", "key", "size_bytes")

    def __init__(self) -> None:
        self.budget: InflightBudget | None = None
        self.key: str | None = None
        self.size_bytes = 0

    def take(self, budget: InflightBudget, key: str | None, request: Any) -> None:
        """Reserve the request's bytes, and a Fetch's response at its max_bytes, which is
        lowered to what the budget can still give; NODE_BUSY when it does not fit."""
        size = int(request.ByteSize())
        if isinstance(request, pb.FetchRequest):
            wanted = min(request.max_bytes or FETCH_BYTES_DEFAULT, FETCH_BYTES_MAX)
            granted = max(FETCH_BYTES_UNDER_PRESSURE_MIN, min(wanted, budget.free_for(key) - size))
            if granted < wanted:
                request.max_bytes = granted
            size += min(wanted, granted)
        if not budget.reserve(key, size):
            raise node_busy(budget, size)
        self.budget, self.key, self.size_bytes = budget, key, size

    def release(self) -> None:
        if self.budget is not None:
            self.budget.release(self.key, self.size_bytes)
            self.budget = None


def _identity(record: KeyRecord) -> Identity:
    return Identity(record.key_id, record.environment, record.role, record.tier)


def _audit(
    guard: Guard | None, identity: Identity | None, method: str, call: _Call, request: Any
) -> None:
    """The audit line of an admin call. A call the guard refused has no identity: the key is
    named when it was valid (a role or environment violation, a rate limit), looked up in the
    guard's cache of verified keys, so the refusal costs no second verification."""
    # The guard also checks queue names (to put them in the caller's namespace): a bad name is
    # the caller's mistake, not a refusal of the caller.
    refused = guard is not None and identity is None and call.code != "INVALID_ARGUMENT"
    if guard is not None and identity is None and call.code != "UNAUTHENTICATED":
        assert guard is not None
        with contextlib.suppress(FluxError):
            identity = _identity(guard.authenticate(_metadata(call.context)))
    audit(
        identity,
        method,
        call.request_id,
        call.code,
        _audit_target(request),
        auth_on=guard is not None,
        refused=refused,
    )


def _streaming(
    method: str,
    behavior: Callable[..., AsyncIterator[Any]],
    guard: Guard | None = None,
    *,
    per_message: bool,
) -> Callable[..., AsyncIterator[Any]]:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        call = _Call(method, context)
        md: tuple[tuple[str, Any], ...] = ()
        try:
            if per_message:
                request = _decoded(request)
            elif isinstance(request, _Undecodable):
                await _key_holder(guard, _metadata(context))
                raise request.error()
            if guard is not None:
                md = _metadata(context)
                if per_message:
                    # A client stream: every request is checked as it arrives (rate limits
                    # count messages, environments are checked per queue).
                    identity = _identity(await _authenticate(guard, md))
                    request = _checked(guard, method, request, md)
                else:
                    identity = await _admit(guard, method, request, md)
                    current_identity.set(identity)
                call.scope = guard.scope_of(identity)
            elif not per_message:
                scope_request(request, None)
            async for response in behavior(request, context):
                if guard is not None:
                    # A stream can outlive its key: a revoked key ends it at the next message
                    # (a remembered verdict makes this a dictionary lookup).
                    guard.authenticate(md)
                    response = caller_response(response, call.scope)
                yield response
            call.ok()
        except BaseException as exc:
            if per_message and isinstance(exc, Exception) and not _is_abort(exc):
                await let_client_finish_writing(context)
            await call.handle(exc)
            raise
        finally:
            call.finish()

    return wrapper


async def _admit(
    guard: Guard, method: str, request: Any, md: tuple[tuple[str, Any], ...]
) -> Identity:
    try:
        return guard.admit(method, request, md)
    except UnknownApiKey as err:
        # Perhaps created through another node a moment ago: once more if the store knows it.
        if not await guard.keys.maybe_fetch(err.key_id):
            raise
    return guard.admit(method, request, md)


async def _authenticate(guard: Guard, md: tuple[tuple[str, Any], ...]) -> KeyRecord:
    try:
        return guard.authenticate(md)
    except UnknownApiKey as err:
        if not await guard.keys.maybe_fetch(err.key_id):
            raise
        return guard.authenticate(md)


async def _decoded(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A client stream's requests; one that does not parse ends the stream with
    MALFORMED_REQUEST (its place in the stream, hence what it meant, is lost)."""
    async for request in requests:
        if isinstance(request, _Undecodable):
            raise request.error()
        yield request


async def _checked(
    guard: Guard, method: str, requests: AsyncIterator[Any], md: tuple[tuple[str, Any], ...]
) -> AsyncIterator[Any]:
    async for request in requests:
        current_identity.set(guard.admit(method, request, md))
        yield request
