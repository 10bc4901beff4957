"""The SDK's security options against a fake broker (a gRPC server in this process that records
what it receives): the API key on every call, the broker's RetryInfo honoured, the key never
shown, TLS and mutual TLS. Nothing here needs the broker's own auth code.

``make_pki`` and ``FakeBroker`` are shared with tests/cli/test_keys.py."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc, queue_pb2, queue_pb2_grpc
from fluxmq.client import (
    NO_RETRY,
    AsyncClient,
    Client,
    FluxMQError,
    RateLimited,
    RetryPolicy,
    Unavailable,
    mask_key,
)
from tests.certs import LOCAL_SANS, Authority

# A key in the documented shape: fmq_live_sk_ + 32 base62 (its first 8 are the public id).
KEY = "fmq_live_sk_Ab3dE5gH9jKlMn0pQrStUvWxYz012345"
KEY_ID = "Ab3dE5gH"
OTHER_KEY = "fmq_test_sk_Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Jh1Gf0Ed"


# -- a fake broker ----------------------------------------------------------------------------


@dataclass
class Call:
    method: str
    metadata: dict[str, str]
    at: float  # time.monotonic() when the call arrived
    request: Any
    peer_cert_cn: str = ""


def rich_abort(
    context: grpc.ServicerContext,
    code: grpc.StatusCode,
    reason: str,
    message: str,
    *,
    retry_ms: int | None = None,
    violations: tuple[tuple[str, str], ...] = (),
    request_id: str = "fakereq1",
) -> None:
    """Ends the call like the broker does: google.rpc.Status with ErrorInfo (domain fluxmq),
    BadRequest, RetryInfo; the request id in the trailers."""
    details: list[any_pb2.Any] = []
    info = error_details_pb2.ErrorInfo(
        reason=reason,
        domain="fluxmq",
        metadata={"request_id": request_id, "retriable": "true" if retry_ms else "false"},
    )
    details.append(_pack(info))
    if violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                for f, d in violations
            ]
        )
        details.append(_pack(bad))
    if retry_ms is not None:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(retry_ms)
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    status = rpc_status.to_status(
        status_pb2.Status(code=code.value[0], message=message, details=details)
    )
    trailers = (*status.trailing_metadata, ("x-request-id", request_id))
    context.abort_with_status(_Status(status.code, status.details, trailers))


class _Status(
    collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status
):
    pass


def _pack(msg: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(msg)
    return packed


@dataclass
class FakeBroker(queue_pb2_grpc.QueueServiceServicer, admin_pb2_grpc.AdminServiceServicer):
    """Records every call (method, metadata, arrival time); answers Publish, CreateQueue,
    ListQueues, GetClusterStatus and the key RPCs. ``rate_limit[method] = [ms, ms...]``: the
    next calls of ``method`` are refused with RATE_LIMITED and those RetryInfo delays."""

    calls: list[Call] = field(default_factory=list)
    rate_limit: dict[str, list[int]] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)  # GetClusterStatus's node list
    leader: str = ""  # named in x-fluxmq-leader of Publish answers
    keys: list[admin_pb2.ApiKeyInfo] = field(default_factory=list)
    fail: dict[str, Callable[[grpc.ServicerContext], None]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _enter(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        cn = ""
        auth = context.auth_context()
        for der in auth.get("x509_common_name", []):
            cn = der.decode()
        with self.lock:
            self.calls.append(
                Call(method, dict(context.invocation_metadata()), time.monotonic(), request, cn)
            )
            pending = self.rate_limit.get(method)
            delay = pending.pop(0) if pending else None
        if delay is not None:
            rich_abort(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "RATE_LIMITED",
                f"key {KEY_ID} is over its publish rate",
                retry_ms=delay,
            )
        failure = self.fail.get(method)
        if failure is not None:
            failure(context)

    def of(self, method: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.method == method]

    # QueueService
    def Publish(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter("Publish", request, context)
        if self.leader:
            context.set_trailing_metadata((("x-fluxmq-leader", self.leader),))
        n = len(self.of("Publish"))
        if request.HasField("encoded"):
            return queue_pb2.PublishResponse(
                batch=queue_pb2.PublishedBatch(
                    partition=request.encoded.partition,
                    base_offset=n * 1000,
                    count=request.encoded.count,
                )
            )
        return queue_pb2.PublishResponse(
            results=[
                queue_pb2.PublishResult(partition=0, offset=n * 1000 + i)
                for i in range(len(request.messages))
            ]
        )

    def CreateQueue(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter("CreateQueue", request, context)
        return queue_pb2.Queue(config=request.config, queue_id=1)

    def ListQueues(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter("ListQueues", request, context)
        return queue_pb2.ListQueuesResponse(
            queues=[queue_pb2.Queue(config=queue_pb2.QueueConfig(name="orders"))]
        )

    # AdminService
    def GetClusterStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter("GetClusterStatus", request, context)
        return admin_pb2.ClusterStatus(
            node_id="fake",
            nodes=[admin_pb2.NodeEntry(node_id=a, grpc_address=a) for a in self.nodes],
        )

    def CreateApiKey(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter("CreateApiKey", request, context)
        env = request.environment or "production"
        kind = "live" if env == "production" else "test"
        key_id = f"New{len(self.keys):05d}"
        info = admin_pb2.ApiKeyInfo(
            key_id=key_id,
            prefix=f"fmq_{kind}_sk_{key_id}",
            name=request.name,
            environment=env,
            role=request.role,
            tier=request.tier or "default",
            created_ms=1_767_225_600_000 + len(self.keys),
        )
        self.keys.append(info)
        secret = f"fmq_{kind}_sk_{key_id}" + "S3cr3tS3cr3tS3cr3tS3cr3t"
        return admin_pb2.CreateApiKeyResponse(key=secret, info=info)

    def ListApiKeys(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter("ListApiKeys", request, context)
        shown = [k for k in self.keys if request.include_revoked or not k.revoked_ms]
        return admin_pb2.ListApiKeysResponse(keys=shown)

    def RevokeApiKey(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter("RevokeApiKey", request, context)
        for k in self.keys:
            if k.key_id == request.key_id:
                k.revoked_ms = k.revoked_ms or 1_767_225_700_000
                return k
        rich_abort(
            context,
            grpc.StatusCode.NOT_FOUND,
            "API_KEY_NOT_FOUND",
            f"no API key {request.key_id}",
        )
        raise AssertionError("unreachable")


@dataclass
class Served:
    broker: FakeBroker
    server: grpc.Server
    address: str

    def stop(self) -> None:
        self.server.stop(grace=None).wait(5)


def serve(
    broker: FakeBroker | None = None, credentials: grpc.ServerCredentials | None = None
) -> Served:
    broker = broker or FakeBroker()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    queue_pb2_grpc.add_QueueServiceServicer_to_server(broker, server)  # type: ignore[no-untyped-call]
    admin_pb2_grpc.add_AdminServiceServicer_to_server(broker, server)  # type: ignore[no-untyped-call]
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return Served(broker, server, f"127.0.0.1:{port}")


@pytest.fixture
def fake() -> Iterator[Served]:
    served = serve()
    yield served
    served.stop()


# -- certificates -----------------------------------------------------------------------------


@dataclass
class Pki:
    ca: Path  # CA certificate (PEM)
    server_cert: Path
    server_key: Path
    client_cert: Path  # signed by the CA, CN "fluxmq-client"
    client_key: Path
    other_ca: Path  # a CA that signed nothing here

    def server_credentials(self, *, mtls: bool = False) -> grpc.ServerCredentials:
        pair = (self.server_key.read_bytes(), self.server_cert.read_bytes())
        if not mtls:
            return grpc.ssl_server_credentials([pair])
        return grpc.ssl_server_credentials(
            [pair], root_certificates=self.ca.read_bytes(), require_client_auth=True
        )


def make_pki(directory: Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1 / localhost and a client certificate, both
    signed by the CA (no extended key usage); and an unrelated CA."""
    ca = Authority("FluxMQ test CA")
    server = ca.issue("127.0.0.1", sans=LOCAL_SANS).write(directory, "server")
    client = ca.issue("fluxmq-client").write(directory, "client")
    return Pki(
        ca=ca.write(directory / "ca.pem"),
        server_cert=server.cert,
        server_key=server.key,
        client_cert=client.cert,
        client_key=client.key,
        other_ca=Authority("Other CA").write(directory / "other-ca.pem"),
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# -- the API key ------------------------------------------------------------------------------


def bearer(call: Call) -> str | None:
    return call.metadata.get("authorization")


async def test_the_key_goes_with_every_call(fake: Served) -> None:
    async with AsyncClient(fake.address, api_key=KEY) as client:  # GetClusterStatus first
        await client.admin.create_queue("orders")
        await client.publish("orders", b"x")
        await client.publish_batch("orders", [b"a", b"b"])
        async with client.producer("orders") as producer:
            await producer.send(b"buffered")
        assert [q.config.name async for q in client.admin.list_queues()] == ["orders"]
    methods = [c.method for c in fake.broker.calls]
    assert methods[0] == "GetClusterStatus"  # node discovery carries the key too
    assert {"CreateQueue", "Publish", "ListQueues"} <= set(methods)
    assert all(bearer(c) == f"Bearer {KEY}" for c in fake.broker.calls), fake.broker.calls


async def test_the_key_comes_from_the_environment_by_default(
    fake: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLUXMQ_API_KEY", f"  {KEY}\n")  # read from a file: whitespace dropped
    async with AsyncClient(fake.address) as client:
        await client.publish("q", b"x")
    # api_key="" sends none, whatever the environment says; another key wins over it
    async with AsyncClient(fake.address, api_key="") as client:
        await client.publish("q", b"y")
    async with AsyncClient(fake.address, api_key=OTHER_KEY) as client:
        await client.publish("q", b"z")
    monkeypatch.delenv("FLUXMQ_API_KEY")
    async with AsyncClient(fake.address) as client:
        await client.publish("q", b"w")
    sent = [bearer(c) for c in fake.broker.of("Publish")]
    assert sent == [f"Bearer {KEY}", None, f"Bearer {OTHER_KEY}", None]


async def test_discovered_nodes_and_leaders_get_the_key_too(fake: Served) -> None:
    """Every channel the SDK opens carries the key: the nodes GetClusterStatus lists and the
    leader a Publish answer names (x-fluxmq-leader)."""
    leader = serve()
    try:
        fake.broker.nodes = [fake.address, leader.address]
        fake.broker.leader = leader.address
        async with AsyncClient(fake.address, api_key=KEY) as client:
            assert leader.address in client.addresses  # discovered
            await client.publish("orders", b"1")  # to the seed; its answer names the leader
            await client.publish("orders", b"2")  # to the leader
            assert client.transport.leader_of("orders") == leader.address
        assert len(leader.broker.of("Publish")) == 1
        for c in fake.broker.calls + leader.broker.calls:
            assert bearer(c) == f"Bearer {KEY}", c
    finally:
        leader.stop()


def test_the_blocking_client_sends_the_key(fake: Served) -> None:
    with Client(fake.address, api_key=KEY) as client:
        client.publish("q", b"x")
        assert [q.config.name for q in client.admin.list_queues()] == ["orders"]
    assert fake.broker.calls and all(bearer(c) == f"Bearer {KEY}" for c in fake.broker.calls)


# -- RetryInfo --------------------------------------------------------------------------------


async def test_a_rate_limited_publish_waits_the_advised_delay_then_succeeds(
    fake: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="fluxmq")
    fake.broker.rate_limit["Publish"] = [200]
    async with AsyncClient(fake.address, api_key=KEY) as client:
        started = time.monotonic()
        result = await client.publish("orders", {"n": 1})
        elapsed = time.monotonic() - started
        assert client.transport.retries == 1
    first, second = fake.broker.of("Publish")
    assert second.at - first.at >= 0.2  # waited at least the advised 200 ms
    assert elapsed >= 0.2
    assert result.offset == 2000
    # the same request again: the idempotency key is reused, so it cannot be stored twice
    (m1,) = first.request.messages
    (m2,) = second.request.messages
    assert m1.idempotency_key and m1.idempotency_key == m2.idempotency_key
    assert bearer(first) == bearer(second) == f"Bearer {KEY}"
    assert "retry 1 in" in caplog.text and KEY not in caplog.text


async def test_rate_limits_delay_calls_that_are_not_idempotent_too(fake: Served) -> None:
    """RATE_LIMITED means nothing was done: a CreateQueue may repeat after the delay."""
    fake.broker.rate_limit["CreateQueue"] = [150, 100]
    async with AsyncClient(fake.address, api_key=KEY) as client:
        queue = await client.admin.create_queue("jobs", type="work")
    assert queue.config.name == "jobs"
    a, b, c = fake.broker.of("CreateQueue")
    assert b.at - a.at >= 0.15 and c.at - b.at >= 0.1


async def test_rate_limit_retries_are_bounded(fake: Served) -> None:
    fake.broker.rate_limit["Publish"] = [50] * 10
    async with AsyncClient(fake.address, api_key=KEY, retry=RetryPolicy(max_attempts=3)) as client:
        with pytest.raises(RateLimited) as caught:
            await client.publish("orders", b"x")
    assert len(fake.broker.of("Publish")) == 3
    err = caught.value
    assert err.reason == "RATE_LIMITED" and err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.retriable and err.retry_after_ms == 50 and err.retry_after == 0.05
    assert err.request_id == "fakereq1"
    # an advised delay longer than the policy allows is not waited for: raised at once
    fake.broker.rate_limit["Publish"] = [60_000]
    policy = RetryPolicy(max_retry_delay_s=5)
    async with AsyncClient(fake.address, api_key=KEY, retry=policy) as client:
        started = time.monotonic()
        with pytest.raises(RateLimited) as caught:
            await client.publish("orders", b"x")
        assert time.monotonic() - started < 5
    assert caught.value.retry_after == 60.0
    assert len(fake.broker.of("Publish")) == 4
    # NO_RETRY: one attempt, the delay is the caller's business
    fake.broker.rate_limit["Publish"] = [100]
    async with AsyncClient(fake.address, api_key=KEY, retry=NO_RETRY) as client:
        with pytest.raises(RateLimited):
            await client.publish("orders", b"x")


def test_the_blocking_client_honours_retry_info(fake: Served) -> None:
    fake.broker.rate_limit["Publish"] = [200]
    with Client(fake.address, api_key=KEY) as client:
        client.publish("q", b"x")
    first, second = fake.broker.of("Publish")
    assert second.at - first.at >= 0.2


# -- the key is never shown -------------------------------------------------------------------


async def test_the_key_never_appears_in_logs_reprs_or_errors(
    fake: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    shown = f"fmq_live_sk_{KEY_ID}…"
    assert mask_key(KEY) == shown
    assert mask_key("not-a-fluxmq-key") == "<hidden>"
    assert mask_key("fmq_live_sk_short") == "<hidden>"

    def refuse(context: grpc.ServicerContext) -> None:
        rich_abort(context, grpc.StatusCode.UNAUTHENTICATED, "INVALID_API_KEY", "unknown key")

    fake.broker.fail["ListQueues"] = refuse
    fake.broker.rate_limit["Publish"] = [10]
    texts: list[str] = []
    async with AsyncClient(fake.address, api_key=KEY) as client:
        await client.publish("orders", b"x")  # one rate-limited retry, logged at debug
        with pytest.raises(FluxMQError) as caught:
            [q async for q in client.admin.list_queues()]
        texts += [repr(client), str(client), repr(client.transport), repr(client.admin)]
        texts += [str(caught.value), repr(caught.value), repr(caught.value.metadata)]
        assert shown in repr(client) and shown in repr(client.transport)
    assert caught.value.reason == "INVALID_API_KEY"
    assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
    with Client(fake.address, api_key=KEY) as sync_client:
        texts.append(repr(sync_client))
        assert shown in repr(sync_client)
    texts.append(caplog.text)
    for text in texts:
        assert KEY not in text and KEY[20:] not in text, text
    # a key that cannot be sent is refused without being echoed
    with pytest.raises(ValueError) as bad:
        AsyncClient(fake.address, api_key=KEY + "\nX-Injected: 1")
    assert KEY not in str(bad.value) and shown in str(bad.value)


# -- TLS --------------------------------------------------------------------------------------


@pytest.fixture
def tls_fake(pki: Pki) -> Iterator[Served]:
    served = serve(credentials=pki.server_credentials())
    yield served
    served.stop()


@pytest.fixture
def mtls_fake(pki: Pki) -> Iterator[Served]:
    served = serve(credentials=pki.server_credentials(mtls=True))
    yield served
    served.stop()


FAST = {"timeout_s": 3.0, "retry": NO_RETRY}


async def test_tls_with_the_ca_file_connects(tls_fake: Served, pki: Pki) -> None:
    async with AsyncClient(tls_fake.address, api_key=KEY, tls_ca_file=pki.ca) as client:
        assert (await client.publish("orders", b"x")).offset == 1000
    async with AsyncClient(
        tls_fake.address, api_key=KEY, tls_root_certificates=pki.ca.read_bytes()
    ) as client:
        await client.publish("orders", b"y")
    assert [bearer(c) for c in tls_fake.broker.of("Publish")] == [f"Bearer {KEY}"] * 2


async def test_tls_fails_without_the_ca(tls_fake: Served, pki: Pki) -> None:
    # plaintext to a TLS port
    async with AsyncClient(tls_fake.address, api_key=KEY, **FAST) as client:  # type: ignore[arg-type]
        with pytest.raises(Unavailable):
            await client.publish("orders", b"x")
    # TLS, but the certificate is not signed by the roots given (or the system's)
    for options in ({"tls_ca_file": pki.other_ca}, {"tls": True}):
        async with AsyncClient(tls_fake.address, api_key=KEY, **FAST, **options) as client:  # type: ignore[arg-type]
            with pytest.raises(Unavailable):
                await client.publish("orders", b"x")
    assert tls_fake.broker.of("Publish") == []  # nothing got through


async def test_mutual_tls(mtls_fake: Served, pki: Pki) -> None:
    async with AsyncClient(
        mtls_fake.address,
        api_key=KEY,
        tls_ca_file=str(pki.ca),
        tls_cert_file=pki.client_cert,
        tls_key_file=pki.client_key,
    ) as client:
        await client.publish("orders", b"x")
        assert "mtls=True" in repr(client.transport.credentials)
    (call,) = mtls_fake.broker.of("Publish")
    assert call.peer_cert_cn == "fluxmq-client" and bearer(call) == f"Bearer {KEY}"
    # without a client certificate the server refuses the handshake
    async with AsyncClient(mtls_fake.address, tls_ca_file=pki.ca, **FAST) as client:  # type: ignore[arg-type]
        with pytest.raises(Unavailable):
            await client.publish("orders", b"x")


def test_the_blocking_client_speaks_tls(tls_fake: Served, pki: Pki) -> None:
    with Client(tls_fake.address, api_key=KEY, tls_ca_file=pki.ca) as client:
        client.publish("q", b"x")
    with (
        Client(tls_fake.address, timeout_s=3, retry=NO_RETRY) as client,
        pytest.raises(Unavailable),
    ):
        client.publish("q", b"x")
    assert len(tls_fake.broker.of("Publish")) == 1


def test_bad_tls_options_are_refused_up_front(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tls_key_file"):
        AsyncClient("127.0.0.1:1", tls_cert_file=pki.client_cert)
    with pytest.raises(ValueError, match="not both"):
        AsyncClient("127.0.0.1:1", tls_ca_file=pki.ca, tls_root_certificates=b"x")
    with pytest.raises(ValueError, match="contradicts"):
        AsyncClient("127.0.0.1:1", tls=False, tls_ca_file=pki.ca)
    missing = tmp_path / "nope.pem"
    with pytest.raises(ValueError, match=f"tls_ca_file {missing}"):
        AsyncClient("127.0.0.1:1", tls_ca_file=missing)
    with pytest.raises(ValueError, match="tls_ca_file"):
        Client("127.0.0.1:1", tls_ca_file=missing)
