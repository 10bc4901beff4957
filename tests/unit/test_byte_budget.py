"""Byte budgets (issue 20, item 8): the node's in-flight bytes with a share per key, and the
bytes-per-second bucket of a rate-limit tier. Pure: time is an input."""

from __future__ import annotations

import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.config import ConfigError, parse_tiers
from fluxmq.core.auth import new_key
from fluxmq.core.errors import FluxError
from fluxmq.core.ratelimit import InflightBudget
from fluxmq.server.guard import Guard, KeyCache
from fluxmq.server.interceptors import _Held
from fluxmq.server.key_admin import make_record
from tests.unit.test_guard_fuzz import _NoStore

MIB = 1024 * 1024


def test_the_node_budget_refuses_beyond_its_ceiling_and_release_gives_the_bytes_back() -> None:
    budget = InflightBudget(node_bytes_max=10 * MIB, key_bytes_max=5 * MIB)
    assert budget.reserve("a", 4 * MIB) and budget.reserve("b", 4 * MIB)
    assert budget.reserve("c", 4 * MIB) is False  # 12 MiB > 10 MiB
    budget.release("a", 4 * MIB)
    assert budget.reserve("c", 4 * MIB)
    budget.release("b", 4 * MIB)
    budget.release("c", 4 * MIB)
    assert budget.in_use == 0 and budget.held_by("a") == budget.held_by("c") == 0


def test_one_key_cannot_hold_more_than_its_share_while_others_still_fit() -> None:
    budget = InflightBudget(node_bytes_max=10 * MIB, key_bytes_max=5 * MIB)
    assert budget.reserve("greedy", 3 * MIB)
    assert budget.reserve("greedy", 3 * MIB) is False  # 6 MiB > its 5 MiB share
    assert budget.reserve("small", 1024)
    assert budget.free_for("greedy") == 2 * MIB


def test_a_request_larger_than_the_share_runs_on_an_idle_node_only() -> None:
    budget = InflightBudget(node_bytes_max=10 * MIB, key_bytes_max=5 * MIB)
    assert budget.reserve("big", 64 * MIB)  # idle: a big but legal message gets through
    assert budget.reserve("other", 1) is False  # until it ends, the node is over budget
    budget.release("big", 64 * MIB)
    assert budget.reserve("other", 1)


def test_callers_without_a_key_are_bound_by_the_node_ceiling_only() -> None:
    budget = InflightBudget(node_bytes_max=10 * MIB, key_bytes_max=1 * MIB)
    assert budget.reserve(None, 6 * MIB) and budget.reserve(None, 4 * MIB)
    assert budget.reserve(None, 1) is False


def test_a_held_call_is_refused_node_busy_and_releases_exactly_what_it_took() -> None:
    budget = InflightBudget(node_bytes_max=2 * MIB, key_bytes_max=1 * MIB)
    request = pb.PublishRequest(queue="q", messages=[pb.PublishMessage(value=b"x" * 700_000)])
    first = _Held()
    first.take(budget, "k", request)
    with pytest.raises(FluxError) as err:
        _Held().take(budget, "k", request)
    assert err.value.reason == "NODE_BUSY" and err.value.retriable
    assert err.value.retry_after_ms
    first.release()
    first.release()  # idempotent: a call ends once, whatever path it takes
    assert budget.in_use == 0


def test_a_fetch_under_pressure_gets_a_smaller_max_bytes_and_reserves_it() -> None:
    budget = InflightBudget(node_bytes_max=8 * MIB, key_bytes_max=4 * MIB)
    assert budget.reserve("k", 3 * MIB)
    fetch = pb.FetchRequest(queue="q", max_bytes=16 * MIB)
    held = _Held()
    held.take(budget, "k", fetch)
    assert fetch.max_bytes < MIB and budget.held_by("k") <= 4 * MIB
    held.release()
    assert budget.held_by("k") == 3 * MIB
    budget.reserve("k", MIB - 10)  # the share is spent: the floor no longer fits
    with pytest.raises(FluxError) as err:
        _Held().take(budget, "k", pb.FetchRequest(queue="q"))
    assert err.value.reason == "NODE_BUSY"


def _guard(tiers: str, now: list[int]) -> tuple[Guard, str]:
    key = new_key("production")
    cache = KeyCache(_NoStore(), lambda: now[0])
    record = make_record(key, "k", "production", "producer", "default", 1)
    cache.records[record.key_id] = record
    return Guard(cache, parse_tiers(tiers), lambda queue: None, lambda: now[0]), key


def test_large_publishes_pay_the_byte_rate_with_retry_info_and_small_ones_fit() -> None:
    now = [1000]
    guard, key = _guard(
        "default:publish=1000/1000,consume=10/10,admin=10/10,bytes=1048576/2097152", now
    )
    md = (("authorization", f"Bearer {key}"),)
    big = pb.PublishRequest(queue="q", messages=[pb.PublishMessage(value=b"x" * 3 * MIB)])
    guard.admit("Publish", big, md)  # beyond the burst: waits for a full bucket, then pays all
    with pytest.raises(FluxError) as err:
        guard.admit("Publish", pb.PublishRequest(queue="q"), md)  # one message, few bytes
    assert err.value.reason == "RATE_LIMITED" and err.value.retriable
    assert err.value.metadata["rate_class"] == "bytes"
    # The debt is 1 MiB: paid back at 1 MiB/s, then small publishes pass again.
    assert 900 <= (err.value.retry_after_ms or 0) <= 1100
    now[0] += 1100
    guard.admit("Publish", pb.PublishRequest(queue="q"), md)


def test_a_tier_without_a_byte_rate_counts_no_bytes() -> None:
    now = [1000]
    guard, key = _guard("default:publish=1000/1000,consume=10/10,admin=10/10", now)
    md = (("authorization", f"Bearer {key}"),)
    big = pb.PublishRequest(queue="q", messages=[pb.PublishMessage(value=b"x" * 3 * MIB)])
    for _ in range(3):
        guard.admit("Publish", big, md)


def test_tiers_take_an_optional_byte_rate_and_refuse_a_bad_one() -> None:
    tiers = parse_tiers("default:publish=1/1,consume=1/1,admin=1/1,bytes=1048576/2097152")
    assert tiers["default"]["bytes"] == (1048576.0, 2097152)
    with pytest.raises(ConfigError, match="bytes"):
        parse_tiers("default:publish=1/1,consume=1/1,admin=1/1,bytes=0/5")
