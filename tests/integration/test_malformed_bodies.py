"""Hostile input against live nodes (auth on): bodies that are not the message, queue names that
are not names, values megabytes long. No call answers INTERNAL or UNKNOWN, no traceback reaches
the log, a log line stays one line, the log grows by a bounded amount per call, and an error
echoes a bounded part of its input. On one node, then on a 3-node cluster on etcd, where queue
names become etcd keys.

The fuzz tests are seeded (the seed is printed; FLUXMQ_FUZZ_SEED replays a run) and bounded in
calls and time."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf import descriptor as d
from google.protobuf import message_factory
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from fluxmq._pb.v1 import admin_pb2, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from tests.etcd_server import EtcdServer
from tests.integration.cluster import Cluster, started
from tests.integration.conftest import Node
from tests.integration.rpc_helpers import rich_error
from tests.integration.test_security import md, secured

SERVICES = [
    pb.DESCRIPTOR.services_by_name["QueueService"],
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"],
]
METHODS: list[d.MethodDescriptor] = [m for s in SERVICES for m in s.methods]
OPEN_METHODS: list[d.MethodDescriptor] = [
    *health_pb2.DESCRIPTOR.services_by_name["Health"].methods,
    *reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"].methods,
]
# Varints that never end: no message type parses them.
CORRUPT = b"\xff" * 11
BAD_NAMES = [" ", "a\0b", "../x", "x\n", "é", "a/b"]
FORGED = "x\n2026-01-01 00:00:00,000 INFO fluxmq.audit [-] admin action DeleteQueue by admin"
CALL_TIMEOUT_S = 5.0
STREAM_TIMEOUT_S = 1.0
NEVER = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
LOG_BYTES_PER_CALL_MAX = 1024  # an audit line is about 250 bytes; nothing else is per call


def path_of(method: d.MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str
    trailers_bytes: int
    stream_errors: list[int]  # PublishStream: codes of the errors inside the responses


def call_raw(
    channel: grpc.Channel,
    method: d.MethodDescriptor,
    bodies: list[bytes],
    metadata: tuple[tuple[str, str], ...],
) -> Outcome:
    """``bodies`` sent as they are (one for unary requests, all for a client stream)."""
    same: Callable[[bytes], bytes] = lambda b: b  # noqa: E731
    kw = {"request_serializer": same, "response_deserializer": same}
    path = path_of(method)
    errors: list[int] = []
    try:
        if method.client_streaming:
            call = channel.stream_stream(path, **kw)(
                iter(bodies), metadata=metadata, timeout=STREAM_TIMEOUT_S
            )
            for raw in call:
                if method.name != "PublishStream":
                    continue
                response = pb.PublishStreamResponse.FromString(raw)
                if response.HasField("error"):
                    errors.append(response.error.code)
        elif method.server_streaming:
            call = channel.unary_stream(path, **kw)(
                bodies[0], metadata=metadata, timeout=STREAM_TIMEOUT_S
            )
            for n, _ in enumerate(call):
                if n >= 2:
                    call.cancel()
                    break
        else:
            channel.unary_unary(path, **kw)(bodies[0], metadata=metadata, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as err:
        trailers = err.trailing_metadata() or ()  # type: ignore[attr-defined]
        size = sum(len(k) + len(v) for k, v in trailers)
        return Outcome(err.code(), err.details() or "", size, errors)  # type: ignore[attr-defined]
    return Outcome(grpc.StatusCode.OK, "", 0, errors)


# -- bodies ------------------------------------------------------------------------------------

SCALARS_INT = [0, 1, 2, 7, 100, 2**31 - 1, 2**32 - 1]
SIGNED_EXTRA = [-1, -(2**31), 2**63 - 1, -(2**63)]


def random_text(rng: random.Random) -> str:
    return rng.choice(
        [
            "fz",
            "fz.dlq",
            "g1",
            "",
            *BAD_NAMES,
            FORGED,
            "y\n" * rng.randint(1, 64 * 1024),  # up to 128 KiB of line breaks
            "".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(1, 20))),
        ]
    )


def fill(msg: Message, rng: random.Random, depth: int = 0) -> None:
    """Random values in a random half of ``msg``'s fields, nested messages three deep."""
    for field in msg.DESCRIPTOR.fields:
        if rng.random() < 0.5:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            fill_map(getattr(msg, field.name), field.message_type, rng)
        elif field.is_repeated:
            for _ in range(rng.randint(0, 3)):
                if field.message_type is not None:
                    if depth < 3:
                        fill(getattr(msg, field.name).add(), rng, depth + 1)
                else:
                    getattr(msg, field.name).append(scalar(field, rng))
        elif field.message_type is not None:
            if depth < 3:
                fill(getattr(msg, field.name), rng, depth + 1)
        else:
            setattr(msg, field.name, scalar(field, rng))


def fill_map(container: object, entry: d.Descriptor, rng: random.Random) -> None:
    key_field, value_field = entry.fields_by_name["key"], entry.fields_by_name["value"]
    for _ in range(rng.randint(0, 3)):
        key = scalar(key_field, rng)
        if value_field.message_type is None:
            container[key] = scalar(value_field, rng)  # type: ignore[index]
        else:
            fill(container[key], rng, 3)  # type: ignore[index]


def scalar(field: d.FieldDescriptor, rng: random.Random) -> object:
    t = field.type
    if t == field.TYPE_STRING:
        return random_text(rng)
    if t == field.TYPE_BYTES:
        return rng.randbytes(rng.randint(0, 64))
    if t == field.TYPE_BOOL:
        return rng.random() < 0.5
    if t == field.TYPE_ENUM:
        return rng.choice([v.number for v in field.enum_type.values] + [99])
    if t in (field.TYPE_DOUBLE, field.TYPE_FLOAT):
        return rng.choice([0.0, -1.0, 1e300, float("nan")])
    signed = t in (field.TYPE_INT32, field.TYPE_INT64, field.TYPE_SINT32, field.TYPE_SINT64)
    values = SCALARS_INT + (SIGNED_EXTRA if signed else [2**64 - 1])
    bits32 = t in (field.TYPE_INT32, field.TYPE_UINT32, field.TYPE_SINT32, field.TYPE_FIXED32)
    if bits32:
        values = [v for v in values if (-(2**31) <= v < 2**31 if signed else 0 <= v < 2**32)]
    return rng.choice(values)


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def wrong_type(descriptor: d.Descriptor, rng: random.Random) -> bytes:
    """A known field under another wire type than its own, or a string with bad UTF-8."""
    fields = list(descriptor.fields) or [None]
    field = rng.choice(fields)
    number = field.number if field is not None else 1
    wire = rng.choice([0, 1, 2, 5])
    payload = {
        0: varint(rng.choice([0, 1, 2**63])),
        1: rng.randbytes(8),
        2: varint(4) + rng.choice([b"\xff\xfe\xfd\xfc", b"\xc0\xaf\x00a", rng.randbytes(4)]),
        5: rng.randbytes(4),
    }[wire]
    return varint(number << 3 | wire) + payload


def body(method: d.MethodDescriptor, rng: random.Random) -> bytes:
    cls = message_factory.GetMessageClass(method.input_type)
    msg = cls()
    fill(msg, rng)
    valid = msg.SerializeToString()
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randint(1, 64))
    if kind == 1 and len(valid) > 1:
        return valid[: rng.randrange(1, len(valid))]  # truncated
    if kind == 2:
        bad = wrong_type(method.input_type, rng)
        return bad + valid if rng.random() < 0.5 else valid + bad
    return valid  # well-formed, with hostile values


# -- nodes -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, str]]:
    node, admin = secured(tmp_path_factory.mktemp("hostile-single"))
    node.start()
    try:
        yield node, admin
    finally:
        node.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three nodes on one etcd, auth on (the cluster default), groups provisioned on demand."""
    with EtcdServer() as etcd:
        c = Cluster(
            tmp_path_factory.mktemp("hostile-cluster"), 3,
            "--etcd", etcd.endpoint, "--auto-provision-groups",
        )  # fmt: skip
        with started(c):
            yield c


def log_size(node: Node) -> int:
    return node.log_path.stat().st_size


def assert_clean_log(node: Node, since: int, calls: int) -> None:
    """No traceback, no line longer than a bounded message, bounded growth per call."""
    with open(node.log_path, "rb") as f:
        f.seek(since)
        added = f.read()
    text = added.decode("utf-8", "replace")
    assert "Traceback" not in text, text[-4000:]
    assert "Unexpected" not in text, text[-4000:]  # grpc's own "Unexpected error in servicer"
    assert max((len(ln) for ln in text.splitlines()), default=0) < 5000
    assert len(added) <= calls * LOG_BYTES_PER_CALL_MAX, f"{len(added)} bytes for {calls} calls"


def existing_queue(node: Node, key: str) -> None:
    """Queue "fz" (with a message and consumer group "g1") for the fuzzed requests that name
    them to reach the code behind the lookups."""
    with grpc.insecure_channel(node.address) as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        try:
            stub.CreateQueue(
                pb.CreateQueueRequest(config=pb.QueueConfig(name="fz", partitions=2)),
                metadata=md(key),
                timeout=10,
            )
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.ALREADY_EXISTS, err
        stub.Publish(
            pb.PublishRequest(queue="fz", messages=[pb.PublishMessage(value=b"v")]),
            metadata=md(key),
            timeout=10,
        )
        try:
            stub.CreateGroup(pb.CreateGroupRequest(queue="fz", group="g1"), metadata=md(key))
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.ALREADY_EXISTS, err


def fuzz(nodes: list[Node], key: str, calls: int) -> None:
    seed = int(os.environ.get("FLUXMQ_FUZZ_SEED", time.time_ns() % 2**32))
    print(f"fuzz seed {seed} (replay: FLUXMQ_FUZZ_SEED={seed})")
    rng = random.Random(seed)
    existing_queue(nodes[0], key)
    since = [log_size(n) for n in nodes]
    channels = [grpc.insecure_channel(n.address) for n in nodes]
    seen: dict[str, set[str]] = {}
    deadline = time.monotonic() + 120
    try:
        for i in range(calls):
            assert time.monotonic() < deadline, f"fuzz over its time bound after {i} calls"
            method = METHODS[i % len(METHODS)]  # every RPC, in turn
            bodies = [body(method, rng) for _ in range(rng.randint(1, 3))]
            metadata = md(key) if rng.random() < 0.9 else ()
            at = rng.randrange(len(nodes))
            out = call_raw(channels[at], method, bodies, metadata)
            where = f"seed {seed}, call {i}: {method.name} on node {at} {bodies[0][:60]!r}"
            assert out.code not in NEVER, f"{where} -> {out.code} {out.details[:300]}"
            assert all(c not in (2, 13) for c in out.stream_errors), f"{where} -> {out}"
            assert len(out.details) <= 4096, f"{where}: {len(out.details)} characters of details"
            assert out.trailers_bytes < 8192, f"{where}: {out.trailers_bytes} bytes of trailers"
            seen.setdefault(method.name, set()).add(out.code.name)
    finally:
        for ch in channels:
            ch.close()
    print({m: sorted(c) for m, c in sorted(seen.items())})
    assert set(seen) == {m.name for m in METHODS}
    for node, start in zip(nodes, since, strict=True):
        assert_clean_log(node, start, calls)


# -- one node ----------------------------------------------------------------------------------


def test_a_body_that_does_not_parse_is_malformed_request_on_every_rpc_after_the_key_check(
    single: tuple[Node, str],
) -> None:
    node, admin = single
    since = log_size(node)
    with grpc.insecure_channel(node.address) as ch:
        for method in METHODS:
            out = call_raw(ch, method, [CORRUPT], md(admin))
            assert out.code == grpc.StatusCode.INVALID_ARGUMENT, (method.name, out)
            assert f"not a valid {method.input_type.full_name}" in out.details, out
            # A caller without a valid key learns nothing, not even that its bytes are bad.
            out = call_raw(ch, method, [CORRUPT], ())
            assert out.code == grpc.StatusCode.UNAUTHENTICATED, (method.name, out)
        # The rich status names the reason.
        stub = ch.unary_unary("/fluxmq.v1.QueueService/GetQueue", request_serializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as raised:
            stub(CORRUPT, metadata=md(admin), timeout=CALL_TIMEOUT_S)
        err = rich_error(raised.value)
        assert err.reason == "MALFORMED_REQUEST"
        assert err.metadata["message_type"] == "fluxmq.v1.GetQueueRequest"
        # The services that need no key (health, reflection) refuse such bodies the same way.
        for method in OPEN_METHODS:
            out = call_raw(ch, method, [CORRUPT], ())
            assert out.code == grpc.StatusCode.INVALID_ARGUMENT, (method.name, out)
    assert_clean_log(node, since, 2 * len(METHODS) + 1 + len(OPEN_METHODS))


def test_a_publish_stream_with_a_body_that_does_not_parse_ends_with_malformed_request(
    single: tuple[Node, str],
) -> None:
    node, admin = single
    good = pb.PublishStreamRequest(sequence=1, publish=pb.PublishRequest(queue="absent"))
    with grpc.insecure_channel(node.address) as ch:
        out = call_raw(
            ch,
            pb.DESCRIPTOR.services_by_name["QueueService"].methods_by_name["PublishStream"],
            [good.SerializeToString(), CORRUPT],
            md(admin),
        )
    assert out.code == grpc.StatusCode.INVALID_ARGUMENT, out
    assert "not a valid fluxmq.v1.PublishStreamRequest" in out.details


def test_a_queue_name_cannot_forge_a_log_line_and_refusals_are_logged_as_refused(
    single: tuple[Node, str],
) -> None:
    node, admin = single
    since = log_size(node)
    with grpc.insecure_channel(node.address) as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        for metadata in [(), md("fmq_live_sk_" + "A" * 32), md(admin)]:
            with pytest.raises(grpc.RpcError):
                stub.DeleteQueue(pb.DeleteQueueRequest(name=FORGED), metadata=metadata, timeout=5)
    audit: list[str] = []
    for _ in range(500):  # a call's audit line is written after its status went out
        with open(node.log_path, "rb") as f:
            f.seek(since)
            lines = f.read().decode().splitlines()
        audit = [ln for ln in lines if " INFO fluxmq.audit " in ln]
        if len(audit) >= 3:
            break
        time.sleep(0.01)
    assert not [ln for ln in lines if ln.startswith("2026-01-01")], lines  # no forged line
    assert len(audit) == 3, lines
    assert all("queue x\\n2026-01-01" in ln for ln in audit), audit
    refused = audit[:2]
    assert all("REFUSED for a caller without a valid key" in ln for ln in refused), refused
    assert all("UNAUTHENTICATED" in ln and "auth off" not in ln for ln in refused), refused
    assert f"DeleteQueue by {admin[12:20]}" in audit[2] and "-> INVALID_ARGUMENT" in audit[2]


def test_a_huge_queue_name_is_refused_with_a_bounded_echo_and_a_bounded_log_line(
    single: tuple[Node, str],
) -> None:
    node, admin = single
    name = "y" * (1 << 20)
    since = log_size(node)
    with grpc.insecure_channel(node.address) as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        for call in (stub.DeleteQueue, stub.GetQueue):
            with pytest.raises(grpc.RpcError) as raised:
                call(pb.GetQueueRequest(name=name), metadata=md(admin), timeout=10)
            err = rich_error(raised.value)
            assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.fields == ["name"]
            assert len(err.message) <= 1024 and err.message.startswith("name: 'yyy")
            assert all(len(v) <= 256 for v in err.metadata.values())
    assert log_size(node) - since < 2048


def test_fuzzed_bodies_on_every_rpc_of_one_node_never_get_internal_nor_a_traceback(
    single: tuple[Node, str],
) -> None:
    node, admin = single
    fuzz([node], admin, calls=10 * len(METHODS))


# -- three nodes on etcd -----------------------------------------------------------------------


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_bad_queue_name_is_invalid_argument_naming_the_field_on_every_node_of_a_cluster(
    cluster: Cluster, name: str
) -> None:
    since = [log_size(n) for n in cluster.nodes]
    for node in cluster.nodes:
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            for call, request, field in [
                (stub.GetQueue, pb.GetQueueRequest(name=name), "name"),
                (stub.DeleteQueue, pb.DeleteQueueRequest(name=name), "name"),
                (stub.Fetch, pb.FetchRequest(queue=name), "queue"),
                (stub.CreateQueue, pb.CreateQueueRequest(config=pb.QueueConfig(name=name)),
                 "config.name"),
            ]:  # fmt: skip
                with pytest.raises(grpc.RpcError) as raised:
                    call(request, timeout=10)
                err = rich_error(raised.value)
                assert err.code == grpc.StatusCode.INVALID_ARGUMENT, (name, err)
                assert err.fields == [field], (name, err)
            # In a publish stream the name is checked per request, and the stream goes on.
            replies = list(
                stub.PublishStream(
                    iter([pb.PublishStreamRequest(sequence=1, publish=pb.PublishRequest(
                        queue=name, messages=[pb.PublishMessage(value=b"v")]))]),
                    timeout=10,
                )
            )  # fmt: skip
            assert replies[0].error.reason == "INVALID_ARGUMENT", replies
    for node, start in zip(cluster.nodes, since, strict=True):
        assert_clean_log(node, start, 20)


def test_fuzzed_bodies_on_every_rpc_of_a_cluster_never_get_internal_nor_a_traceback(
    cluster: Cluster,
) -> None:
    fuzz(cluster.nodes, cluster.api_key, calls=6 * len(METHODS))
