"""Fuzzing the security edge: malformed metadata and requests never crash the guard and never
get in without a valid key (hypothesis; seeds are printed by hypothesis on failure)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.auth import METHOD_ACTIONS, new_key
from fluxmq.core.errors import FluxError
from fluxmq.core.namespaces import STORED_QUEUE_NAME_RE
from fluxmq.server.guard import Guard, KeyCache, queues_of
from fluxmq.server.key_admin import make_record

ADMIN = new_key("production")
PRODUCER = new_key("staging")
STAGE_ADMIN = new_key("staging")
REVOKED = new_key("production")
TIERS = {"default": {"publish": (1e9, 10**9), "consume": (1e9, 10**9), "admin": (1e9, 10**9)}}


class _NoStore:
    async def list_api_keys(self) -> list[Any]:
        return []

    async def get_api_key(self, key_id: str) -> Any:
        return None

    async def touch_api_keys(self, last_used_ms: Any) -> None:
        pass

    def watch(self) -> Any:
        return iter(())  # no events: the guard under test never starts the cache's routines


def guard() -> Guard:
    cache = KeyCache(_NoStore(), lambda: 0)
    for key, env, role, revoked in [
        (ADMIN, "production", "admin", 0),
        (PRODUCER, "staging", "producer", 0),
        (STAGE_ADMIN, "staging", "admin", 0),
        (REVOKED, "production", "admin", 5),
    ]:
        rec = make_record(key, "k", env, role, "default", 1)
        if revoked:
            rec = replace(rec, revoked_ms=revoked)
        cache.records[rec.key_id] = rec
    envs = {"prod-q": "production", "stage-q": "staging", "old-q": ""}
    return Guard(cache, TIERS, envs.get, lambda: 1000)


G = guard()
METHODS = [*sorted(METHOD_ACTIONS), "", "Bogus", "Publish\x00", "../Publish"]
text = st.text(max_size=80)
header_values = st.one_of(
    text,
    st.binary(max_size=40),
    st.builds(lambda k: f"Bearer {k}", text),
    st.sampled_from(
        [
            f"Bearer {ADMIN}",
            f"bearer {PRODUCER}",
            f"Bearer {STAGE_ADMIN}",
            f"Bearer {REVOKED}",
            ADMIN,
        ]
    ),
    st.builds(
        lambda k, n: f"Bearer {k[:n]}", st.sampled_from([ADMIN, PRODUCER]), st.integers(0, 44)
    ),
    st.builds(
        lambda k, c: f"Bearer {k[:-1]}{c}", st.sampled_from([ADMIN, PRODUCER]), st.characters()
    ),
)
metadata = st.lists(
    st.tuples(
        st.sampled_from(["authorization", "Authorization", "x-request-id", "other"]), header_values
    ),
    max_size=4,
)
queue_names = st.one_of(st.sampled_from(["prod-q", "stage-q", "old-q", "absent"]), text)
requests = st.one_of(
    st.builds(
        lambda q, n: pb.PublishRequest(queue=q, messages=[pb.PublishMessage(value=b"v")] * n),
        queue_names,
        st.integers(0, 5),
    ),
    st.builds(lambda q: pb.GetQueueRequest(name=q), queue_names),
    st.builds(
        lambda q, e: pb.CreateQueueRequest(config=pb.QueueConfig(name=q, environment=e)),
        queue_names,
        text,
    ),
    st.builds(
        lambda a, p: pb.TransactRequest(
            acks=[pb.AckRequest(queue=a)], publishes=[pb.PublishRequest(queue=p)]
        ),
        queue_names,
        queue_names,
    ),
    st.builds(
        lambda q, n: pb.PublishStreamRequest(
            sequence=1, publish=pb.PublishRequest(queue=q, messages=[pb.PublishMessage()] * n)
        ),
        queue_names,
        st.integers(0, 5),
    ),
    st.builds(lambda n: apb.CreateApiKeyRequest(name=n, role="admin"), text),
    st.builds(lambda s: apb.TransferLeadershipRequest(shard_id=s), text),
    st.just(pb.ListQueuesRequest()),
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(method=st.sampled_from(METHODS), md=metadata, request=requests)
def test_malformed_input_never_crashes_and_never_bypasses_auth(
    method: str, md: list[tuple[str, Any]], request: Any
) -> None:
    headers = [v for k, v in md if k == "authorization"]
    try:
        identity = G.admit(method, request, md)
    except FluxError as err:
        assert err.reason in (
            "INVALID_API_KEY",
            "PERMISSION_DENIED",
            "RATE_LIMITED",
            "INVALID_ARGUMENT",
        ), err
        return
    # Admitted: exactly one authorization header carrying a known, active key, whose role
    # allows the method and whose environment holds every queue named.
    assert len(headers) == 1
    assert headers[0].strip().split(" ", 1)[1].strip() in (ADMIN, PRODUCER, STAGE_ADMIN)
    assert method in METHOD_ACTIONS
    if identity.role == "producer":
        assert (
            method in ("Publish", "PublishStream", "InitProducer", "GetQueue", "ListQueues")
            or METHOD_ACTIONS[method].value == "read"
        )
    if METHOD_ACTIONS[method].value == "cluster":  # shared shards: the operators' keys only
        assert identity.environment == "production"
    for name in queues_of(request):  # stored names: a queue of another environment is refused
        if name == "prod-q":
            assert identity.environment == "production"
        if name == "stage-q":  # staging's, from before namespaces: the operators' admins only
            assert identity.environment == "production" and identity.role == "admin"
    # Every queue name is in the caller's namespace once admitted: a staging key's names are
    # all under "staging:", an operators' key's under none.
    # (A publish stream leaves a bad name to its handler, which refuses it per request: then it
    # is no stored name at all, never another namespace's.)
    for name in filter(None, queues_of(request)):
        usable = STORED_QUEUE_NAME_RE.match(name) is not None
        if identity.environment == "staging":
            assert name.startswith("staging:") or not usable, name
        else:
            assert ":" not in name or not usable, name


def test_admit_is_synchronous_so_the_hot_path_never_awaits() -> None:
    # admit() is synchronous: nothing in the hot path awaits.
    assert not asyncio.iscoroutinefunction(Guard.admit)


def test_a_key_admitted_before_is_refused_once_revoked() -> None:
    # The guard remembers values it has checked; a revocation (a new record from the watch) or
    # a reload must make it check again.
    g = guard()
    md = [("authorization", f"Bearer {ADMIN}")]
    request = pb.GetQueueRequest(name="prod-q")
    assert g.admit("GetQueue", request, md).role == "admin"
    staging = [("authorization", f"Bearer {PRODUCER}")]
    assert g.admit("GetQueue", pb.GetQueueRequest(name="stage-q"), staging).role == "producer"
    key_id = ADMIN[len("fmq_live_sk_") :][:8]
    g.keys.records[key_id] = replace(g.keys.records[key_id], revoked_ms=2000)
    try:
        g.admit("GetQueue", request, md)
    except FluxError as err:
        assert err.reason == "INVALID_API_KEY" and "revoked" in err.message
    else:
        raise AssertionError("a revoked key was admitted from the guard's memory")
    g.keys.records = {}  # a reload that no longer has the key
    try:
        g.admit("GetQueue", pb.GetQueueRequest(name="stage-q"), staging)
    except FluxError as err:
        assert err.reason == "INVALID_API_KEY"
    else:
        raise AssertionError("a key missing from the reloaded records was admitted")


def test_a_value_close_to_an_admitted_key_is_not_admitted() -> None:
    g = guard()
    assert g.admit(
        "GetQueue", pb.GetQueueRequest(name="prod-q"), [("authorization", f"Bearer {ADMIN}")]
    )
    for other in (ADMIN[:-1] + ("x" if ADMIN[-1] != "x" else "y"), ADMIN + " ", ADMIN.upper()):
        try:
            identity = g.admit(
                "GetQueue",
                pb.GetQueueRequest(name="prod-q"),
                [("authorization", f"Bearer {other}")],
            )
        except FluxError as err:
            assert err.reason == "INVALID_API_KEY"
        else:
            # Trailing space is stripped by the bearer parser: the same key, checked afresh.
            assert other.strip() == ADMIN and identity.role == "admin"


def test_stream_requests_and_shard_operations_are_held_to_the_environment() -> None:
    g = guard()
    stage = [("authorization", f"Bearer {STAGE_ADMIN}")]
    prod = [("authorization", f"Bearer {ADMIN}")]

    def into_prod() -> pb.PublishStreamRequest:
        return pb.PublishStreamRequest(publish=pb.PublishRequest(queue="prod-q"))

    # A staging key naming production's queue names its own namespace's queue of that name.
    request = into_prod()
    assert g.admit("PublishStream", request, stage).environment == "staging"
    assert request.publish.queue == "staging:prod-q"
    request = into_prod()
    assert g.admit("PublishStream", request, prod).environment == "production"
    assert request.publish.queue == "prod-q"
    shard_op = apb.TransferLeadershipRequest(shard_id="g1")
    try:
        g.admit("TransferLeadership", shard_op, stage)
    except FluxError as err:
        assert err.reason == "PERMISSION_DENIED", err
    else:
        raise AssertionError("a staging admin was admitted to TransferLeadership")
    assert g.admit("TransferLeadership", shard_op, prod).environment == "production"


def test_a_queue_from_before_namespaces_is_reached_by_the_operators_admins_only() -> None:
    # stage-q: staging's, stored under a name of the operators' namespace (made before
    # namespaces). Staging's keys name their own namespace's stage-q now.
    g = guard()
    request = pb.GetQueueRequest(name="stage-q")
    assert g.admit("GetQueue", request, [("authorization", f"Bearer {ADMIN}")]).role == "admin"
    assert request.name == "stage-q"
    request = pb.GetQueueRequest(name="stage-q")
    g.admit("GetQueue", request, [("authorization", f"Bearer {STAGE_ADMIN}")])
    assert request.name == "staging:stage-q"
