"""The cluster metadata interface: records, errors, limits, the JSON codec and the watch stream.

Besides the cluster's own records it keeps the API keys (``fluxmq.core.auth.KeyRecord``: salted
digests, never a key) with their last-used times, and enforces the rotation limit (at most
``active_max`` active keys per environment and role) atomically, even across nodes.

Two implementations follow it and must answer identically: ``EtcdMetadataStore`` (etcd v3 through
aetcd) and ``EmbeddedMetadataStore`` (one node, LMDB or memory). The contract suite in
``tests/contract/test_metadata_contract.py`` runs against both.

Records are stored as compact JSON with sorted keys and a schema version ``"v": 1``. Decoding
checks every field right after reading; anything unexpected raises ``MetadataCorrupt`` rather than
letting a half-valid record travel further.

Watches are hints to re-read, not a change log: events may be coalesced, and an event whose key
is ``""`` (``MetadataEvent.resync``) means "anything of this kind may have changed". Every watch
starts with one resync event per kind, and emits them again whenever it may have missed changes
(an etcd reconnect, a slow consumer), so a consumer that re-reads on each event converges.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar, get_args

from fluxmq.core.auth import ENVIRONMENTS, KEY_ID_CHARS, ROLES, SALT_BYTES, KeyRecord
from fluxmq.core.limits import LABEL_KEY_RE, LABEL_VALUE_CHARS_MAX, LABELS_MAX
from fluxmq.core.namespaces import STORED_PREFIX_RE, STORED_QUEUE_NAME_RE

SCHEMA_VERSION = 1

ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")  # node ids and group ids
SETTING_KEY_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
SETTING_VALUE_BYTES_MAX = 64 * 1024
ADDRESS_CHARS_MAX = 256
SHARD_MEMBERS_MAX = 7
NODES_MAX = 1000
SHARDS_MAX = 10_000
LIST_LIMIT_MAX = 1000
NODE_TTL_MS_MIN = 1000  # etcd leases have whole-second TTLs and a 1 s floor
NODE_TTL_MS_MAX = 300_000
INT_MAX = 2**63 - 1  # terms, revisions and timestamps are int64 in etcd and on disk
API_KEYS_MAX = 10_000  # stored keys, revoked ones included (the longest-revoked are forgotten)
# On etcd the count is checked before writing, so racing creators can overshoot API_KEYS_MAX a
# little; reads accept up to this many so that an overshoot never stops a node loading its keys.
API_KEYS_READ_MAX = 2 * API_KEYS_MAX
ACTIVE_KEYS_LIMIT_MAX = 100  # the largest active_max a caller may ask for
KEY_ID_RE = re.compile(rf"[A-Za-z0-9]{{{KEY_ID_CHARS}}}")
KEY_NAME_RE = re.compile(r"[A-Za-z0-9._ -]{1,64}")  # as fluxmq.core.auth.check_new_key
KEY_TIER_RE = ID_RE
KEY_SALT_BYTES_MAX = 64
KEY_DIGEST_BYTES = 32  # SHA-256

EventKind = Literal["node", "group", "placement", "leader", "setting", "api_key"]
EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)

T = TypeVar("T")


# --- errors -----------------------------------------------------------------------------------


class MetadataError(Exception):
    """Base of every metadata failure: ``reason`` is a stable code, ``detail`` the story."""

    reason: ClassVar[str] = "METADATA_ERROR"
    retriable: ClassVar[bool] = False

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def __str__(self) -> str:
        return self.detail


class MetadataUnavailable(MetadataError):
    """The store cannot be reached or did not answer in time (or is closed); try again later."""

    reason = "METADATA_UNAVAILABLE"
    retriable = True


class AlreadyExists(MetadataError):
    reason = "ALREADY_EXISTS"


class PortTaken(AlreadyExists):
    """A Raft port a shard record names is claimed by another shard on that node: read the
    claims again (``list_raft_ports``) and pick another."""

    reason = "RAFT_PORT_TAKEN"

    def __init__(self, node_id: str, port: int, owner: str) -> None:
        super().__init__(f"raft port {port} of node {node_id!r} is taken by group {owner!r}")
        self.node_id = node_id
        self.port = port
        self.owner = owner


class RevisionConflict(MetadataError):
    """A compare-and-set lost: re-read, re-apply the change, retry."""

    reason = "REVISION_CONFLICT"
    retriable = True


class NotFound(MetadataError, KeyError):
    reason = "NOT_FOUND"


class NodeNotRegistered(NotFound):
    """The node's registration expired or was removed; register it again."""

    reason = "NODE_NOT_REGISTERED"


class LimitExceeded(MetadataError):
    reason = "LIMIT_EXCEEDED"


class MetadataCorrupt(MetadataError):
    """Stored data fails validation: a bug or foreign writer; never silently repaired."""

    reason = "METADATA_CORRUPT"


class InvalidArgument(MetadataError, ValueError):
    """An argument the store refuses before any request (a queue name that is not a name):
    ``what`` names it. A ValueError still, for callers that catch bad input as such; a
    MetadataError, so that the gRPC edge answers INVALID_ARGUMENT, never INTERNAL."""

    reason = "INVALID_ARGUMENT"

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(detail)
        self.what = what


class MetadataRefused(MetadataError):
    """The store refused this client: missing or wrong credentials, or no permission. Retrying
    cannot help; the operator must fix the node's etcd settings."""

    reason = "METADATA_REFUSED"


class ForgedRecord(MetadataError):
    """An API key record without a valid seal (HMAC with the cluster secret): written by
    someone who can write to the store but does not hold the secret. Stores treat it as absent
    and log it (``report_forged_key``), so nobody mints a key by writing to etcd."""

    reason = "FORGED_RECORD"


# --- input checks -----------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(what: str, value: object, low: int, high: int = INT_MAX) -> int:
    if not _is_int(value):
        raise InvalidArgument(what, f"{what} must be an integer, got {type(value).__name__}")
    assert isinstance(value, int)
    if not low <= value <= high:
        raise InvalidArgument(what, f"{what} must be in {low}..{high}, got {value}")
    return value


def _check_pattern(what: str, value: object, pattern: re.Pattern[str], rule: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(what, f"{what} must be a string, got {type(value).__name__}")
    if not pattern.fullmatch(value):
        raise InvalidArgument(what, f"{what} {value[:80]!r} is invalid: {rule}")
    return value


def check_node_id(value: object, what: str = "node_id") -> str:
    return _check_pattern(what, value, ID_RE, "1..64 characters of A-Z a-z 0-9 . _ -")


def check_shard_id(value: object, what: str = "group_id") -> str:
    return _check_pattern(what, value, ID_RE, "1..64 characters of A-Z a-z 0-9 . _ -")


def check_queue_name(value: object, what: str = "queue") -> str:
    return _check_pattern(what, value, STORED_QUEUE_NAME_RE, _STORED_NAME_RULE)


_STORED_NAME_RULE = "1..200 characters of A-Z a-z 0-9 . _ -, optionally after '<environment>:'"


def check_setting_key(value: object) -> str:
    return _check_pattern("setting key", value, SETTING_KEY_RE, "1..128 of A-Z a-z 0-9 . _ -")


def check_setting_value(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"setting value must be a string, got {type(value).__name__}")
    if len(value.encode("utf-8", "surrogatepass")) > SETTING_VALUE_BYTES_MAX:
        raise ValueError(f"setting value is longer than {SETTING_VALUE_BYTES_MAX} bytes")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise ValueError("setting value holds lone surrogates (not valid UTF-8)")
    return value


def check_key_id(value: object, what: str = "key_id") -> str:
    return _check_pattern(what, value, KEY_ID_RE, f"{KEY_ID_CHARS} characters of A-Z a-z 0-9")


def _check_bytes(what: str, value: object, low: int, high: int) -> bytes:
    if not isinstance(value, bytes):
        raise ValueError(f"{what} must be bytes, got {type(value).__name__}")
    if not low <= len(value) <= high:
        raise ValueError(f"{what} must be {low}..{high} bytes, got {len(value)}")
    return value


def check_api_key(record: object) -> KeyRecord:
    """Every field of a KeyRecord (it validates nothing itself); ValueError on the first bad one."""
    if not isinstance(record, KeyRecord):
        raise ValueError(f"record must be a KeyRecord, got {type(record).__name__}")
    check_key_id(record.key_id)
    _check_pattern("key name", record.name, KEY_NAME_RE, "1..64 of A-Z a-z 0-9 . _ - and space")
    if record.environment not in ENVIRONMENTS:
        raise ValueError(f"environment {record.environment!r} is not one of {ENVIRONMENTS}")
    if record.role not in ROLES:
        raise ValueError(f"role {record.role!r} is not one of {ROLES}")
    _check_pattern("tier", record.tier, KEY_TIER_RE, "1..64 characters of A-Z a-z 0-9 . _ -")
    _check_bytes("salt", record.salt, SALT_BYTES, KEY_SALT_BYTES_MAX)
    _check_bytes("digest", record.digest, KEY_DIGEST_BYTES, KEY_DIGEST_BYTES)
    check_int("created_ms", record.created_ms, 0)
    check_int("revoked_ms", record.revoked_ms, 0)
    return record


def check_new_api_key(record: object, active_max: object) -> tuple[KeyRecord, int]:
    """create_api_key's arguments: a valid, active record and a limit in 1..100."""
    checked = check_api_key(record)
    if not checked.active:
        raise ValueError(f"a new key must be active, {checked.key_id!r} has revoked_ms set")
    return checked, check_int("active_max", active_max, 1, ACTIVE_KEYS_LIMIT_MAX)


def check_revoked_ms(value: object) -> int:
    return check_int("revoked_ms", value, 1)


def check_key_usage(last_used_ms: object) -> dict[str, int]:
    """touch_api_keys' argument: at most API_KEYS_MAX key ids, each with a time >= 0."""
    if not isinstance(last_used_ms, Mapping):
        raise ValueError(f"last_used_ms must be a mapping, got {type(last_used_ms).__name__}")
    if len(last_used_ms) > API_KEYS_MAX:
        raise ValueError(f"at most {API_KEYS_MAX} keys per touch, got {len(last_used_ms)}")
    return {
        check_key_id(key_id): check_int(f"last_used_ms[{key_id!r}]", ms, 0)
        for key_id, ms in last_used_ms.items()
    }


def key_limit_reached(environment: str, role: str, active: list[str]) -> LimitExceeded:
    return LimitExceeded(
        f"{environment}/{role} already has {len(active)} active keys "
        f"({', '.join(sorted(active))}): revoke one first"
    )


def keys_to_forget(records: list[KeyRecord], cap: int) -> list[str]:
    """The ids of the keys to delete so that one more fits under ``cap``: the longest-revoked
    first (a revoked key is history; an active one is never forgotten). LimitExceeded when
    there are not enough revoked keys.

    Worked example: cap 3, keys a (revoked at 50), b (active), c (revoked at 20). One more
    needs one gone: c, revoked first.

    >>> rec = lambda key_id, revoked_ms: KeyRecord(
    ...     key_id, "n", "production", "admin", "default", b"s", b"d" * 32, 1, revoked_ms)
    >>> keys_to_forget([rec("a", 50), rec("b", 0), rec("c", 20)], cap=3)
    ['c']
    >>> keys_to_forget([rec("a", 50), rec("b", 0)], cap=3)
    []
    """
    excess = len(records) - cap + 1
    if excess <= 0:
        return []
    revoked = sorted(
        (r for r in records if not r.active), key=lambda r: (r.revoked_ms, r.created_ms, r.key_id)
    )
    if len(revoked) < excess:
        raise LimitExceeded(
            f"at most {cap} api keys are stored and {len(records) - len(revoked)} of them are "
            "active: revoke some first"
        )
    return [r.key_id for r in revoked[:excess]]


def sort_api_keys(records: list[KeyRecord]) -> list[KeyRecord]:
    return sorted(records, key=lambda r: (r.created_ms, r.key_id))


ROLE_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def check_role(value: object) -> str:
    return _check_pattern("role", value, ROLE_RE, "1-64 of a-z 0-9 _, starting with a letter")


def check_ttl_ms(value: object) -> int:
    return check_int("ttl_ms", value, NODE_TTL_MS_MIN, NODE_TTL_MS_MAX)


def check_revision(value: object) -> int:
    return check_int("expect_revision", value, 1)


def check_term(value: object) -> int:
    return check_int("term", value, 0)


def check_list_args(prefix: object, after: object, limit: object) -> tuple[str, str, int]:
    """Checks list_placements' paging arguments: prefix/after are "" or name-shaped."""
    if prefix != "":
        _check_pattern("prefix", prefix, STORED_PREFIX_RE, _STORED_NAME_RULE)
    if after != "":
        check_queue_name(after, "after")
    assert isinstance(prefix, str) and isinstance(after, str)
    return prefix, after, check_int("limit", limit, 1, LIST_LIMIT_MAX)


def _check_address(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    if not 1 <= len(value) <= ADDRESS_CHARS_MAX or not value.isprintable() or " " in value:
        raise ValueError(f"{what} {value[:80]!r} must be 1..{ADDRESS_CHARS_MAX} printable chars")
    return value


def _check_port(what: str, value: object) -> int:
    return check_int(what, value, 1, 65535)


# --- records ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeInfo:
    """A live broker node: where to reach it and where its Raft ports start."""

    node_id: str
    grpc_address: str
    raft_host: str
    raft_port_base: int
    started_ms: int
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_node_id(self.node_id)
        _check_address("grpc_address", self.grpc_address)
        _check_address("raft_host", self.raft_host)
        _check_port("raft_port_base", self.raft_port_base)
        check_int("started_ms", self.started_ms, 0)
        if not isinstance(self.labels, Mapping):
            raise ValueError(f"labels must be a mapping, got {type(self.labels).__name__}")
        if len(self.labels) > LABELS_MAX:
            raise ValueError(f"at most {LABELS_MAX} labels, got {len(self.labels)}")
        for key, value in self.labels.items():
            _check_pattern(
                "label key", key, LABEL_KEY_RE, "1..63 of A-Z a-z 0-9 . _ / -, alnum first"
            )
            if not isinstance(value, str) or len(value) > LABEL_VALUE_CHARS_MAX:
                raise ValueError(f"label {key!r}: value must be a string of <= 256 characters")
        # A private copy: a caller mutating its dict later must not change a frozen record.
        object.__setattr__(self, "labels", dict(self.labels))


@dataclass(frozen=True)
class ShardRecord:
    """A replication group (Raft shard): its member nodes and each member's Raft port."""

    group_id: str
    members: tuple[str, ...]
    raft_ports: dict[str, int]
    factor: int
    created_ms: int

    def __post_init__(self) -> None:
        check_shard_id(self.group_id)
        if not isinstance(self.members, tuple | list):
            raise ValueError(f"members must be a tuple, got {type(self.members).__name__}")
        members = tuple(self.members)
        if not 1 <= len(members) <= SHARD_MEMBERS_MAX:
            raise ValueError(f"a group has 1..{SHARD_MEMBERS_MAX} members, got {len(members)}")
        for member in members:
            check_node_id(member, "member")
        if len(set(members)) != len(members):
            raise ValueError(f"members must be distinct, got {list(members)}")
        if not isinstance(self.raft_ports, Mapping):
            raise ValueError("raft_ports must be a mapping of member -> port")
        if set(self.raft_ports) != set(members):
            raise ValueError(
                f"raft_ports must name exactly the members {sorted(members)}, "
                f"got {sorted(map(str, self.raft_ports))}"
            )
        for member, port in self.raft_ports.items():
            _check_port(f"raft_ports[{member!r}]", port)
        check_int("factor", self.factor, 1, SHARD_MEMBERS_MAX)
        check_int("created_ms", self.created_ms, 0)
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "raft_ports", dict(self.raft_ports))


@dataclass(frozen=True)
class Placement:
    """Which replication group holds a queue."""

    queue: str
    group_id: str
    created_ms: int

    def __post_init__(self) -> None:
        check_queue_name(self.queue)
        check_shard_id(self.group_id)
        check_int("created_ms", self.created_ms, 0)


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A record with the revision it was last modified at (the compare-and-set token)."""

    value: T
    revision: int


@dataclass(frozen=True)
class MetadataEvent:
    """A hint that something changed; ``key == ""`` means re-read everything of ``kind``."""

    kind: EventKind
    key: str
    deleted: bool = False
    # Placement events that carry the new value: the queue's group ("" = read it yourself).
    group_id: str = ""

    @property
    def resync(self) -> bool:
        return self.key == ""


# --- codec ------------------------------------------------------------------------------------


def _dump(fields: dict[str, Any]) -> bytes:
    fields = {"v": SCHEMA_VERSION, **fields}
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def json_object(data: bytes, what: str) -> dict[str, Any]:
    """``data`` as a JSON object (MetadataCorrupt naming ``what`` otherwise)."""
    try:
        obj = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise MetadataCorrupt(f"{what}: not JSON ({e})") from e
    if not isinstance(obj, dict):
        raise MetadataCorrupt(f"{what}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _load(
    data: bytes, what: str, names: frozenset[str], optional: frozenset[str] = frozenset()
) -> dict[str, Any]:
    obj = json_object(data, what)
    if obj.get("v") != SCHEMA_VERSION:
        raise MetadataCorrupt(f"{what}: unsupported schema version {obj.get('v')!r}")
    del obj["v"]
    if not names <= set(obj) <= names | optional:
        raise MetadataCorrupt(f"{what}: fields {sorted(obj)} != expected {sorted(names)}")
    return obj


_NODE_FIELDS = frozenset(("node_id", "grpc_address", "raft_host", "raft_port_base", "started_ms"))
_SHARD_FIELDS = frozenset(("group_id", "members", "raft_ports", "factor", "created_ms"))
_PLACEMENT_FIELDS = frozenset(("queue", "group_id", "created_ms"))


def encode_node(node: NodeInfo) -> bytes:
    return _dump(
        {
            "node_id": node.node_id,
            "grpc_address": node.grpc_address,
            "raft_host": node.raft_host,
            "raft_port_base": node.raft_port_base,
            "started_ms": node.started_ms,
            "labels": node.labels,
        }
    )


def decode_node(data: bytes, key: str) -> NodeInfo:
    obj = _load(data, f"node {key!r}", _NODE_FIELDS | {"labels"})
    node = _build(f"node {key!r}", NodeInfo, obj)
    _expect(node.node_id == key, f"node record under {key!r} names {node.node_id!r}")
    return node


def encode_shard(group: ShardRecord) -> bytes:
    return _dump(
        {
            "group_id": group.group_id,
            "members": list(group.members),
            "raft_ports": group.raft_ports,
            "factor": group.factor,
            "created_ms": group.created_ms,
        }
    )


def decode_shard(data: bytes, key: str) -> ShardRecord:
    obj = _load(data, f"group {key!r}", _SHARD_FIELDS)
    group = _build(f"group {key!r}", ShardRecord, obj)
    _expect(group.group_id == key, f"group record under {key!r} names {group.group_id!r}")
    return group


def encode_placement(placement: Placement) -> bytes:
    return _dump(
        {
            "queue": placement.queue,
            "group_id": placement.group_id,
            "created_ms": placement.created_ms,
        }
    )


def decode_placement(data: bytes, key: str) -> Placement:
    obj = _load(data, f"placement {key!r}", _PLACEMENT_FIELDS)
    placement = _build(f"placement {key!r}", Placement, obj)
    _expect(placement.queue == key, f"placement under {key!r} names {placement.queue!r}")
    return placement


def encode_leader(node_id: str, term: int) -> bytes:
    return _dump({"node_id": node_id, "term": term})


def decode_leader(data: bytes, key: str) -> tuple[str, int]:
    obj = _load(data, f"leader of {key!r}", frozenset(("node_id", "term")))
    try:
        return check_node_id(obj["node_id"]), check_term(obj["term"])
    except ValueError as e:
        raise MetadataCorrupt(f"leader of {key!r}: {e}") from e


def encode_setting(value: str) -> bytes:
    return _dump({"value": value})


def decode_setting(data: bytes, key: str) -> str:
    """The value of setting ``key``: the JSON record ``put_setting`` writes, or the plain text
    an operator writes with ``etcdctl put <prefix>settings/<key> true`` (surrounding white
    space dropped). A JSON object that is not a valid record is corrupt, never taken as text."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise MetadataCorrupt(f"setting {key!r}: not UTF-8 text ({e})") from e
    if not text.lstrip().startswith("{"):
        try:
            return check_setting_value(text.strip())
        except ValueError as e:
            raise MetadataCorrupt(f"setting {key!r}: {e}") from e
    obj = _load(data, f"setting {key!r}", frozenset(("value",)))
    try:
        return check_setting_value(obj["value"])
    except ValueError as e:
        raise MetadataCorrupt(f"setting {key!r}: {e}") from e


_API_KEY_FIELDS = frozenset(
    ("key_id", "name", "environment", "role", "tier", "salt", "digest", "created_ms", "revoked_ms")
)


_SEAL_CONTEXT = b"fluxmq api key record seal v1"
FORGED_LOG_INTERVAL_S = 60.0
_FORGED_LOGGED_MAX = 1024
_forged_logged_at: dict[str, float] = {}
# The logger keeps the package's old name: operators filter and alert on it (the JSON logs'
# ``logger`` field; README, "ignored API key record"), so it outlived the move to fluxmq.metadata.
_log = logging.getLogger("fluxmq.cluster.metadata")


def api_key_seal_key(secret: str) -> bytes:
    """The HMAC key that seals API key records, derived from the cluster secret: a separate
    key per purpose, so a seal says nothing about the key Raft authenticates with."""
    if not secret:
        raise ValueError("record_secret must be a non-empty string")
    return hmac.new(secret.encode(), _SEAL_CONTEXT, hashlib.sha256).digest()


def _seal(seal_key: bytes, unsealed: bytes) -> str:
    return hmac.new(seal_key, unsealed, hashlib.sha256).hexdigest()


def report_forged_key(err: ForgedRecord, key_id: str) -> None:
    """Logs a forged key record: each key id at most once per FORGED_LOG_INTERVAL_S, so
    someone writing records to etcd cannot flood the node's log."""
    now_s = time.monotonic()
    last_s = _forged_logged_at.get(key_id)
    if last_s is not None and now_s - last_s < FORGED_LOG_INTERVAL_S:
        return
    if len(_forged_logged_at) >= _FORGED_LOGGED_MAX:
        _forged_logged_at.clear()
    _forged_logged_at[key_id] = now_s
    _log.warning("ignored API key record %r: %s", key_id[:16], err)


def encode_api_key(record: KeyRecord, seal_key: bytes | None = None) -> bytes:
    """The record as JSON, salt and digest in hex; ``check_api_key`` it first. With
    ``seal_key`` (``api_key_seal_key``) it carries ``mac``: HMAC-SHA256 over the record's
    encoding without it."""
    unsealed = _encode_api_key_fields(record)
    if seal_key is None:
        return _dump(unsealed)
    return _dump({**unsealed, "mac": _seal(seal_key, _dump(unsealed))})


def _encode_api_key_fields(record: KeyRecord) -> dict[str, Any]:
    return {
        "key_id": record.key_id,
        "name": record.name,
        "environment": record.environment,
        "role": record.role,
        "tier": record.tier,
        "salt": record.salt.hex(),
        "digest": record.digest.hex(),
        "created_ms": record.created_ms,
        "revoked_ms": record.revoked_ms,
    }


def decode_sealed_api_key(data: bytes, key: str, seal_key: bytes | None) -> KeyRecord | None:
    """Both stores' reading of a key record: the record, or None (logged, rate limited) when it
    is not sealed with the record secret, so a forged record reads as a missing key."""
    try:
        return decode_api_key(data, key, seal_key)
    except ForgedRecord as err:
        report_forged_key(err, key)
        return None


def decode_api_key(data: bytes, key: str, seal_key: bytes | None = None) -> KeyRecord:
    """The record stored under ``key``. With ``seal_key``, a record whose ``mac`` is missing or
    wrong raises ForgedRecord (after the fields check out: a broken record is still corrupt)."""
    what = f"api key {key!r}"
    obj = _load(data, what, _API_KEY_FIELDS, optional=frozenset(("mac",)))
    mac = obj.pop("mac", None)
    try:
        for name in ("salt", "digest"):
            if not isinstance(obj[name], str):
                raise ValueError(f"{name} must be a hex string, got {type(obj[name]).__name__}")
            obj[name] = bytes.fromhex(obj[name])
        record = check_api_key(KeyRecord(**obj))
    except (TypeError, ValueError) as e:
        raise MetadataCorrupt(f"{what}: {e}") from e
    _expect(record.key_id == key, f"api key record under {key!r} names {record.key_id!r}")
    if seal_key is not None:
        expected = _seal(seal_key, _dump(_encode_api_key_fields(record)))
        if not isinstance(mac, str) or not hmac.compare_digest(mac, expected):
            why = "has no seal" if mac is None else "has a seal that does not match"
            raise ForgedRecord(
                f"{what} {why} (written without the cluster secret, or before records were sealed)"
            )
    return record


def encode_key_usage(last_used_ms: int) -> bytes:
    return _dump({"last_used_ms": last_used_ms})


def decode_key_usage(data: bytes, key: str) -> int:
    obj = _load(data, f"usage of api key {key!r}", frozenset(("last_used_ms",)))
    try:
        return check_int("last_used_ms", obj["last_used_ms"], 0)
    except ValueError as e:
        raise MetadataCorrupt(f"usage of api key {key!r}: {e}") from e


def encode_key_slots(active: list[str]) -> bytes:
    """The active key ids of one (environment, role): the index etcd's limit check guards."""
    return _dump({"active": sorted(active)})


def decode_key_slots(data: bytes, key: str) -> list[str]:
    what = f"key slots {key!r}"
    obj = _load(data, what, frozenset(("active",)))
    active = obj["active"]
    try:
        if not isinstance(active, list) or len(active) > ACTIVE_KEYS_LIMIT_MAX:
            raise ValueError(f"active must be a list of at most {ACTIVE_KEYS_LIMIT_MAX} key ids")
        ids = [check_key_id(key_id) for key_id in active]
        if len(set(ids)) != len(ids):
            raise ValueError(f"active key ids repeat: {ids}")
    except ValueError as e:
        raise MetadataCorrupt(f"{what}: {e}") from e
    return ids


def _build(what: str, cls: type[T], obj: dict[str, Any]) -> T:
    try:
        return cls(**obj)
    except (TypeError, ValueError) as e:
        raise MetadataCorrupt(f"{what}: {e}") from e


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise MetadataCorrupt(message)


# --- the interface ----------------------------------------------------------------------------


class MetadataWatch(AsyncIterator[MetadataEvent]):
    """An async iterator of change hints; ends when closed (``aclose`` or the store's ``close``).

    Pending events are coalesced (a repeated event moves to the end) and bounded: past
    PENDING_MAX the backlog collapses into one resync event per kind. Subclasses feed it with
    ``push``; ``_poll`` runs whenever the consumer finds nothing pending, every ``poll_ms``
    while it waits, which is how the embedded store evaluates node expiry lazily.
    """

    PENDING_MAX = 10_000

    def __init__(self, poll_ms: int | None = None) -> None:
        self._pending: dict[MetadataEvent, None] = {}
        self._wakeup = asyncio.Event()
        self._closed = False
        self._poll_s = None if poll_ms is None else poll_ms / 1000

    @property
    def closed(self) -> bool:
        return self._closed

    def push(self, event: MetadataEvent) -> None:
        if self._closed:
            return
        self._pending.pop(event, None)
        self._pending[event] = None
        if len(self._pending) > self.PENDING_MAX:
            self._pending.clear()
            self.push_resync()
        self._wakeup.set()

    def push_resync(self) -> None:
        for kind in EVENT_KINDS:
            self.push(MetadataEvent(kind, ""))

    def end(self) -> None:
        """Stops the stream at once: pending events are dropped, waiting consumers return."""
        self._closed = True
        self._pending.clear()
        self._wakeup.set()

    def _poll(self) -> None:
        """Hook: look for changes nobody pushed (the embedded store's node expiry)."""

    async def _shutdown(self) -> None:
        """Hook: release what feeds this watch."""

    def __aiter__(self) -> MetadataWatch:
        return self

    async def __anext__(self) -> MetadataEvent:
        while True:
            if self._closed:
                raise StopAsyncIteration
            if not self._pending:
                self._poll()
            if self._pending:
                event = next(iter(self._pending))
                del self._pending[event]
                return event
            self._wakeup.clear()
            if self._poll_s is None:
                await self._wakeup.wait()
            else:
                try:
                    async with asyncio.timeout(self._poll_s):
                        await self._wakeup.wait()
                except TimeoutError:
                    pass

    async def aclose(self) -> None:
        self.end()
        await self._shutdown()


class MetadataStore(Protocol):
    """Cluster metadata: live nodes, replication groups, queue placement, shard leaders, settings
    and API keys.

    Every method may raise ``MetadataUnavailable`` (retriable) and ``ValueError`` for bad input
    (checked before anything is sent). Lists are sorted by their natural key.
    """

    async def register_node(self, node: NodeInfo, ttl_ms: int) -> None:
        """Publishes ``node`` for ``ttl_ms`` (1 s..5 min; etcd rounds up to whole seconds).

        Registering the same id again replaces the record and its lease.
        """
        ...

    async def refresh_node(self, node_id: str) -> None:
        """Extends the registration by its TTL; NodeNotRegistered if it already lapsed."""
        ...

    async def deregister_node(self, node_id: str) -> None:
        """Removes the node at once (clean shutdown); a no-op when it is not registered."""
        ...

    async def list_nodes(self) -> list[NodeInfo]:
        """Live nodes only, by node_id."""
        ...

    async def create_shard(self, group: ShardRecord) -> None:
        """Records a new group and claims its Raft ports (each (node, port) of
        ``raft_ports``) in one atomic step: AlreadyExists if the id is taken, PortTaken if
        another group holds one of the ports; LimitExceeded past SHARDS_MAX."""
        ...

    async def update_shard(self, group: ShardRecord, expect_revision: int) -> int:
        """Compare-and-set: RevisionConflict unless the stored revision is ``expect_revision``,
        NotFound if the group does not exist. Ports the new record names and the old one did
        not are claimed (PortTaken if another group holds one), ports only the old one named
        are released, in the same atomic step. Returns the new revision."""
        ...

    async def list_raft_ports(self) -> dict[str, dict[int, str]]:
        """Every claimed Raft port: node id -> port -> the group holding it."""
        ...

    async def campaign(self, role: str, node_id: str, ttl_ms: int) -> str:
        """Holds ``role`` (e.g. the placement controller) for ``node_id``: takes it when nobody
        holds it, keeps it alive for another ``ttl_ms`` when this node already does. A holder
        that stops campaigning loses the role when its ``ttl_ms`` lapse. -> the holder."""
        ...

    async def resign(self, role: str, node_id: str) -> None:
        """Gives ``role`` up at once if ``node_id`` holds it."""
        ...

    async def get_shard(self, group_id: str) -> Versioned[ShardRecord] | None: ...

    async def list_shards(self) -> list[Versioned[ShardRecord]]: ...

    async def create_placement(self, placement: Placement) -> None:
        """Atomic create-if-absent: of concurrent creators exactly one wins, the rest get
        AlreadyExists."""
        ...

    async def get_placement(self, queue: str) -> Placement | None: ...

    async def list_placements(
        self, prefix: str = "", after: str = "", limit: int = 1000
    ) -> list[Placement]:
        """Placements whose queue starts with ``prefix`` and sorts after ``after``, by queue
        name, at most ``limit`` (1..1000). Page on by passing the last queue as ``after``."""
        ...

    async def delete_placement(self, queue: str) -> bool:
        """True if a placement was removed."""
        ...

    async def set_shard_leader(self, group_id: str, node_id: str, term: int) -> None:
        """Records who leads a shard. Only a strictly higher term replaces the record; an
        equal or lower term is ignored (Raft elects at most one leader per term)."""
        ...

    async def get_shard_leaders(self) -> dict[str, tuple[str, int]]:
        """group_id -> (node_id, term)."""
        ...

    async def get_setting(self, key: str) -> str | None: ...

    async def put_setting(self, key: str, value: str) -> None: ...

    async def create_api_key(self, record: KeyRecord, active_max: int) -> None:
        """Stores a new, active key. Atomically (even between nodes on etcd): LimitExceeded when
        its (environment, role) already has ``active_max`` (1..100) active keys, naming them;
        AlreadyExists when the key_id is taken. At API_KEYS_MAX stored keys it first deletes
        the longest-revoked ones (keys_to_forget; LimitExceeded when all are active), with a
        watch event each. The record holds only the salted digest; the key itself never
        reaches the store."""
        ...

    async def revoke_api_key(self, key_id: str, revoked_ms: int) -> KeyRecord:
        """Marks the key revoked at ``revoked_ms`` (>= 1) and frees its slot in the limit, in one
        step; returns the record. Idempotent: a revoked key is returned unchanged (its first
        revocation time stays). NotFound when there is no such key."""
        ...

    async def get_api_key(self, key_id: str) -> KeyRecord | None: ...

    async def list_api_keys(self) -> list[KeyRecord]:
        """Every key, revoked ones too, by created_ms then key_id; LimitExceeded past
        API_KEYS_READ_MAX."""
        ...

    async def touch_api_keys(self, last_used_ms: Mapping[str, int]) -> None:
        """Best-effort last-used times (key_id -> ms), kept apart from the records so they never
        conflict with a revocation, and without watch events. A time only moves forward; ids
        of keys that do not exist are ignored."""
        ...

    async def list_api_key_usage(self) -> dict[str, int]:
        """key_id -> last-used ms, for the keys ever touched."""
        ...

    def watch(self) -> MetadataWatch:
        """Change hints from now on (see the module docstring); call from a running loop."""
        ...

    async def close(self) -> None:
        """Ends every watch and releases the store; later calls raise MetadataUnavailable."""
        ...
