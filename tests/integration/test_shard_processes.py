"""A single node with several shard processes (``shard_processes = 2``): each runs a local shard
of its own; a queue lives in one of them; the front end routes each call to the one that holds
its queue; a shard process killed under load is restarted and loses nothing acknowledged, while
the other keeps serving."""

from __future__ import annotations

import os
import random
import signal
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.server.shard_process.siblings import home_process
from fluxmq.server.shard_process.supervisor import LOCAL_SHARDS_DIR, pid_file

from .conftest import Node
from .test_crash import BATCHES, batch_values
from .test_security import md, serving_secured
from .test_shard_process import _check, _load, alive, error_info, kill_after

COUNT = 2


def names_in(index: int, how_many: int) -> list[str]:
    """Queue names a node with COUNT shard processes creates in shard process ``index``."""
    names = (f"queue-{i}" for i in range(1000))
    return [n for n in names if home_process(n, COUNT) == index][:how_many]


def process_dir(node: Node, index: int) -> Path:
    return node.data_dir if index == 0 else node.data_dir / LOCAL_SHARDS_DIR / str(index)


def shard_pid(node: Node, index: int) -> int:
    return int(Path(pid_file(str(process_dir(node, index)), index)).read_text().strip())


@pytest.fixture
def node(tmp_path: Path) -> Node:
    n = Node(tmp_path / "n", "--shard-processes", str(COUNT))
    n.start()
    yield n  # type: ignore[misc]
    n.stop()


def publish(stub: queue_pb2_grpc.QueueServiceStub, queue: str, value: bytes) -> pb.PublishResult:
    res = stub.Publish(pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(value=value)]))
    return res.results[0]


def test_each_queue_lives_in_one_shard_process_and_every_call_reaches_it(node: Node) -> None:
    placed = {0: names_in(0, 2), 1: names_in(1, 2)}
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        for names in placed.values():
            for name in names:
                stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name=name)))
        for names in placed.values():
            for name in names:
                assert publish(stub, name, name.encode()).offset == 0
                fetched = stub.Fetch(pb.FetchRequest(queue=name, partition=0, max_messages=10))
                assert [r.value for r in fetched.records] == [name.encode()]
        listed = stub.ListQueues(pb.ListQueuesRequest()).queues
        assert sorted(q.config.name for q in listed) == sorted(placed[0] + placed[1])
        limited = stub.ListQueues(pb.ListQueuesRequest(limit=3))
        assert len(limited.queues) == 3 and limited.next_page_token
        status = admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(
            admin_pb2.GetClusterStatusRequest(skip_digest=True)
        )
        by_shard = {q.name: q.shard_id for q in status.queues}
        assert {s.shard_id for s in status.shards} == {"local", "local-1"}
        for index, names in placed.items():
            for name in names:
                assert by_shard[name] == ("local" if index == 0 else f"local-{index}")
        with pytest.raises(grpc.RpcError) as err:  # wherever it is asked, it exists once
            stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name=placed[1][0])))
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert (process_dir(node, 1) / "data.mdb").exists()


def test_a_publish_stream_reaches_queues_in_every_shard_process(node: Node) -> None:
    first, other = names_in(0, 1)[0], names_in(1, 1)[0]
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        for name in (first, other):
            stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name=name)))
        requests = [
            pb.PublishStreamRequest(
                sequence=i,
                publish=pb.PublishRequest(
                    queue=name, messages=[pb.PublishMessage(value=b"%d" % i)]
                ),
            )
            for i, name in enumerate((first, other, other, first))
        ]
        answers = list(stub.PublishStream(iter(requests), timeout=20))
        assert [a.sequence for a in answers] == [0, 1, 2, 3]
        assert all(not a.HasField("error") for a in answers), answers
        for name, values in ((first, [b"0", b"3"]), (other, [b"1", b"2"])):
            fetched = stub.Fetch(pb.FetchRequest(queue=name, partition=0, max_messages=10))
            assert [r.value for r in fetched.records] == values


def test_a_transaction_spans_one_shard_process_and_a_named_local_shard_shares_one(
    node: Node,
) -> None:
    first, other = names_in(0, 1)[0], names_in(1, 1)[0]
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        for name in (first, other):
            stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name=name)))
        config = pb.QueueConfig(name="beside-" + other)
        config.replication.group = "local-1"  # beside ``other``, whatever its name hashes to
        stub.CreateQueue(pb.CreateQueueRequest(config=config))

        def transact(*queues: str) -> pb.TransactResponse:
            return stub.Transact(
                pb.TransactRequest(
                    publishes=[
                        pb.PublishRequest(queue=q, messages=[pb.PublishMessage(value=b"t")])
                        for q in queues
                    ]
                )
            )

        with pytest.raises(grpc.RpcError) as err:
            transact(first, other)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(err.value)[0] == "TRANSACTION_SPANS_GROUPS"
        for queue in (first, other):  # nothing of it was written
            fetched = stub.Fetch(pb.FetchRequest(queue=queue, partition=0, max_messages=10))
            assert not fetched.records
        done = transact(other, "beside-" + other)
        assert len(done.publishes) == 2


def test_acknowledged_messages_survive_kill_9_of_one_shard_process_under_load(
    node: Node,
) -> None:
    seed = random.randrange(1 << 30)
    values = [batch_values(b, random.Random(seed + b)) for b in range(BATCHES)]
    holder = home_process("crash", COUNT)  # the queue _load writes to
    bystander = 1 - holder
    first, untouched = shard_pid(node, holder), shard_pid(node, bystander)
    on_acked, killed = kill_after(first, 30)
    acked = _load(node, values, on_acked)
    assert killed.is_set(), f"seed {seed}: the shard process was never killed"
    assert len(acked) == BATCHES, f"seed {seed}: {BATCHES - len(acked)} batches never acknowledged"
    assert shard_pid(node, holder) != first and not alive(first), "a new shard process serves"
    assert shard_pid(node, bystander) == untouched, "the other shard process kept running"
    _check(node, values, acked, seed)


def test_a_restarted_node_serves_every_queue_from_its_shard_process(tmp_path: Path) -> None:
    node = Node(tmp_path / "n", "--shard-processes", str(COUNT))
    node.start()
    names = names_in(0, 1) + names_in(1, 1)
    try:
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            for name in names:
                stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name=name)))
                publish(stub, name, name.encode())
        node.kill9()
        node.start()
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            for name in names:
                fetched = stub.Fetch(pb.FetchRequest(queue=name, partition=0, max_messages=10))
                assert [r.value for r in fetched.records] == [name.encode()]
    finally:
        node.stop()


def test_a_node_with_fewer_shard_processes_than_its_local_shards_stops_and_says_why(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path / "n", "--shard-processes", str(COUNT))
    node.start()
    node.stop()
    assert (process_dir(node, 1) / "data.mdb").exists()
    fewer = Node(tmp_path / "n", "--shard-processes", "1")
    fewer.spawn()
    assert fewer.proc is not None
    assert fewer.proc.wait(60) == 1
    assert "set shard_processes to at least 2" in fewer.log_path.read_text()


def scrape(node: Node, path: str) -> tuple[int, str]:
    try:
        url = f"http://127.0.0.1:{node.metrics_port}{path}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_the_metrics_port_serves_every_shard_process_labelled_with_it(node: Node) -> None:
    placed = names_in(0, 1) + names_in(1, 1)
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        for name in placed:
            stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name=name)))
            publish(stub, name, b"x")
    assert scrape(node, "/readyz")[0] == 200
    code, text = scrape(node, "/metrics")
    assert code == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    up = {s.labels["shard_process"]: s.value for s in families["fluxmq_shard_process_up"].samples}
    assert up == {"0": 1.0, "1": 1.0}
    high = {
        s.labels["queue"]: (s.labels["shard_process"], s.value)
        for s in families["fluxmq_partition_high_watermark"].samples
    }
    assert high[placed[0]] == ("0", 1.0) and high[placed[1]] == ("1", 1.0)
    os.kill(shard_pid(node, 1), signal.SIGSTOP)  # holds still: its part of a scrape is late
    try:
        assert scrape(node, "/readyz")[0] in (200, 503)  # never hangs
        code, text = scrape(node, "/metrics")
        assert code == 200
        up_now = {
            s.labels["shard_process"]: s.value
            for f in text_string_to_metric_families(text)
            if f.name == "fluxmq_shard_process_up"
            for s in f.samples
        }
        assert up_now == {"0": 1.0, "1": 0.0}
    finally:
        os.kill(shard_pid(node, 1), signal.SIGCONT)


def test_api_keys_hold_in_every_shard_process_and_a_revocation_reaches_them_all_at_once(
    tmp_path: Path,
) -> None:
    with serving_secured(tmp_path, "--shard-processes", str(COUNT)) as (_node, admin, api):
        placed = names_in(0, 1) + names_in(1, 1)
        for name in placed:
            api.q.CreateQueue(
                pb.CreateQueueRequest(config=pb.QueueConfig(name=name)), metadata=md(admin)
            )
        producer = api.key(admin, "producer")  # minted by one shard process, known to both
        one = [pb.PublishMessage(value=b"x")]
        for name in placed:
            api.q.Publish(
                pb.PublishRequest(queue=name, messages=one), metadata=md(producer), timeout=10
            )
        reader = api.key(admin, "read-only")
        tail = api.q.Tail(pb.TailRequest(queue=placed[1]), metadata=md(reader), timeout=30)
        assert [r.value for r in next(tail).records] == [b"x"]
        for key in (producer, reader):
            api.a.RevokeApiKey(
                apb.RevokeApiKeyRequest(key_id=key[12:20]), metadata=md(admin), timeout=10
            )
        # Refused at once by every shard process, not when its watch catches up.
        for name in placed:
            with pytest.raises(grpc.RpcError) as err:
                api.q.Publish(
                    pb.PublishRequest(queue=name, messages=one), metadata=md(producer), timeout=10
                )
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        api.q.Publish(
            pb.PublishRequest(queue=placed[1], messages=one), metadata=md(admin), timeout=10
        )
        with pytest.raises(grpc.RpcError) as err:  # the open stream ends at its next message
            for _ in range(100):
                next(tail)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_another_environments_key_sees_its_queues_in_every_shard_process(
    tmp_path: Path,
) -> None:
    with serving_secured(tmp_path, "--shard-processes", str(COUNT)) as (_node, admin, api):
        staging = api.key(admin, "admin", environment="staging")
        names = names_in(0, 2) + names_in(1, 2)
        for name in names:
            api.q.CreateQueue(
                pb.CreateQueueRequest(config=pb.QueueConfig(name=name)), metadata=md(staging)
            )
        status = api.a.GetClusterStatus(
            admin_pb2.GetClusterStatusRequest(skip_digest=True), metadata=md(staging)
        )
        shown = sorted(q for s in status.shards for q in s.queues)
        assert shown == sorted(names), shown
        assert sorted(q.name for q in status.queues) == sorted(names)
        listed = api.q.ListQueues(pb.ListQueuesRequest(), metadata=md(staging)).queues
        assert sorted(q.config.name for q in listed) == sorted(names)
        assert not api.q.ListQueues(pb.ListQueuesRequest(), metadata=md(admin)).queues


def test_a_name_lives_in_one_shard_process_whatever_the_create_says(node: Node) -> None:
    other = names_in(1, 1)[0]
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name=other)))
        again = pb.QueueConfig(name=other)
        again.replication.group = "local"  # another local shard than the one it is in
        # Internal marks from a client: ignored (only a shard process of the node sets them).
        spoofed = (("x-fluxmq-shard-process", "0"), ("x-fluxmq-forwarded", "1"))
        for metadata in ((), spoofed):
            with pytest.raises(grpc.RpcError) as err:
                stub.CreateQueue(pb.CreateQueueRequest(config=again), metadata=metadata)
            assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        nowhere = pb.QueueConfig(name="elsewhere")
        nowhere.replication.group = "local-7"
        with pytest.raises(grpc.RpcError) as err:
            stub.CreateQueue(pb.CreateQueueRequest(config=nowhere))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "no local shard 'local-7'" in (err.value.details() or "")
        status = admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(
            admin_pb2.GetClusterStatusRequest(skip_digest=True)
        )
        assert [q.name for q in status.queues].count(other) == 1


def test_a_queue_is_created_beside_its_dead_letter_queue(node: Node) -> None:
    # The DLQ hashes to one shard process, its queue to the other: the queue follows its DLQ,
    # whose messages its shard writes.
    dlq = names_in(1, 1)[0]
    origin = names_in(0, 1)[0]
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        stub.CreateQueue(
            pb.CreateQueueRequest(config=pb.QueueConfig(name=dlq, dead_letter_disabled=True))
        )
        config = pb.QueueConfig(name=origin, dead_letter_queue=dlq)
        stub.CreateQueue(pb.CreateQueueRequest(config=config))
        status = admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(
            admin_pb2.GetClusterStatusRequest(skip_digest=True)
        )
        shard_of = {q.name: q.shard_id for q in status.queues}
        assert shard_of[origin] == shard_of[dlq] == "local-1"
        pinned = pb.QueueConfig(name=origin + "-pinned", dead_letter_queue=dlq)
        pinned.replication.group = "local"
        with pytest.raises(grpc.RpcError) as err:
            stub.CreateQueue(pb.CreateQueueRequest(config=pinned))
        assert error_info(err.value)[0] == "REPLICATION_UNSATISFIABLE"
