"""The records placement acts on, sealed with the cluster secret.

Nodes, replication groups, queue placements, shard leaders, and the settings the placement
controller reads (``node_state.<node>``, ``preferred_leader.<group>``) decide where replicas
run and who leads. Anyone who can write to etcd could otherwise move replicas, drain a node or
point clients elsewhere. With the cluster secret each such record carries ``mac``: HMAC-SHA256,
under a key derived from the secret for this purpose only, over the record's kind, its name and
its encoding without ``mac``. Binding kind and name means a sealed record copied under another
key (a ``draining`` state onto another node) is as forged as a made-up one.

A record without a valid seal reads as absent (and is logged, at most once a minute per key):
it moves nothing. Operators' own settings (``auto_provision_groups``, ``groups_per_size``,
``cluster_name``) stay plain, so ``etcdctl put`` keeps working for them; they shape groups yet
to be provisioned, never a running one.

Without a secret (a single node's embedded store, tests) records are written and read plain.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fluxmq.metadata.metadata import (
    EventKind,
    MetadataCorrupt,
    NodeInfo,
    Placement,
    ShardRecord,
    decode_leader,
    decode_node,
    decode_placement,
    decode_setting,
    decode_shard,
    encode_leader,
    encode_node,
    encode_placement,
    encode_setting,
    encode_shard,
    json_object,
)

_CONTEXT = b"fluxmq topology record seal v1"
SEALED_KINDS: tuple[EventKind, ...] = ("node", "group", "placement", "leader", "setting")
# Settings the placement controller acts on (fluxmq.server.placement.node_states).
SEALED_SETTING_PREFIXES = ("node_state.", "preferred_leader.")
FORGED_LOG_INTERVAL_S = 60.0
_FORGED_LOGGED_MAX = 1024
_log = logging.getLogger("fluxmq.cluster.metadata")


def is_sealed(kind: EventKind, name: str) -> bool:
    """Whether records of ``kind`` named ``name`` are sealed (when there is a secret)."""
    if kind in ("node", "group", "placement", "leader"):
        return True
    return kind == "setting" and name.startswith(SEALED_SETTING_PREFIXES)


def _canonical(obj: dict[str, Any]) -> bytes:
    # The same form fluxmq.metadata.metadata._dump writes: what is sealed is what is stored.
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class RecordSeal:
    """Seals and opens records with a key derived from the cluster secret."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("the record secret must be a non-empty string")
        self._key = hmac.new(secret.encode(), _CONTEXT, hashlib.sha256).digest()
        self._logged_at: dict[str, float] = {}

    def _mac(self, kind: str, name: str, unsealed: bytes) -> str:
        message = kind.encode() + b"\x00" + name.encode() + b"\x00" + unsealed
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def seal(self, kind: EventKind, name: str, data: bytes) -> bytes:
        """``data`` (a JSON object, as the codec writes it) with its ``mac``."""
        obj = json.loads(data)
        assert isinstance(obj, dict) and "mac" not in obj, f"{kind} {name!r}: not a record"
        unsealed = _canonical(obj)
        assert unsealed == data, f"{kind} {name!r}: not in canonical form"
        return _canonical({**obj, "mac": self._mac(kind, name, unsealed)})

    def open(self, kind: EventKind, name: str, data: bytes) -> bytes | None:
        """The record without its ``mac``; None (logged) when the seal is missing or wrong."""
        try:
            obj = json.loads(bytes(data).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            obj = None
        if not isinstance(obj, dict):
            self._report(kind, name, "is not a sealed JSON record")
            return None
        mac = obj.pop("mac", None)
        unsealed = _canonical(obj)
        if not isinstance(mac, str):
            self._report(kind, name, "has no seal")
            return None
        if not hmac.compare_digest(mac, self._mac(kind, name, unsealed)):
            self._report(kind, name, "has a seal that does not match")
            return None
        return unsealed

    def _report(self, kind: str, name: str, why: str) -> None:
        """Each key at most once per FORGED_LOG_INTERVAL_S: writing records to etcd must not
        flood the node's log."""
        where = f"{kind}/{name[:64]}"
        now_s = time.monotonic()
        last_s = self._logged_at.get(where)
        if last_s is not None and now_s - last_s < FORGED_LOG_INTERVAL_S:
            return
        if len(self._logged_at) >= _FORGED_LOGGED_MAX:
            self._logged_at.clear()
        self._logged_at[where] = now_s
        _log.warning(
            "ignored %s record %r: it %s (written without the cluster secret, or before "
            "records were sealed: `fluxmq seal-records`)",
            kind,
            name[:64],
            why,
        )


class TopologyCodec:
    """Both stores' encoding of the records placement acts on: sealed with ``seal`` when there
    is one. Every ``decode_*`` returns None for a record whose seal is missing or wrong (it
    reads as absent); a sealed record that is broken inside still raises MetadataCorrupt."""

    def __init__(self, seal: RecordSeal | None) -> None:
        self.seal = seal

    def _out(self, kind: EventKind, name: str, data: bytes) -> bytes:
        if self.seal is None or not is_sealed(kind, name):
            return data
        return self.seal.seal(kind, name, data)

    def _in(self, kind: EventKind, name: str, data: bytes) -> bytes | None:
        if self.seal is None or not is_sealed(kind, name):
            return bytes(data)
        return self.seal.open(kind, name, data)

    def encode_node(self, node: NodeInfo) -> bytes:
        return self._out("node", node.node_id, encode_node(node))

    def decode_node(self, data: bytes, name: str) -> NodeInfo | None:
        opened = self._in("node", name, data)
        return None if opened is None else decode_node(opened, name)

    def encode_shard(self, group: ShardRecord) -> bytes:
        return self._out("group", group.group_id, encode_shard(group))

    def decode_shard(self, data: bytes, name: str) -> ShardRecord | None:
        opened = self._in("group", name, data)
        return None if opened is None else decode_shard(opened, name)

    def encode_placement(self, placement: Placement) -> bytes:
        return self._out("placement", placement.queue, encode_placement(placement))

    def decode_placement(self, data: bytes, name: str) -> Placement | None:
        opened = self._in("placement", name, data)
        return None if opened is None else decode_placement(opened, name)

    def encode_leader(self, group_id: str, node_id: str, term: int) -> bytes:
        return self._out("leader", group_id, encode_leader(node_id, term))

    def decode_leader(self, data: bytes, name: str) -> tuple[str, int] | None:
        opened = self._in("leader", name, data)
        return None if opened is None else decode_leader(opened, name)

    def encode_setting(self, key: str, value: str) -> bytes:
        return self._out("setting", key, encode_setting(value))

    def decode_setting(self, data: bytes, key: str) -> str | None:
        opened = self._in("setting", key, data)
        return None if opened is None else decode_setting(opened, key)

    def reseal(self, kind: EventKind, name: str, data: bytes) -> bytes | None:
        """An unsealed record of a sealed kind, checked and sealed (``fluxmq seal-records``,
        run by an operator who vouches for what etcd holds). None: nothing to do (already
        sealed with this secret, or a kind that is not sealed). MetadataCorrupt: not a valid
        record, or sealed with another secret."""
        if self.seal is None or not is_sealed(kind, name):
            return None
        obj = json_object(data, f"{kind} {name!r}")
        if "mac" in obj:
            if self.seal.open(kind, name, data) is None:
                raise MetadataCorrupt(f"{kind} {name!r}: sealed with another secret")
            return None
        plain = _canonical(obj)
        _DECODERS[kind](plain, name)  # raises MetadataCorrupt for a broken record
        return self.seal.seal(kind, name, plain)


_DECODERS: dict[str, Any] = {
    "node": decode_node,
    "group": decode_shard,
    "placement": decode_placement,
    "leader": decode_leader,
    "setting": decode_setting,
}


@dataclass
class ResealReport:
    """What ``reseal_records`` did: records sealed now, records left as they were (sealed
    already, or of settings that stay plain), and records refused with the reason."""

    sealed: int = 0
    unchanged: int = 0
    refused: list[str] = field(default_factory=list)
