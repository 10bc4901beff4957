"""The API-key part of the metadata contract, checked against every MetadataStore.

Same stores as tests/contract/test_metadata_contract.py (its ``h`` and ``etcd`` fixtures): the
embedded store on LMDB and in memory, and EtcdMetadataStore on a real etcd. The etcd-only tests
at the end race separate clients, as separate nodes would, against the rotation limit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import doctest
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from fluxmq.core import auth
from fluxmq.core.auth import KeyRecord
from fluxmq.metadata import (
    AlreadyExists,
    EmbeddedMetadataStore,
    EtcdMetadataStore,
    MetadataCorrupt,
    MetadataEvent,
    MetadataStore,
    NotFound,
)
from fluxmq.metadata import embedded as embedded_module
from fluxmq.metadata import etcd as etcd_module
from fluxmq.metadata import metadata as md
from fluxmq.metadata.metadata import LimitExceeded, RevisionConflict
from tests.contract import test_metadata_contract as contract
from tests.contract.test_metadata_contract import Harness, _prefix, established, next_event
from tests.etcd_server import EtcdServer

# The metadata contract's store fixtures: each test runs on embedded-lmdb, embedded-memory, etcd.
h = contract.h
etcd = contract.etcd

LIMIT = auth.ACTIVE_KEYS_PER_ENV_ROLE_MAX


def make_key(
    environment: str = "production",
    role: str = "admin",
    created_ms: int = 1_000,
    *,
    name: str = "ci deploy",
    tier: str = "default",
) -> tuple[str, KeyRecord]:
    """A fresh key and the record a server would store of it (salted digest only)."""
    key = auth.new_key(environment)
    presented = auth.parse_key(key)
    assert presented is not None
    salt = secrets.token_bytes(auth.SALT_BYTES)
    digest = auth.hash_key(salt, key)
    return key, KeyRecord(presented.key_id, name, environment, role, tier, salt, digest, created_ms)


def record(
    environment: str = "production",
    role: str = "admin",
    created_ms: int = 1_000,
    *,
    name: str = "ci deploy",
    tier: str = "default",
) -> KeyRecord:
    return make_key(environment, role, created_ms, name=name, tier=tier)[1]


async def stored_bytes(h: Harness) -> list[bytes]:
    """Every key and value the store holds, read under the interface (plus LMDB's whole file)."""
    store = h.store
    if isinstance(store, EtcdMetadataStore):
        found = await store._scan_dir(store.root)
        return [bytes(kv.key) for _, kv in found] + [bytes(kv.value) for _, kv in found]
    assert isinstance(store, EmbeddedMetadataStore)
    blobs: list[bytes] = []
    with store._backend.read() as txn:
        for key, value in txn.scan(b"", b"\xff" * 16):
            blobs += [key, value]
    env = getattr(store._backend, "_env", None)
    if env is not None:
        blobs.append(_read_file(env.path()))
    return blobs


def _read_file(path: str) -> bytes:
    return Path(path).read_bytes()


async def active_ids(store: MetadataStore, environment: str, role: str) -> list[str]:
    return sorted(
        r.key_id
        for r in await store.list_api_keys()
        if r.active and r.environment == environment and r.role == role
    )


# --- create, read, list ---------------------------------------------------------------------------


async def test_created_keys_read_back_and_list_by_creation_time_then_id(h: Harness) -> None:
    first = record("production", "admin", 3_000)
    second = record("staging", "consumer", 1_000, name="reader.v2")
    third = record("development", "read-only", 3_000, tier="gold")
    for r in (first, second, third):
        await h.store.create_api_key(r, LIMIT)

    for r in (first, second, third):
        assert await h.store.get_api_key(r.key_id) == r
    listed = await h.store.list_api_keys()
    assert listed == [second, *sorted((first, third), key=lambda r: r.key_id)]
    assert await h.store.get_api_key("nokey000") is None


async def test_the_key_itself_is_never_stored_only_its_salted_digest(h: Harness) -> None:
    key, rec = make_key()
    await h.store.create_api_key(rec, LIMIT)
    await h.store.touch_api_keys({rec.key_id: 5_000})
    await h.store.revoke_api_key(rec.key_id, 6_000)

    blobs = await stored_bytes(h)
    secret = key.split("_sk_")[1]
    hidden = secret[auth.KEY_ID_CHARS :]  # the part after the public id
    for blob in blobs:
        assert key.encode() not in blob
        assert hidden.encode() not in blob
    assert any(rec.digest.hex().encode() in blob for blob in blobs)
    assert any(rec.salt.hex().encode() in blob for blob in blobs)


# --- the rotation limit ---------------------------------------------------------------------------


async def test_an_environment_and_role_holds_at_most_two_active_keys(h: Harness) -> None:
    admins = [record("production", "admin", i) for i in range(LIMIT)]
    for r in admins:
        await h.store.create_api_key(r, LIMIT)

    third = record("production", "admin", 10)
    with pytest.raises(LimitExceeded) as raised:
        await h.store.create_api_key(third, LIMIT)
    assert raised.value.reason == "LIMIT_EXCEEDED" and not raised.value.retriable
    message = str(raised.value)
    assert "production" in message and "admin" in message
    assert all(r.key_id in message for r in admins), message
    assert await h.store.get_api_key(third.key_id) is None

    # Other roles of the environment and the same role elsewhere are unaffected.
    for environment, role in [("production", "producer"), ("staging", "admin")] * LIMIT:
        await h.store.create_api_key(record(environment, role), LIMIT)
    assert len(await active_ids(h.store, "production", "producer")) == LIMIT
    assert len(await active_ids(h.store, "staging", "admin")) == LIMIT
    assert await active_ids(h.store, "production", "admin") == sorted(r.key_id for r in admins)

    # The limit is the caller's: a stricter one refuses at once, a looser one allows more.
    with pytest.raises(LimitExceeded):
        await h.store.create_api_key(record("staging", "admin"), 1)
    await h.store.create_api_key(record("staging", "admin"), LIMIT + 1)


async def test_revoking_frees_a_slot_and_revoking_again_changes_nothing(h: Harness) -> None:
    old, current = record("staging", "producer", 1), record("staging", "producer", 2)
    await h.store.create_api_key(old, LIMIT)
    await h.store.create_api_key(current, LIMIT)

    revoked = await h.store.revoke_api_key(old.key_id, 7_000)
    assert revoked == dataclasses.replace(old, revoked_ms=7_000) and not revoked.active
    assert await h.store.get_api_key(old.key_id) == revoked

    rotated = record("staging", "producer", 3)
    await h.store.create_api_key(rotated, LIMIT)
    with pytest.raises(LimitExceeded) as raised:
        await h.store.create_api_key(record("staging", "producer", 4), LIMIT)
    assert old.key_id not in str(raised.value)  # only active keys are named
    assert current.key_id in str(raised.value) and rotated.key_id in str(raised.value)

    again = await h.store.revoke_api_key(old.key_id, 9_000)
    assert again == revoked  # idempotent: the first revocation time stays
    assert await h.store.list_api_keys() == [revoked, current, rotated]
    # A revoked key does not come back by being revoked twice: still no free slot.
    with pytest.raises(LimitExceeded):
        await h.store.create_api_key(record("staging", "producer", 5), LIMIT)


async def test_revoking_an_unknown_key_raises_not_found(h: Harness) -> None:
    with pytest.raises(NotFound) as raised:
        await h.store.revoke_api_key("nokey000", 1)
    assert raised.value.reason == "NOT_FOUND"


async def test_creating_a_taken_key_id_raises_already_exists(h: Harness) -> None:
    rec = record("production", "consumer")
    await h.store.create_api_key(rec, LIMIT)
    twin = dataclasses.replace(record("development", "admin"), key_id=rec.key_id)
    with pytest.raises(AlreadyExists):
        await h.store.create_api_key(twin, LIMIT)
    with pytest.raises(AlreadyExists):  # before the limit: it names the real problem
        await h.store.create_api_key(rec, 1)
    await h.store.revoke_api_key(rec.key_id, 2_000)
    with pytest.raises(AlreadyExists):  # ids are never reused, not even after revocation
        await h.store.create_api_key(rec, LIMIT)
    assert await h.store.list_api_keys() == [dataclasses.replace(rec, revoked_ms=2_000)]


async def test_concurrent_creates_for_one_role_let_exactly_the_limit_win(h: Harness) -> None:
    attempts = [record("production", "producer", i) for i in range(10)]
    results = await asyncio.gather(
        *(h.store.create_api_key(r, LIMIT) for r in attempts), return_exceptions=True
    )
    winners = sorted(r.key_id for r, res in zip(attempts, results, strict=True) if res is None)
    assert len(winners) == LIMIT, results
    assert all(isinstance(res, LimitExceeded) for res in results if res is not None), results
    assert await active_ids(h.store, "production", "producer") == winners


async def test_a_full_store_forgets_the_longest_revoked_keys_and_never_an_active_one(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (md, embedded_module, etcd_module):
        monkeypatch.setattr(module, "API_KEYS_MAX", 3)
    a, b, c = (
        record(environment, "admin") for environment in ("production", "staging", "development")
    )
    for r in (a, b, c):
        await h.store.create_api_key(r, LIMIT)
    with pytest.raises(LimitExceeded, match="active"):  # all three active: nothing to forget
        await h.store.create_api_key(record("production", "consumer"), LIMIT)

    await h.store.touch_api_keys({a.key_id: 5, c.key_id: 6})
    await h.store.revoke_api_key(c.key_id, 2_000)  # revoked first: forgotten first
    await h.store.revoke_api_key(a.key_id, 3_000)
    watch = h.store.watch()
    await established(watch)
    d = record("production", "consumer")
    await h.store.create_api_key(d, LIMIT)

    assert await next_event(watch, lambda e: e.kind == "api_key") == MetadataEvent(
        "api_key", c.key_id, deleted=True
    )
    assert await h.store.get_api_key(c.key_id) is None
    listed = await h.store.list_api_keys()
    assert sorted(r.key_id for r in listed) == sorted([a.key_id, b.key_id, d.key_id])
    assert await h.store.list_api_key_usage() == {a.key_id: 5}  # c's usage went with it
    await h.store.touch_api_keys({c.key_id: 9})  # a forgotten key is not touched back to life
    assert await h.store.list_api_key_usage() == {a.key_id: 5}
    await watch.aclose()


def test_keys_to_forget_worked_example() -> None:
    assert doctest.testmod(md).failed == 0


async def test_reads_refuse_a_store_past_its_read_limit(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (md, embedded_module, etcd_module):
        monkeypatch.setattr(module, "API_KEYS_READ_MAX", 2)
    for environment in ("production", "staging"):
        await h.store.create_api_key(record(environment, "admin"), LIMIT)
    assert len(await h.store.list_api_keys()) == 2
    extra = record("production", "consumer")
    await h.write_raw("api_key", extra.key_id, md.encode_api_key(extra))  # past the guard
    with pytest.raises(LimitExceeded):
        await h.store.list_api_keys()


# --- last used ------------------------------------------------------------------------------------


async def test_last_used_times_only_move_forward_and_leave_the_record_alone(h: Harness) -> None:
    a, b = record("production", "admin", 1), record("production", "admin", 2)
    await h.store.create_api_key(a, LIMIT)
    await h.store.create_api_key(b, LIMIT)
    assert await h.store.list_api_key_usage() == {}

    await h.store.touch_api_keys({a.key_id: 100, b.key_id: 50})
    await h.store.touch_api_keys({a.key_id: 90, b.key_id: 60})
    await h.store.touch_api_keys({a.key_id: 100})
    await h.store.touch_api_keys({})
    await h.store.touch_api_keys({"nokey000": 500})  # not a stored key: ignored
    assert await h.store.list_api_key_usage() == {a.key_id: 100, b.key_id: 60}

    assert await h.store.get_api_key(a.key_id) == a
    revoked = await h.store.revoke_api_key(a.key_id, 200)
    await h.store.touch_api_keys({a.key_id: 300})  # a late report after revocation
    assert await h.store.get_api_key(a.key_id) == revoked
    assert (await h.store.list_api_key_usage())[a.key_id] == 300


async def test_touching_many_keys_at_once(h: Harness) -> None:
    # 60 keys: more than one etcd transaction's worth (TOUCH_BATCH_KEYS), each within etcd's
    # default of 128 operations per transaction.
    pairs = [(e, r) for e in auth.ENVIRONMENTS for r in auth.ROLES]
    records = [record(*pairs[i % len(pairs)], i) for i in range(60)]
    for r in records:
        await h.store.create_api_key(r, 5)
    await h.store.touch_api_keys({r.key_id: 1_000 + r.created_ms for r in records})
    await h.store.touch_api_keys({r.key_id: 1_000 + r.created_ms // 2 for r in records})
    usage = await h.store.list_api_key_usage()
    assert usage == {r.key_id: 1_000 + r.created_ms for r in records}


# --- watch ----------------------------------------------------------------------------------------


async def test_watch_reports_creations_and_revocations_but_not_touches(h: Harness) -> None:
    watch = h.store.watch()
    await established(watch)  # the opening resync covers api keys too

    rec = record("production", "admin")
    await h.store.create_api_key(rec, LIMIT)
    event = await next_event(watch, lambda e: e.kind == "api_key")
    assert event == MetadataEvent("api_key", rec.key_id)

    await h.store.touch_api_keys({rec.key_id: 5})
    await h.store.revoke_api_key(rec.key_id, 10)
    assert await next_event(watch, lambda e: e.kind == "api_key") == MetadataEvent(
        "api_key", rec.key_id
    )
    assert not (await h.store.get_api_key(rec.key_id) or rec).active

    await h.store.touch_api_keys({rec.key_id: 50})
    other = record("staging", "admin")
    await h.store.create_api_key(other, LIMIT)
    assert await next_event(watch, lambda e: e.kind == "api_key") == MetadataEvent(
        "api_key", other.key_id
    )
    await h.store.revoke_api_key(rec.key_id, 20)  # already revoked: nothing changes, no event
    await h.store.put_setting("marker", "x")
    event = await next_event(watch, lambda e: e.kind in ("api_key", "setting"))
    assert event == MetadataEvent("setting", "marker")
    await watch.aclose()


def test_event_kinds_include_api_keys() -> None:
    assert "api_key" in md.EVENT_KINDS


# --- bad input and bad data -----------------------------------------------------------------------

GOOD = record()

BAD_CALLS: list[tuple[str, Callable[[MetadataStore], Awaitable[object]]]] = [
    ("not a record", lambda s: s.create_api_key("k", LIMIT)),  # type: ignore[arg-type]
    ("short key id", lambda s: s.create_api_key(dataclasses.replace(GOOD, key_id="abc"), LIMIT)),
    ("key id slash", lambda s: s.create_api_key(dataclasses.replace(GOOD, key_id="ab/cdefg"), 2)),
    ("unknown env", lambda s: s.create_api_key(dataclasses.replace(GOOD, environment="qa"), 2)),
    ("unknown role", lambda s: s.create_api_key(dataclasses.replace(GOOD, role="root"), 2)),
    ("bad tier", lambda s: s.create_api_key(dataclasses.replace(GOOD, tier="a b"), 2)),
    ("empty name", lambda s: s.create_api_key(dataclasses.replace(GOOD, name=""), 2)),
    ("name newline", lambda s: s.create_api_key(dataclasses.replace(GOOD, name="a\nb"), 2)),
    ("short salt", lambda s: s.create_api_key(dataclasses.replace(GOOD, salt=b"x" * 15), 2)),
    ("short digest", lambda s: s.create_api_key(dataclasses.replace(GOOD, digest=b"x" * 31), 2)),
    ("str digest", lambda s: s.create_api_key(dataclasses.replace(GOOD, digest="ab" * 32), 2)),  # type: ignore[arg-type]
    ("negative created", lambda s: s.create_api_key(dataclasses.replace(GOOD, created_ms=-1), 2)),
    ("born revoked", lambda s: s.create_api_key(dataclasses.replace(GOOD, revoked_ms=5), 2)),
    ("active_max 0", lambda s: s.create_api_key(GOOD, 0)),
    ("active_max 101", lambda s: s.create_api_key(GOOD, 101)),
    ("active_max bool", lambda s: s.create_api_key(GOOD, True)),
    ("revoke at 0", lambda s: s.revoke_api_key(GOOD.key_id, 0)),
    ("revoke bad id", lambda s: s.revoke_api_key("", 1)),
    ("get bad id", lambda s: s.get_api_key("abcdefghi")),
    ("touch bad id", lambda s: s.touch_api_keys({"a-b": 1})),
    ("touch negative", lambda s: s.touch_api_keys({GOOD.key_id: -1})),
    ("touch not a map", lambda s: s.touch_api_keys([GOOD.key_id])),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("case", "call"), BAD_CALLS, ids=[c for c, _ in BAD_CALLS])
async def test_bad_key_input_is_rejected_with_value_error_before_any_write(
    h: Harness, case: str, call: Callable[[MetadataStore], Awaitable[object]]
) -> None:
    with pytest.raises(ValueError):
        await call(h.store)
    assert await h.store.list_api_keys() == []


def _corrupt(**change: object) -> bytes:
    obj = json.loads(md.encode_api_key(GOOD))
    obj.update(change)
    return json.dumps(obj).encode()


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b'{"v":2}',
        _corrupt(salt="zz"),
        _corrupt(salt=7),
        _corrupt(digest="ab"),
        _corrupt(role="root"),
        _corrupt(revoked_ms=-5),
        _corrupt(extra=1),
        _corrupt(key_id="other000"),
    ],
    ids=[
        "not-json",
        "future-version",
        "salt-not-hex",
        "salt-not-str",
        "digest-short",
        "unknown-role",
        "negative-revoked",
        "extra-field",
        "wrong-key",
    ],
)
async def test_a_corrupt_key_record_raises_metadata_corrupt(h: Harness, raw: bytes) -> None:
    await h.write_raw("api_key", GOOD.key_id, raw)
    with pytest.raises(MetadataCorrupt):
        await h.store.get_api_key(GOOD.key_id)
    with pytest.raises(MetadataCorrupt):
        await h.store.list_api_keys()
    with pytest.raises(MetadataCorrupt):
        await h.store.revoke_api_key(GOOD.key_id, 1)


def test_key_records_encode_as_compact_json_with_hex_bytes_and_round_trip() -> None:
    raw = md.encode_api_key(GOOD)
    obj = json.loads(raw)
    assert obj == {
        "v": 1,
        "key_id": GOOD.key_id,
        "name": GOOD.name,
        "environment": "production",
        "role": "admin",
        "tier": "default",
        "salt": GOOD.salt.hex(),
        "digest": GOOD.digest.hex(),
        "created_ms": GOOD.created_ms,
        "revoked_ms": 0,
    }
    assert raw == json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    assert md.decode_api_key(raw, GOOD.key_id) == GOOD
    revoked = dataclasses.replace(GOOD, revoked_ms=9)
    assert md.decode_api_key(md.encode_api_key(revoked), GOOD.key_id) == revoked
    assert md.decode_key_usage(md.encode_key_usage(42), GOOD.key_id) == 42
    assert md.decode_key_slots(md.encode_key_slots(["bbbbbbbb", "aaaaaaaa"]), "s") == [
        "aaaaaaaa",
        "bbbbbbbb",
    ]
    with pytest.raises(MetadataCorrupt):
        md.decode_key_slots(md.encode_key_slots(["aaaaaaaa", "aaaaaaaa"]), "s")


# --- etcd only: separate clients, as separate nodes -----------------------------------------------


async def test_creates_racing_from_three_etcd_clients_let_exactly_two_win(etcd: EtcdServer) -> None:
    prefix = _prefix()
    clients = [EtcdMetadataStore(etcd.endpoint, prefix=prefix) for _ in range(3)]
    try:
        for round_ in range(3):  # a few rounds, each on a fresh environment/role pair
            environment, role = auth.ENVIRONMENTS[round_], auth.ROLES[round_]
            attempts = [record(environment, role, i) for i in range(10)]
            started = time.monotonic()
            results = await asyncio.gather(
                *(clients[i % 3].create_api_key(r, LIMIT) for i, r in enumerate(attempts)),
                return_exceptions=True,
            )
            assert time.monotonic() - started < 5.0
            winners = sorted(
                r.key_id for r, res in zip(attempts, results, strict=True) if res is None
            )
            assert len(winners) == LIMIT, results
            losers = [res for res in results if res is not None]
            assert all(isinstance(res, LimitExceeded) for res in losers), losers
            for client in clients:
                assert await active_ids(client, environment, role) == winners
    finally:
        for client in clients:
            await client.close()


async def test_racing_creates_and_revokes_on_etcd_never_exceed_the_limit(etcd: EtcdServer) -> None:
    prefix = _prefix()
    clients = [EtcdMetadataStore(etcd.endpoint, prefix=prefix) for _ in range(3)]
    try:
        originals = [record("production", "consumer", i) for i in range(LIMIT)]
        for r in originals:
            await clients[0].create_api_key(r, LIMIT)
        newcomers = [record("production", "consumer", 100 + i) for i in range(9)]
        operations: list[Awaitable[object]] = [
            clients[i % 3].revoke_api_key(r.key_id, 5_000) for i, r in enumerate(originals)
        ]
        operations += [clients[i % 3].create_api_key(r, LIMIT) for i, r in enumerate(newcomers)]
        results = await asyncio.gather(*operations, return_exceptions=True)
        assert not any(isinstance(res, RevisionConflict) for res in results), results
        assert all(isinstance(res, KeyRecord) for res in results[:LIMIT]), results
        created = [r for r, res in zip(newcomers, results[LIMIT:], strict=True) if res is None]
        assert all(isinstance(res, LimitExceeded | None) for res in results[LIMIT:]), results
        assert len(created) <= LIMIT
        assert await active_ids(clients[1], "production", "consumer") == sorted(
            r.key_id for r in created
        )
        # The slot index agrees with the records: exactly the free slots can still be filled.
        for i in range(LIMIT - len(created)):
            await clients[2].create_api_key(record("production", "consumer", 200 + i), LIMIT)
        with pytest.raises(LimitExceeded):
            await clients[0].create_api_key(record("production", "consumer", 300), LIMIT)
    finally:
        for client in clients:
            await client.close()


async def test_a_revocation_on_one_etcd_client_reaches_another_watcher_quickly(
    etcd: EtcdServer,
) -> None:
    prefix = _prefix()
    writer = EtcdMetadataStore(etcd.endpoint, prefix=prefix)
    reader = EtcdMetadataStore(etcd.endpoint, prefix=prefix)
    try:
        rec = record("production", "admin")
        await writer.create_api_key(rec, LIMIT)
        watch = reader.watch()
        await established(watch)
        started = time.monotonic()
        await writer.revoke_api_key(rec.key_id, 1_234)
        await next_event(watch, lambda e: e == MetadataEvent("api_key", rec.key_id))
        seen = await reader.get_api_key(rec.key_id)
        assert time.monotonic() - started < 1.0
        assert seen is not None and seen.revoked_ms == 1_234
        await watch.aclose()
    finally:
        await writer.close()
        await reader.close()


async def test_a_slot_taken_between_read_and_write_makes_the_etcd_writer_retry(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deterministic interleavings: another node changes the slot right after this one read it."""
    prefix = _prefix()
    mine = EtcdMetadataStore(etcd.endpoint, prefix=prefix)
    other = EtcdMetadataStore(etcd.endpoint, prefix=prefix)
    read = mine._get_many
    meddle: list[Callable[[], Awaitable[object]]] = []

    async def read_then_meddle(keys: list[bytes]) -> list[object]:
        found = await read(keys)
        while meddle:
            await meddle.pop()()
        return found

    monkeypatch.setattr(mine, "_get_many", read_then_meddle)
    try:
        first, second, third = (record("staging", "admin", i) for i in range(3))
        await mine.create_api_key(first, LIMIT)
        # A create that read one free slot loses it to the other node and must see the limit.
        meddle.append(lambda: other.create_api_key(second, LIMIT))
        with pytest.raises(LimitExceeded):
            await mine.create_api_key(third, LIMIT)
        assert await active_ids(other, "staging", "admin") == sorted((first.key_id, second.key_id))
        # A revoke whose slot read is outdated must not write back a stale list of ids.
        meddle.append(lambda: other.revoke_api_key(second.key_id, 10))
        await mine.revoke_api_key(first.key_id, 20)
        meddle.append(lambda: other.create_api_key(third, LIMIT))
        await mine.create_api_key(record("staging", "admin", 4), LIMIT)
        with pytest.raises(LimitExceeded):
            await other.create_api_key(record("staging", "admin", 5), LIMIT)
        assert len(await active_ids(mine, "staging", "admin")) == LIMIT
    finally:
        await mine.close()
        await other.close()


# --- sealed records: the cluster secret binds every key record ------------------------------------

SECRET = "cluster-secret-0123456789"


@pytest.fixture(params=["embedded-lmdb", "embedded-memory", "etcd"])
async def sealed(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    """A store that seals key records with SECRET, as every node of a cluster does."""
    harness: Harness
    if request.param == "etcd":
        server: EtcdServer = request.getfixturevalue("etcd")
        store = EtcdMetadataStore(server.endpoint, prefix=_prefix(), record_secret=SECRET)
        harness = Harness(store, "etcd")
    else:
        path = tmp_path / "meta" if request.param == "embedded-lmdb" else None
        harness = Harness(
            EmbeddedMetadataStore(path, sync=False, record_secret=SECRET), request.param
        )
    yield harness
    await harness.store.close()


async def test_sealed_key_records_round_trip_and_carry_a_mac(sealed: Harness) -> None:
    rec = record("production", "admin")
    await sealed.store.create_api_key(rec, LIMIT)
    assert await sealed.store.get_api_key(rec.key_id) == rec
    revoked = await sealed.store.revoke_api_key(rec.key_id, 2_000)
    assert await sealed.store.get_api_key(rec.key_id) == revoked
    assert await sealed.store.list_api_keys() == [revoked]
    stored = [b for b in await stored_bytes(sealed) if rec.digest.hex().encode() in b]
    assert stored and all(b'"mac":"' in b for b in stored)


def _forgeries(rec: KeyRecord) -> dict[str, bytes]:
    """What someone who can write to the store but lacks the secret can write."""
    promoted = dataclasses.replace(rec, role="admin")
    genuine = json.loads(md.encode_api_key(rec, md.api_key_seal_key(SECRET)))
    return {
        "no-mac": md.encode_api_key(rec),  # a plain `etcdctl put` of a well-formed record
        "other-secret": md.encode_api_key(rec, md.api_key_seal_key("another-secret-0123")),
        "mac-of-another-record": json.dumps(
            {**json.loads(md.encode_api_key(promoted)), "mac": genuine["mac"]}
        ).encode(),
        "mac-not-a-string": json.dumps({**genuine, "mac": 7}).encode(),
    }


@pytest.mark.parametrize("forgery", ["no-mac", "other-secret", "mac-of-another-record",
                                     "mac-not-a-string"])  # fmt: skip
async def test_a_key_record_written_without_the_cluster_secret_is_ignored_and_logged(
    sealed: Harness, forgery: str, caplog: pytest.LogCaptureFixture
) -> None:
    rec = record("production", "consumer")
    md._forged_logged_at.clear()
    await sealed.write_raw("api_key", rec.key_id, _forgeries(rec)[forgery])
    with caplog.at_level("WARNING", logger="fluxmq.cluster.metadata"):
        assert await sealed.store.get_api_key(rec.key_id) is None
        assert await sealed.store.list_api_keys() == []
        with pytest.raises(NotFound):
            await sealed.store.revoke_api_key(rec.key_id, 5)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings  # logged once per key id, not once per read
    assert rec.key_id in warnings[0] and "cluster secret" in warnings[0]
    # A genuine key beside the forgery is unaffected, and the forgery takes no slot.
    good = [record("production", "consumer", 2_000 + i) for i in range(LIMIT)]
    for r in good:
        await sealed.store.create_api_key(r, LIMIT)
    assert await sealed.store.list_api_keys() == sorted(good, key=lambda r: r.created_ms)


async def test_forged_records_are_logged_at_most_once_per_interval_per_key(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1_000.0]
    monkeypatch.setattr(md.time, "monotonic", lambda: now[0])
    md._forged_logged_at.clear()
    err = md.ForgedRecord("api key 'aaaaaaaa' has no seal")
    with caplog.at_level("WARNING", logger="fluxmq.cluster.metadata"):
        for _ in range(100):
            md.report_forged_key(err, "aaaaaaaa")
        md.report_forged_key(err, "bbbbbbbb")
        now[0] += md.FORGED_LOG_INTERVAL_S
        md.report_forged_key(err, "aaaaaaaa")
    assert len(caplog.records) == 3


def test_sealed_records_decode_without_a_secret_and_an_empty_secret_is_refused() -> None:
    """Sealing adds a field; a reader that does not check seals (a single node, tools) still
    decodes the record, and a missing secret is refused, never taken as an empty key."""
    rec = record()
    assert md.decode_api_key(md.encode_api_key(rec, md.api_key_seal_key(SECRET)), rec.key_id) == rec
    with pytest.raises(ValueError):
        md.api_key_seal_key("")
