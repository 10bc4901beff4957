"""API keys against live nodes: authentication, roles, environments, the two-key rotation limit,
revocation on every node within a second, rotation under traffic, rate limits, audit log. Each
rule on one node (auth on explicitly), then across one shared 3-node cluster on etcd (auth on by
default there), through nodes that lead, follow, own or only forward to a queue."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq._pb.v1 import admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client.record_batches import encode_records
from fluxmq.core.auth import new_key
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster, started
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


@contextmanager
def serving_secured(root: Path, *extra: str) -> Iterator[tuple[Node, str, Api]]:
    """A started ``secured`` node, its admin key and an Api on it; stopped after the block."""
    node, admin = secured(root, *extra)
    node.start()
    api = Api(node)
    try:
        yield node, admin, api
    finally:
        api.ch.close()
        node.stop()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Node, str, Api]]:
    with serving_secured(tmp_path) as served:
        yield served


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
        # Production's queue is not in staging's namespace: staging has no such queue.
        err = refused(call, request, metadata=md(staging_admin))
        assert err.code() == grpc.StatusCode.NOT_FOUND, call
        assert rich_error(err).metadata["queue"] == "prod-q"
    assert stored(api, admin, "prod-q") == 0
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


def stream_outcome(api: Api, key: str, requests: list[pb.PublishStreamRequest]) -> str:
    """Send a PublishStream; -> "ok", or the gRPC code name that ended it or failed a request."""
    try:
        for response in api.q.PublishStream(iter(requests), metadata=md(key), timeout=30):
            if response.HasField("error"):
                return next(c.name for c in grpc.StatusCode if c.value[0] == response.error.code)
    except grpc.RpcError as err:
        return str(err.code().name)
    return "ok"


def stored(api: Api, admin: str, queue: str) -> int:
    stats = api.q.GetQueueStats(pb.GetQueueStatsRequest(name=queue), metadata=md(admin), timeout=10)
    return int(stats.messages)


def test_a_publish_stream_is_checked_like_publish_for_environment_and_rate(
    live: tuple[Node, str, Api],
) -> None:
    _node, admin, api = live
    for name in ("prod-q", "rl"):
        api.q.CreateQueue(
            pb.CreateQueueRequest(config=pb.QueueConfig(name=name)), metadata=md(admin)
        )
    staging = api.key(admin, "producer", "staging")
    evil = pb.PublishRequest(queue="prod-q", messages=[pb.PublishMessage(value=b"evil")])
    assert stream_outcome(api, staging, [pb.PublishStreamRequest(sequence=1, publish=evil)]) == (
        "NOT_FOUND"  # staging's own "prod-q", which does not exist
    )
    assert stored(api, admin, "prod-q") == 0

    # A stream request costs one token per message, as a Publish does.
    tight = api.key(admin, "producer", tier="tight")  # publish 20/s, burst 20
    thousand = pb.PublishRequest(queue="rl", messages=[pb.PublishMessage(value=b"x")] * 1000)
    requests = [pb.PublishStreamRequest(sequence=i, publish=thousand) for i in range(15)]
    assert stream_outcome(api, tight, requests) == "RESOURCE_EXHAUSTED"
    assert stored(api, admin, "rl") == 1000  # the first, on a full bucket; then 49 s of debt


@pytest.mark.parametrize("form", ["messages", "encoded"])
def test_a_batch_larger_than_the_burst_pays_for_every_message(
    live: tuple[Node, str, Api], form: str
) -> None:
    _node, admin, api = live
    api.q.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="rl")), metadata=md(admin))
    tight = api.key(admin, "producer", tier="tight")  # publish 20/s, burst 20
    messages = [pb.PublishMessage(value=b"x")] * 1000
    if form == "messages":
        thousand = pb.PublishRequest(queue="rl", messages=messages)
    else:  # records the client encoded cost a token each as well
        thousand = pb.PublishRequest(
            queue="rl",
            encoded=pb.EncodedRecords(partition=0, count=1000, records=encode_records(messages)),
        )
    api.q.Publish(thousand, metadata=md(tight), timeout=10)  # waited for a full bucket: passes
    time.sleep(1.05)  # 21 tokens back: once enough for a batch, not now
    err = refused(api.q.Publish, thousand, metadata=md(tight))
    info = rich_error(err)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and info.reason == "RATE_LIMITED"
    assert info.retry_delay_ms is not None and info.retry_delay_ms > 40_000  # 980 owed at 20/s
    assert stored(api, admin, "rl") == 1000


def test_listing_pages_and_their_tokens_reveal_no_other_environments_queue(
    live: tuple[Node, str, Api],
) -> None:
    _node, admin, api = live
    staging = api.key(admin, "admin", "staging")
    for name, key in (("a-prod-payroll", admin), ("b-stage", staging), ("c-prod", admin)):
        api.q.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name=name)), metadata=md(key))
    api.q.CreateQueue(
        pb.CreateQueueRequest(config=pb.QueueConfig(name="d-stage")), metadata=md(staging)
    )
    seen, token = [], ""
    for _ in range(10):
        page = api.q.ListQueues(
            pb.ListQueuesRequest(limit=1, page_token=token), metadata=md(staging)
        )
        seen += [q.config.name for q in page.queues]
        assert len(page.queues) == 1 or not page.next_page_token  # no empty pages mid-listing
        token = page.next_page_token
        assert "prod" not in base64.urlsafe_b64decode(token + "==").decode(errors="replace")
        if not token:
            break
    assert seen == ["b-stage", "d-stage"]


def test_a_dead_letter_queue_never_pairs_queues_of_two_environments(
    live: tuple[Node, str, Api],
) -> None:
    _node, admin, api = live
    dev = api.key(admin, "admin", "development")

    def create(key: str, name: str, dlq: str = "") -> pb.Queue:
        config = pb.QueueConfig(name=name, type=pb.QUEUE_TYPE_WORK, dead_letter_queue=dlq)
        api.q.CreateQueue(pb.CreateQueueRequest(config=config), metadata=md(key), timeout=10)
        return api.q.GetQueue(pb.GetQueueRequest(name=name), metadata=md(key), timeout=10)

    # A DLQ is named in its queue's namespace: a development queue's "billing" DLQ reserves no
    # production name, and production's "billing" is another queue.
    assert create(dev, "dev-q", dlq="billing").config.dead_letter_queue == "billing"
    assert create(admin, "billing").config.environment == "production"
    assert create(admin, "ledger").config.environment == "production"
    assert create(dev, "dev-2", dlq="ledger").config.dead_letter_queue == "ledger"
    create(admin, "orders.dlq")
    create(dev, "orders")  # its default DLQ is development's orders.dlq, not production's
    dev_names = api.q.ListQueues(pb.ListQueuesRequest(), metadata=md(dev), timeout=10)
    # (a DLQ is made by its first dead letter)
    assert sorted(q.config.name for q in dev_names.queues) == ["dev-2", "dev-q", "orders"]
    assert {q.config.environment for q in dev_names.queues} == {"development"}
    prod_names = api.q.ListQueues(pb.ListQueuesRequest(), metadata=md(admin), timeout=10)
    assert sorted(q.config.name for q in prod_names.queues) == ["billing", "ledger", "orders.dlq"]
    # The dead-letter calls of dev-q therefore never reach a production queue.
    listed = api.q.ListDeadLetters(pb.ListDeadLettersRequest(queue="dev-q"), metadata=md(dev))
    assert list(listed.dead_letters) == []


def test_shard_operations_take_an_admin_key_of_the_operators_environment(
    live: tuple[Node, str, Api],
) -> None:
    _node, admin, api = live
    dev = api.key(admin, "admin", "development")
    for call, request in (
        (api.a.TransferLeadership, apb.TransferLeadershipRequest(shard_id="g1")),
        (api.a.AddReplica, apb.AddReplicaRequest(shard_id="g1", address="127.0.0.1:1")),
        (api.a.RemoveReplica, apb.RemoveReplicaRequest(shard_id="g1", address="127.0.0.1:1")),
    ):
        err = refused(call, request, metadata=md(dev))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err
        assert "production" in str(err.details())
        with pytest.raises(grpc.RpcError) as other:  # production's admin gets past the guard
            call(request, metadata=md(admin), timeout=10)
        assert other.value.code() != grpc.StatusCode.PERMISSION_DENIED


def test_a_revoked_key_ends_its_open_streams_at_the_next_message(
    live: tuple[Node, str, Api],
) -> None:
    _node, admin, api = live
    api.q.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="feed")), metadata=md(admin))
    reader = api.key(admin, "read-only")
    one = pb.PublishRequest(queue="feed", messages=[pb.PublishMessage(value=b"1")])
    api.q.Publish(one, metadata=md(admin), timeout=10)
    stream = api.q.Tail(pb.TailRequest(queue="feed"), metadata=md(reader), timeout=30)
    assert [r.value for r in next(stream).records] == [b"1"]
    api.a.RevokeApiKey(apb.RevokeApiKeyRequest(key_id=reader[12:20]), metadata=md(admin))
    api.q.Publish(one, metadata=md(admin), timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        for _ in range(100):  # bounded: the stream must end, not deliver
            next(stream)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value


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


# -- three nodes and etcd: one cluster, started once, for every test below --------------------

# "tiny" refills its publish burst of 10 in half a second: a test trips it and waits out the
# advised delay quickly. "default" (the bootstrap key's tier) never gets in the way.
CLUSTER_TIERS = TIERS + ";tiny:publish=20/10,consume=1000/1000,admin=1000/1000"
REVOCATION_BOUND_S = 1.0  # the guarantee: a revoked key is refused everywhere by then
# How long a test waits for a new key to reach the other nodes: a bound, not a speed claim.
PROPAGATION_BOUND_S = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three nodes on one etcd, started WITHOUT --auth: authentication is the cluster default.
    The Cluster helper bootstraps a production admin key (``cluster.api_key``) that every
    ``node.channel()`` presents unless a call brings its own. With auto-provisioning a queue of
    replication factor 1 lives on one node only, and the two others forward its calls."""
    with EtcdServer() as etcd:
        c = Cluster(
            tmp_path_factory.mktemp("secured-cluster"), 3,
            "--etcd", etcd.endpoint,
            "--rate-limit-tiers", CLUSTER_TIERS,
            "--auto-provision-groups",
        )  # fmt: skip
        with started(c):
            yield c


def known_on(api: Api, key: str) -> bool:
    """Whether the node accepts ``key`` (any role may read the cluster status)."""
    try:
        api.a.GetClusterStatus(
            apb.GetClusterStatusRequest(skip_digest=True), metadata=md(key), timeout=5
        )
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.UNAUTHENTICATED:
            raise
        assert rich_error(err).reason == "INVALID_API_KEY"
        return False
    return True


def wait_everywhere(apis: list[Api], key: str, *, known: bool, bound_s: float) -> None:
    """Until every node accepts ``key`` (known) or refuses it (not known), at most ``bound_s``."""
    deadline = time.monotonic() + bound_s
    pending = set(range(len(apis)))
    for _ in range(10_000):
        pending = {i for i in pending if known_on(apis[i], key) != known}
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    state = "accepted" if known else "refused"
    assert not pending, f"key not {state} by nodes {sorted(pending)} within {bound_s} s"


class Nodes:
    """A client of every node of the shared cluster. The keys made through it are revoked when
    the test ends, and the revocation seen by every node, so the tests sharing the cluster stay
    within two active keys per environment and role and leave no node with a stale key cache."""

    def __init__(self, cluster: Cluster) -> None:
        self.admin = cluster.api_key
        self.apis = [Api(n) for n in cluster.nodes]
        self.made: list[str] = []

    def key(self, role: str, environment: str = "", tier: str = "", via: int = 0) -> str:
        key = self.apis[via].key(self.admin, role, environment, tier)
        self.made.append(key)
        return key

    def close(self) -> None:
        try:
            for key in self.made:
                self.apis[0].a.RevokeApiKey(apb.RevokeApiKeyRequest(key_id=key[12:20]), timeout=10)
            for key in self.made:
                wait_everywhere(self.apis, key, known=False, bound_s=PROPAGATION_BOUND_S)
        finally:
            for api in self.apis:
                api.ch.close()


@pytest.fixture
def nodes(cluster: Cluster) -> Iterator[Nodes]:
    n = Nodes(cluster)
    try:
        yield n
    finally:
        n.close()


def hosts_of(apis: list[Api], queue: str, key: str = "") -> list[int]:
    """The nodes with a replica of ``queue``, as a key of its environment sees them (default:
    the cluster's production admin key; the status names no other environment's queues)."""
    hosts = []
    for i, api in enumerate(apis):
        status = api.a.GetClusterStatus(
            apb.GetClusterStatusRequest(skip_digest=True),
            metadata=md(key) if key else None,
            timeout=10,
        )
        if any(queue in shard.queues for shard in status.shards):
            hosts.append(i)
    return hosts


def create_queue(apis: list[Api], name: str, *, factor: int = 0, key: str = "") -> list[int]:
    """Creates ``name`` through node 0 with ``key`` (default: the cluster's admin key) and waits
    (bounded) until each of its replicas has applied it; -> the nodes that have it. Factor 1:
    one node has it and the two others forward its calls; 0: every node has a replica."""
    config = pb.QueueConfig(name=name, replication=pb.Replication(factor=factor))
    apis[0].q.CreateQueue(
        pb.CreateQueueRequest(config=config), metadata=md(key) if key else None, timeout=30
    )
    want = factor or len(apis)
    deadline = time.monotonic() + 10
    hosts: list[int] = []
    for _ in range(1_000):
        hosts = hosts_of(apis, name, key)
        if len(hosts) >= want or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(hosts) == want, f"{name} should have {want} replicas, not {hosts}"
    return hosts


def solo_queue(apis: list[Api], name: str, key: str = "") -> int:
    """A queue with one replica; -> the node that has it (the two others forward its calls)."""
    (owner,) = create_queue(apis, name, factor=1, key=key)
    return owner


def test_auth_is_on_by_default_in_a_cluster_so_every_node_refuses_a_call_without_a_key(
    cluster: Cluster,
) -> None:
    assert all("--auth" not in node.extra for node in cluster.nodes), "the default is under test"
    for i, node in enumerate(cluster.nodes):
        with grpc.insecure_channel(node.address) as ch:  # no key (node.channel() has one)
            q, a = queue_pb2_grpc.QueueServiceStub(ch), admin_pb2_grpc.AdminServiceStub(ch)
            errors = [
                refused(q.ListQueues, pb.ListQueuesRequest()),
                refused(q.Publish, pb.PublishRequest(queue="q", messages=[pb.PublishMessage()])),
                refused(a.GetClusterStatus, apb.GetClusterStatusRequest(skip_digest=True)),
                refused(a.CreateApiKey, apb.CreateApiKeyRequest(name="x", role="admin")),
            ]
            with pytest.raises(grpc.RpcError) as tail:  # a server stream, refused alike
                next(iter(q.Tail(pb.TailRequest(queue="q"), timeout=10)))
            errors.append(tail.value)
        for err in errors:
            info = rich_error(err)
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (i, err.details())
            assert info.reason == "INVALID_API_KEY" and "missing API key" in info.message, i
            assert info.metadata["request_id"] and info.request_id == info.metadata["request_id"]
        with node.channel() as ch:  # the bootstrapped admin key is accepted on every node
            queue_pb2_grpc.QueueServiceStub(ch).ListQueues(pb.ListQueuesRequest(), timeout=10)


def test_a_staging_key_never_sees_or_touches_production_queues_through_any_node(
    cluster: Cluster, nodes: Nodes
) -> None:
    apis = nodes.apis
    leader = cluster.nodes.index(cluster.wait_leader())
    owner = solo_queue(apis, "env-prod-solo")  # two nodes forward its calls
    create_queue(apis, "env-prod-all")  # on every node: two of them are followers for it
    staging = nodes.key("admin", "staging", via=2)  # made through node 2 ...
    wait_everywhere(apis, staging, known=True, bound_s=PROPAGATION_BOUND_S)
    solo_queue(apis, "env-stage-solo", staging)  # ... used through node 0
    production = ["env-prod-all", "env-prod-solo"]
    one = [pb.PublishMessage(value=b"x")]
    for i, api in enumerate(apis):
        where = f"node {i}: {'leader' if i == leader else 'follower'} of env-prod-all, " + (
            "owner of env-prod-solo" if i == owner else f"forwards env-prod-solo to {owner}"
        )
        listed = api.q.ListQueues(
            pb.ListQueuesRequest(prefix="env-"), metadata=md(staging), timeout=10
        )
        assert [(q.config.name, q.config.environment) for q in listed.queues] == [
            ("env-stage-solo", "staging")
        ], where
        prod_listed = api.q.ListQueues(pb.ListQueuesRequest(prefix="env-"), timeout=10)
        assert [q.config.name for q in prod_listed.queues] == production, where
        status = api.a.GetClusterStatus(
            apb.GetClusterStatusRequest(skip_digest=True), metadata=md(staging), timeout=10
        )
        shown = {q for s in status.shards for q in s.queues} | {q.name for q in status.queues}
        assert not shown & set(production), (where, shown)
        # Each key works on its own environment's queue through this node, forwarded or not.
        api.q.Publish(
            pb.PublishRequest(queue="env-stage-solo", messages=one),
            metadata=md(staging),
            timeout=10,
        )
        api.q.Publish(pb.PublishRequest(queue="env-prod-solo", messages=one), timeout=10)
        for queue in production:
            for method, call, request in [
                ("Publish", api.q.Publish, pb.PublishRequest(queue=queue, messages=one)),
                ("Fetch", api.q.Fetch, pb.FetchRequest(queue=queue, partition=0)),
                ("GetQueue", api.q.GetQueue, pb.GetQueueRequest(name=queue)),
                ("CreateGroup", api.q.CreateGroup, pb.CreateGroupRequest(queue=queue, group="g")),
                ("DeleteQueue", api.q.DeleteQueue, pb.DeleteQueueRequest(name=queue)),
            ]:
                # Not staging's queue: staging has none of that name (the same answer as
                # for a name no environment has), shown in the caller's words.
                err = refused(call, request, metadata=md(staging))
                info = rich_error(err)
                assert err.code() == grpc.StatusCode.NOT_FOUND, (where, queue, method)
                assert info.reason == "QUEUE_NOT_FOUND", (where, queue, method)
                assert info.metadata["queue"] == queue and info.request_id, (where, method)
                assert "staging" not in str(err.details()), (where, method, err.details())
        sneak = pb.QueueConfig(name=f"env-sneak-{i}", environment="production")
        err = refused(api.q.CreateQueue, pb.CreateQueueRequest(config=sneak), metadata=md(staging))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, where
    # Staging may have a queue of production's name: another queue, forwarded or not.
    owner_of_stage_twin = solo_queue(apis, "env-prod-solo", staging)
    for api in apis:
        api.q.Publish(
            pb.PublishRequest(queue="env-prod-solo", messages=[pb.PublishMessage(value=b"s")]),
            metadata=md(staging),
            timeout=10,
        )
    twin = apis[owner_of_stage_twin].q.Fetch(
        pb.FetchRequest(queue="env-prod-solo", partition=0, max_messages=100),
        metadata=md(staging),
        timeout=10,
    )
    assert [r.value for r in twin.records] == [b"s"] * 3
    # Staging's listing, one queue a page, merges every group's page in the caller's names
    # through every node (each solo queue is on its own group, listed by another node).
    for i, api in enumerate(apis):
        seen, token = [], ""
        for _ in range(10):
            page = api.q.ListQueues(
                pb.ListQueuesRequest(prefix="env-", limit=1, page_token=token),
                metadata=md(staging),
                timeout=10,
            )
            seen += [q.config.name for q in page.queues]
            token = page.next_page_token
            if not token:
                break
        assert seen == ["env-prod-solo", "env-stage-solo"], (i, seen)
    # Nothing the staging key tried landed: env-prod-solo holds the production key's 3 messages.
    fetched = apis[owner].q.Fetch(
        pb.FetchRequest(queue="env-prod-solo", partition=0, max_messages=100), timeout=10
    )
    assert len(fetched.records) == 3
    names = [q.config.name for q in apis[1].q.ListQueues(pb.ListQueuesRequest(), timeout=10).queues]
    assert not [n for n in names if n.startswith("env-sneak-")]


def test_each_role_is_refused_what_it_may_not_do_on_every_node_forwarding_or_not(
    nodes: Nodes,
) -> None:
    apis = nodes.apis
    owner = solo_queue(apis, "roles-solo")
    apis[0].q.CreateGroup(pb.CreateGroupRequest(queue="roles-solo", group="g"), timeout=10)
    keys = {role: nodes.key(role) for role in ("producer", "consumer", "read-only")}
    for key in keys.values():
        wait_everywhere(apis, key, known=True, bound_s=PROPAGATION_BOUND_S)
    producer, consumer = keys["producer"], keys["consumer"]
    publish = pb.PublishRequest(queue="roles-solo", messages=[pb.PublishMessage(value=b"r")])
    lease = pb.LeaseRequest(queue="roles-solo", group="g", consumer_id="c", max_messages=1)
    consume = pb.ConsumeRequest(queue="roles-solo", group="g", consumer_id="p")
    delete = pb.DeleteQueueRequest(name="roles-solo")
    purge = pb.PurgeQueueRequest(name="roles-solo")
    mint = apb.CreateApiKeyRequest(name="x", role="read-only")  # even the least of keys
    revoke = apb.RevokeApiKeyRequest(key_id=producer[12:20])
    for i, api in enumerate(apis):
        where = f"node {i} " + ("(owner)" if i == owner else f"(forwards to node {owner})")
        # What a role may do works through this node ...
        api.q.Publish(publish, metadata=md(producer), timeout=10)
        got = api.q.Lease(lease, metadata=md(consumer), timeout=10)
        assert len(got.messages) == 1, where
        ack = pb.AckRequest(queue="roles-solo", group="g", receipts=[got.messages[0].receipt])
        api.q.Ack(ack, metadata=md(consumer), timeout=10)
        for key in keys.values():  # every role may read
            api.q.Fetch(
                pb.FetchRequest(queue="roles-solo", partition=0), metadata=md(key), timeout=10
            )
        # ... and what it may not is refused.
        create = pb.CreateQueueRequest(config=pb.QueueConfig(name=f"roles-new-{i}"))
        cases = [
            ("consumer", "Publish", api.q.Publish, publish),
            ("read-only", "Publish", api.q.Publish, publish),
            ("producer", "Lease", api.q.Lease, lease),
            ("read-only", "Lease", api.q.Lease, lease),
            ("producer", "Ack", api.q.Ack, ack),
            ("consumer", "DeleteQueue", api.q.DeleteQueue, delete),
            ("producer", "PurgeQueue", api.q.PurgeQueue, purge),
        ]
        for role in keys:  # only an admin manages queues and keys
            cases += [
                (role, "CreateQueue", api.q.CreateQueue, create),
                (role, "CreateApiKey", api.a.CreateApiKey, mint),
                (role, "ListApiKeys", api.a.ListApiKeys, apb.ListApiKeysRequest()),
                (role, "RevokeApiKey", api.a.RevokeApiKey, revoke),
            ]
        errors = [
            (role, method, refused(call, request, metadata=md(keys[role])))
            for role, method, call, request in cases
        ]
        with pytest.raises(grpc.RpcError) as stream:  # a producer may not consume a stream either
            next(iter(api.q.Consume(consume, metadata=md(producer), timeout=10)))
        errors.append(("producer", "Consume", stream.value))
        for role, method, err in errors:
            info = rich_error(err)
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED, (where, role, method)
            assert info.metadata["role"] == role and info.metadata["method"] == method, where
            assert info.request_id, where
    names = [q.config.name for q in apis[0].q.ListQueues(pb.ListQueuesRequest(), timeout=10).queues]
    assert "roles-solo" in names and not [n for n in names if n.startswith("roles-new-")]


def test_concurrent_key_creation_through_three_nodes_yields_exactly_two_keys_per_role(
    nodes: Nodes,
) -> None:
    apis = nodes.apis

    def active_ids(api: Api) -> set[str]:
        keys = api.a.ListApiKeys(apb.ListApiKeysRequest(), timeout=10).keys
        return {k.key_id for k in keys if (k.environment, k.role) == ("development", "consumer")}

    assert not active_ids(apis[0]), "the slots under test start empty"
    attempts = 6  # two through each node, all at once
    start = threading.Barrier(attempts, timeout=30)
    won: list[str] = []
    lost: list[grpc.RpcError] = []

    def create(i: int) -> None:
        request = apb.CreateApiKeyRequest(
            name=f"race {i}", role="consumer", environment="development"
        )
        start.wait()
        try:
            won.append(apis[i % 3].a.CreateApiKey(request, timeout=20).key)
        except grpc.RpcError as err:
            lost.append(err)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(attempts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    nodes.made.extend(won)
    assert len(won) == 2, [f"{e.code()}: {e.details()}" for e in lost]
    assert len(lost) == attempts - 2
    for err in lost:
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
        assert rich_error(err).reason == "KEY_LIMIT_REACHED", err.details()
    for api in apis:
        assert active_ids(api) == {k[12:20] for k in won}
    for key in won:
        wait_everywhere(apis, key, known=True, bound_s=PROPAGATION_BOUND_S)
    for err in lost:  # the store's refusal names the slot like the cache's does
        assert rich_error(err).metadata.get("role") == "consumer", err.details()
    # Revoking one through node 0 frees its slot at once for a key made through node 2 (its
    # cache may not have seen the revocation yet: the store decides), and then the limit holds
    # again, through node 1.
    apis[0].a.RevokeApiKey(apb.RevokeApiKeyRequest(key_id=won[0][12:20]), timeout=10)
    nodes.key("consumer", "development", via=2)
    err = refused(
        apis[1].a.CreateApiKey,
        apb.CreateApiKeyRequest(name="third", role="consumer", environment="development"),
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert rich_error(err).reason == "KEY_LIMIT_REACHED"
    assert len(active_ids(apis[1])) == 2


def test_a_rate_limited_key_gets_retry_info_and_recovers_on_the_owner_and_through_a_forwarder(
    nodes: Nodes,
) -> None:
    apis = nodes.apis
    owner = solo_queue(apis, "rl-solo")
    forwarder = (owner + 1) % 3  # charges the key's bucket on itself, then again on the owner
    ten = pb.PublishRequest(queue="rl-solo", messages=[pb.PublishMessage(value=b"x")] * 10)
    apis[forwarder].q.Publish(ten, timeout=10)  # the path to the owner is warm
    # One key per path: buckets are per node and per key, and each starts full.
    direct, forwarded = nodes.key("producer", tier="tiny"), nodes.key("producer", tier="tiny")
    for key in (direct, forwarded):
        wait_everywhere(apis, key, known=True, bound_s=PROPAGATION_BOUND_S)
    for key, api, path in ((direct, apis[owner], "direct"), (forwarded, apis[forwarder], "fwd")):
        api.q.Publish(ten, metadata=md(key), timeout=10)  # spends the burst of 10
        err = refused(api.q.Publish, ten, metadata=md(key))
        info = rich_error(err)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (path, err.details())
        assert info.reason == "RATE_LIMITED" and info.metadata["tier"] == "tiny", path
        assert info.request_id, path
        assert info.retry_delay_ms is not None and 0 < info.retry_delay_ms <= 1000, path
        api.q.Publish(ten, timeout=10)  # another key (the admin's) is not held back
        time.sleep(info.retry_delay_ms / 1000 + 0.1)
        api.q.Publish(ten, metadata=md(key), timeout=10)  # recovered after the advised delay
    # Refused by the owner while the forwarder had tokens: the RetryInfo comes back through.
    apis[0].a.RevokeApiKey(apb.RevokeApiKeyRequest(key_id=direct[12:20]), timeout=10)
    third = nodes.key("producer", tier="tiny")  # in the slot of the revoked one
    wait_everywhere(apis, third, known=True, bound_s=PROPAGATION_BOUND_S)
    apis[owner].q.Publish(ten, metadata=md(third), timeout=10)  # the owner's bucket is empty
    err = refused(apis[forwarder].q.Publish, ten, metadata=md(third))
    info = rich_error(err)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and info.reason == "RATE_LIMITED"
    assert info.retry_delay_ms is not None and 0 < info.retry_delay_ms <= 1000, err.details()


def test_revocation_reaches_every_node_within_a_second_and_rotation_fails_nothing(
    nodes: Nodes,
) -> None:
    apis = nodes.apis
    create_queue(apis, "rot")
    old = nodes.key("producer")
    wait_everywhere(apis, old, known=True, bound_s=PROPAGATION_BOUND_S)
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
    try:
        time.sleep(0.5)
        new = nodes.key("producer", via=1)  # rotation: a second key, made on another node
        wait_everywhere(apis, new, known=True, bound_s=PROPAGATION_BOUND_S)  # before its use
        current[0] = new
        time.sleep(0.5)
        apis[0].a.RevokeApiKey(apb.RevokeApiKeyRequest(key_id=old[12:20]), timeout=10)
        wait_everywhere(apis, old, known=False, bound_s=REVOCATION_BOUND_S)
        time.sleep(0.3)
    finally:
        stop.set()
        t.join(30)
    assert not failures, failures[:3]
    assert sent[0] > 0


HAMMER_AFTER_CREATE_S = 1.0


def _hammer(api: Api, key: str, queue: str, stop: threading.Event, landed: list[str]) -> None:
    """Publishes to ``queue`` with ``key`` until ``stop``, or until refused with
    PERMISSION_DENIED (bounded in count)."""
    for _ in range(5_000):
        if stop.is_set():
            return
        try:
            api.q.Publish(
                pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(value=b"s")]),
                metadata=md(key),
                timeout=10,
            )
            landed.append(queue)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.PERMISSION_DENIED:
                return


def test_a_staging_key_cannot_publish_into_a_production_queue_a_replica_has_not_applied_yet(
    cluster: Cluster, nodes: Nodes
) -> None:
    apis = nodes.apis
    leader = cluster.nodes.index(cluster.wait_leader())
    staging = nodes.key("producer", "staging")
    wait_everywhere(apis, staging, known=True, bound_s=PROPAGATION_BOUND_S)
    landed: list[str] = []
    for attempt in range(10):  # the race is usually lost in the first round
        queue, stop = f"fresh-{attempt}", threading.Event()
        threads = [
            threading.Thread(target=_hammer, args=(api, staging, queue, stop, landed))
            for i, api in enumerate(apis)
            if i != leader
        ]
        for t in threads:
            t.start()
        try:
            time.sleep(0.02)  # the followers are being asked for the queue before it exists
            apis[leader].q.CreateQueue(
                pb.CreateQueueRequest(config=pb.QueueConfig(name=queue)), timeout=15
            )
            # The race is the followers' apply of the create (milliseconds behind the leader);
            # a staging key is refused with NOT_FOUND in its own environment, so the hammers
            # do not stop by themselves: they go on this long past the create, then stop.
            time.sleep(HAMMER_AFTER_CREATE_S)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        if landed:
            break
    assert not landed, f"a staging key published {len(landed)} messages into {sorted(set(landed))}"


def test_a_new_key_works_at_once_on_every_node_not_only_where_it_was_made(nodes: Nodes) -> None:
    # A node whose cache has not heard of a key yet looks it up in etcd before refusing it:
    # behind a load balancer, a key handed out by one node must not bounce off another.
    apis = nodes.apis
    create_queue(apis, "fresh-key")
    for via in range(3):
        key = nodes.key("producer", via=via)
        for i in (via + 1) % 3, (via + 2) % 3:  # no waiting for the watch
            apis[i].q.Publish(
                pb.PublishRequest(queue="fresh-key", messages=[pb.PublishMessage(value=b"k")]),
                metadata=md(key),
                timeout=10,
            )
        nodes.apis[0].a.RevokeApiKey(apb.RevokeApiKeyRequest(key_id=key[12:20]), timeout=10)
