"""``EtcdMetadataStore``: cluster metadata in etcd v3, through aetcd (asyncio gRPC client).

Layout under the prefix (default ``/fluxmq/``): ``nodes/<id>`` (leased), ``groups/<id>``,
``placements/<queue>``, ``leaders/<group>``, ``settings/<key>``; values are the JSON records of
``fluxmq.cluster.metadata``.

- Nodes: ``register_node`` grants an etcd lease of ``ceil(ttl_ms / 1000)`` seconds (etcd may raise
  it to its own minimum, 1.5 x election timeout) and attaches the key to it; ``refresh_node`` is a
  lease keepalive. A node that stops refreshing disappears when etcd expires the lease.
- Creations are transactions guarded by ``create_revision == 0``; ``update_group`` by
  ``mod_revision == expect_revision``; so two nodes never both win.
- Every public call runs under one deadline (``timeout_ms``, default 2 s). Connection failures,
  timeouts and etcd-side unavailability become ``MetadataUnavailable``; the gRPC channel retries
  connecting with a short backoff, so calls work again soon after etcd is back.
- A watch owns a background task that re-creates the etcd watch after failures (with backoff)
  and emits resync events once it is established again, since events in between are lost.

The count limits (NODES_MAX, GROUPS_MAX) are checked before writing, not inside the transaction:
concurrent creators may overshoot them slightly. One endpoint only: aetcd connects to a single
host, so high availability of etcd itself needs a load balancer or DNS name in front of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
import aetcd.rpc

from fluxmq.cluster.metadata import (
    EVENT_KINDS,
    GROUPS_MAX,
    NODES_MAX,
    AlreadyExists,
    EventKind,
    GroupInfo,
    LimitExceeded,
    MetadataCorrupt,
    MetadataError,
    MetadataEvent,
    MetadataUnavailable,
    MetadataWatch,
    NodeInfo,
    NodeNotRegistered,
    NotFound,
    Placement,
    RevisionConflict,
    Versioned,
    check_group_id,
    check_int,
    check_list_args,
    check_node_id,
    check_queue_name,
    check_revision,
    check_setting_key,
    check_setting_value,
    check_term,
    check_ttl_ms,
    decode_group,
    decode_leader,
    decode_node,
    decode_placement,
    decode_setting,
    encode_group,
    encode_leader,
    encode_node,
    encode_placement,
    encode_setting,
)

T = TypeVar("T")

PREFIX_DEFAULT = "/fluxmq/"
TIMEOUT_MS_DEFAULT = 2000
PAGE_KEYS = 1000  # keys per etcd range request when reading a whole kind
LEADER_CAS_ATTEMPTS = 16
WATCH_RETRY_MIN_MS = 100
WATCH_RETRY_MAX_MS = 2000

_DIRS: dict[EventKind, str] = {
    "node": "nodes/",
    "group": "groups/",
    "placement": "placements/",
    "leader": "leaders/",
    "setting": "settings/",
}
_KIND_BY_DIR = {directory: kind for kind, directory in _DIRS.items()}
assert set(_DIRS) == set(EVENT_KINDS)

# Status codes that mean "etcd is not reachable or not serving right now" (worth a retry).
_UNAVAILABLE_CODES = frozenset(
    getattr(aetcd.rpc.StatusCode, name)
    for name in (
        "UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "CANCELLED",
        "UNKNOWN",
        "INTERNAL",
        "ABORTED",
        "RESOURCE_EXHAUSTED",
    )
)

_UNAVAILABLE_ERRORS = (
    aetcd.ConnectionFailedError,
    aetcd.ConnectionTimeoutError,
    aetcd.InternalError,
    aetcd.WatchTimeoutError,
)


_REJECTED_ERRORS = (
    aetcd.InvalidArgumentError,
    aetcd.PreconditionFailedError,
    aetcd.exceptions.UnauthenticatedError,
)


def _prefix_end(prefix: bytes) -> bytes:
    """The first key after every key starting with ``prefix`` (whose last byte is ASCII)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise ValueError(f"prefix must be a string, got {type(prefix).__name__}")
    if not (2 <= len(prefix) <= 128 and prefix.startswith("/") and prefix.endswith("/")):
        raise ValueError(f"prefix {prefix!r} must be 2..128 characters, start and end with '/'")
    if not prefix.isascii() or not prefix.isprintable() or " " in prefix:
        raise ValueError(f"prefix {prefix!r} must be printable ASCII without spaces")
    return prefix


def _check_endpoint(endpoint: object) -> tuple[str, int]:
    if not isinstance(endpoint, str) or ":" not in endpoint:
        raise ValueError(f"endpoint {endpoint!r} must be 'host:port'")
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"endpoint {endpoint!r} must be 'host:port'")
    return host, int(port)


class _EtcdWatch(MetadataWatch):
    """Feeds a MetadataWatch from an etcd watch on the whole prefix, reconnecting forever."""

    def __init__(self, store: EtcdMetadataStore) -> None:
        super().__init__()
        self._store = store
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        store = self._store
        retry_ms = WATCH_RETRY_MIN_MS
        while not self.closed:
            try:
                async with asyncio.timeout(store.timeout_ms / 1000):
                    stream = await store.client.watch(store.root, range_end=_prefix_end(store.root))
            except Exception:  # unreachable etcd, timeouts, aetcd's own failures: retry
                await asyncio.sleep(retry_ms / 1000)
                retry_ms = min(2 * retry_ms, WATCH_RETRY_MAX_MS)
                continue
            retry_ms = WATCH_RETRY_MIN_MS
            # Whatever changed before the watch existed is only visible by re-reading.
            self.push_resync()
            try:
                async for event in stream:
                    parsed = store.parse_key(bytes(event.kv.key))
                    if parsed is not None:
                        deleted = event.kind == "DELETE"
                        group_id = ""
                        if parsed[0] == "placement" and not deleted:
                            with contextlib.suppress(MetadataError, ValueError):
                                placed = decode_placement(bytes(event.kv.value), parsed[1])
                                group_id = placed.group_id
                        self.push(MetadataEvent(parsed[0], parsed[1], deleted, group_id))
            except Exception:  # the stream broke; a consumer must never wait on a dead task
                await asyncio.sleep(retry_ms / 1000)
                continue
            finally:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(store.timeout_ms / 1000):
                        await stream.cancel()
            self.end()  # the stream ends cleanly only when the client closes
            return

    async def _shutdown(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._store.forget_watch(self)


class EtcdMetadataStore:
    """The MetadataStore on etcd; see the module docstring."""

    def __init__(
        self,
        endpoint: str = "127.0.0.1:2379",
        *,
        prefix: str = PREFIX_DEFAULT,
        timeout_ms: int = TIMEOUT_MS_DEFAULT,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        host, port = _check_endpoint(endpoint)
        self.endpoint = endpoint
        self.timeout_ms = check_int("timeout_ms", timeout_ms, 10, 600_000)
        self._prefix = _check_prefix(prefix)
        self.root = self._prefix.encode()
        self.client = aetcd.Client(
            host=host,
            port=port,
            username=username,
            password=password,
            timeout=self.timeout_ms / 1000,
            options={
                # gRPC backs off up to 2 min between reconnects by default; etcd restarts in
                # seconds, and callers must see it back about as soon.
                "grpc.initial_reconnect_backoff_ms": 100,
                "grpc.min_reconnect_backoff_ms": 100,
                "grpc.max_reconnect_backoff_ms": 1000,
                # Notice a silently dead etcd (no RST) on idle watch streams.
                "grpc.keepalive_time_ms": 10_000,
                "grpc.keepalive_timeout_ms": 5_000,
            },
        )
        self._leases: dict[str, int] = {}  # node id -> lease id, for refresh without a read
        self._watches: set[_EtcdWatch] = set()
        self._closed = False

    # --- plumbing -----------------------------------------------------------------------------

    def _key(self, kind: EventKind, name: str) -> bytes:
        return (self._prefix + _DIRS[kind] + name).encode()

    def _dir(self, kind: EventKind) -> bytes:
        return (self._prefix + _DIRS[kind]).encode()

    def parse_key(self, key: bytes) -> tuple[EventKind, str] | None:
        """(kind, name) of a key under the prefix, None for anything else."""
        if not key.startswith(self.root):
            return None
        rest = key[len(self.root) :].decode("utf-8", "replace")
        directory, slash, name = rest.partition("/")
        kind = _KIND_BY_DIR.get(directory + slash)
        return None if kind is None or not name else (kind, name)

    async def _call(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        """Runs one public operation under the deadline, translating transport failures."""
        if self._closed:
            raise MetadataUnavailable("the etcd metadata store is closed")
        try:
            async with asyncio.timeout(self.timeout_ms / 1000):
                return await operation()
        except TimeoutError as e:
            raise MetadataUnavailable(
                f"etcd at {self.endpoint}: {what} timed out after {self.timeout_ms} ms"
            ) from e
        except _UNAVAILABLE_ERRORS as e:
            raise MetadataUnavailable(f"etcd at {self.endpoint}: {what}: {e}") from e
        except aetcd.rpc.AioRpcError as e:
            if e.code() in _UNAVAILABLE_CODES:
                raise MetadataUnavailable(f"etcd at {self.endpoint}: {what}: {e.details()}") from e
            raise MetadataError(f"etcd at {self.endpoint}: {what}: {e.details()}") from e
        except aetcd.ClientError as e:
            # Unmapped gRPC codes land here; only argument and auth errors are not transient.
            if isinstance(e, _REJECTED_ERRORS):
                raise MetadataError(f"etcd at {self.endpoint}: {what}: {e}") from e
            raise MetadataUnavailable(f"etcd at {self.endpoint}: {what}: {e}") from e

    @staticmethod
    def _name(key: bytes, directory: bytes) -> str:
        try:
            return bytes(key)[len(directory) :].decode()
        except UnicodeDecodeError as e:
            raise MetadataCorrupt(f"etcd: key {bytes(key)!r} is not UTF-8") from e

    async def _range(self, start: bytes, end: bytes, limit: int) -> tuple[list[Any], bool]:
        """Keys in [start, end) in key order, at most ``limit``; aetcd's get_range has no limit."""
        await self.client.connect()
        request = aetcd.rpc.RangeRequest(key=start, range_end=end, limit=limit)
        response = await self.client.kvstub.Range(
            request, timeout=self.timeout_ms / 1000, metadata=self.client.metadata
        )
        return list(response.kvs), bool(response.more)

    async def _count(self, kind: EventKind) -> int:
        await self.client.connect()
        directory = self._dir(kind)
        request = aetcd.rpc.RangeRequest(
            key=directory, range_end=_prefix_end(directory), count_only=True
        )
        response = await self.client.kvstub.Range(
            request, timeout=self.timeout_ms / 1000, metadata=self.client.metadata
        )
        return int(response.count)

    async def _scan(self, kind: EventKind) -> list[tuple[str, Any]]:
        """Every (name, kv) of a kind, paging so no single response grows without bound."""
        directory = self._dir(kind)
        start, end = directory, _prefix_end(directory)
        found: list[tuple[str, Any]] = []
        while True:
            kvs, more = await self._range(start, end, PAGE_KEYS)
            found.extend((self._name(kv.key, directory), kv) for kv in kvs)
            if not more or not kvs:
                return found
            start = bytes(kvs[-1].key) + b"\x00"

    async def _create(self, key: bytes, value: bytes) -> bool:
        """Puts ``key`` only if it does not exist; False if it did."""
        tx = self.client.transactions
        succeeded, _ = await self.client.transaction(
            compare=[tx.create(key) == 0], success=[tx.put(key, value)], failure=[]
        )
        return bool(succeeded)

    def forget_watch(self, watch: _EtcdWatch) -> None:
        self._watches.discard(watch)

    # --- nodes --------------------------------------------------------------------------------

    async def register_node(self, node: NodeInfo, ttl_ms: int) -> None:
        if not isinstance(node, NodeInfo):
            raise ValueError(f"node must be a NodeInfo, got {type(node).__name__}")
        ttl_s = math.ceil(check_ttl_ms(ttl_ms) / 1000)
        key = self._key("node", node.node_id)

        async def register() -> None:
            if await self._count("node") >= NODES_MAX and await self.client.get(key) is None:
                raise LimitExceeded(f"at most {NODES_MAX} nodes may be registered")
            lease = await self.client.lease(ttl_s)
            put = await self.client.put(key, encode_node(node), lease=lease.id, prev_kv=True)
            self._leases[node.node_id] = lease.id
            old_lease = put.prev_kv.lease if put.prev_kv is not None else 0
            if old_lease and old_lease != lease.id:
                # The key moved to the new lease; the old one has nothing left to keep.
                with contextlib.suppress(aetcd.ClientError):
                    await self.client.revoke_lease(old_lease)

        await self._call("register_node", register)

    async def refresh_node(self, node_id: str) -> None:
        check_node_id(node_id)
        key = self._key("node", node_id)

        async def refresh() -> None:
            lease_id = self._leases.get(node_id)
            if lease_id is None:
                kv = await self.client.get(key)
                if kv is None:
                    raise NodeNotRegistered(f"node {node_id!r} is not registered")
                if not kv.lease:
                    raise MetadataCorrupt(f"etcd: node key {key!r} is not attached to a lease")
                lease_id = int(kv.lease)
            reply = await self.client.refresh_lease(lease_id)
            if reply is None or reply.TTL <= 0:
                self._leases.pop(node_id, None)
                raise NodeNotRegistered(f"node {node_id!r}: its lease lapsed; register again")
            self._leases[node_id] = lease_id

        await self._call("refresh_node", refresh)

    async def deregister_node(self, node_id: str) -> None:
        check_node_id(node_id)
        key = self._key("node", node_id)

        async def deregister() -> None:
            deleted = await self.client.delete(key, prev_kv=True)
            lease_ids = {self._leases.pop(node_id, 0)}
            if deleted is not None and deleted.prev_kv is not None:
                lease_ids.add(deleted.prev_kv.lease)
            for lease_id in lease_ids - {0}:
                # The key is already gone; an unrevoked lease would only expire on its own.
                with contextlib.suppress(aetcd.ClientError):
                    await self.client.revoke_lease(lease_id)

        await self._call("deregister_node", deregister)

    async def list_nodes(self) -> list[NodeInfo]:
        async def list_all() -> list[NodeInfo]:
            return [decode_node(bytes(kv.value), name) for name, kv in await self._scan("node")]

        return await self._call("list_nodes", list_all)

    # --- groups -------------------------------------------------------------------------------

    async def create_group(self, group: GroupInfo) -> None:
        if not isinstance(group, GroupInfo):
            raise ValueError(f"group must be a GroupInfo, got {type(group).__name__}")
        key = self._key("group", group.group_id)

        async def create() -> None:
            if await self._count("group") >= GROUPS_MAX:
                raise LimitExceeded(f"at most {GROUPS_MAX} groups")
            if not await self._create(key, encode_group(group)):
                raise AlreadyExists(f"group {group.group_id!r} already exists")

        await self._call("create_group", create)

    async def update_group(self, group: GroupInfo, expect_revision: int) -> int:
        if not isinstance(group, GroupInfo):
            raise ValueError(f"group must be a GroupInfo, got {type(group).__name__}")
        check_revision(expect_revision)
        key = self._key("group", group.group_id)
        tx = self.client.transactions

        async def update() -> int:
            succeeded, responses = await self.client.transaction(
                compare=[tx.mod(key) == expect_revision],
                success=[tx.put(key, encode_group(group)), tx.get(key)],
                failure=[tx.get(key)],
            )
            if succeeded:
                # The get after the put, in the same transaction, reports the put's revision.
                (_, kv), *_ = responses[1]
                return int(kv.mod_revision)
            if not responses[0]:
                raise NotFound(f"group {group.group_id!r} does not exist")
            current = int(responses[0][0][1].mod_revision)
            raise RevisionConflict(
                f"group {group.group_id!r} is at revision {current}, not {expect_revision}"
            )

        return await self._call("update_group", update)

    async def get_group(self, group_id: str) -> Versioned[GroupInfo] | None:
        check_group_id(group_id)

        async def get() -> Versioned[GroupInfo] | None:
            kv = await self.client.get(self._key("group", group_id))
            if kv is None:
                return None
            return Versioned(decode_group(bytes(kv.value), group_id), int(kv.mod_revision))

        return await self._call("get_group", get)

    async def list_groups(self) -> list[Versioned[GroupInfo]]:
        async def list_all() -> list[Versioned[GroupInfo]]:
            return [
                Versioned(decode_group(bytes(kv.value), name), int(kv.mod_revision))
                for name, kv in await self._scan("group")
            ]

        return await self._call("list_groups", list_all)

    # --- placements ---------------------------------------------------------------------------

    async def create_placement(self, placement: Placement) -> None:
        if not isinstance(placement, Placement):
            raise ValueError(f"placement must be a Placement, got {type(placement).__name__}")
        key = self._key("placement", placement.queue)

        async def create() -> None:
            if not await self._create(key, encode_placement(placement)):
                raise AlreadyExists(f"queue {placement.queue!r} is already placed")

        await self._call("create_placement", create)

    async def get_placement(self, queue: str) -> Placement | None:
        check_queue_name(queue)

        async def get() -> Placement | None:
            kv = await self.client.get(self._key("placement", queue))
            return None if kv is None else decode_placement(bytes(kv.value), queue)

        return await self._call("get_placement", get)

    async def list_placements(
        self, prefix: str = "", after: str = "", limit: int = 1000
    ) -> list[Placement]:
        prefix, after, limit = check_list_args(prefix, after, limit)
        directory = self._dir("placement")
        scope = directory + prefix.encode()  # the keys of every queue starting with prefix
        start, end = scope, _prefix_end(scope)
        if after:
            start = max(start, directory + after.encode() + b"\x00")

        async def list_page() -> list[Placement]:
            if start >= end:
                return []
            kvs, _ = await self._range(start, end, limit)
            return [decode_placement(bytes(kv.value), self._name(kv.key, directory)) for kv in kvs]

        return await self._call("list_placements", list_page)

    async def delete_placement(self, queue: str) -> bool:
        check_queue_name(queue)

        async def delete() -> bool:
            return await self.client.delete(self._key("placement", queue)) is not None

        return await self._call("delete_placement", delete)

    # --- leaders ------------------------------------------------------------------------------

    async def set_group_leader(self, group_id: str, node_id: str, term: int) -> None:
        check_group_id(group_id)
        check_node_id(node_id)
        check_term(term)
        key = self._key("leader", group_id)
        value = encode_leader(node_id, term)
        tx = self.client.transactions

        async def set_leader() -> None:
            for _ in range(LEADER_CAS_ATTEMPTS):
                kv = await self.client.get(key)
                if kv is None:
                    if await self._create(key, value):
                        return
                    continue
                if decode_leader(bytes(kv.value), group_id)[1] >= term:
                    return
                succeeded, _ = await self.client.transaction(
                    compare=[tx.mod(key) == kv.mod_revision],
                    success=[tx.put(key, value)],
                    failure=[],
                )
                if succeeded:
                    return
            raise RevisionConflict(f"leader of {group_id!r}: lost {LEADER_CAS_ATTEMPTS} races")

        await self._call("set_group_leader", set_leader)

    async def get_group_leaders(self) -> dict[str, tuple[str, int]]:
        async def get_all() -> dict[str, tuple[str, int]]:
            return {
                name: decode_leader(bytes(kv.value), name)
                for name, kv in await self._scan("leader")
            }

        return await self._call("get_group_leaders", get_all)

    # --- settings -----------------------------------------------------------------------------

    async def get_setting(self, key: str) -> str | None:
        check_setting_key(key)

        async def get() -> str | None:
            kv = await self.client.get(self._key("setting", key))
            return None if kv is None else decode_setting(bytes(kv.value), key)

        return await self._call("get_setting", get)

    async def put_setting(self, key: str, value: str) -> None:
        check_setting_key(key)
        check_setting_value(value)

        async def put() -> None:
            await self.client.put(self._key("setting", key), encode_setting(value))

        await self._call("put_setting", put)

    # --- watch and close ----------------------------------------------------------------------

    def watch(self) -> MetadataWatch:
        if self._closed:
            raise MetadataUnavailable("the etcd metadata store is closed")
        watch = _EtcdWatch(self)
        self._watches.add(watch)
        return watch

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for watch in list(self._watches):
            await watch.aclose()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.timeout_ms / 1000):
                await self.client.close()
