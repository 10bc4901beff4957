"""``EmbeddedMetadataStore``: the metadata of a single node, with no etcd.

State lives in one small LMDB file (``<directory>/metadata.lmdb``, plus LMDB's ``-lock`` file), or
in memory when ``path`` is None (unit tests). It mimics etcd closely enough that the contract suite
cannot tell them apart: one global revision counter bumped per write, per-key modification
revisions for compare-and-set, and leased node keys.

Time is an input (``clock_ms``). Node expiry is evaluated lazily, when nodes are read or
refreshed and whenever a watcher polls, so a test advances a fake clock instead of sleeping. The
default clock is the wall clock because expiry deadlines are stored and must stay meaningful
across restarts.

Everything runs synchronously on the event loop: metadata writes are rare and tiny, and no await
inside an operation is what makes each one atomic (create-if-absent, compare-and-set, the API-key
limit, which simply counts the active records of the environment and role inside the write).
API keys live under ``keys/<key_id>``, their last-used times under ``keys_used/<key_id>``. With
``record_secret`` key records are sealed and checked as in the etcd store (``ForgedRecord``).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import os
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol

import lmdb

from fluxmq.core.auth import KeyRecord
from fluxmq.metadata.metadata import (
    API_KEYS_MAX,
    API_KEYS_READ_MAX,
    NODES_MAX,
    SHARDS_MAX,
    AlreadyExists,
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
    PortTaken,
    RevisionConflict,
    ShardRecord,
    Versioned,
    api_key_seal_key,
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
    decode_key_usage,
    decode_sealed_api_key,
    encode_api_key,
    encode_key_usage,
    key_limit_reached,
    keys_to_forget,
    sort_api_keys,
)
from fluxmq.metadata.sealed_records import RecordSeal, TopologyCodec

FILE_NAME = "metadata.lmdb"
MAP_SIZE_BYTES_DEFAULT = 64 * 1024 * 1024
WATCH_POLL_MS_DEFAULT = 200

# Stored value = header (mod_revision, expires_at_ms, ttl_ms; 0 = no lease) + record JSON.
_HEADER = struct.Struct(">QQQ")
_REVISION_KEY = b"\xffrevision"  # sorts after every record key (those are ASCII)
_WATCHED_KEY = b"\xffwatched"  # the revision of the last write watches hear of
_PREFIXES = {
    "node": b"nodes/",
    "group": b"groups/",
    "placement": b"placements/",
    "leader": b"leaders/",
    "setting": b"settings/",
    "api_key": b"keys/",
    "api_key_usage": b"keys_used/",  # not a watched kind: touches make no events
    "raft_port": b"raft_ports/",  # <node>/<port> -> the group holding it; not watched
    "role": b"roles/",  # <role> -> the node holding it, with a lease; not watched
}


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _key(kind: str, name: str) -> bytes:
    return _PREFIXES[kind] + name.encode()


def _prefix_end(prefix: bytes) -> bytes:
    """The first key after every key starting with ``prefix`` (prefixes end in ASCII '/')."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


class _Txn(Protocol):
    def get(self, key: bytes) -> bytes | None: ...
    def put(self, key: bytes, value: bytes) -> None: ...
    def delete(self, key: bytes) -> bool: ...
    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]: ...


class _Backend(Protocol):
    def read(self) -> AbstractContextManager[_Txn]: ...
    def write(self) -> AbstractContextManager[_Txn]: ...
    def close(self) -> None: ...


class _LmdbTxn:
    def __init__(self, txn: lmdb.Transaction) -> None:
        self._txn = txn

    def get(self, key: bytes) -> bytes | None:
        value = self._txn.get(key)
        return None if value is None else bytes(value)

    def put(self, key: bytes, value: bytes) -> None:
        self._txn.put(key, value)

    def delete(self, key: bytes) -> bool:
        return bool(self._txn.delete(key))

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        cursor = self._txn.cursor()
        if not cursor.set_range(start):
            return
        for key, value in cursor:
            if bytes(key) >= end:
                return
            yield bytes(key), bytes(value)


class _LmdbBackend:
    def __init__(self, directory: Path, map_size_bytes: int, sync: bool) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        try:
            self._env = lmdb.open(
                str(directory / FILE_NAME),
                subdir=False,
                map_size=map_size_bytes,
                max_dbs=0,
                sync=sync,
                metasync=sync,
                readahead=False,
            )
        except (lmdb.InvalidError, lmdb.CorruptedError, lmdb.VersionMismatchError) as e:
            raise MetadataCorrupt(f"{directory / FILE_NAME} is not a usable LMDB file: {e}") from e
        except lmdb.Error as e:
            raise MetadataUnavailable(f"cannot open {directory / FILE_NAME}: {e}") from e

    @contextmanager
    def read(self) -> Iterator[_Txn]:
        try:
            with self._env.begin(write=False) as txn:
                yield _LmdbTxn(txn)
        except lmdb.Error as e:
            raise MetadataUnavailable(f"embedded metadata (LMDB): {e}") from e

    @contextmanager
    def write(self) -> Iterator[_Txn]:
        try:
            with self._env.begin(write=True) as txn:
                yield _LmdbTxn(txn)
        except lmdb.Error as e:
            raise MetadataUnavailable(f"embedded metadata (LMDB): {e}") from e

    def close(self) -> None:
        self._env.close()


class _MemoryBackend:
    """A sorted dict with an undo log, so a failed write leaves nothing behind, as LMDB would."""

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []
        self._undo: list[tuple[bytes, bytes | None]] | None = None

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        assert self._undo is not None, "write outside a write transaction"
        self._undo.append((key, self._data.get(key)))
        self._set(key, value)

    def delete(self, key: bytes) -> bool:
        assert self._undo is not None, "write outside a write transaction"
        if key not in self._data:
            return False
        self._undo.append((key, self._data[key]))
        self._set(key, None)
        return True

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        index = bisect.bisect_left(self._keys, start)
        while index < len(self._keys) and self._keys[index] < end:
            key = self._keys[index]
            yield key, self._data[key]
            index += 1

    def _set(self, key: bytes, value: bytes | None) -> None:
        present = key in self._data
        if value is None:
            del self._data[key]
            del self._keys[bisect.bisect_left(self._keys, key)]
            return
        self._data[key] = value
        if not present:
            bisect.insort(self._keys, key)

    @contextmanager
    def read(self) -> Iterator[_Txn]:
        yield self

    @contextmanager
    def write(self) -> Iterator[_Txn]:
        self._undo = []
        try:
            yield self
        except BaseException:
            for key, value in reversed(self._undo):
                self._set(key, value)
            raise
        finally:
            self._undo = None

    def close(self) -> None:
        self._data.clear()
        self._keys.clear()


class _Entry:
    __slots__ = ("expires_at_ms", "mod_revision", "record", "ttl_ms")

    mod_revision: int
    expires_at_ms: int
    ttl_ms: int
    record: bytes

    def __init__(self, raw: bytes, key: bytes) -> None:
        if len(raw) < _HEADER.size:
            raise MetadataCorrupt(f"embedded metadata: value of {key!r} is truncated")
        self.mod_revision, self.expires_at_ms, self.ttl_ms = _HEADER.unpack_from(raw)
        self.record = raw[_HEADER.size :]
        if self.mod_revision < 1:
            raise MetadataCorrupt(f"embedded metadata: {key!r} has revision 0")


def _revision_in(txn: _Txn) -> int:
    """The revision of the last write watches hear of."""
    raw = txn.get(_WATCHED_KEY)
    return 0 if raw is None or len(raw) != 8 else int.from_bytes(raw, "big")


class _EmbeddedWatch(MetadataWatch):
    def __init__(self, store: EmbeddedMetadataStore, poll_ms: int) -> None:
        super().__init__(poll_ms)
        self._store = store

    def _poll(self) -> None:
        # A failure here would kill the consumer's loop; the next read reports it instead.
        if not self._store.closed:
            with contextlib.suppress(MetadataError):
                self._store.expire_nodes()
                self._store.notice_other_writers()

    async def _shutdown(self) -> None:
        self._store.forget_watch(self)


class EmbeddedMetadataStore:
    """The single-node MetadataStore; see the module docstring. The processes of one node may
    share its file (LMDB serializes their writes): each one's watches hear of the others'
    writes when they poll, as a re-read of everything."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
        map_size_bytes: int = MAP_SIZE_BYTES_DEFAULT,
        sync: bool = True,
        watch_poll_ms: int = WATCH_POLL_MS_DEFAULT,
        record_secret: str = "",
    ) -> None:
        self._seal_key = api_key_seal_key(record_secret) if record_secret else None
        self.records = TopologyCodec(RecordSeal(record_secret) if record_secret else None)
        self._clock_ms = clock_ms
        self._watch_poll_ms = watch_poll_ms
        self._backend: _Backend = (
            _MemoryBackend() if path is None else _LmdbBackend(Path(path), map_size_bytes, sync)
        )
        self._watches: set[_EmbeddedWatch] = set()
        self._closed = False
        # The revision counter as this process last saw it: one it did not write means another
        # process of the node wrote (several shard processes share the file), and its watches
        # re-read everything (they cannot know what changed).
        self._known_revision: int | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    # --- plumbing -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataUnavailable("the embedded metadata store is closed")

    def _read(self) -> AbstractContextManager[_Txn]:
        self._check_open()
        return self._backend.read()

    @contextmanager
    def _write(self) -> Iterator[_Txn]:
        self._check_open()
        with self._backend.write() as txn:
            before = _revision_in(txn)
            yield txn
            after = _revision_in(txn)
        # Committed.
        other_wrote = self._known_revision is not None and before != self._known_revision
        self._known_revision = after
        if other_wrote:
            self._resync_watches()

    def notice_other_writers(self) -> None:
        """Another process wrote since this one last looked: every watch re-reads everything
        (the node's other shard processes create and revoke API keys in the same file)."""
        with self._read() as txn:
            revision = _revision_in(txn)
        if self._known_revision is None:
            self._known_revision = revision
        elif revision != self._known_revision:
            self._known_revision = revision
            self._resync_watches()

    def _resync_watches(self) -> None:
        for watch in self._watches:
            watch.push_resync()

    @staticmethod
    def _next_revision(txn: _Txn, *, watched: bool = True) -> int:
        """The next revision; ``watched``: a change other processes' watches must hear of
        (every write but API-key usage times, which only ``list_api_key_usage`` reads)."""
        raw = txn.get(_REVISION_KEY)
        if raw is not None and len(raw) != 8:
            raise MetadataCorrupt("embedded metadata: the revision counter is malformed")
        revision = (0 if raw is None else int.from_bytes(raw, "big")) + 1
        txn.put(_REVISION_KEY, revision.to_bytes(8, "big"))
        if watched:
            txn.put(_WATCHED_KEY, revision.to_bytes(8, "big"))
        return revision

    @staticmethod
    def _entry(txn: _Txn, key: bytes) -> _Entry | None:
        raw = txn.get(key)
        return None if raw is None else _Entry(raw, key)

    @staticmethod
    def _put(
        txn: _Txn, key: bytes, record: bytes, revision: int, expires_at_ms: int = 0, ttl_ms: int = 0
    ) -> None:
        txn.put(key, _HEADER.pack(revision, expires_at_ms, ttl_ms) + record)

    def _scan(self, txn: _Txn, kind: str, start: bytes = b"") -> Iterator[tuple[str, _Entry]]:
        prefix = _PREFIXES[kind]
        for key, raw in txn.scan(max(prefix, start), _prefix_end(prefix)):
            yield key[len(prefix) :].decode(), _Entry(raw, key)

    def _count(self, txn: _Txn, kind: str) -> int:
        prefix = _PREFIXES[kind]
        return sum(1 for _ in txn.scan(prefix, _prefix_end(prefix)))

    def _publish(self, *events: MetadataEvent) -> None:
        for watch in self._watches:
            for event in events:
                watch.push(event)

    def _live(self, entry: _Entry, now_ms: int) -> bool:
        return entry.expires_at_ms == 0 or now_ms < entry.expires_at_ms

    def expire_nodes(self) -> None:
        """Deletes node keys whose lease lapsed and tells the watchers."""
        now_ms = self._clock_ms()
        with self._read() as txn:
            lapsed = [
                name for name, entry in self._scan(txn, "node") if not self._live(entry, now_ms)
            ]
        if not lapsed:
            return
        with self._write() as txn:
            gone = []
            for name in lapsed:
                entry = self._entry(txn, _key("node", name))
                if entry is not None and not self._live(entry, now_ms):
                    txn.delete(_key("node", name))
                    gone.append(name)
            if gone:
                self._next_revision(txn)
        self._publish(*(MetadataEvent("node", name, deleted=True) for name in gone))

    def forget_watch(self, watch: _EmbeddedWatch) -> None:
        self._watches.discard(watch)

    # --- nodes --------------------------------------------------------------------------------

    async def register_node(self, node: NodeInfo, ttl_ms: int) -> None:
        if not isinstance(node, NodeInfo):
            raise ValueError(f"node must be a NodeInfo, got {type(node).__name__}")
        check_ttl_ms(ttl_ms)
        self.expire_nodes()
        now_ms = self._clock_ms()
        key = _key("node", node.node_id)
        with self._write() as txn:
            if txn.get(key) is None and self._count(txn, "node") >= NODES_MAX:
                raise LimitExceeded(f"at most {NODES_MAX} nodes may be registered")
            revision = self._next_revision(txn)
            self._put(txn, key, self.records.encode_node(node), revision, now_ms + ttl_ms, ttl_ms)
        self._publish(MetadataEvent("node", node.node_id))

    async def refresh_node(self, node_id: str) -> None:
        check_node_id(node_id)
        self.expire_nodes()
        now_ms = self._clock_ms()
        key = _key("node", node_id)
        with self._write() as txn:
            entry = self._entry(txn, key)
            if entry is None:
                raise NodeNotRegistered(f"node {node_id!r} is not registered (or its lease lapsed)")
            if entry.ttl_ms == 0:
                raise MetadataCorrupt(f"embedded metadata: node {node_id!r} has no lease")
            # Like an etcd keepalive: the deadline moves, the record and its revision do not.
            self._put(
                txn, key, entry.record, entry.mod_revision, now_ms + entry.ttl_ms, entry.ttl_ms
            )

    async def deregister_node(self, node_id: str) -> None:
        check_node_id(node_id)
        with self._write() as txn:
            removed = txn.delete(_key("node", node_id))
            if removed:
                self._next_revision(txn)
        if removed:
            self._publish(MetadataEvent("node", node_id, deleted=True))

    async def list_nodes(self) -> list[NodeInfo]:
        self.expire_nodes()
        now_ms = self._clock_ms()
        with self._read() as txn:
            found = [
                self.records.decode_node(entry.record, name)
                for name, entry in self._scan(txn, "node")
                if self._live(entry, now_ms)
            ]
            return [n for n in found if n is not None]

    # --- groups -------------------------------------------------------------------------------

    @staticmethod
    def _claim_ports(txn: _Txn, group_id: str, claims: list[tuple[str, int]]) -> None:
        """Claims each (node, port) for ``group_id`` (PortTaken: another group holds one; the
        caller's write transaction is then aborted, so nothing is written)."""
        for node_id, port in claims:
            key = _key("raft_port", f"{node_id}/{port}")
            owner = txn.get(key)
            if owner is not None:
                raise PortTaken(node_id, port, bytes(owner).decode("utf-8", "replace"))
            txn.put(key, group_id.encode())

    async def create_shard(self, group: ShardRecord) -> None:
        if not isinstance(group, ShardRecord):
            raise ValueError(f"group must be a ShardRecord, got {type(group).__name__}")
        key = _key("group", group.group_id)
        with self._write() as txn:
            if txn.get(key) is not None:
                raise AlreadyExists(f"group {group.group_id!r} already exists")
            if self._count(txn, "group") >= SHARDS_MAX:
                raise LimitExceeded(f"at most {SHARDS_MAX} groups")
            self._claim_ports(txn, group.group_id, sorted(group.raft_ports.items()))
            self._put(txn, key, self.records.encode_shard(group), self._next_revision(txn))
        self._publish(MetadataEvent("group", group.group_id))

    async def update_shard(self, group: ShardRecord, expect_revision: int) -> int:
        if not isinstance(group, ShardRecord):
            raise ValueError(f"group must be a ShardRecord, got {type(group).__name__}")
        check_revision(expect_revision)
        key = _key("group", group.group_id)
        with self._write() as txn:
            entry = self._entry(txn, key)
            if entry is None:
                raise NotFound(f"group {group.group_id!r} does not exist")
            if entry.mod_revision != expect_revision:
                raise RevisionConflict(
                    f"group {group.group_id!r} is at revision {entry.mod_revision}, "
                    f"not {expect_revision}"
                )
            stored = self.records.decode_shard(entry.record, group.group_id)
            # A forged record claimed nothing: this update claims every port it names.
            old = set() if stored is None else set(stored.raft_ports.items())
            new = set(group.raft_ports.items())
            self._claim_ports(txn, group.group_id, sorted(new - old))
            for node_id, port in sorted(old - new):
                txn.delete(_key("raft_port", f"{node_id}/{port}"))
            revision = self._next_revision(txn)
            self._put(txn, key, self.records.encode_shard(group), revision)
        self._publish(MetadataEvent("group", group.group_id))
        return revision

    async def campaign(self, role: str, node_id: str, ttl_ms: int) -> str:
        check_role(role)
        check_node_id(node_id)
        check_ttl_ms(ttl_ms)
        now_ms = self._clock_ms()
        key = _key("role", role)
        with self._write() as txn:
            entry = self._entry(txn, key)
            if entry is not None and self._live(entry, now_ms):
                holder = entry.record.decode("utf-8", "replace")
                if holder != node_id:
                    return holder
            self._put(txn, key, node_id.encode(), 1, now_ms + ttl_ms, ttl_ms)
        return node_id

    async def resign(self, role: str, node_id: str) -> None:
        check_role(role)
        check_node_id(node_id)
        key = _key("role", role)
        with self._write() as txn:
            entry = self._entry(txn, key)
            if entry is not None and entry.record.decode("utf-8", "replace") == node_id:
                txn.delete(key)

    async def list_raft_ports(self) -> dict[str, dict[int, str]]:
        out: dict[str, dict[int, str]] = {}
        prefix = _PREFIXES["raft_port"]
        with self._read() as txn:
            for key, raw in txn.scan(prefix, _prefix_end(prefix)):
                node_id, _, port = key[len(prefix) :].decode().rpartition("/")
                if not node_id or not port.isdigit():
                    raise MetadataCorrupt(f"embedded metadata: a raft port claim {key!r}")
                out.setdefault(node_id, {})[int(port)] = bytes(raw).decode("utf-8", "replace")
        return out

    async def get_shard(self, group_id: str) -> Versioned[ShardRecord] | None:
        check_shard_id(group_id)
        with self._read() as txn:
            entry = self._entry(txn, _key("group", group_id))
            group = None if entry is None else self.records.decode_shard(entry.record, group_id)
            return None if group is None or entry is None else Versioned(group, entry.mod_revision)

    async def list_shards(self) -> list[Versioned[ShardRecord]]:
        with self._read() as txn:
            found = [
                (self.records.decode_shard(entry.record, name), entry.mod_revision)
                for name, entry in self._scan(txn, "group")
            ]
        return [Versioned(group, rev) for group, rev in found if group is not None]

    # --- placements ---------------------------------------------------------------------------

    async def create_placement(self, placement: Placement) -> None:
        if not isinstance(placement, Placement):
            raise ValueError(f"placement must be a Placement, got {type(placement).__name__}")
        key = _key("placement", placement.queue)
        with self._write() as txn:
            if txn.get(key) is not None:
                raise AlreadyExists(f"queue {placement.queue!r} is already placed")
            self._put(txn, key, self.records.encode_placement(placement), self._next_revision(txn))
        self._publish(MetadataEvent("placement", placement.queue, group_id=placement.group_id))

    async def get_placement(self, queue: str) -> Placement | None:
        check_queue_name(queue)
        with self._read() as txn:
            entry = self._entry(txn, _key("placement", queue))
            return None if entry is None else self.records.decode_placement(entry.record, queue)

    async def list_placements(
        self, prefix: str = "", after: str = "", limit: int = 1000
    ) -> list[Placement]:
        prefix, after, limit = check_list_args(prefix, after, limit)
        start = _key("placement", after) + b"\x00" if after else b""
        found: list[Placement] = []
        with self._read() as txn:
            for name, entry in self._scan(txn, "placement", max(start, _key("placement", prefix))):
                if not name.startswith(prefix) or len(found) == limit:
                    break
                placement = self.records.decode_placement(entry.record, name)
                if placement is not None:
                    found.append(placement)
        return found

    async def delete_placement(self, queue: str) -> bool:
        check_queue_name(queue)
        with self._write() as txn:
            removed = txn.delete(_key("placement", queue))
            if removed:
                self._next_revision(txn)
        if removed:
            self._publish(MetadataEvent("placement", queue, deleted=True))
        return removed

    # --- leaders ------------------------------------------------------------------------------

    async def set_shard_leader(self, group_id: str, node_id: str, term: int) -> None:
        check_shard_id(group_id)
        check_node_id(node_id)
        check_term(term)
        key = _key("leader", group_id)
        with self._write() as txn:
            entry = self._entry(txn, key)
            stored = None if entry is None else self.records.decode_leader(entry.record, group_id)
            if stored is not None and stored[1] >= term:
                return  # a forged record is overwritten
            value = self.records.encode_leader(group_id, node_id, term)
            self._put(txn, key, value, self._next_revision(txn))
        self._publish(MetadataEvent("leader", group_id))

    async def get_shard_leaders(self) -> dict[str, tuple[str, int]]:
        with self._read() as txn:
            found = {
                name: self.records.decode_leader(entry.record, name)
                for name, entry in self._scan(txn, "leader")
            }
        return {name: leader for name, leader in found.items() if leader is not None}

    # --- settings -----------------------------------------------------------------------------

    async def get_setting(self, key: str) -> str | None:
        check_setting_key(key)
        with self._read() as txn:
            entry = self._entry(txn, _key("setting", key))
            return None if entry is None else self.records.decode_setting(entry.record, key)

    async def put_setting(self, key: str, value: str) -> None:
        check_setting_key(key)
        check_setting_value(value)
        with self._write() as txn:
            value_bytes = self.records.encode_setting(key, value)
            self._put(txn, _key("setting", key), value_bytes, self._next_revision(txn))
        self._publish(MetadataEvent("setting", key))

    # --- API keys -----------------------------------------------------------------------------

    async def create_api_key(self, record: KeyRecord, active_max: int) -> None:
        record, active_max = check_new_api_key(record, active_max)
        key = _key("api_key", record.key_id)
        with self._write() as txn:
            if txn.get(key) is not None:
                raise AlreadyExists(f"api key {record.key_id!r} already exists")
            stored = [
                r
                for name, entry in self._scan(txn, "api_key")
                if (r := self._decode_key(entry.record, name)) is not None
            ]
            active = [
                r.key_id
                for r in stored
                if r.active and r.environment == record.environment and r.role == record.role
            ]
            if len(active) >= active_max:
                raise key_limit_reached(record.environment, record.role, active)
            forgotten = keys_to_forget(stored, API_KEYS_MAX)
            for key_id in forgotten:
                txn.delete(_key("api_key", key_id))
                txn.delete(_key("api_key_usage", key_id))
            self._put(txn, key, encode_api_key(record, self._seal_key), self._next_revision(txn))
        self._publish(
            *(MetadataEvent("api_key", key_id, deleted=True) for key_id in forgotten),
            MetadataEvent("api_key", record.key_id),
        )

    async def revoke_api_key(self, key_id: str, revoked_ms: int) -> KeyRecord:
        check_key_id(key_id)
        check_revoked_ms(revoked_ms)
        key = _key("api_key", key_id)
        with self._write() as txn:
            entry = self._entry(txn, key)
            if entry is None:
                raise NotFound(f"api key {key_id!r} does not exist")
            found = self._decode_key(entry.record, key_id)
            if found is None:
                raise NotFound(f"api key {key_id!r} does not exist")
            if not found.active:
                return found
            record = dataclasses.replace(found, revoked_ms=revoked_ms)
            self._put(txn, key, encode_api_key(record, self._seal_key), self._next_revision(txn))
        self._publish(MetadataEvent("api_key", key_id))
        return record

    async def get_api_key(self, key_id: str) -> KeyRecord | None:
        check_key_id(key_id)
        with self._read() as txn:
            entry = self._entry(txn, _key("api_key", key_id))
            return None if entry is None else self._decode_key(entry.record, key_id)

    async def list_api_keys(self) -> list[KeyRecord]:
        found: list[KeyRecord] = []
        with self._read() as txn:
            for name, entry in self._scan(txn, "api_key"):
                if len(found) == API_KEYS_READ_MAX:
                    raise LimitExceeded(f"more than {API_KEYS_READ_MAX} api keys are stored")
                record = self._decode_key(entry.record, name)
                if record is not None:
                    found.append(record)
        return sort_api_keys(found)

    def _decode_key(self, raw: bytes, key_id: str) -> KeyRecord | None:
        return decode_sealed_api_key(raw, key_id, self._seal_key)

    async def touch_api_keys(self, last_used_ms: Mapping[str, int]) -> None:
        wanted = check_key_usage(last_used_ms)
        if not wanted:
            return
        with self._write() as txn:
            forward: list[tuple[bytes, int]] = []
            for key_id, used_ms in wanted.items():
                if txn.get(_key("api_key", key_id)) is None:
                    continue
                usage = _key("api_key_usage", key_id)
                entry = self._entry(txn, usage)
                if entry is None or decode_key_usage(entry.record, key_id) < used_ms:
                    forward.append((usage, used_ms))
            if forward:
                revision = self._next_revision(txn, watched=False)
                for usage, used_ms in forward:
                    self._put(txn, usage, encode_key_usage(used_ms), revision)

    async def list_api_key_usage(self) -> dict[str, int]:
        found: dict[str, int] = {}
        with self._read() as txn:
            for name, entry in self._scan(txn, "api_key_usage"):
                if len(found) == API_KEYS_READ_MAX:
                    raise LimitExceeded(f"more than {API_KEYS_READ_MAX} api key usage records")
                found[name] = decode_key_usage(entry.record, name)
        return found

    # --- watch and close ----------------------------------------------------------------------

    def watch(self) -> MetadataWatch:
        self._check_open()
        if self._known_revision is None:  # before the re-read the new watch starts with
            with self._read() as txn:
                self._known_revision = _revision_in(txn)
        watch = _EmbeddedWatch(self, self._watch_poll_ms)
        watch.push_resync()
        self._watches.add(watch)
        return watch

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for watch in self._watches:
            watch.end()
        self._watches.clear()
        self._backend.close()
