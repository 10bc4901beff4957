"""Environments are namespaces of queue names, on a live node with authentication on: a name is
unique within its environment only, no key can learn whether a name exists in another
environment, no environment can take a name from another, and /metrics names no queue of an
environment that did not opt in."""

from __future__ import annotations

import doctest
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import status_pb2

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.core import namespaces
from fluxmq.core.errors import FluxError
from fluxmq.core.namespaces import STORED_QUEUE_NAME_RE, caller_text, check_caller_name
from fluxmq.server.scoping import caller_response, scope_request

from .conftest import Node
from .test_security import Api, md, refused, rich_error, serving_secured


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Node, str, Api]]:
    with serving_secured(tmp_path) as served:
        yield served


def one(value: bytes) -> list[pb.PublishMessage]:
    return [pb.PublishMessage(value=value)]


def values(api: Api, key: str, queue: str) -> list[bytes]:
    fetched = api.q.Fetch(
        pb.FetchRequest(queue=queue, partition=0, max_messages=100), metadata=md(key), timeout=10
    )
    return [r.value for r in fetched.records]


def test_the_same_name_is_two_queues_in_two_environments_and_neither_can_squat_it(
    live: tuple[Node, str, Api],
) -> None:
    _node, admin, api = live
    dev = api.key(admin, "admin", "development")
    # Development takes the name first; production can still have it: nothing to squat.
    api.q.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="orders")), metadata=md(dev))
    api.q.CreateQueue(
        pb.CreateQueueRequest(config=pb.QueueConfig(name="orders")), metadata=md(admin)
    )
    api.q.Publish(pb.PublishRequest(queue="orders", messages=one(b"dev")), metadata=md(dev))
    api.q.Publish(pb.PublishRequest(queue="orders", messages=one(b"prod")), metadata=md(admin))
    assert values(api, dev, "orders") == [b"dev"]
    assert values(api, admin, "orders") == [b"prod"]
    for key, environment in ((dev, "development"), (admin, "production")):
        queue = api.q.GetQueue(pb.GetQueueRequest(name="orders"), metadata=md(key), timeout=10)
        assert (queue.config.name, queue.config.environment) == ("orders", environment)
        listed = api.q.ListQueues(pb.ListQueuesRequest(prefix="ord"), metadata=md(key))
        assert [(q.config.name, q.config.environment) for q in listed.queues] == [
            ("orders", environment)
        ]
    # A second create in the same environment is refused as ever, in the caller's words.
    err = refused(
        api.q.CreateQueue,
        pb.CreateQueueRequest(config=pb.QueueConfig(name="orders")),
        metadata=md(dev),
    )
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "development" not in str(err.details()), err.details()
    assert rich_error(err).metadata["queue"] == "orders"
    # Deleting development's queue leaves production's.
    api.q.DeleteQueue(pb.DeleteQueueRequest(name="orders"), metadata=md(dev), timeout=10)
    assert values(api, admin, "orders") == [b"prod"]


def test_a_key_cannot_tell_whether_a_name_exists_in_another_environment(
    live: tuple[Node, str, Api],
) -> None:
    _node, admin, api = live
    reader = api.key(admin, "read-only", "development")
    api.q.CreateQueue(
        pb.CreateQueueRequest(config=pb.QueueConfig(name="payroll")), metadata=md(admin)
    )

    def answer(name: str) -> tuple[grpc.StatusCode, str, str]:
        err = refused(api.q.GetQueue, pb.GetQueueRequest(name=name), metadata=md(reader))
        info = rich_error(err)
        return err.code(), info.reason, str(err.details()).replace(name, "<name>")

    # The same answer for production's queue as for a name that exists nowhere.
    assert answer("payroll") == answer("no-such-queue")
    assert answer("payroll")[0] == grpc.StatusCode.NOT_FOUND
    for call, request in [
        (api.q.Fetch, pb.FetchRequest(queue="payroll", partition=0)),
        (api.q.GetQueueStats, pb.GetQueueStatsRequest(name="payroll")),
        (api.q.ListGroups, pb.ListGroupsRequest(queue="payroll")),
    ]:
        assert refused(call, request, metadata=md(reader)).code() == grpc.StatusCode.NOT_FOUND
    # No key can name a queue of another namespace by its stored name.
    for key, name in (
        (reader, "production:payroll"),
        (reader, "staging:x"),
        (admin, "development:x"),
    ):
        err = refused(api.q.GetQueue, pb.GetQueueRequest(name=name), metadata=md(key))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, name
    # Cluster status shows the caller's environment's queues only.
    status = api.a.GetClusterStatus(
        apb.GetClusterStatusRequest(skip_digest=True), metadata=md(reader), timeout=10
    )
    shown = {q for s in status.shards for q in s.queues} | {q.name for q in status.queues}
    shown |= {c.queue for c in status.queue_counters}
    assert "payroll" not in shown and not any(":" in name for name in shown), shown


def test_dead_letters_name_their_source_as_its_environment_does(
    live: tuple[Node, str, Api],
) -> None:
    _node, admin, api = live
    dev = api.key(admin, "admin", "development")
    config = pb.QueueConfig(name="jobs", type=pb.QUEUE_TYPE_WORK)
    api.q.CreateQueue(pb.CreateQueueRequest(config=config), metadata=md(dev), timeout=10)
    api.q.CreateGroup(pb.CreateGroupRequest(queue="jobs", group="g"), metadata=md(dev))
    api.q.Publish(pb.PublishRequest(queue="jobs", messages=one(b"j")), metadata=md(dev))
    leased = api.q.Lease(
        pb.LeaseRequest(queue="jobs", group="g", consumer_id="c", max_messages=1, wait_ms=2000),
        metadata=md(dev),
        timeout=10,
    )
    receipt = leased.messages[0].receipt
    api.q.Nack(
        pb.NackRequest(queue="jobs", group="g", receipts=[receipt], dead=True, reason="bad"),
        metadata=md(dev),
        timeout=10,
    )
    letters = api.q.ListDeadLetters(pb.ListDeadLettersRequest(queue="jobs"), metadata=md(dev))
    (letter,) = letters.dead_letters
    assert letter.record.headers["fluxmq-original-queue"] == b"jobs"
    queue = api.q.GetQueue(pb.GetQueueRequest(name="jobs"), metadata=md(dev), timeout=10)
    assert queue.config.dead_letter_queue == "jobs.dlq"
    dlq = api.q.Fetch(pb.FetchRequest(queue="jobs.dlq", partition=0), metadata=md(dev))
    assert [r.headers["fluxmq-original-queue"] for r in dlq.records] == [b"jobs"]
    described = api.q.GetQueue(pb.GetQueueRequest(name="jobs.dlq"), metadata=md(dev))
    assert (described.config.name, described.dead_letter_of) == ("jobs.dlq", "jobs")


def test_a_publish_stream_error_names_the_queue_in_the_callers_words(
    live: tuple[Node, str, Api],
) -> None:
    _node, admin, api = live
    dev = api.key(admin, "producer", "development")
    request = pb.PublishStreamRequest(
        sequence=1, publish=pb.PublishRequest(queue="nowhere", messages=one(b"x"))
    )
    (reply,) = list(api.q.PublishStream(iter([request]), metadata=md(dev), timeout=10))
    assert reply.error.reason == "QUEUE_NOT_FOUND"
    status = status_pb2.Status.FromString(reply.error.status_details)
    details = str(status) + reply.error.message
    assert "nowhere" in details and "development" not in details, details


def test_a_queue_made_before_namespaces_is_reached_by_the_operators_admins_only(
    tmp_path: Path,
) -> None:
    # Before namespaces, a development queue held a name of the one shared namespace. It is no
    # longer its environment's by name, so the operators' admins may move and delete it; no
    # other key reaches it, and /metrics does not name it.
    legacy = Node(tmp_path / "node", "--auth", "off")
    legacy.start()
    with legacy.channel() as ch:
        config = pb.QueueConfig(name="old-dev", environment="development")
        queue_pb2_grpc.QueueServiceStub(ch).CreateQueue(
            pb.CreateQueueRequest(config=config), timeout=10
        )
    legacy.stop()
    with serving_secured(tmp_path) as (node, admin, api):
        assert "keep names of the production namespace (e.g. old-dev)" in node.log_path.read_text()
        dev = api.key(admin, "admin", "development")
        producer = api.key(admin, "producer")
        err = refused(api.q.GetQueue, pb.GetQueueRequest(name="old-dev"), metadata=md(dev))
        assert err.code() == grpc.StatusCode.NOT_FOUND
        err = refused(api.q.GetQueue, pb.GetQueueRequest(name="old-dev"), metadata=md(producer))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert 'queue="old-dev"' not in scrape(node)
        queue = api.q.GetQueue(pb.GetQueueRequest(name="old-dev"), metadata=md(admin))
        assert queue.config.environment == "development"
        api.q.DeleteQueue(pb.DeleteQueueRequest(name="old-dev"), metadata=md(admin), timeout=10)


def scrape(node: Node) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=30) as r:
        return str(r.read().decode())


def test_metrics_name_no_queue_or_group_of_another_environment(
    live: tuple[Node, str, Api],
) -> None:
    node, admin, api = live
    dev = api.key(admin, "admin", "development")
    for key, name in ((dev, "secret-dev-project"), (admin, "public-orders")):
        config = pb.QueueConfig(name=name, type=pb.QUEUE_TYPE_WORK)
        api.q.CreateQueue(pb.CreateQueueRequest(config=config), metadata=md(key), timeout=10)
        api.q.CreateGroup(
            pb.CreateGroupRequest(queue=name, group=f"{name}-workers"), metadata=md(key)
        )
        api.q.Publish(pb.PublishRequest(queue=name, messages=one(b"m")), metadata=md(key))
    text = scrape(node)
    assert 'queue="public-orders"' in text
    assert "secret-dev-project" not in text
    folded = re.search(r'^fluxmq_metrics_series_folded\{kind="environment"\} (\S+)$', text, re.M)
    assert folded and float(folded.group(1)) == 1  # its DLQ is made by its first dead letter


def test_names_are_scoped_and_shown_back_by_pure_rules() -> None:
    assert doctest.testmod(namespaces).failed == 0
    assert check_caller_name("orders", "queue", "staging") == "staging:orders"
    assert check_caller_name("staging:orders", "queue", "staging") == "staging:orders"
    assert check_caller_name("orders", "queue", "") == "orders"
    assert check_caller_name("staging:orders", "queue", None) == "staging:orders"
    for name, scope in (("staging:o", ""), ("production:o", "staging"), ("a:b", None), ("", "")):
        with pytest.raises(FluxError) as err:
            check_caller_name(name, "queue", scope)
        assert err.value.reason == "INVALID_ARGUMENT"
    # Only the caller's own scope is taken out of text, and only where a name starts.
    assert caller_text("staging", "queue 'staging:a' and 'staging:b'") == "queue 'a' and 'b'"
    assert caller_text("staging", "in staging: retry") == "in staging: retry"
    assert caller_text("staging", "'development:a'") == "'development:a'"
    # In a publish stream a bad name is answered per request, so it is not refused at the edge:
    # it is made a name no namespace has, never another namespace's name.
    for name, scope in (("production:x", "development"), ("development:x", "")):
        stream = pb.PublishStreamRequest(publish=pb.PublishRequest(queue=name))
        scope_request(stream, scope)
        assert not STORED_QUEUE_NAME_RE.match(stream.publish.queue), stream.publish.queue
    status = apb.ClusterStatus(
        shards=[apb.ShardInfo(queues=["staging:a"])],
        queues=[apb.QueueStatus(name="staging:a", dead_letter_queue="staging:a.dlq")],
    )
    shown = caller_response(status, "staging")
    assert list(shown.shards[0].queues) == ["a"]
    assert (shown.queues[0].name, shown.queues[0].dead_letter_queue) == ("a", "a.dlq")
    assert status.queues[0].name == "staging:a"  # a copy: the servicer's object is untouched
    assert caller_response(status, "development") is status  # nothing of development's
