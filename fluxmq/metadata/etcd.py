"""``EtcdMetadataStore``: cluster metadata in etcd v3, through aetcd (asyncio gRPC client).

Layout under the prefix (default ``/fluxmq/``): ``nodes/<id>`` (leased), ``groups/<id>``,
``placements/<queue>``, ``leaders/<group>``, ``settings/<key>``, ``keys/<key_id>`` (API keys),
``key_slots/<environment>/<role>`` (the ids of that pair's active keys), ``keys_used/<key_id>``
(last-used times), ``raft_ports/<node>/<port>`` (the group that claimed a node's Raft port) and
``roles/<role>`` (the node holding a cluster role, a leased key); values are the JSON records of
``fluxmq.metadata.metadata``. Only the first six are watched: slots, usage, port claims and roles
make no events.

- Nodes: ``register_node`` grants an etcd lease of ``ceil(ttl_ms / 1000)`` seconds (etcd may raise
  it to its own minimum, 1.5 x election timeout) and attaches the key to it; ``refresh_node`` is a
  lease keepalive. A node that stops refreshing disappears when etcd expires the lease.
- Creations are transactions guarded by ``create_revision == 0``; ``update_shard`` by
  ``mod_revision == expect_revision``; so two nodes never both win. A group's record and the
  claims of the Raft ports it names are written in one transaction guarded by each claim's
  ``create_revision == 0`` too: two nodes provisioning groups at once never give one port of a
  node to two groups.
- API keys: the rotation limit is a property of the slot record, not of a count of keys. Creating
  a key is one transaction guarded by ``create_revision(key) == 0`` and the slot's
  ``mod_revision`` as read (``create_revision == 0`` while it does not exist yet) that writes the
  record and the slot with the new id; revoking guards the record and the slot the same way and
  removes the id. A writer that loses re-reads and tries again, at most KEY_CAS_ATTEMPTS times
  (then RevisionConflict), so of concurrent creators on any number of nodes only as many win as
  there are free slots. Last-used times live in their own keys, so touching never makes a
  revocation retry; they move forward by compare-and-set too, guarded by the record's create
  revision so that no usage record outlives its key. At API_KEYS_MAX keys a create first
  deletes the longest-revoked ones (record and usage), each only while unchanged.
- Every public call runs under one deadline (``timeout_ms``, default 2 s). Connection failures,
  timeouts and etcd-side unavailability become ``MetadataUnavailable``; the gRPC channel retries
  connecting with a short backoff, so calls work again soon after etcd is back.
- A watch owns a background task that re-creates the etcd watch after failures (with backoff)
  and emits resync events once it is established again, since events in between are lost.

The count limits (NODES_MAX, SHARDS_MAX, API_KEYS_MAX) are checked before writing, not inside the
transaction: concurrent creators may overshoot them slightly (the per-role key limit is exact).
One endpoint only: aetcd connects to a single host, so high availability of etcd itself needs a
load balancer or DNS name in front of it.

Security: whoever can write to etcd could otherwise mint API keys, so etcd must run with
authentication and TLS, reachable by the nodes only. The store speaks TLS when given a CA file
(``ca_file``; ``cert_file``/``key_file`` add a client certificate, which etcd with
``--client-cert-auth`` takes as the user's name) and authenticates with ``username``/``password``.
aetcd 1.0 opens plaintext channels only, so ``_Client`` opens the channel itself, and it
authenticates again when etcd forgets the token (a restart, or the token's TTL). With
``record_secret`` (the cluster secret) every API key record carries an HMAC (``mac``): a record
without a valid one was written by someone without the secret, and is treated as absent and logged
(``metadata.ForgedRecord``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.watcher
import grpc

from fluxmq.core.auth import KeyRecord
from fluxmq.metadata.metadata import (
    API_KEYS_MAX,
    API_KEYS_READ_MAX,
    EVENT_KINDS,
    NODES_MAX,
    SHARDS_MAX,
    AlreadyExists,
    EventKind,
    LimitExceeded,
    MetadataCorrupt,
    MetadataError,
    MetadataEvent,
    MetadataRefused,
    MetadataUnavailable,
    MetadataWatch,
    NodeInfo,
    NodeNotRegistered,
    NotFound,
    Placement,
    PortTaken,
    RevisionConflict,
    ShardRecord,
    Versioned,
    api_key_seal_key,
    check_int,
    check_key_id,
    check_key_usage,
    check_list_args,
    check_new_api_key,
    check_node_id,
    check_queue_name,
    check_revision,
    check_revoked_ms,
    check_role,
    check_setting_key,
    check_setting_value,
    check_shard_id,
    check_term,
    check_ttl_ms,
    decode_key_slots,
    decode_key_usage,
    decode_sealed_api_key,
    encode_api_key,
    encode_key_slots,
    encode_key_usage,
    key_limit_reached,
    keys_to_forget,
    sort_api_keys,
)
from fluxmq.metadata.sealed_records import SEALED_KINDS, RecordSeal, ResealReport, TopologyCodec

T = TypeVar("T")

PREFIX_DEFAULT = "/fluxmq/"
TIMEOUT_MS_DEFAULT = 2000
PAGE_KEYS = 1000  # keys per etcd range request when reading a whole kind
LEADER_CAS_ATTEMPTS = 16
KEY_CAS_ATTEMPTS = 16
KEY_CAS_BACKOFF_MS = 5  # at most this x the attempt number, at random, between attempts
# etcd refuses a transaction with more than 128 compares, or 128 operations on either branch
# (its default --max-txn-ops): at most two of each per key.
TOUCH_BATCH_KEYS = 50
KEYS_FORGOTTEN_PER_TXN = 50
WATCH_RETRY_MIN_MS = 100
WATCH_RETRY_MAX_MS = 2000

_DIRS: dict[EventKind, str] = {
    "node": "nodes/",
    "group": "groups/",
    "placement": "placements/",
    "leader": "leaders/",
    "setting": "settings/",
    "api_key": "keys/",
}
_SLOTS_DIR = "key_slots/"
_USAGE_DIR = "keys_used/"
_PORTS_DIR = "raft_ports/"  # raft_ports/<node id>/<port> -> the group holding it
_ROLES_DIR = "roles/"  # roles/<role> -> the node holding it (a leased key)
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


_AUTH_HINT = (
    "etcd refused this node's credentials (set etcd_user and etcd_password_file, or "
    "etcd_cert_file and etcd_key_file with a certificate whose common name is an etcd user)"
)
# etcd's answers when it no longer knows a token it issued: authenticate again.
_STALE_TOKEN_DETAILS = ("invalid auth token", "auth token is expired")
# etcd's answers to missing or wrong credentials: retrying cannot help.
_REFUSED_DETAILS = ("user name is empty", "authentication failed", "permission denied")


def _read_pem(name: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{name}: cannot read {path!r}: {e.strerror}") from None


def _channel_credentials(ca_file: str, cert_file: str, key_file: str) -> grpc.ChannelCredentials:
    if bool(cert_file) != bool(key_file):
        raise ValueError("cert_file and key_file: give both or neither")
    if cert_file and not ca_file:
        raise ValueError("cert_file: a client certificate needs ca_file (TLS to etcd)")
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem("ca_file", ca_file),
        private_key=_read_pem("key_file", key_file) if key_file else None,
        certificate_chain=_read_pem("cert_file", cert_file) if cert_file else None,
    )


class _Client(aetcd.Client):  # type: ignore[misc]
    """aetcd's client over a TLS channel when given credentials; the rest of its connect() as
    is (aetcd 1.0 cannot open anything but a plaintext channel)."""

    _is_connecting: bool
    _connected: asyncio.Event

    def __init__(self, *, credentials: grpc.ChannelCredentials | None, **kwargs: Any) -> None:
        self._credentials = credentials
        super().__init__(**kwargs)

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            options = list(self._options.items())
            if self._credentials is None:
                self.channel = aetcd.rpc.insecure_channel(target, options=options)
            else:
                self.channel = aetcd.rpc.secure_channel(target, self._credentials, options=options)
            if self._username is not None and self._password is not None:
                self.auth_stub = aetcd.rpc.AuthStub(self.channel)
                request = aetcd.rpc.AuthenticateRequest(
                    name=self._username, password=self._password
                )
                resp = await self.auth_stub.Authenticate(request, timeout=self._timeout)
                self.metadata = (("token", resp.token),)
            self.kvstub = aetcd.rpc.KVStub(self.channel)
            self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
            self.leasestub = aetcd.rpc.LeaseStub(self.channel)
            self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                aetcd.rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        except BaseException:
            if self.channel is not None:
                await self.channel.close()
            self._init_channel_attrs()
            raise
        finally:
            self._is_connecting = False


def _detail(e: BaseException) -> str:
    return e.details() if isinstance(e, aetcd.rpc.AioRpcError) else str(e)


def _is_stale_token(e: BaseException) -> bool:
    return any(d in _detail(e) for d in _STALE_TOKEN_DETAILS)


def _is_refused(e: BaseException) -> bool:
    code = e.code() if isinstance(e, aetcd.rpc.AioRpcError) else None
    return code == aetcd.rpc.StatusCode.PERMISSION_DENIED or any(
        d in _detail(e) for d in _REFUSED_DETAILS
    )


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
            except Exception as e:  # unreachable etcd, timeouts, aetcd's own failures: retry
                await store.forget_stale_token(e)
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
                                placed = store.records.decode_placement(
                                    bytes(event.kv.value), parsed[1]
                                )
                                group_id = "" if placed is None else placed.group_id
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
        ca_file: str = "",
        cert_file: str = "",
        key_file: str = "",
        record_secret: str = "",
    ) -> None:
        """``username``/``password``: etcd's user (both or neither). ``ca_file``: speak TLS
        to etcd and trust this CA; ``cert_file``/``key_file``: this node's client certificate.
        ``record_secret``: seal API key records with it and ignore records not sealed with it
        (the cluster secret; every node of a cluster needs the same one)."""
        host, port = _check_endpoint(endpoint)
        if (username is None) != (password is None) or username == "" or password == "":
            raise ValueError("username and password: give both (non-empty) or neither")
        self.endpoint = endpoint
        self.timeout_ms = check_int("timeout_ms", timeout_ms, 10, 600_000)
        self._prefix = _check_prefix(prefix)
        self.root = self._prefix.encode()
        self._seal_key = api_key_seal_key(record_secret) if record_secret else None
        self.records = TopologyCodec(RecordSeal(record_secret) if record_secret else None)
        self._has_password = username is not None
        credentials = (
            _channel_credentials(ca_file, cert_file, key_file)
            if ca_file or cert_file or key_file
            else None
        )
        self.client = _Client(
            credentials=credentials,
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
        # (role, node id) -> the lease of the role key this store took for that node
        self._role_leases: dict[tuple[str, str], int] = {}
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

    async def forget_stale_token(self, e: BaseException) -> bool:
        """After etcd refused this client's token (etcd restarted, or the token expired): drop
        the channel, so the next call connects and authenticates again. -> whether it did."""
        if not self._has_password or not _is_stale_token(e):
            return False
        with contextlib.suppress(Exception):
            await self.client.close()
        return True

    async def _call(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        """Runs one public operation under the deadline, translating transport failures. An
        operation etcd refused for a stale token did nothing, so it runs once more."""
        if self._closed:
            raise MetadataUnavailable("the etcd metadata store is closed")
        try:
            async with asyncio.timeout(self.timeout_ms / 1000):
                try:
                    return await operation()
                except (aetcd.ClientError, aetcd.rpc.AioRpcError) as e:
                    if not await self.forget_stale_token(e):
                        raise
                    return await operation()
        except TimeoutError as e:
            raise MetadataUnavailable(
                f"etcd at {self.endpoint}: {what} timed out after {self.timeout_ms} ms"
            ) from e
        except _UNAVAILABLE_ERRORS as e:
            raise MetadataUnavailable(f"etcd at {self.endpoint}: {what}: {e}") from e
        except aetcd.rpc.AioRpcError as e:
            if _is_refused(e):
                raise MetadataRefused(
                    f"etcd at {self.endpoint}: {what}: {e.details()}: {_AUTH_HINT}"
                ) from e
            if e.code() in _UNAVAILABLE_CODES:
                raise MetadataUnavailable(f"etcd at {self.endpoint}: {what}: {e.details()}") from e
            raise MetadataError(f"etcd at {self.endpoint}: {what}: {e.details()}") from e
        except aetcd.ClientError as e:
            if _is_refused(e):
                raise MetadataRefused(f"etcd at {self.endpoint}: {what}: {e}: {_AUTH_HINT}") from e
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
        return await self._scan_dir(self._dir(kind))

    async def _scan_dir(self, directory: bytes, cap: int | None = None) -> list[tuple[str, Any]]:
        """Every (name, kv) under ``directory``; LimitExceeded when there are more than ``cap``."""
        start, end = directory, _prefix_end(directory)
        found: list[tuple[str, Any]] = []
        while True:
            kvs, more = await self._range(start, end, PAGE_KEYS)
            found.extend((self._name(kv.key, directory), kv) for kv in kvs)
            if cap is not None and len(found) > cap:
                raise LimitExceeded(f"more than {cap} records under {directory!r}")
            if not more or not kvs:
                return found
            start = bytes(kvs[-1].key) + b"\x00"

    async def _get_many(self, keys: list[bytes]) -> list[Any]:
        """Each key's kv, or None where it does not exist, all read at one revision."""
        tx = self.client.transactions
        _, responses = await self.client.transaction(
            compare=[], success=[tx.get(key) for key in keys], failure=[]
        )
        return [found[0][1] if found else None for found in responses]

    def _unchanged(self, key: bytes, kv: Any) -> Any:
        """The compare that holds while ``key`` is still as read (``kv`` None: still absent)."""
        tx = self.client.transactions
        return tx.create(key) == 0 if kv is None else tx.mod(key) == int(kv.mod_revision)

    def _slots_key(self, environment: str, role: str) -> bytes:
        return f"{self._prefix}{_SLOTS_DIR}{environment}/{role}".encode()

    def _usage_key(self, key_id: str) -> bytes:
        return f"{self._prefix}{_USAGE_DIR}{key_id}".encode()

    def _active_ids(self, slots_key: bytes, kv: Any) -> list[str]:
        return [] if kv is None else decode_key_slots(bytes(kv.value), slots_key.decode())

    @staticmethod
    async def _back_off(attempt: int) -> None:
        await asyncio.sleep(random.uniform(0, KEY_CAS_BACKOFF_MS * attempt) / 1000)

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
            put = await self.client.put(
                key, self.records.encode_node(node), lease=lease.id, prev_kv=True
            )
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
            found = [
                self.records.decode_node(bytes(kv.value), name)
                for name, kv in await self._scan("node")
            ]
            return [n for n in found if n is not None]

        return await self._call("list_nodes", list_all)

    # --- groups -------------------------------------------------------------------------------

    def _port_key(self, node_id: str, port: int) -> bytes:
        return f"{self._prefix}{_PORTS_DIR}{node_id}/{port}".encode()

    async def _port_taken(self, claims: list[tuple[str, int]]) -> PortTaken | None:
        """The first of ``claims`` another group holds (None: all free)."""
        kvs = await self._get_many([self._port_key(n, p) for n, p in claims])
        for (node_id, port), kv in zip(claims, kvs, strict=True):
            if kv is not None:
                return PortTaken(node_id, port, bytes(kv.value).decode("utf-8", "replace"))
        return None

    async def create_shard(self, group: ShardRecord) -> None:
        if not isinstance(group, ShardRecord):
            raise ValueError(f"group must be a ShardRecord, got {type(group).__name__}")
        key = self._key("group", group.group_id)
        claims = sorted(group.raft_ports.items())
        tx = self.client.transactions
        owner = group.group_id.encode()

        async def create() -> None:
            if await self._count("group") >= SHARDS_MAX:
                raise LimitExceeded(f"at most {SHARDS_MAX} groups")
            ports = [self._port_key(n, p) for n, p in claims]
            succeeded, _ = await self.client.transaction(
                compare=[tx.create(key) == 0, *(tx.create(k) == 0 for k in ports)],
                success=[
                    tx.put(key, self.records.encode_shard(group)),
                    *(tx.put(k, owner) for k in ports),
                ],
                failure=[],
            )
            if succeeded:
                return
            if await self.client.get(key) is not None:
                raise AlreadyExists(f"group {group.group_id!r} already exists")
            taken = await self._port_taken(claims)
            if taken is not None:
                raise taken
            raise RevisionConflict(f"group {group.group_id!r}: a port claim moved; try again")

        await self._call("create_shard", create)

    async def update_shard(self, group: ShardRecord, expect_revision: int) -> int:
        if not isinstance(group, ShardRecord):
            raise ValueError(f"group must be a ShardRecord, got {type(group).__name__}")
        check_revision(expect_revision)
        key = self._key("group", group.group_id)
        tx = self.client.transactions
        owner = group.group_id.encode()

        async def update() -> int:
            kv = await self.client.get(key)
            if kv is None:
                raise NotFound(f"group {group.group_id!r} does not exist")
            if int(kv.mod_revision) != expect_revision:
                raise RevisionConflict(
                    f"group {group.group_id!r} is at revision {int(kv.mod_revision)}, "
                    f"not {expect_revision}"
                )
            stored = self.records.decode_shard(bytes(kv.value), group.group_id)
            # A forged record claimed nothing: this update claims every port it names.
            old = set() if stored is None else set(stored.raft_ports.items())
            new = set(group.raft_ports.items())
            claims = sorted(new - old)
            released = sorted(old - new)
            claimed = [self._port_key(n, p) for n, p in claims]
            succeeded, responses = await self.client.transaction(
                compare=[tx.mod(key) == expect_revision, *(tx.create(k) == 0 for k in claimed)],
                success=[
                    tx.put(key, self.records.encode_shard(group)),
                    *(tx.put(k, owner) for k in claimed),
                    *(tx.delete(self._port_key(n, p)) for n, p in released),
                    tx.get(key),
                ],
                failure=[tx.get(key)],
            )
            if succeeded:
                # The get after the puts, in the same transaction, reports their revision.
                (_, got), *_ = responses[-1]
                return int(got.mod_revision)
            if not responses[0]:
                raise NotFound(f"group {group.group_id!r} does not exist")
            current = int(responses[0][0][1].mod_revision)
            if current != expect_revision:
                raise RevisionConflict(
                    f"group {group.group_id!r} is at revision {current}, not {expect_revision}"
                )
            taken = await self._port_taken(claims)
            if taken is not None:
                raise taken
            raise RevisionConflict(f"group {group.group_id!r}: a port claim moved; try again")

        return await self._call("update_shard", update)

    async def campaign(self, role: str, node_id: str, ttl_ms: int) -> str:
        check_role(role)
        check_node_id(node_id)
        ttl_s = math.ceil(check_ttl_ms(ttl_ms) / 1000)
        key = f"{self._prefix}{_ROLES_DIR}{role}".encode()
        tx = self.client.transactions

        async def campaign() -> str:
            held = self._role_leases.get((role, node_id))
            if held is not None:
                reply = await self.client.refresh_lease(held)
                if reply is not None and reply.TTL > 0:
                    kv = await self.client.get(key)
                    if kv is not None and int(kv.lease) == held:
                        return node_id
                self._role_leases.pop((role, node_id), None)
            kv = await self.client.get(key)
            if kv is not None:
                return bytes(kv.value).decode("utf-8", "replace")
            lease = await self.client.lease(ttl_s)
            succeeded, responses = await self.client.transaction(
                compare=[tx.create(key) == 0],
                success=[tx.put(key, node_id.encode(), lease=lease.id)],
                failure=[tx.get(key)],
            )
            if succeeded:
                self._role_leases[(role, node_id)] = lease.id
                return node_id
            with contextlib.suppress(aetcd.ClientError):
                await self.client.revoke_lease(lease.id)
            found = responses[0]
            return bytes(found[0][0]).decode("utf-8", "replace") if found else ""

        return await self._call("campaign", campaign)

    async def resign(self, role: str, node_id: str) -> None:
        check_role(role)
        check_node_id(node_id)

        async def resign() -> None:
            held = self._role_leases.pop((role, node_id), None)
            if held is not None:
                with contextlib.suppress(aetcd.ClientError):
                    await self.client.revoke_lease(held)  # deletes the key with it

        await self._call("resign", resign)

    async def list_raft_ports(self) -> dict[str, dict[int, str]]:
        async def list_all() -> dict[str, dict[int, str]]:
            directory = f"{self._prefix}{_PORTS_DIR}".encode()
            out: dict[str, dict[int, str]] = {}
            for name, kv in await self._scan_dir(directory):
                node_id, _, port = name.rpartition("/")
                if not node_id or not port.isdigit():
                    raise MetadataCorrupt(f"etcd: a raft port claim {name!r} is not node/port")
                out.setdefault(node_id, {})[int(port)] = bytes(kv.value).decode("utf-8", "replace")
            return out

        return await self._call("list_raft_ports", list_all)

    async def get_shard(self, group_id: str) -> Versioned[ShardRecord] | None:
        check_shard_id(group_id)

        async def get() -> Versioned[ShardRecord] | None:
            kv = await self.client.get(self._key("group", group_id))
            group = None if kv is None else self.records.decode_shard(bytes(kv.value), group_id)
            return None if group is None else Versioned(group, int(kv.mod_revision))

        return await self._call("get_shard", get)

    async def list_shards(self) -> list[Versioned[ShardRecord]]:
        async def list_all() -> list[Versioned[ShardRecord]]:
            found = [
                (self.records.decode_shard(bytes(kv.value), name), int(kv.mod_revision))
                for name, kv in await self._scan("group")
            ]
            return [Versioned(group, rev) for group, rev in found if group is not None]

        return await self._call("list_shards", list_all)

    # --- placements ---------------------------------------------------------------------------

    async def create_placement(self, placement: Placement) -> None:
        if not isinstance(placement, Placement):
            raise ValueError(f"placement must be a Placement, got {type(placement).__name__}")
        key = self._key("placement", placement.queue)

        async def create() -> None:
            if not await self._create(key, self.records.encode_placement(placement)):
                raise AlreadyExists(f"queue {placement.queue!r} is already placed")

        await self._call("create_placement", create)

    async def get_placement(self, queue: str) -> Placement | None:
        check_queue_name(queue)

        async def get() -> Placement | None:
            kv = await self.client.get(self._key("placement", queue))
            return None if kv is None else self.records.decode_placement(bytes(kv.value), queue)

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
            found = [
                self.records.decode_placement(bytes(kv.value), self._name(kv.key, directory))
                for kv in kvs
            ]
            return [p for p in found if p is not None]

        return await self._call("list_placements", list_page)

    async def delete_placement(self, queue: str) -> bool:
        check_queue_name(queue)

        async def delete() -> bool:
            return await self.client.delete(self._key("placement", queue)) is not None

        return await self._call("delete_placement", delete)

    # --- leaders ------------------------------------------------------------------------------

    async def set_shard_leader(self, group_id: str, node_id: str, term: int) -> None:
        check_shard_id(group_id)
        check_node_id(node_id)
        check_term(term)
        key = self._key("leader", group_id)
        value = self.records.encode_leader(group_id, node_id, term)
        tx = self.client.transactions

        async def set_leader() -> None:
            for _ in range(LEADER_CAS_ATTEMPTS):
                kv = await self.client.get(key)
                if kv is None:
                    if await self._create(key, value):
                        return
                    continue
                stored = self.records.decode_leader(bytes(kv.value), group_id)
                if stored is not None and stored[1] >= term:
                    return  # a forged record is overwritten
                succeeded, _ = await self.client.transaction(
                    compare=[tx.mod(key) == kv.mod_revision],
                    success=[tx.put(key, value)],
                    failure=[],
                )
                if succeeded:
                    return
            raise RevisionConflict(f"leader of {group_id!r}: lost {LEADER_CAS_ATTEMPTS} races")

        await self._call("set_shard_leader", set_leader)

    async def get_shard_leaders(self) -> dict[str, tuple[str, int]]:
        async def get_all() -> dict[str, tuple[str, int]]:
            found = {
                name: self.records.decode_leader(bytes(kv.value), name)
                for name, kv in await self._scan("leader")
            }
            return {name: leader for name, leader in found.items() if leader is not None}

        return await self._call("get_shard_leaders", get_all)

    # --- settings -----------------------------------------------------------------------------

    async def get_setting(self, key: str) -> str | None:
        check_setting_key(key)

        async def get() -> str | None:
            kv = await self.client.get(self._key("setting", key))
            return None if kv is None else self.records.decode_setting(bytes(kv.value), key)

        return await self._call("get_setting", get)

    async def put_setting(self, key: str, value: str) -> None:
        check_setting_key(key)
        check_setting_value(value)

        async def put() -> None:
            value_bytes = self.records.encode_setting(key, value)
            await self.client.put(self._key("setting", key), value_bytes)

        await self._call("put_setting", put)

    # --- sealing (an upgrade step) -------------------------------------------------------------

    async def reseal_records(self) -> ResealReport:
        """Seals, with this store's record secret, every record of a sealed kind that has no
        seal yet (records written by a version that did not seal them). Each is rewritten
        only if unchanged since it was read, keeping its lease. An operator runs this once,
        vouching for what etcd holds: nodes never seal what they did not write."""
        if self.records.seal is None:
            raise ValueError("reseal_records needs the record secret (the cluster secret)")
        report = ResealReport()
        tx = self.client.transactions

        async def reseal() -> ResealReport:
            for kind in SEALED_KINDS:
                for name, kv in await self._scan(kind):
                    try:
                        sealed = self.records.reseal(kind, name, bytes(kv.value))
                    except MetadataCorrupt as err:
                        report.refused.append(str(err))
                        continue
                    if sealed is None:
                        report.unchanged += 1
                        continue
                    key = self._key(kind, name)
                    succeeded, _ = await self.client.transaction(
                        compare=[tx.mod(key) == kv.mod_revision],
                        success=[tx.put(key, sealed, lease=int(kv.lease))],
                        failure=[],
                    )
                    if succeeded:
                        report.sealed += 1
                    else:
                        report.refused.append(f"{kind} {name!r}: changed while sealing; run again")
            return report

        return await self._call("reseal_records", reseal)

    # --- API keys -----------------------------------------------------------------------------

    async def create_api_key(self, record: KeyRecord, active_max: int) -> None:
        record, active_max = check_new_api_key(record, active_max)
        key = self._key("api_key", record.key_id)
        slots_key = self._slots_key(record.environment, record.role)
        value = encode_api_key(record, self._seal_key)
        tx = self.client.transactions

        async def create() -> None:
            for attempt in range(KEY_CAS_ATTEMPTS):
                existing, slots = await self._get_many([key, slots_key])
                if existing is not None:
                    raise AlreadyExists(f"api key {record.key_id!r} already exists")
                active = self._active_ids(slots_key, slots)
                if len(active) >= active_max:
                    raise key_limit_reached(record.environment, record.role, active)
                if attempt == 0 and await self._count("api_key") >= API_KEYS_MAX:
                    await self._forget_revoked_keys()
                succeeded, _ = await self.client.transaction(
                    compare=[tx.create(key) == 0, self._unchanged(slots_key, slots)],
                    success=[
                        tx.put(key, value),
                        tx.put(slots_key, encode_key_slots([*active, record.key_id])),
                    ],
                    failure=[],
                )
                if succeeded:
                    return
                await self._back_off(attempt + 1)
            raise RevisionConflict(
                f"api key {record.key_id!r}: lost {KEY_CAS_ATTEMPTS} races for a slot of "
                f"{record.environment}/{record.role}"
            )

        await self._call("create_api_key", create)

    async def _forget_revoked_keys(self) -> None:
        """Make room for one more key: delete the longest-revoked ones (keys_to_forget). Each
        delete holds only while its record is unchanged; a racing creator that deleted it
        first is fine, the count is a soft limit."""
        found = await self._scan_dir(self._dir("api_key"), API_KEYS_READ_MAX)
        kvs = dict(found)
        records = self._decode_keys(found)
        forget = keys_to_forget(records, API_KEYS_MAX)
        tx = self.client.transactions
        for start in range(0, len(forget), KEYS_FORGOTTEN_PER_TXN):
            chunk = forget[start : start + KEYS_FORGOTTEN_PER_TXN]
            await self.client.transaction(
                compare=[
                    tx.mod(self._key("api_key", i)) == int(kvs[i].mod_revision) for i in chunk
                ],
                success=[
                    op
                    for i in chunk
                    for op in (tx.delete(self._key("api_key", i)), tx.delete(self._usage_key(i)))
                ],
                failure=[],
            )

    async def revoke_api_key(self, key_id: str, revoked_ms: int) -> KeyRecord:
        check_key_id(key_id)
        check_revoked_ms(revoked_ms)
        key = self._key("api_key", key_id)
        tx = self.client.transactions

        async def revoke() -> KeyRecord:
            for attempt in range(KEY_CAS_ATTEMPTS):
                kv = await self.client.get(key)
                if kv is None:
                    raise NotFound(f"api key {key_id!r} does not exist")
                record = self._decode_key(bytes(kv.value), key_id)
                if record is None:
                    raise NotFound(f"api key {key_id!r} does not exist")
                if not record.active:
                    return record
                slots_key = self._slots_key(record.environment, record.role)
                (slots,) = await self._get_many([slots_key])
                active = [i for i in self._active_ids(slots_key, slots) if i != key_id]
                revoked = dataclasses.replace(record, revoked_ms=revoked_ms)
                succeeded, _ = await self.client.transaction(
                    compare=[
                        tx.mod(key) == int(kv.mod_revision),
                        self._unchanged(slots_key, slots),
                    ],
                    success=[
                        tx.put(key, encode_api_key(revoked, self._seal_key)),
                        tx.put(slots_key, encode_key_slots(active)),
                    ],
                    failure=[],
                )
                if succeeded:
                    return revoked
                await self._back_off(attempt + 1)
            raise RevisionConflict(f"api key {key_id!r}: lost {KEY_CAS_ATTEMPTS} races to revoke")

        return await self._call("revoke_api_key", revoke)

    async def get_api_key(self, key_id: str) -> KeyRecord | None:
        check_key_id(key_id)

        async def get() -> KeyRecord | None:
            kv = await self.client.get(self._key("api_key", key_id))
            return None if kv is None else self._decode_key(bytes(kv.value), key_id)

        return await self._call("get_api_key", get)

    async def list_api_keys(self) -> list[KeyRecord]:
        async def list_all() -> list[KeyRecord]:
            found = await self._scan_dir(self._dir("api_key"), API_KEYS_READ_MAX)
            return sort_api_keys(self._decode_keys(found))

        return await self._call("list_api_keys", list_all)

    def _decode_key(self, raw: bytes, key_id: str) -> KeyRecord | None:
        return decode_sealed_api_key(raw, key_id, self._seal_key)

    def _decode_keys(self, found: list[tuple[str, Any]]) -> list[KeyRecord]:
        records = (self._decode_key(bytes(kv.value), name) for name, kv in found)
        return [r for r in records if r is not None]

    async def touch_api_keys(self, last_used_ms: Mapping[str, int]) -> None:
        wanted = list(check_key_usage(last_used_ms).items())

        async def touch() -> None:
            for start in range(0, len(wanted), TOUCH_BATCH_KEYS):
                await self._touch_batch(wanted[start : start + TOUCH_BATCH_KEYS])

        await self._call("touch_api_keys", touch)

    async def _touch_batch(self, wanted: list[tuple[str, int]]) -> None:
        tx = self.client.transactions
        for attempt in range(KEY_CAS_ATTEMPTS):
            keys = [
                k
                for key_id, _ in wanted
                for k in (self._key("api_key", key_id), self._usage_key(key_id))
            ]
            found = await self._get_many(keys)
            compare, success = [], []
            for index, (key_id, used_ms) in enumerate(wanted):
                record, usage = found[2 * index], found[2 * index + 1]
                if record is None:
                    continue  # no such key, or forgotten since
                if usage is not None and decode_key_usage(bytes(usage.value), key_id) >= used_ms:
                    continue
                usage_key = self._usage_key(key_id)
                compare.append(self._unchanged(usage_key, usage))
                # The record still exists (a revocation keeps its create revision; forgetting
                # it does not), so no usage record outlives its key.
                record_key = self._key("api_key", key_id)
                compare.append(tx.create(record_key) == int(record.create_revision))
                success.append(tx.put(usage_key, encode_key_usage(used_ms)))
            if not success:
                return
            succeeded, _ = await self.client.transaction(
                compare=compare, success=success, failure=[]
            )
            if succeeded:
                return
            await self._back_off(attempt + 1)
        raise RevisionConflict(f"api key usage: lost {KEY_CAS_ATTEMPTS} races")

    async def list_api_key_usage(self) -> dict[str, int]:
        async def list_all() -> dict[str, int]:
            directory = f"{self._prefix}{_USAGE_DIR}".encode()
            found = await self._scan_dir(directory, API_KEYS_READ_MAX)
            return {name: decode_key_usage(bytes(kv.value), name) for name, kv in found}

        return await self._call("list_api_key_usage", list_all)

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
