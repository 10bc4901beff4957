"""etcd as production runs it: TLS with client certificates and authentication on, reachable by
credentials only, and API key records sealed with the cluster secret, so that whoever can write
to etcd (a plain ``etcdctl put``) cannot mint a key. First the metadata store against such an
etcd, then three ``fluxmq serve`` nodes on it, then a node without credentials at start."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq.core import auth
from fluxmq.core.auth import KeyRecord
from fluxmq.metadata import EtcdMetadataStore, MetadataEvent
from fluxmq.metadata import metadata as md_codec
from fluxmq.metadata.metadata import MetadataRefused, MetadataUnavailable
from fluxmq.metadata.sealed_records import RecordSeal
from tests.contract.test_metadata_contract import established, next_event
from tests.etcd_server import PASSWORD, USER, EtcdServer
from tests.integration.cluster import SECRET, Cluster
from tests.integration.conftest import free_port
from tests.integration.test_security import Api, known_on, md

START_TIMEOUT_S = 60.0  # a refused node gives up at once; the bound only stops a hung test
# A forged key must stay refused while a sealed one written the same way is accepted within it.
PROPAGATION_BOUND_S = 10.0
WATCH_BACK_WITHIN_S = 60.0  # only stops a hung test


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with EtcdServer(secure=True) as server:
        yield server


def _tls(etcd: EtcdServer, cert_user: str = "node") -> dict[str, str]:
    """TLS settings of a store whose client certificate names ``cert_user`` ("node" is no
    etcd user: such a certificate passes TLS and grants nothing by itself)."""
    cert = etcd.client_cert(cert_user)
    return {"ca_file": str(etcd.ca_file), "cert_file": str(cert.cert), "key_file": str(cert.key)}


def _prefix() -> str:
    return f"/t-{secrets.token_hex(6)}/"


# --- the metadata store -------------------------------------------------------------------------


async def test_a_store_with_tls_and_a_password_works_and_authenticates_again_after_a_restart(
    etcd: EtcdServer,
) -> None:
    """etcd forgets its tokens when it restarts: the store must authenticate again instead of
    failing forever (aetcd authenticates once per channel), for calls and for watches."""
    store = EtcdMetadataStore(
        etcd.endpoint, prefix=_prefix(), username=USER, password=PASSWORD, **_tls(etcd)
    )
    try:
        await store.put_setting("auto_provision_groups", "true")
        watch = store.watch()
        await established(watch)
        etcd.stop()
        etcd.start()
        deadline = time.monotonic() + 15
        while True:  # the first calls may race etcd's own start; none may fail for the token
            try:
                assert await store.get_setting("auto_provision_groups") == "true"
                break
            except MetadataUnavailable:
                assert time.monotonic() < deadline, "etcd did not come back"
                await asyncio.sleep(0.1)
        # The watch comes back on its own (its retry backs off up to 2 s, and TLS + a fresh
        # token take a while on a loaded machine): its resync says it is watching again, and
        # what happened before that is only visible by re-reading.
        resynced: set[str] = set()
        async with asyncio.timeout(WATCH_BACK_WITHIN_S):
            async for back in watch:
                resynced.update([back.kind] if back.resync else [])
                if len(resynced) == len(md_codec.EVENT_KINDS):
                    break
        await store.put_setting("placement_strategy", "spread")
        event = await next_event(watch, lambda e: e.kind == "setting" and e.key != "")
        assert event == MetadataEvent("setting", "placement_strategy")
        await watch.aclose()
    finally:
        await store.close()


async def test_a_client_certificate_alone_authenticates_as_its_common_name(
    etcd: EtcdServer,
) -> None:
    store = EtcdMetadataStore(etcd.endpoint, prefix=_prefix(), **_tls(etcd, USER))
    try:
        await store.put_setting("auto_provision_groups", "false")
        assert await store.get_setting("auto_provision_groups") == "false"
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("case", "credentials"),
    [
        ("no-user", {}),
        ("wrong-password", {"username": USER, "password": "not-the-password"}),
    ],
)
async def test_etcd_refuses_a_store_without_valid_credentials_naming_the_settings(
    etcd: EtcdServer, case: str, credentials: dict[str, str]
) -> None:
    store = EtcdMetadataStore(etcd.endpoint, prefix=_prefix(), **_tls(etcd), **credentials)  # type: ignore[arg-type]
    try:
        with pytest.raises(MetadataRefused) as err:
            await store.get_setting("auto_provision_groups")
        assert "etcd_user" in str(err.value) and "etcd_cert_file" in str(err.value)
    finally:
        await store.close()


def test_a_plain_etcdctl_put_is_refused_by_a_secured_etcd(etcd: EtcdServer) -> None:
    """The attack as reported: no certificate fails TLS, a certificate of no user is denied."""
    no_cert = etcd.etcdctl("put", "/fluxmq/keys/aaaaaaaa", "{}", user="", check=False)
    assert "OK" not in no_cert
    denied = etcd.etcdctl("put", "/fluxmq/keys/aaaaaaaa", "{}", user="nobody", check=False)
    assert "permission denied" in denied
    assert etcd.etcdctl("get", "/fluxmq/keys/aaaaaaaa", "--print-value-only").strip() == ""


# --- three nodes on the secured etcd ------------------------------------------------------------


def _node_flags(etcd: EtcdServer, root: Path) -> tuple[str, ...]:
    password_file = root / "etcd-password"
    root.mkdir(parents=True, exist_ok=True)
    password_file.write_text(PASSWORD + "\n")
    tls = _tls(etcd)
    return (
        "--etcd", etcd.endpoint,
        "--etcd-user", USER,
        "--etcd-password-file", str(password_file),
        "--etcd-ca-file", tls["ca_file"],
        "--etcd-cert-file", tls["cert_file"],
        "--etcd-key-file", tls["key_file"],
    )  # fmt: skip


@pytest.fixture(scope="module")
def cluster(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("etcd-secured-cluster")
    c = Cluster(root, 3, *_node_flags(etcd, root))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _admin_record(seal_secret: str | None) -> tuple[str, bytes]:
    """A production admin key and the record of it someone with etcd access could write:
    sealed with ``seal_secret``, or (None) as a plain well-formed record."""
    key = auth.new_key("production")
    presented = auth.parse_key(key)
    assert presented is not None
    salt = secrets.token_bytes(auth.SALT_BYTES)
    rec = KeyRecord(
        presented.key_id, "minted", "production", "admin", "default", salt,
        auth.hash_key(salt, key), 1_000,
    )  # fmt: skip
    seal = md_codec.api_key_seal_key(seal_secret) if seal_secret else None
    return key, md_codec.encode_api_key(rec, seal)


def _still_refused(apis: list[Api], key: str, bound_s: float) -> None:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        assert not any(known_on(api, key) for api in apis), "a forged key was accepted"
        time.sleep(0.1)


def test_nodes_run_on_etcd_with_tls_and_auth_and_ignore_a_key_record_written_without_the_secret(
    etcd: EtcdServer, cluster: Cluster
) -> None:
    apis = [Api(n) for n in cluster.nodes]
    try:
        assert all(known_on(api, cluster.api_key) for api in apis)  # the bootstrap key, sealed
        # Even etcd's root, writing a well-formed admin record without the secret, mints nothing.
        forged, raw = _admin_record(None)
        etcd.etcdctl("put", f"/fluxmq/keys/{forged[12:20]}", raw.decode())
        other, raw_other = _admin_record("a-different-secret-0123")
        etcd.etcdctl("put", f"/fluxmq/keys/{other[12:20]}", raw_other.decode())
        # The same write sealed with the cluster secret is accepted everywhere: so the forged
        # ones reached the nodes too and were refused for their seal, not for being late.
        sealed, raw_sealed = _admin_record(SECRET)
        etcd.etcdctl("put", f"/fluxmq/keys/{sealed[12:20]}", raw_sealed.decode())
        deadline = time.monotonic() + PROPAGATION_BOUND_S
        while not all(known_on(api, sealed) for api in apis):
            assert time.monotonic() < deadline, "a sealed key did not reach every node"
            time.sleep(0.05)
        _still_refused(apis, forged, 1.0)
        _still_refused(apis, other, 0.2)
        logs = "".join(n.log_path.read_text(errors="replace") for n in cluster.nodes)
        assert f"ignored API key record '{forged[12:20]}'" in logs
    finally:
        for api in apis:
            api.ch.close()


def _states(api: Api, key: str) -> dict[str, str]:
    nodes = api.a.ListNodes(apb.ListNodesRequest(), metadata=md(key), timeout=10).nodes
    return {n.node_id: n.state for n in nodes}


def _raft_members(api: Api, key: str) -> set[tuple[str, ...]]:
    status = api.a.GetClusterStatus(apb.GetClusterStatusRequest(), metadata=md(key), timeout=10)
    return {tuple(sorted(s.members)) for s in status.shards if s.shard_id == "g1"}


def test_placement_records_written_without_the_secret_move_nothing(
    etcd: EtcdServer, cluster: Cluster
) -> None:
    """Well-formed group, leader and node-state records put into etcd without the cluster
    secret (by etcd's root) are ignored by every node: no replica leaves the group, no node
    drains. The same node-state record sealed with the secret is heeded, so the forged ones
    reached the nodes and were refused for their seal."""
    apis = [Api(n) for n in cluster.nodes]
    key = cluster.api_key
    saved: dict[str, str] = {}
    try:
        members_before = _raft_members(apis[0], key)
        assert len(members_before) == 1 and len(next(iter(members_before))) == 3
        node_ids = sorted(_states(apis[0], key))
        victim = node_ids[-1]
        for k in ("groups/g1", "leaders/g1"):
            saved[k] = etcd.etcdctl("get", f"/fluxmq/{k}", "--print-value-only").strip()
        group = json.loads(saved["groups/g1"])
        assert "mac" in group  # written sealed by the node that recorded it
        forged_group = {k: v for k, v in group.items() if k != "mac"}
        forged_group["members"] = [n for n in group["members"] if n != victim]
        forged_group["raft_ports"] = {n: p for n, p in group["raft_ports"].items() if n != victim}
        state = md_codec.encode_setting("draining").decode()
        for k, value in (
            ("groups/g1", json.dumps(forged_group)),
            ("leaders/g1", json.dumps({"v": 1, "node_id": victim, "term": 2**40})),
            (f"settings/node_state.{victim}", state),
        ):
            etcd.etcdctl("put", f"/fluxmq/{k}", value)
        time.sleep(3.0)  # the controller and the membership converger act every second
        for api in apis:
            assert _states(api, key)[victim] == "active"
            assert _raft_members(api, key) == members_before
        logs = "".join(n.log_path.read_text(errors="replace") for n in cluster.nodes)
        assert "ignored group record 'g1'" in logs
        assert f"ignored setting record 'node_state.{victim}'" in logs
        sealed = RecordSeal(SECRET).seal(
            "setting", f"node_state.{victim}", md_codec.encode_setting("draining")
        )
        etcd.etcdctl("put", f"/fluxmq/settings/node_state.{victim}", sealed.decode())
        deadline = time.monotonic() + PROPAGATION_BOUND_S
        while _states(apis[0], key)[victim] not in ("draining", "drained"):
            assert time.monotonic() < deadline, "a sealed node state was not heeded"
            time.sleep(0.1)
    finally:
        etcd.etcdctl("del", "/fluxmq/settings/node_state.", "--prefix")
        for k, value in saved.items():
            etcd.etcdctl("put", f"/fluxmq/{k}", value)
        for api in apis:
            api.ch.close()


def test_a_node_without_etcd_credentials_stops_at_start_with_one_line(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    tls = _tls(etcd)
    raft = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLUXMQ")}
    proc = subprocess.run(
        [
            sys.executable, "-m", "fluxmq", "serve",
            "--data-dir", str(tmp_path / "d"),
            "--listen", f"127.0.0.1:{free_port()}",
            "--metrics-listen", "",
            "--raft-listen", raft[0], "--peers", raft[1],
            "--etcd", etcd.endpoint,
            "--etcd-ca-file", tls["ca_file"],
            "--etcd-cert-file", tls["cert_file"],
            "--etcd-key-file", tls["key_file"],
        ],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        env={**env, "FLUXMQ_CLUSTER_SECRET": SECRET},
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fluxmq:")]
    assert len(errors) == 1, proc.stderr
    assert "permission denied" in errors[0] and "etcd_user" in errors[0], errors[0]


# --- the deployments' one-shot job that turns etcd's authentication on ----------------------------


def _etcd_auth(etcd: EtcdServer, *extra: str) -> subprocess.CompletedProcess[str]:
    root = etcd.client_cert("root")
    return subprocess.run(
        [
            sys.executable, "-m", "fluxmq.metadata.etcd_auth",
            "--endpoint", etcd.endpoint, "--ca-file", str(etcd.ca_file),
            "--cert-file", str(root.cert), "--key-file", str(root.key), *extra,
        ],
        capture_output=True, text=True, timeout=START_TIMEOUT_S, stdin=subprocess.DEVNULL,
    )  # fmt: skip


async def test_the_etcd_auth_job_gives_the_nodes_user_its_prefix_only_and_can_run_again() -> None:
    with EtcdServer(secure=True, enable_auth=False) as etcd:
        # Before: any certificate of the CA may write anything (TLS alone is not enough).
        assert "OK" in etcd.etcdctl("put", "/fluxmq/x", "1", user="nobody")
        for _ in range(2):  # a restarted job changes nothing and succeeds
            done = _etcd_auth(etcd, "--user", USER, "--prefix", "/fluxmq/")
            assert done.returncode == 0, done.stderr
        # The nodes' certificate (CN fluxmq) reads and writes the cluster's prefix, nothing else.
        store = EtcdMetadataStore(etcd.endpoint, **_tls(etcd, USER))
        try:
            await store.put_setting("auto_provision_groups", "true")
        finally:
            await store.close()
        outside = etcd.etcdctl("put", "/elsewhere/x", "1", user=USER, check=False)
        assert "permission denied" in outside
        anyone = etcd.etcdctl("put", "/fluxmq/keys/aaaaaaaa", "{}", user="nobody", check=False)
        assert "permission denied" in anyone
