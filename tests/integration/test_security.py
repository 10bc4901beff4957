"""API keys against live nodes: authentication, roles, environments, the two-key rotation limit,
revocation on every node within a second, rotation under traffic, rate limits, audit log."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq._pb.v1 import admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.auth import new_key
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster
from tests.integration.conftest import Node
from tests.integration.rpc_helpers import rich_error

TIERS = "default:publish=100000/100000,consume=100000/100000,admin=1000/1000;" + (
    "tight:publish=20/20,consume=5/5,admin=5/5"
)


def md(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


class Api:
    def __init__(self, node: Node) -> None:
        self.ch = node.channel()
        self.q = queue_pb2_grpc.QueueServiceStub(self.ch)
        self.a = admin_pb2_grpc.AdminServiceStub(self.ch)

    def key(self, admin: str, role: str, environment: str = "", tier: str = "") -> str:
        r = self.a.CreateApiKey(
            apb.CreateApiKeyRequest(
                name=f"{role} key", role=role, environment=environment, tier=tier
            ),
            metadata=md(admin),
            timeout=10,
        )
        return str(r.key)


def secured(root: Path, *extra: str) -> tuple[Node, str]:
    admin = new_key("production")
    key_file = root / "admin.key"
    root.mkdir(parents=True, exist_ok=True)
    key_file.write_text(admin + "\n")
    node = Node(
        root / "node",
        "--auth", "on",
        "--auth-bootstrap-key-file", str(key_file),
        "--rate-limit-tiers", TIERS,
        *extra,
    )  # fmt: skip
    return node, admin


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Node, str, Api]]:
    node, admin = secured(tmp_path)
    node.start()
    api = Api(node)
    try:
        yield node, admin, api
    finally:
        api.ch.close()
        node.stop()


def refused(call, *args, **kwargs) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as err:
        call(*args, timeout=10, **kwargs)
    return err.value


def test_missing_malformed_unknown_and_revoked_keys_are_unauthenticated(
    live: tuple[Node, str, Api],
) -> None:
    _node, admin, api = live
    producer = api.key(admin, "producer")
    cases = {
        "missing": None,
        "not bearer": (("authorization", producer),),
        "malformed": md("fmq_live_sk_short"),
        "unknown": md(new_key("production")),
        "wrong kind": md(producer.replace("fmq_live_", "fmq_test_")),
        "two headers": md(producer) + md(producer),
    }
    for what, metadata in cases.items():
        err = refused(api.q.ListQueues, pb.ListQueuesRequest(), metadata=metadata)
        info = rich_error(err)
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, what
        assert info.reason == "INVALID_API_KEY" and info.metadata["request_id"], what
        assert producer[12:] not in (err.details() or ""), "the secret must not be echoed"
    key_id = producer[12:20]
    api.a.RevokeApiKey(apb.RevokeApiKeyRequest(key_id=key_id), metadata=md(admin), timeout=10)
    err = refused(api.q.ListQueues, pb.ListQueuesRequest(), metadata=md(producer))
    assert rich_error(err).reason == "INVALID_API_KEY" and "revoked" in (err.details() or "")


def test_roles_allow_exactly_their_methods(live: tuple[Node, str, Api]) -> None:
    _node, admin, api = live
    api.q.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="jobs")), metadata=md(admin))
    api.q.CreateGroup(pb.CreateGroupRequest(queue="jobs", group="g"), metadata=md(admin))
    producer, consumer, reader = (api.key(admin, r) for r in ("producer", "consumer", "read-only"))
    publish = pb.PublishRequest(queue="jobs", messages=[pb.PublishMessage(value=b"x")])
    lease = pb.LeaseRequest(queue="jobs", group="g", consumer_id="c", max_messages=1)
    api.q.Publish(publish, metadata=md(producer), timeout=10)
    got = api.q.Lease(lease, metadata=md(consumer), timeout=10)
    api.q.Ack(
        pb.AckRequest(queue="jobs", group="g", receipts=[got.messages[0].receipt]),
        metadata=md(consumer),
        timeout=10,
    )
    api.q.Fetch(pb.FetchRequest(queue="jobs", partition=0), metadata=md(reader), timeout=10)
    for key, call, request in [
        (producer, api.q.Lease, lease),
        (consumer, api.q.Publish, publish),
        (reader, api.q.Publish, publish),
        (reader, api.q.PurgeQueue, pb.PurgeQueueRequest(name="jobs")),
        (consumer, api.q.DeleteQueue, pb.DeleteQueueRequest(name="jobs")),
        (producer, api.a.CreateApiKey, apb.CreateApiKeyRequest(name="x", role="admin")),
    ]:
        err = refused(call, request, metadata=md(key))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, (call, err.details())
        assert rich_error(err).metadata["request_id"]


def test_a_key_never_sees_or_touches_another_environments_queues(
    live: tuple[Node, str, Api],
) -> None:
    _node, admin, api = live
    staging_admin = api.key(admin, "admin", "staging")
    api.q.CreateQueue(
        pb.CreateQueueRequest(config=pb.QueueConfig(name="prod-q")), metadata=md(admin)
    )
    api.q.CreateQueue(
        pb.CreateQueueRequest(config=pb.QueueConfig(name="stage-q")), metadata=md(staging_admin)
    )
    listed = api.q.ListQueues(pb.ListQueuesRequest(), metadata=md(staging_admin), timeout=10)
    assert [q.config.name for q in listed.queues] == ["stage-q"]
    assert listed.queues[0].config.environment == "staging"
    prod_listed = api.q.ListQueues(pb.ListQueuesRequest(), metadata=md(admin), timeout=10)
    assert "stage-q" not in [q.config.name for q in prod_listed.queues]
    for call, request in [
        (
            api.q.Publish,
            pb.PublishRequest(queue="prod-q", messages=[pb.PublishMessage(value=b"x")]),
        ),
        (api.q.GetQueue, pb.GetQueueRequest(name="prod-q")),
        (api.q.Fetch, pb.FetchRequest(queue="prod-q", partition=0)),
        (api.q.DeleteQueue, pb.DeleteQueueRequest(name="prod-q")),
    ]:
        err = refused(call, request, metadata=md(staging_admin))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, call
    # Nor can a staging admin mint production keys, or see them.
    err = refused(
        api.a.CreateApiKey,
        apb.CreateApiKeyRequest(name="x", role="admin", environment="production"),
        metadata=md(staging_admin),
    )
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    keys = api.a.ListApiKeys(apb.ListApiKeysRequest(), metadata=md(staging_admin), timeout=10)
    assert {k.environment for k in keys.keys} == {"staging"}
    assert all(len(k.prefix) == 20 for k in keys.keys)


def test_at_most_two_active_keys_per_environment_and_role(live: tuple[Node, str, Api]) -> None:
    _node, admin, api = live
    first, _second = api.key(admin, "consumer"), api.key(admin, "consumer")
    err = refused(
        api.a.CreateApiKey,
        apb.CreateApiKeyRequest(name="third", role="consumer"),
        metadata=md(admin),
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert rich_error(err).reason == "KEY_LIMIT_REACHED"
    api.a.RevokeApiKey(apb.RevokeApiKeyRequest(key_id=first[12:20]), metadata=md(admin))
    api.key(admin, "consumer")  # the revoked key freed its slot


def test_rate_limit_trips_with_retry_info_and_recovers(live: tuple[Node, str, Api]) -> None:
    _node, admin, api = live
    api.q.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="rl")), metadata=md(admin))
    tight = api.key(admin, "producer", tier="tight")
    ten = pb.PublishRequest(queue="rl", messages=[pb.PublishMessage(value=b"x")] * 10)
    api.q.Publish(ten, metadata=md(tight), timeout=10)
    api.q.Publish(ten, metadata=md(tight), timeout=10)  # the burst of 20 is spent
    err = refused(api.q.Publish, ten, metadata=md(tight))
    info = rich_error(err)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and info.reason == "RATE_LIMITED"
    assert info.retry_delay_ms is not None and 0 < info.retry_delay_ms <= 1000
    # Other keys are not affected, and the key itself recovers after the advised delay.
    api.q.Publish(ten, metadata=md(admin), timeout=10)
    time.sleep(info.retry_delay_ms / 1000 + 0.05)
    api.q.Publish(ten, metadata=md(tight), timeout=10)


def test_every_admin_action_is_audit_logged(live: tuple[Node, str, Api]) -> None:
    node, admin, api = live
    api.q.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="aud")), metadata=md(admin))
    refused(api.q.DeleteQueue, pb.DeleteQueueRequest(name="absent"), metadata=md(admin))
    api.key(admin, "producer")
    log = node.log_path.read_text()
    admin_id = admin[12:20]
    lines = [ln for ln in log.splitlines() if "fluxmq.audit" in ln]
    assert any(f"CreateQueue by {admin_id}" in ln and "queue aud -> OK" in ln for ln in lines)
    assert any("DeleteQueue" in ln and "-> NOT_FOUND" in ln for ln in lines), lines
    assert any("CreateApiKey" in ln and "request id" in ln for ln in lines)


# -- three nodes and etcd ---------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Cluster, str]]:
    admin = new_key("production")
    key_file = tmp_path / "admin.key"
    key_file.write_text(admin)
    with EtcdServer() as etcd:
        c = Cluster(
            tmp_path / "c", 3,
            "--etcd", etcd.endpoint, "--auth", "on", "--auth-bootstrap-key-file", str(key_file),
        )  # fmt: skip
        c.metadata = md(admin)
        c.start()
        try:
            yield c, admin
        finally:
            c.stop()


def test_revocation_reaches_every_node_within_a_second_and_rotation_fails_nothing(
    cluster: tuple[Cluster, str],
) -> None:
    c, admin = cluster
    apis = [Api(n) for n in c.nodes]
    try:
        apis[0].q.CreateQueue(
            pb.CreateQueueRequest(config=pb.QueueConfig(name="rot")), metadata=md(admin), timeout=15
        )
        old = apis[0].key(admin, "producer")
        current = [old]
        failures: list[str] = []
        sent = [0]
        stop = threading.Event()

        def traffic() -> None:  # through every node in turn, bounded
            for i in range(20_000):
                if stop.is_set():
                    return
                try:
                    apis[i % 3].q.Publish(
                        pb.PublishRequest(queue="rot", messages=[pb.PublishMessage(value=b"r")]),
                        metadata=md(current[0]),
                        timeout=10,
                    )
                    sent[0] += 1
                except grpc.RpcError as err:
                    failures.append(f"{err.code()}: {err.details()}")

        t = threading.Thread(target=traffic)
        t.start()
        time.sleep(0.5)
        new = apis[1].key(admin, "producer")  # rotation: a second key, on another node
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the new key is known everywhere before use
            try:
                for api in apis:
                    api.q.GetQueue(pb.GetQueueRequest(name="rot"), metadata=md(new), timeout=5)
                break
            except grpc.RpcError:
                time.sleep(0.05)
        current[0] = new
        time.sleep(0.5)
        apis[0].a.RevokeApiKey(
            apb.RevokeApiKeyRequest(key_id=old[12:20]), metadata=md(admin), timeout=10
        )
        revoked_at = time.monotonic()
        refused_on = set()
        while len(refused_on) < 3 and time.monotonic() - revoked_at < 1.0:
            for i, api in enumerate(apis):
                try:
                    api.q.GetQueue(pb.GetQueueRequest(name="rot"), metadata=md(old), timeout=1)
                except grpc.RpcError as err:
                    if rich_error(err).reason == "INVALID_API_KEY":
                        refused_on.add(i)
            time.sleep(0.01)
        assert refused_on == {0, 1, 2}, (
            f"revoked key still accepted by nodes {refused_on ^ {0, 1, 2}}"
        )
        time.sleep(0.3)
        stop.set()
        t.join(30)
        assert not failures, failures[:3]
        assert sent[0] > 0
    finally:
        for api in apis:
            api.ch.close()
