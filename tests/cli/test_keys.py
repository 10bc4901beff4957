"""``fluxmqctl key create|list|revoke`` and the global security options (``--api-key`` /
``FLUXMQ_API_KEY``, ``--tls-ca``, ``--tls-cert`` / ``--tls-key``), run as a user runs them (a
subprocess) against a fake broker in this process that records what it receives."""

from __future__ import annotations

import json
import secrets
import string
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import admin_pb2
from fluxmq.cli.main import main
from fluxmq.client import Client
from tests.client.test_auth_options import (
    KEY,
    KEY_ID,
    FakeBroker,
    Pki,
    Served,
    make_pki,
    rich_abort,
    serve,
)
from tests.integration.conftest import Node, free_port

from .conftest import Ctl

SECRET_PART = "S3cr3tS3cr3tS3cr3tS3cr3t"  # what the fake puts after a new key's prefix


def fields(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep:
            out[k.strip()] = v.strip()
    return out


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()[1:] if line.strip()]


def seeded() -> FakeBroker:
    broker = FakeBroker()
    broker.keys = [
        admin_pb2.ApiKeyInfo(
            key_id=KEY_ID, prefix=f"fmq_live_sk_{KEY_ID}", name="bootstrap",
            environment="production", role="admin", tier="default", created_ms=1_767_225_600_000,
            last_used_ms=1_767_225_650_000,
        ),
        admin_pb2.ApiKeyInfo(
            key_id="Old0ne99", prefix="fmq_live_sk_Old0ne99", name="old producer",
            environment="production", role="producer", tier="gold", created_ms=1_767_225_610_000,
            revoked_ms=1_767_225_620_000,
        ),
    ]  # fmt: skip
    return broker


@pytest.fixture
def fake() -> Iterator[Served]:
    served = serve(seeded())
    yield served
    served.stop()


@pytest.fixture
def ctl(fake: Served, tmp_path: Path) -> Ctl:
    return Ctl(fake.address, tmp_path)


def with_key(ctl: Ctl, **extra: str) -> dict[str, str]:
    return ctl.env(FLUXMQ_API_KEY=KEY, **extra)


def no_secret(text: str) -> None:
    assert KEY not in text and SECRET_PART not in text, text


def test_create_prints_the_key_once_with_a_warning(ctl: Ctl, fake: Served) -> None:
    proc = ctl.run(
        "key", "create", "--name", "billing svc", "--role", "producer", "--tier", "gold",
        "--environment", "staging", env=with_key(ctl),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shown = fields(proc.stdout)
    assert shown["key"] == "fmq_test_sk_New00002" + SECRET_PART
    assert shown["prefix"] == "fmq_test_sk_New00002" and shown["key_id"] == "New00002"
    assert shown["name"] == "billing svc" and shown["role"] == "producer"
    assert shown["environment"] == "staging" and shown["tier"] == "gold"
    assert shown["created"].startswith("2026-01-01T") and shown["last used"] == "never"
    assert "only time the key is shown" in proc.stderr and proc.stderr.startswith("warning: ")
    assert KEY not in proc.stdout + proc.stderr
    (call,) = fake.broker.of("CreateApiKey")
    r = call.request
    assert (r.name, r.role, r.tier, r.environment) == ("billing svc", "producer", "gold", "staging")
    assert call.metadata["authorization"] == f"Bearer {KEY}"

    # -o json: the key and its info, the warning on stderr (stdout stays one JSON document)
    proc = ctl.run(
        "-o", "json", "key", "create", "--name", "ci", "--role", "read-only", env=with_key(ctl)
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["key"] == "fmq_live_sk_New00003" + SECRET_PART
    assert doc["info"]["prefix"] == "fmq_live_sk_New00003" and doc["info"]["role"] == "read-only"
    assert "only time the key is shown" in proc.stderr
    r = fake.broker.of("CreateApiKey")[1].request
    assert (r.tier, r.environment) == ("", "")  # defaults: left to the broker


def test_list_shows_prefixes_never_secrets(ctl: Ctl, fake: Served) -> None:
    proc = ctl.run("key", "list", env=with_key(ctl))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == [
        "PREFIX", "ENVIRONMENT", "ROLE", "TIER", "CREATED", "LAST_USED", "REVOKED", "NAME",
    ]  # fmt: skip
    assert rows(proc.stdout) == [
        [f"fmq_live_sk_{KEY_ID}", "production", "admin", "default", "2026-01-01T00:00:00.000Z",
         "2026-01-01T00:00:50.000Z", "-", "bootstrap"],
    ]  # fmt: skip
    no_secret(proc.stdout + proc.stderr)
    assert fake.broker.of("ListApiKeys")[0].request.include_revoked is False

    proc = ctl.run("key", "list", "--all", env=with_key(ctl))
    assert proc.returncode == 0, proc.stderr
    revoked = rows(proc.stdout)[1]
    assert revoked[0] == "fmq_live_sk_Old0ne99" and revoked[6] != "-"
    assert revoked[-2:] == ["old", "producer"]  # the name, spaces and all, comes last
    assert fake.broker.of("ListApiKeys")[1].request.include_revoked is True

    doc = json.loads(ctl.ok("-o", "json", "key", "list", "--all"))
    assert [k["prefix"] for k in doc["keys"]] == [f"fmq_live_sk_{KEY_ID}", "fmq_live_sk_Old0ne99"]
    assert doc["keys"][1]["revoked_ms"] == "1767225620000"
    no_secret(json.dumps(doc))


def test_revoke_asks_first(ctl: Ctl, fake: Served) -> None:
    # off a terminal: --yes is needed, nothing is sent without it
    err = ctl.fails(2, "key", "revoke", "Old0ne99")
    assert "--yes" in err and len(err.splitlines()) == 1
    assert fake.broker.of("RevokeApiKey") == []
    out = ctl.ok("key", "revoke", "Old0ne99", "--yes")
    assert out.strip() == "key fmq_live_sk_Old0ne99 revoked (old producer)"
    # the prefix as listings show it works too; the whole key is refused without echoing it
    doc = json.loads(ctl.ok("-o", "json", "key", "revoke", f"fmq_live_sk_{KEY_ID}", "-y"))
    assert doc["key_id"] == KEY_ID and doc["revoked_ms"] != "0"
    assert [c.request.key_id for c in fake.broker.of("RevokeApiKey")] == ["Old0ne99", KEY_ID]
    proc = ctl.run("key", "revoke", KEY, "--yes")
    assert proc.returncode == 2 and "not the whole key" in proc.stderr
    no_secret(proc.stdout + proc.stderr)
    assert ctl.run("key", "revoke", "short", "--yes").returncode == 2
    assert len(fake.broker.of("RevokeApiKey")) == 2


def test_revoke_confirms_on_a_terminal(
    fake: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.delenv("FLUXMQ_PROFILE", raising=False)
    monkeypatch.setenv("FLUXMQ_API_KEY", KEY)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    asked: list[str] = []

    def answer(reply: str) -> None:
        monkeypatch.setattr("builtins.input", lambda q: asked.append(q) or reply)

    answer("n")
    assert main(["--server", fake.address, "key", "revoke", "Old0ne99"]) == 1
    assert "aborted" in capsys.readouterr().err
    assert asked == [
        "Revoke API key Old0ne99? Every client using it is refused from then on. [y/N] "
    ]
    assert fake.broker.of("RevokeApiKey") == []
    answer("y")
    assert main(["--server", fake.address, "key", "revoke", "Old0ne99"]) == 0
    assert "revoked" in capsys.readouterr().out
    (call,) = fake.broker.of("RevokeApiKey")
    assert call.metadata["authorization"] == f"Bearer {KEY}"


def test_errors_map_to_exit_codes(ctl: Ctl, fake: Served) -> None:
    # bad usage: exit 2, nothing sent
    for args in (
        ("key", "create", "--name", "x", "--role", "superuser"),
        ("key", "create", "--role", "admin"),  # --name is required
        ("key", "create", "--name", "x", "--role", "admin", "--environment", "prod"),
        ("key", "revoke"),
        ("key",),
    ):
        assert ctl.run(*args, env=with_key(ctl)).returncode == 2, args
    assert fake.broker.of("CreateApiKey") == []

    # the broker's refusals: exit 1, one line with the reason and the request id
    def bad_name(context: grpc.ServicerContext) -> None:
        rich_abort(
            context, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "bad request",
            violations=(("name", "1-64 of A-Z a-z 0-9 . _ - and space"),),
        )  # fmt: skip

    fake.broker.fail["CreateApiKey"] = bad_name
    err = ctl.fails(1, "key", "create", "--name", "bad!", "--role", "admin")
    assert err.startswith("error: INVALID_ARGUMENT: bad request (request id fakereq1); name: 1-64")
    err = ctl.fails(1, "key", "revoke", "Missing1", "--yes")
    assert err == "error: API_KEY_NOT_FOUND: no API key Missing1 (request id fakereq1)"

    # an unknown key: the broker's message may even quote it, fluxmqctl masks it
    def unknown_key(context: grpc.ServicerContext) -> None:
        rich_abort(
            context, grpc.StatusCode.UNAUTHENTICATED, "INVALID_API_KEY", f"unknown key {KEY}"
        )

    fake.broker.fail["ListApiKeys"] = unknown_key
    proc = ctl.run("key", "list", env=with_key(ctl))
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"error: INVALID_API_KEY: unknown key fmq_live_sk_{KEY_ID}… (request id fakereq1)"
    )
    no_secret(proc.stdout + proc.stderr)

    # unreachable: exit 3
    dead = f"127.0.0.1:{free_port()}"
    err = ctl.fails(3, "--server", dead, "key", "list")
    assert err.startswith(f"error: UNAVAILABLE: cannot reach the broker at {dead}")


def test_rate_limited_calls_wait_the_advised_delay(ctl: Ctl, fake: Served) -> None:
    fake.broker.rate_limit["ListApiKeys"] = [200]
    ctl.ok("key", "list")
    first, second = fake.broker.of("ListApiKeys")
    assert second.at - first.at >= 0.2
    # still limited after a few tries: exit 1, and when to come back
    fake.broker.rate_limit["ListApiKeys"] = [20] * 10
    err = ctl.fails(1, "key", "list")
    assert err.startswith("error: RATE_LIMITED: ") and "(retry after 0.02 s)" in err
    assert len(fake.broker.of("ListApiKeys")) == 2 + 5


def test_the_key_goes_with_every_command(ctl: Ctl, fake: Served) -> None:
    env = with_key(ctl)
    assert ctl.run("queue", "list", env=env).returncode == 0
    # --api-key beats FLUXMQ_API_KEY
    other = "fmq_test_sk_" + "q" * 32
    proc = ctl.run("--api-key", other, "publish", "orders", "x", env=env)
    assert proc.returncode == 0, proc.stderr
    proc = ctl.run("cluster", "status", "--window", "0", env=env)
    assert proc.returncode in (0, 1), proc.stderr  # a fake node: healthy or not, it answered
    sent = [(c.method, c.metadata.get("authorization")) for c in fake.broker.calls]
    assert ("ListQueues", f"Bearer {KEY}") in sent
    assert ("Publish", f"Bearer {other}") in sent
    assert ("GetClusterStatus", f"Bearer {KEY}") in sent
    assert all(auth for _, auth in sent), sent
    # without a key nothing is sent
    ctl.ok("queue", "list")
    assert "authorization" not in fake.broker.calls[-1].metadata
    # a value that cannot be a header is a usage error that does not echo it
    proc = ctl.run("--api-key", KEY + "\tx", "queue", "list")
    assert proc.returncode == 2
    no_secret(proc.stderr)


# -- TLS --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_fake(pki: Pki) -> Iterator[Served]:
    served = serve(seeded(), pki.server_credentials())
    yield served
    served.stop()


@pytest.fixture
def mtls_fake(pki: Pki) -> Iterator[Served]:
    served = serve(seeded(), pki.server_credentials(mtls=True))
    yield served
    served.stop()


def test_tls_options(tls_fake: Served, pki: Pki, tmp_path: Path) -> None:
    ctl = Ctl(tls_fake.address, tmp_path)
    env = with_key(ctl)
    out = ctl.run("--tls-ca", str(pki.ca), "key", "list", env=env)
    assert out.returncode == 0, out.stderr
    assert rows(out.stdout)[0][0] == f"fmq_live_sk_{KEY_ID}"
    assert tls_fake.broker.calls[-1].metadata["authorization"] == f"Bearer {KEY}"
    # cluster status opens its own connections: TLS too
    proc = ctl.run("cluster", "status", "--window", "0", "--tls-ca", str(pki.ca), env=env)
    assert proc.returncode in (0, 1) and "no node answered" not in proc.stderr, proc.stderr
    # without the CA (plaintext, or roots that did not sign the certificate): unreachable
    calls = len(tls_fake.broker.calls)
    for args in ((), ("--tls-ca", str(pki.other_ca)), ("--tls",)):
        proc = ctl.run("--timeout", "3", *args, "key", "list", env=env)
        assert proc.returncode == 3, (args, proc.stderr)
        assert proc.stderr.startswith(
            f"error: UNAVAILABLE: cannot reach the broker at {ctl.address}"
        )
        no_secret(proc.stderr)
    assert len(tls_fake.broker.calls) == calls
    # the profile file can name the CA
    profile = tmp_path / "profile.toml"
    profile.write_text(f'tls_ca = "{pki.ca}"\n')
    proc = ctl.run("key", "list", env=ctl.env(FLUXMQ_PROFILE=str(profile)))
    assert proc.returncode == 0, proc.stderr
    # files are checked before anything is sent
    proc = ctl.run("--tls-ca", str(tmp_path / "missing.pem"), "key", "list")
    assert proc.returncode == 2 and "missing.pem" in proc.stderr
    proc = ctl.run("--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert), "key", "list")
    assert proc.returncode == 2 and "--tls-key" in proc.stderr


def test_mutual_tls(mtls_fake: Served, pki: Pki, tmp_path: Path) -> None:
    ctl = Ctl(mtls_fake.address, tmp_path)
    mtls = ("--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert))
    proc = ctl.run(*mtls, "--tls-key", str(pki.client_key), "key", "list", env=with_key(ctl))
    assert proc.returncode == 0, proc.stderr
    assert mtls_fake.broker.calls[-1].peer_cert_cn == "fluxmq-client"
    started = time.monotonic()
    proc = ctl.run("--timeout", "3", "--tls-ca", str(pki.ca), "key", "list", env=with_key(ctl))
    assert proc.returncode == 3, proc.stderr  # no client certificate: the handshake fails
    assert time.monotonic() - started < 20


# -- end to end -------------------------------------------------------------------------------


def new_admin_key() -> str:
    """A key in the documented format (fmq_live_sk_ + 32 base62), made here as an operator
    would, for --auth-bootstrap-key-file."""
    body = "".join(secrets.choice(string.digits + string.ascii_letters) for _ in range(32))
    return f"fmq_live_sk_{body}"


@pytest.mark.slow
def test_keys_against_a_secured_node(tmp_path: Path) -> None:
    admin = new_admin_key()
    key_file = tmp_path / "admin.key"
    key_file.write_text(admin + "\n")
    node = Node(tmp_path / "node", "--auth", "on", "--auth-bootstrap-key-file", str(key_file))
    node.start()
    try:
        ctl = Ctl(node.address, tmp_path)
        env = ctl.env(FLUXMQ_API_KEY=admin)
        # no key, or an unknown one: refused (exit 1), the key not echoed
        assert ctl.fails(1, "key", "list").startswith("error: INVALID_API_KEY: ")
        proc = ctl.run("--api-key", KEY, "key", "list")
        assert proc.returncode == 1 and "INVALID_API_KEY" in proc.stderr
        no_secret(proc.stderr)
        # the bootstrap admin key lists itself by prefix
        doc = json.loads(ctl.run("-o", "json", "key", "list", env=env).stdout)
        assert [k["prefix"] for k in doc["keys"]] == [admin[:20]]
        assert doc["keys"][0]["role"] == "admin"
        # a producer key, shown once
        proc = ctl.run("-o", "json", "key", "create", "--name", "e2e producer", "--role",
                       "producer", env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        created = json.loads(proc.stdout)
        producer, info = created["key"], created["info"]
        assert producer.startswith(info["prefix"]) and info["role"] == "producer"
        assert ctl.run("queue", "create", "e2e", env=env).returncode == 0
        ctl_producer = ctl.env(FLUXMQ_API_KEY=producer)
        assert ctl.run("publish", "e2e", "hello", env=ctl_producer).returncode == 0
        err = ctl.run("key", "list", env=ctl_producer)
        assert err.returncode == 1 and "PERMISSION_DENIED" in err.stderr, err.stderr
        listing = ctl.run("key", "list", env=env).stdout
        assert info["prefix"] in listing and producer not in listing and admin not in listing
        # revoked: refused from then on (within a second or so)
        assert ctl.run("key", "revoke", info["key_id"], "--yes", env=env).returncode == 0
        deadline = time.monotonic() + 10
        while True:
            proc = ctl.run("publish", "e2e", "again", env=ctl_producer)
            if proc.returncode == 1 and "INVALID_API_KEY" in proc.stderr:
                break
            assert time.monotonic() < deadline, proc.stderr
            time.sleep(0.2)
        # the SDK with the admin key
        with Client(node.address, api_key=admin) as client:
            keys = client.admin.list_api_keys(include_revoked=True)
            assert {k.key_id for k in keys} == {admin[12:20], info["key_id"]}
            assert client.publish("e2e", b"sdk").partition == 0
    finally:
        node.stop()
