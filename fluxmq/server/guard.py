"""The security edge: who is calling (API key), may they (role), where (environment), how often
(rate limits). Runs inside EdgeInterceptor for every call, before routing, so a refused call
never reaches a queue nor another node, and its error carries the request id.

Keys come from the metadata store (etcd in a cluster, the embedded store on a single node)
through ``KeyCache``: loaded at start, kept current by the store's watch (a revocation on any
node reaches every node within the watch's latency, well under a second), re-read in full
every ``KEYS_RESYNC_INTERVAL_S`` in case a watch event was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.auth import (
    METHOD_ACTIONS,
    RATE_CLASS,
    Action,
    KeyRecord,
    authorize,
    parse_bearer,
    parse_key,
    permission_denied,
    unauthenticated,
)
from fluxmq.core.errors import FluxError
from fluxmq.core.namespaces import scope_of, scope_of_name
from fluxmq.core.ratelimit import Bucket, Limit, RateLimiter
from fluxmq.core.text import printable
from fluxmq.server.scoping import queue_field, scope_request

log = logging.getLogger("fluxmq.auth")
audit_log = logging.getLogger("fluxmq.audit")

KEYS_RESYNC_INTERVAL_S = 30.0
TOUCH_INTERVAL_S = 5.0
# Authorization values already checked against their record: a client sends the same key on
# every call, and skipping the parse and the salted hash on a repeat is most of a check's cost.
VERIFIED_MAX = 4096
# A key created through another node may reach this node's cache a moment after its creator
# hands it out; an unknown key id is looked up in the store, at most this often, so that a
# stream of made-up keys costs the store a bounded trickle of reads.
KEY_LOOKUPS = Limit(rate_per_s=20, burst=20)


@dataclass(eq=False)
class UnknownApiKey(FluxError):
    """INVALID_API_KEY for a well-formed key whose id this node's cache does not hold."""

    key_id: str = ""


AUTH_HEADER = "authorization"
API_KEY_EVENT_KIND = "api_key"


@dataclass(frozen=True, slots=True)
class Identity:
    key_id: str
    environment: str
    role: str
    tier: str

    def __str__(self) -> str:
        return f"{self.key_id} ({self.environment}/{self.role})"


current_identity: ContextVar[Identity | None] = ContextVar("current_identity", default=None)


class KeyStore(Protocol):
    async def list_api_keys(self) -> list[KeyRecord]: ...

    async def get_api_key(self, key_id: str) -> KeyRecord | None: ...

    async def touch_api_keys(self, last_used_ms: Mapping[str, int]) -> None: ...

    def watch(self) -> Any: ...


class KeyCache:
    """Every key record in memory (a few thousand at most), by key id."""

    def __init__(self, store: KeyStore, now_ms: Callable[[], int]) -> None:
        self._store = store
        self._now_ms = now_ms
        self.records: dict[str, KeyRecord] = {}
        self._used: dict[str, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._lookups = Bucket(KEY_LOOKUPS, float(KEY_LOOKUPS.burst), 0)

    async def start(self) -> None:
        await self.ensure_loaded()
        for name, routine in (
            ("keys_watch", self.watch_routine),
            ("keys_resync", self.resync_routine),
            ("keys_touch", self.touch_routine),
        ):
            self._tasks.append(asyncio.create_task(routine(), name=name))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.maybe_touch(), 2.0)

    async def ensure_loaded(self) -> None:
        records = await self._store.list_api_keys()
        self.records = {r.key_id: r for r in records}

    async def watch_routine(self) -> None:
        while True:
            try:
                async for event in self._store.watch():
                    if event.kind != API_KEY_EVENT_KIND:
                        continue
                    if event.key == "":
                        await self.ensure_loaded()
                        continue
                    record = await self._store.get_api_key(event.key)
                    if record is None:
                        self.records.pop(event.key, None)
                    else:
                        self.records[record.key_id] = record
                        if not record.active:
                            log.info("API key %s revoked", record.prefix)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the store reconnects; keep the cache current meanwhile
                log.warning("watching API keys failed (%s); retrying", err)
                await asyncio.sleep(1.0)

    async def resync_routine(self) -> None:
        while True:
            await asyncio.sleep(KEYS_RESYNC_INTERVAL_S)
            with contextlib.suppress(Exception):
                await self.ensure_loaded()

    async def touch_routine(self) -> None:
        while True:
            await asyncio.sleep(TOUCH_INTERVAL_S)
            with contextlib.suppress(Exception):
                await self.maybe_touch()

    async def maybe_touch(self) -> None:
        if self._used:
            used, self._used = self._used, {}
            await self._store.touch_api_keys(used)

    async def maybe_fetch(self, key_id: str) -> bool:
        """Look an unknown key id up in the store (within KEY_LOOKUPS); -> whether it is known
        now."""
        if self._lookups.take(1, self._now_ms()):
            return False
        try:
            record = await self._store.get_api_key(key_id)
        except Exception as err:  # the caller answers INVALID_API_KEY; the watch catches up
            log.warning("looking up API key %s failed (%s)", key_id, err)
            return False
        if record is None:
            return False
        # setdefault: a revocation the watch stored meanwhile must not be overwritten by this
        # (older) read.
        self.records.setdefault(record.key_id, record)
        return True

    def note_used(self, key_id: str, now_ms: int) -> None:
        self._used[key_id] = now_ms


Tiers = Mapping[str, Mapping[str, tuple[float, int]]]
# queue -> the environment its config names ("" for a queue created without auth), None when
# no group this node hosts has it (the node that has it checks a forwarded call itself).
QueueEnvironment = Callable[[str], "str | None"]


def queues_of(request: Any) -> list[str]:
    """Every queue a request names (to check each against the caller's environment)."""
    if request.DESCRIPTOR.file is not pb.DESCRIPTOR:
        return []  # AdminService requests name shards and keys, not queues
    if isinstance(request, pb.TransactRequest):
        return sorted({a.queue for a in request.acks} | {p.queue for p in request.publishes})
    if isinstance(request, pb.PublishStreamRequest):
        return [request.publish.queue] if request.publish.queue else []
    if isinstance(request, pb.CreateQueueRequest | pb.UpdateQueueRequest):
        names = [request.config.name]
        if request.config.dead_letter_queue:
            names.append(request.config.dead_letter_queue)
        return names
    field_name = queue_field(type(request))
    if not field_name:
        return []
    value = str(getattr(request, field_name))
    return [value] if value else []


def _cost(method: str, request: Any) -> int:
    if isinstance(request, pb.PublishRequest):
        return max(1, len(request.messages) + request.encoded.count)
    if isinstance(request, pb.PublishStreamRequest):
        return max(1, len(request.publish.messages) + request.publish.encoded.count)
    if isinstance(request, pb.TransactRequest):
        return max(1, sum(len(p.messages) for p in request.publishes))
    return 1


BYTES_CLASS = "bytes"  # the optional byte rate of a tier (config.BYTES_CLASS)


def _rate_limited(record: KeyRecord, rate_class: str, limit: Limit, wait_ms: int) -> FluxError:
    unit = " bytes" if rate_class == BYTES_CLASS else ""
    return FluxError(
        "RATE_LIMITED",
        f"key {record.prefix} is over its {rate_class} rate ({limit.rate_per_s:g}{unit}/s, "
        f"burst {limit.burst}{unit}, tier {record.tier}): retry in {wait_ms} ms",
        retriable=True,
        retry_after_ms=wait_ms,
        metadata={"rate_class": rate_class, "tier": record.tier},
    )


class Guard:
    def __init__(
        self,
        keys: KeyCache,
        tiers: Tiers,
        queue_environment: QueueEnvironment,
        now_ms: Callable[[], int],
        default_environment: str = "production",
    ) -> None:
        self.keys = keys
        self.default_environment = default_environment  # of queues created without auth
        self._tiers = {
            tier: {cls: Limit(rate, burst) for cls, (rate, burst) in limits.items()}
            for tier, limits in tiers.items()
        }
        self._queue_environment = queue_environment
        self._now_ms = now_ms
        self.limiter = RateLimiter()
        self._verified: dict[str, KeyRecord] = {}

    def authenticate(self, metadata: Iterable[tuple[str, Any]]) -> KeyRecord:
        values = [v for k, v in metadata if k == AUTH_HEADER]
        if not values:
            raise unauthenticated(
                "missing API key: send the metadata 'authorization: Bearer fmq_..._sk_...'"
            )
        if len(values) > 1 or not isinstance(values[0], str):
            raise unauthenticated("malformed API key: one authorization header, as text")
        cached = self._verified.get(values[0])
        # Identity, not equality: a revocation or reload puts a new record object in the cache
        # of keys, so a value checked against the old one is checked again.
        if cached is not None and self.keys.records.get(cached.key_id) is cached:
            return cached
        record = self._verify(values[0])
        if len(self._verified) >= VERIFIED_MAX:
            self._verified.clear()
        self._verified[values[0]] = record
        return record

    def _verify(self, value: str) -> KeyRecord:
        token = parse_bearer(value)
        presented = parse_key(token) if token is not None else None
        if presented is None:
            raise unauthenticated(
                "malformed API key: expected 'Bearer fmq_live_sk_<32 characters>' or "
                "'Bearer fmq_test_sk_<32 characters>'"
            )
        record = self.keys.records.get(presented.key_id)
        if record is None:
            raise UnknownApiKey(
                "INVALID_API_KEY",
                f"unknown API key fmq_{presented.kind}_sk_{presented.key_id}",
                key_id=presented.key_id,
            )
        if not record.matches(presented):
            raise unauthenticated(f"unknown API key fmq_{presented.kind}_sk_{presented.key_id}")
        if not record.active:
            raise unauthenticated(f"revoked API key {record.prefix}")
        return record

    def admit(self, method: str, request: Any, metadata: Iterable[tuple[str, Any]]) -> Identity:
        """Authenticate, authorize, rate-limit and check environments; -> the caller."""
        record = self.authenticate(metadata)
        authorize(record, method)
        now_ms = self._now_ms()
        action = METHOD_ACTIONS[method]
        rate_class = RATE_CLASS[action].value
        limit = self._tiers.get(record.tier, self._tiers["default"])[rate_class]
        wait_ms = self.limiter.take(
            record.key_id, rate_class, limit, _cost(method, request), now_ms
        )
        if wait_ms:
            raise _rate_limited(record, rate_class, limit, wait_ms)
        self._charge_bytes(record, request, now_ms)
        identity = Identity(record.key_id, record.environment, record.role, record.tier)
        if action is Action.CLUSTER and identity.environment != self.default_environment:
            # Shards are shared by every environment: moving leaders or replicas is for the
            # operators' environment only.
            raise permission_denied(
                f"{method} changes shards every environment shares: it takes an admin key of "
                f"the {self.default_environment} environment",
                method=method,
                environment=identity.environment,
            )
        # Names into the caller's namespace first: every check after this sees stored names,
        # so a name of another environment is never even looked up.
        scope_request(request, self.scope_of(identity))
        self.check_environment(identity, method, request)
        self.keys.note_used(record.key_id, now_ms)
        return identity

    def scope_of(self, identity: Identity) -> str:
        """The namespace of the caller's queue names ("" for the operators' environment)."""
        return scope_of(identity.environment, self.default_environment)

    def _charge_bytes(self, record: KeyRecord, request: Any, now_ms: int) -> None:
        """The tier's bytes bucket pays for the request's serialized size, so a key sending
        few but large messages is held to a byte rate like one sending many small ones (the
        same debt rule: a request beyond the burst waits for a full bucket, then pays all)."""
        limits = self._tiers.get(record.tier, self._tiers["default"])
        limit = limits.get(BYTES_CLASS)
        if limit is None:
            return
        size = int(request.ByteSize())
        if size == 0:
            return
        wait_ms = self.limiter.take(record.key_id, BYTES_CLASS, limit, size, now_ms)
        if wait_ms:
            raise _rate_limited(record, BYTES_CLASS, limit, wait_ms)

    def check_environment(self, identity: Identity, method: str, request: Any) -> None:
        """PERMISSION_DENIED when the request names a queue of another environment. Names are
        in the caller's namespace by now (``admit``), so only a queue created before namespaces
        (a development or staging queue under a name of the operators') can be one. A queue
        this node does not know passes (the node that has it checks forwarded calls): a caller
        that learns a queue later, e.g. by catching up, must check again."""
        if isinstance(request, pb.CreateQueueRequest):
            if request.config.environment not in ("", identity.environment):
                raise permission_denied(
                    f"a {identity.environment} key cannot create a queue in "
                    f"{request.config.environment}",
                    environment=identity.environment,
                )
            request.config.environment = identity.environment
        for queue in queues_of(request):
            env = self._environment_of(queue)
            if (
                env is not None
                and env != identity.environment
                and not self._legacy_for(identity, queue)
            ):
                raise permission_denied(
                    f"queue {queue!r} is not in the {identity.environment} environment",
                    queue=queue,
                    environment=identity.environment,
                )

    def _legacy_for(self, identity: Identity, queue: str) -> bool:
        """A queue of another environment created before namespaces holds a name of the
        operators' namespace, which its own environment no longer reaches: the operators'
        admins may, to move its messages and delete it."""
        return (
            not scope_of_name(queue)
            and identity.environment == self.default_environment
            and identity.role == "admin"
        )

    def filter_response(self, identity: Identity, method: str, response: Any) -> Any:
        """Drop from listings what belongs to other environments."""
        if isinstance(response, pb.ListQueuesResponse):
            keep = [q for q in response.queues if self.visible(identity, q.config)]
            del response.queues[:]
            response.queues.extend(keep)
        elif isinstance(response, apb.ShardInfo):
            self._filter_shard(identity, response)
        elif isinstance(response, apb.ClusterStatus):
            for shard in response.shards:
                self._filter_shard(identity, shard)
            queues = [q for q in response.queues if self._visible_name(identity, q.name)]
            del response.queues[:]
            response.queues.extend(queues)
            counters = [c for c in response.queue_counters if self._visible_name(identity, c.queue)]
            del response.queue_counters[:]
            response.queue_counters.extend(counters)
        return response

    def _filter_shard(self, identity: Identity, shard: apb.ShardInfo) -> None:
        names = [q for q in shard.queues if self._visible_name(identity, q)]
        del shard.queues[:]
        shard.queues.extend(names)

    def visible(self, identity: Identity, config: pb.QueueConfig) -> bool:
        return (config.environment or self.default_environment) == identity.environment

    def _visible_name(self, identity: Identity, queue: str) -> bool:
        env = self._environment_of(queue)
        return (env or self.default_environment) == identity.environment

    def _environment_of(self, queue: str) -> str | None:
        """The environment of a stored name: its scope, else (a name of the operators'
        environment, or one created before namespaces) what its config says; None when it is
        not scoped and no group this node hosts has it."""
        scope = scope_of_name(queue)
        if scope:
            return scope
        env = self._queue_environment(queue)
        if env is None:
            return None
        return env or self.default_environment


# Refusals of callers without a valid key are audited at most this often: anyone who can reach
# the port can make them, and each must not cost the node a log line without bound.
UNAUTHENTICATED_AUDIT = Limit(rate_per_s=10, burst=100)


class _RefusalAudit:
    """The budget of audit lines for callers without a valid key, and what it skipped."""

    def __init__(self) -> None:
        self.bucket = Bucket(UNAUTHENTICATED_AUDIT, float(UNAUTHENTICATED_AUDIT.burst), 0)
        self.skipped = 0

    def admit(self) -> int | None:
        """-> how many earlier refusals went unlogged (to say so on this line), or None when
        this one must go unlogged too."""
        if self.bucket.take(1, int(time.monotonic() * 1000)):
            self.skipped += 1
            return None
        skipped, self.skipped = self.skipped, 0
        return skipped


_refusals = _RefusalAudit()


def audit(
    identity: Identity | None,
    method: str,
    request_id: str,
    outcome: str,
    what: str,
    *,
    auth_on: bool = False,
    refused: bool = False,
) -> None:
    """One line per admin action: who, what, when (the log line's time), request id. ``what``
    may hold caller-supplied text: it is escaped and cut here (one line, bounded). A call the
    guard refused is logged as refused, with the key when it was valid (a role or environment
    violation, a rate limit), and at a bounded rate when the caller had no valid key."""
    what = printable(what)
    if identity is None and not auth_on:
        audit_log.info(
            "admin action %s by anonymous (auth off): %s -> %s (request id %s)",
            method, what, outcome, request_id,
        )  # fmt: skip
        return
    if identity is None:
        skipped = _refusals.admit()
        if skipped is None:
            return
        audit_log.info(
            "admin action %s REFUSED for a caller without a valid key: %s -> %s "
            "(request id %s)%s",
            method, what, outcome, request_id,
            f" ({skipped} more such refusals not logged)" if skipped else "",
        )  # fmt: skip
        return
    verb = "REFUSED for" if refused else "by"
    audit_log.info(
        "admin action %s %s %s: %s -> %s (request id %s)",
        method, verb, identity, what, outcome, request_id,
    )  # fmt: skip
