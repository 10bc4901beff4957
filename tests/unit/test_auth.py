"""API-key policy: key format, salted storage, roles per method, rotation limit, token buckets."""

from __future__ import annotations

import doctest
import random

import pytest

import fluxmq.core.auth as auth
import fluxmq.core.ratelimit as ratelimit
from fluxmq._pb.v1 import admin_pb2, queue_pb2
from fluxmq.core.auth import (
    ACTIVE_KEYS_PER_ENV_ROLE_MAX,
    Action,
    KeyRecord,
    authorize,
    check_new_key,
    hash_key,
    new_key,
    parse_bearer,
    parse_key,
)
from fluxmq.core.errors import FluxError
from fluxmq.core.ratelimit import Bucket, Limit, RateLimiter

TIERS = ("default", "bulk")


def record(key: str, environment: str = "staging", role: str = "producer", **kw: object):
    p = parse_key(key)
    assert p is not None
    salt = b"s" * 16
    return KeyRecord(
        key_id=p.key_id, name="k", environment=environment, role=role, tier="default",
        salt=salt, digest=hash_key(salt, key), created_ms=1, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_every_rpc_of_the_api_has_an_action() -> None:
    methods = set(queue_pb2.DESCRIPTOR.services_by_name["QueueService"].methods_by_name)
    methods |= set(admin_pb2.DESCRIPTOR.services_by_name["AdminService"].methods_by_name)
    assert methods <= set(auth.METHOD_ACTIONS), methods - set(auth.METHOD_ACTIONS)


@pytest.mark.parametrize("environment", auth.ENVIRONMENTS)
def test_new_keys_have_the_documented_format_and_their_kind(environment: str) -> None:
    key = new_key(environment)
    p = parse_key(key)
    assert p is not None and len(key) == len("fmq_live_sk_") + 32
    assert p.kind == ("live" if environment == "production" else "test")
    assert new_key(environment) != key


@pytest.mark.parametrize(
    "bad",
    ["", "fmq_live_sk_", "fmq_live_sk_" + "a" * 31, "fmq_live_sk_" + "a" * 33,
     "fmq_prod_sk_" + "a" * 32, "fmq_live_pk_" + "a" * 32, "fmq_live_sk_" + "a" * 31 + "-",
     " fmq_live_sk_" + "a" * 32, "fmq_live_sk_" + "é" * 32],
)  # fmt: skip
def test_malformed_keys_do_not_parse(bad: str) -> None:
    assert parse_key(bad) is None


def test_bearer_parsing() -> None:
    assert parse_bearer("Bearer abc") == "abc"
    assert parse_bearer("bearer   abc ") == "abc"
    for bad in ("abc", "Basic abc", "Bearer", "Bearer ", ""):
        assert parse_bearer(bad) is None, bad


def test_a_record_matches_only_its_own_key_and_kind() -> None:
    key = new_key("staging")
    rec = record(key)
    p = parse_key(key)
    assert p is not None and rec.matches(p)
    other = parse_key(key[:-1] + ("A" if key[-1] != "A" else "B"))
    assert other is not None and not rec.matches(other)
    # The same secret presented as a live key is another key.
    live = parse_key(key.replace("fmq_test_", "fmq_live_"))
    assert live is not None and not rec.matches(live)
    assert rec.prefix == f"fmq_test_sk_{p.key_id}" and key not in repr(rec)


@pytest.mark.parametrize(
    ("role", "method", "allowed"),
    [
        ("admin", "DeleteQueue", True),
        ("admin", "TransferLeadership", True),
        ("producer", "Publish", True),
        ("producer", "Lease", False),
        ("producer", "CreateQueue", False),
        ("producer", "Transact", False),  # acks need CONSUME
        ("consumer", "Lease", True),
        ("consumer", "Publish", False),
        ("consumer", "GetQueueStats", True),
        ("read-only", "Fetch", True),
        ("read-only", "Ack", False),
        ("read-only", "PurgeQueue", False),
        ("admin", "NotAMethod", False),
    ],
)
def test_roles_allow_exactly_their_actions(role: str, method: str, allowed: bool) -> None:
    rec = record(new_key("staging"), role=role)
    if allowed:
        authorize(rec, method)
    else:
        with pytest.raises(FluxError) as err:
            authorize(rec, method)
        assert err.value.reason == "PERMISSION_DENIED"


def test_at_most_two_active_keys_per_environment_and_role() -> None:
    keys = [record(new_key("production"), "production", "consumer") for _ in range(2)]
    with pytest.raises(FluxError) as err:
        check_new_key("third", "production", "consumer", "default", TIERS, keys)
    assert err.value.reason == "KEY_LIMIT_REACHED"
    assert ACTIVE_KEYS_PER_ENV_ROLE_MAX == 2
    # Another role or environment is not affected, and a revoked key frees its slot.
    check_new_key("p", "production", "producer", "default", TIERS, keys)
    check_new_key("s", "staging", "consumer", "default", TIERS, keys)
    keys[0] = record(new_key("production"), "production", "consumer", revoked_ms=5)
    check_new_key("third", "production", "consumer", "default", TIERS, keys)


@pytest.mark.parametrize(
    ("args", "field_name"),
    [
        (("k", "prod", "admin", "default"), "environment"),
        (("k", "production", "root", "default"), "role"),
        (("k", "production", "admin", "gold"), "tier"),
        (("", "production", "admin", "default"), "name"),
        (("x" * 65, "production", "admin", "default"), "name"),
    ],
)
def test_bad_key_requests_name_the_field(args: tuple[str, str, str, str], field_name: str) -> None:
    with pytest.raises(FluxError) as err:
        check_new_key(*args, TIERS, [])
    assert err.value.reason == "INVALID_ARGUMENT" and err.value.metadata["field"] == field_name


def test_bucket_refills_at_its_rate_and_never_beyond_its_burst() -> None:
    b = Bucket(Limit(rate_per_s=100, burst=10), tokens=10, updated_ms=0)
    assert b.take(10, 0) == 0
    assert b.take(1, 0) == 10  # 1 token at 100/s: 10 ms
    assert b.take(5, 50) == 0
    assert b.take(1, 10_000) == 0 and b.tokens == 9  # capped at the burst, then one taken
    # A batch larger than the burst waits for a full bucket instead of never passing...
    assert b.take(50, 10_000) == 10
    assert b.take(50, 10_010) == 0 and b.tokens == -40
    # ...and then pays for all of it: the next call waits until the debt is paid back.
    assert b.take(1, 10_010) == 410


def test_batches_larger_than_the_burst_still_hold_the_rate() -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    limit = Limit(rate_per_s=rng.choice([5, 50, 500]), burst=rng.choice([1, 10, 100]))
    limiter = RateLimiter()
    now = passed = 0
    n_max = 3 * limit.burst
    for _ in range(5000):
        now += rng.randrange(0, 200)
        n = rng.randrange(1, n_max + 1)
        if limiter.take("k", "publish", limit, n, now) == 0:
            passed += n
    assert passed <= n_max + limit.rate_per_s * now / 1000 + 1e-6, f"seed {seed}"


def test_random_traffic_never_exceeds_rate_times_time_plus_burst() -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    limit = Limit(rate_per_s=rng.choice([5, 50, 500]), burst=rng.choice([1, 10, 100]))
    limiter = RateLimiter(buckets_max=4)
    now = 0
    passed = 0
    for _ in range(5000):
        now += rng.randrange(0, 20)
        n = rng.randrange(1, limit.burst + 1)
        if limiter.take("k", "publish", limit, n, now) == 0:
            passed += n
    assert passed <= limit.burst + limit.rate_per_s * now / 1000 + 1e-6, f"seed {seed}"


def test_limiter_keeps_buckets_apart_and_bounded() -> None:
    limiter = RateLimiter(buckets_max=2)
    lim = Limit(rate_per_s=1, burst=1)
    assert limiter.take("a", "publish", lim, 1, 0) == 0
    assert limiter.take("a", "consume", lim, 1, 0) == 0  # another class, another bucket
    assert limiter.take("a", "publish", lim, 1, 0) > 0
    limiter.take("b", "publish", lim, 1, 0)
    assert len(limiter._buckets) == 2


def test_docstring_examples_hold() -> None:
    assert doctest.testmod(auth).failed == 0
    assert doctest.testmod(ratelimit).failed == 0
    assert Action.READ in auth.ROLE_ACTIONS["read-only"]
