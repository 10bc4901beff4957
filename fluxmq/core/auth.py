"""API keys, roles and environments: the pure policy of who may call what.

A key looks like ``fmq_live_sk_<32 base62>`` (production) or ``fmq_test_sk_<32 base62>``
(development, staging). Its first 8 secret characters are its public id (``key_id``), shown in
listings and logs; the rest never leaves the client. Keys are stored only as salted SHA-256
hashes: a key carries ~190 random bits, so a slow password hash would buy nothing against
guessing and would cost every request (the same choice as GitHub's and Stripe's tokens).

Each key is bound to one environment and one role; every RPC method is one action, and a role
allows a set of actions. Rate limiting counts by action class (publish / consume / admin).
Nothing here does I/O or reads a clock: time comes in as ``now_ms``.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from fluxmq.core.errors import FluxError, invalid_argument

KEY_PREFIX = "fmq_"
KEY_SECRET_CHARS = 32
KEY_ID_CHARS = 8
_KEY = re.compile(r"fmq_(live|test)_sk_([A-Za-z0-9]{32})")
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
SALT_BYTES = 16
ACTIVE_KEYS_PER_ENV_ROLE_MAX = 2  # rotation: the new key and the one it replaces

ENVIRONMENTS = ("development", "staging", "production")
ROLES = ("admin", "producer", "consumer", "read-only")


class Action(enum.Enum):
    READ = "read"  # look, change nothing
    PUBLISH = "publish"
    CONSUME = "consume"  # lease, ack, offsets, membership
    MANAGE = "manage"  # queues and groups: create, update, delete, purge, replay
    CLUSTER = "cluster"  # the cluster itself: leadership, replicas, keys


class RateClass(enum.Enum):
    PUBLISH = "publish"
    CONSUME = "consume"
    ADMIN = "admin"


RATE_CLASS = {
    Action.PUBLISH: RateClass.PUBLISH,
    Action.CONSUME: RateClass.CONSUME,
    Action.READ: RateClass.CONSUME,
    Action.MANAGE: RateClass.ADMIN,
    Action.CLUSTER: RateClass.ADMIN,
}

ROLE_ACTIONS: dict[str, frozenset[Action]] = {
    "admin": frozenset(Action),
    "producer": frozenset({Action.READ, Action.PUBLISH}),
    "consumer": frozenset({Action.READ, Action.CONSUME}),
    "read-only": frozenset({Action.READ}),
}

# Every RPC of QueueService and AdminService. A method missing here is refused (fail closed);
# tests/unit/test_auth.py checks the table covers the whole API.
METHOD_ACTIONS: dict[str, Action] = {
    "CreateQueue": Action.MANAGE,
    "UpdateQueue": Action.MANAGE,
    "GetQueue": Action.READ,
    "ListQueues": Action.READ,
    "DeleteQueue": Action.MANAGE,
    "PurgeQueue": Action.MANAGE,
    "GetQueueStats": Action.READ,
    "Publish": Action.PUBLISH,
    "PublishStream": Action.PUBLISH,
    "InitProducer": Action.PUBLISH,
    "Fetch": Action.READ,
    "Tail": Action.READ,
    "SeekToTimestamp": Action.READ,
    "CreateGroup": Action.MANAGE,
    "ListGroups": Action.READ,
    "DescribeGroup": Action.READ,
    "DeleteGroup": Action.MANAGE,
    "JoinGroup": Action.CONSUME,
    "Heartbeat": Action.CONSUME,
    "LeaveGroup": Action.CONSUME,
    "Lease": Action.CONSUME,
    "Consume": Action.CONSUME,
    "EndConsume": Action.CONSUME,
    "Ack": Action.CONSUME,
    "Nack": Action.CONSUME,
    "ExtendLease": Action.CONSUME,
    "CommitOffsets": Action.CONSUME,
    "GetOffsets": Action.READ,
    "ResetOffsets": Action.MANAGE,
    "ListDeadLetters": Action.READ,
    "ReplayDeadLetters": Action.MANAGE,
    "PurgeDeadLetters": Action.MANAGE,
    "Transact": Action.PUBLISH,  # publishes and acks: needs CONSUME as well, see actions_of
    "GetClusterStatus": Action.READ,
    "TransferLeadership": Action.CLUSTER,
    "AddReplica": Action.CLUSTER,
    "RemoveReplica": Action.CLUSTER,
    "ListNodes": Action.READ,
    "DrainNode": Action.CLUSTER,
    "DecommissionNode": Action.CLUSTER,
    "UndrainNode": Action.CLUSTER,
    "MoveReplica": Action.CLUSTER,
    "RebalanceShards": Action.CLUSTER,
    "CreateApiKey": Action.MANAGE,
    "ListApiKeys": Action.MANAGE,
    "RevokeApiKey": Action.MANAGE,
}


def actions_of(method: str) -> frozenset[Action]:
    """What a call of ``method`` does; empty for an unknown method (refused).

    >>> sorted(a.value for a in actions_of("Transact"))
    ['consume', 'publish']
    >>> actions_of("Nope")
    frozenset()
    """
    action = METHOD_ACTIONS.get(method)
    if action is None:
        return frozenset()
    if method == "Transact":
        return frozenset({Action.PUBLISH, Action.CONSUME})
    return frozenset({action})


def kind_of(environment: str) -> str:
    """``live`` keys are for production, ``test`` keys for everything else."""
    return "live" if environment == "production" else "test"


@dataclass(frozen=True, slots=True)
class PresentedKey:
    kind: str  # "live" | "test"
    key_id: str
    key: str  # the whole key as presented


def parse_key(presented: str) -> PresentedKey | None:
    """The key's parts, or None when it is not a well-formed FluxMQ key.

    >>> parse_key("fmq_test_sk_" + "a" * 32).key_id
    'aaaaaaaa'
    >>> parse_key("fmq_test_sk_short") is None
    True
    """
    m = _KEY.fullmatch(presented)
    if m is None:
        return None
    return PresentedKey(m.group(1), m.group(2)[:KEY_ID_CHARS], presented)


def parse_bearer(value: str) -> str | None:
    """The token of an ``authorization`` metadata value (``Bearer <token>``), or None."""
    scheme, sep, token = value.strip().partition(" ")
    if not sep or scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


def new_key(environment: str) -> str:
    """A fresh random key for ``environment`` (190 random bits from the OS)."""
    body = "".join(secrets.choice(_BASE62) for _ in range(KEY_SECRET_CHARS))
    return f"fmq_{kind_of(environment)}_sk_{body}"


def hash_key(salt: bytes, key: str) -> bytes:
    return hashlib.sha256(salt + key.encode()).digest()


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """What is stored of a key: never the key itself."""

    key_id: str
    name: str
    environment: str
    role: str
    tier: str
    salt: bytes
    digest: bytes
    created_ms: int
    revoked_ms: int = 0  # 0: active

    @property
    def active(self) -> bool:
        return self.revoked_ms == 0

    @property
    def prefix(self) -> str:
        """How listings show the key: kind and id, never the secret."""
        return f"fmq_{kind_of(self.environment)}_sk_{self.key_id}"

    def matches(self, presented: PresentedKey) -> bool:
        return (
            presented.key_id == self.key_id
            and presented.kind == kind_of(self.environment)
            and hmac.compare_digest(hash_key(self.salt, presented.key), self.digest)
        )


def unauthenticated(why: str) -> FluxError:
    return FluxError("INVALID_API_KEY", why)


def permission_denied(why: str, **metadata: str) -> FluxError:
    return FluxError("PERMISSION_DENIED", why, metadata=dict(metadata))


def check_new_key(
    name: str, environment: str, role: str, tier: str, tiers: Iterable[str],
    existing: Iterable[KeyRecord],
) -> None:  # fmt: skip
    """Refuse a key that breaks a rule: unknown environment, role or tier, a bad name, or a
    third active key of the same environment and role (rotation keeps at most two)."""
    if environment not in ENVIRONMENTS:
        raise invalid_argument("environment", f"one of {', '.join(ENVIRONMENTS)}")
    if role not in ROLES:
        raise invalid_argument("role", f"one of {', '.join(ROLES)}")
    known = sorted(tiers)
    if tier not in known:
        raise invalid_argument("tier", f"one of {', '.join(known)}")
    if not re.fullmatch(r"[A-Za-z0-9._ -]{1,64}", name):
        raise invalid_argument("name", "1-64 of A-Z a-z 0-9 . _ - and space")
    active = [r for r in existing if r.active and r.environment == environment and r.role == role]
    if len(active) >= ACTIVE_KEYS_PER_ENV_ROLE_MAX:
        raise FluxError(
            "KEY_LIMIT_REACHED",
            f"{environment}/{role} already has {len(active)} active keys "
            f"({', '.join(sorted(r.prefix for r in active))}): revoke one first",
            metadata={"environment": environment, "role": role},
        )


def authorize(record: KeyRecord, method: str) -> None:
    """Raise PERMISSION_DENIED unless the key's role allows every action of ``method``."""
    needed = actions_of(method)
    if not needed:
        raise permission_denied(f"{method} is not a known method", method=method)
    allowed = ROLE_ACTIONS[record.role]
    missing = needed - allowed
    if missing:
        raise permission_denied(
            f"role {record.role!r} may not {', '.join(sorted(a.value for a in missing))} "
            f"({method})",
            method=method,
            role=record.role,
        )
