"""A key this node has not heard of yet is looked up in the store before it is refused, and a
flood of made-up keys costs the store a bounded number of reads."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.auth import KeyRecord, new_key
from fluxmq.core.errors import FluxError
from fluxmq.server.guard import KEY_LOOKUPS, Guard, KeyCache
from fluxmq.server.interceptors import _admit
from fluxmq.server.key_admin import make_record

TIERS = {"default": {"publish": (1e9, 10**9), "consume": (1e9, 10**9), "admin": (1e9, 10**9)}}


class Store:
    """Key records as another node just wrote them; counts reads."""

    def __init__(self) -> None:
        self.records: dict[str, KeyRecord] = {}
        self.reads = 0

    async def list_api_keys(self) -> list[KeyRecord]:
        return list(self.records.values())

    async def get_api_key(self, key_id: str) -> KeyRecord | None:
        self.reads += 1
        return self.records.get(key_id)

    async def touch_api_keys(self, last_used_ms: Mapping[str, int]) -> None:
        pass

    def watch(self) -> Any:
        return iter(())


def setup(now: list[int]) -> tuple[Store, Guard]:
    store = Store()
    cache = KeyCache(store, lambda: now[0])
    return store, Guard(cache, TIERS, {"q": "production"}.get, lambda: now[0])


def publish(key: str) -> tuple[str, pb.PublishRequest, tuple[tuple[str, str], ...]]:
    return "Publish", pb.PublishRequest(queue="q"), (("authorization", f"Bearer {key}"),)


def test_a_key_made_through_another_node_is_admitted_before_the_watch_brings_it() -> None:
    now = [1_000]
    store, guard = setup(now)
    key = new_key("production")
    record = make_record(key, "made elsewhere", "production", "producer", "default", 1)
    store.records[record.key_id] = record  # in the store, not yet in this node's cache
    with pytest.raises(FluxError, match="unknown API key"):
        guard.admit(*publish(key))
    identity = asyncio.run(_admit(guard, *publish(key)))
    assert identity.role == "producer" and guard.keys.records[record.key_id] is record


def test_a_lookup_never_undoes_a_revocation_the_watch_stored_meanwhile() -> None:
    now = [1_000]
    store, guard = setup(now)
    key = new_key("production")
    record = make_record(key, "k", "production", "producer", "default", 1)
    store.records[record.key_id] = record

    async def revoked_while_reading(key_id: str) -> KeyRecord | None:
        guard.keys.records[key_id] = replace(record, revoked_ms=5)  # the watch, meanwhile
        return record  # what the (older) read returned

    store.get_api_key = revoked_while_reading  # type: ignore[method-assign]
    with pytest.raises(FluxError, match="revoked"):
        asyncio.run(_admit(guard, *publish(key)))


def test_made_up_keys_cost_the_store_a_bounded_number_of_reads() -> None:
    now = [1_000]
    store, guard = setup(now)
    for _ in range(200):
        with pytest.raises(FluxError) as err:
            asyncio.run(_admit(guard, *publish(new_key("production"))))
        assert err.value.reason == "INVALID_API_KEY"
    assert store.reads == KEY_LOOKUPS.burst
    now[0] += 1_000  # a second later: rate_per_s more
    for _ in range(200):
        with pytest.raises(FluxError):
            asyncio.run(_admit(guard, *publish(new_key("production"))))
    assert store.reads == KEY_LOOKUPS.burst + int(KEY_LOOKUPS.rate_per_s)
