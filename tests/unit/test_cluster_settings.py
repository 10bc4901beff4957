"""Cluster settings in etcd are validated when read (issue 20, item 13): the value an operator
writes with ``etcdctl put`` as the README words it (``true``) is understood, and a value that
cannot be used fails the request that needs it with FAILED_PRECONDITION naming the key, never
INTERNAL. Real etcd, real etcdctl."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from typing import Any, cast

import grpc
import pytest

from fluxmq.core.errors import FluxError
from fluxmq.metadata import EtcdMetadataStore, NodeInfo
from fluxmq.server.cluster_view import AUTO_PROVISION_SETTING, GROUPS_PER_SIZE_SETTING, ClusterView
from fluxmq.server.errors import status_code
from tests.etcd_server import EtcdServer

PREFIX = "/fluxmq/"


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with EtcdServer() as server:
        yield server


def etcdctl_put(server: EtcdServer, key: str, value: str) -> None:
    """What an operator types: ``etcdctl put /fluxmq/settings/<key> <value>``."""
    env = {**os.environ, "ETCDCTL_API": "3"}
    subprocess.run(
        ["etcdctl", f"--endpoints={server.endpoint}", "put", key, value],
        check=True,
        env=env,
        capture_output=True,
        timeout=20,
    )


def read_setting(server: EtcdServer, read: str, **defaults: Any) -> Any:
    """``ClusterView.<read>()`` on a view whose node defaults are ``defaults`` (no shard: it
    plays no part in reading a setting)."""

    async def run() -> Any:
        store = EtcdMetadataStore(server.endpoint, prefix=PREFIX)
        node = NodeInfo("n1", "127.0.0.1:7070", "127.0.0.1", 7100, 1, {})
        view = ClusterView(
            store, node, None, "g1", node_ttl_ms=10_000, clock_ms=lambda: 1, **defaults
        )
        try:
            return await getattr(view, read)()
        finally:
            await store.close()

    return asyncio.run(run())


def auto_provisioning(server: EtcdServer, default: bool = False) -> bool:
    return bool(read_setting(server, "_auto_provisioning", auto_provision_groups=default))


def groups_wanted(server: EtcdServer, default: int = 1) -> int:
    return int(read_setting(server, "_groups_wanted", groups_per_size=default))


@pytest.mark.parametrize("written", ["true", "TRUE", "True"])
def test_auto_provision_groups_written_with_etcdctl_as_the_readme_words_it_is_honoured(
    etcd: EtcdServer, written: str
) -> None:
    etcdctl_put(etcd, f"{PREFIX}settings/{AUTO_PROVISION_SETTING}", written)
    assert auto_provisioning(etcd) is True
    etcdctl_put(etcd, f"{PREFIX}settings/{AUTO_PROVISION_SETTING}", "false")
    assert auto_provisioning(etcd, default=True) is False


def test_a_setting_written_by_the_store_still_reads_back(etcd: EtcdServer) -> None:
    async def put() -> None:
        store = EtcdMetadataStore(etcd.endpoint, prefix=PREFIX)
        try:
            await store.put_setting(AUTO_PROVISION_SETTING, "true")
        finally:
            await store.close()

    asyncio.run(put())
    assert auto_provisioning(etcd) is True


@pytest.mark.parametrize(
    "written", ["yes", "1", '{"v":9,"value":"true"}', '{"value":true}'], ids=str
)
def test_an_unusable_auto_provision_groups_value_is_refused_naming_the_key(
    etcd: EtcdServer, written: str
) -> None:
    etcdctl_put(etcd, f"{PREFIX}settings/{AUTO_PROVISION_SETTING}", written)
    with pytest.raises(FluxError) as exc:
        auto_provisioning(etcd, default=True)
    err = exc.value
    assert err.reason == "INVALID_CLUSTER_SETTING"
    assert status_code(err) == grpc.StatusCode.FAILED_PRECONDITION
    assert not err.retriable
    assert err.metadata["setting"] == AUTO_PROVISION_SETTING
    assert f"settings/{AUTO_PROVISION_SETTING}" in err.message


def test_a_garbled_setting_does_not_stop_metadata_changes(etcd: EtcdServer) -> None:
    """``cluster_name`` is read only to see that etcd answers: its value cannot matter."""
    etcdctl_put(etcd, f"{PREFIX}settings/cluster_name", '{"v":9}')

    async def run() -> None:
        store = EtcdMetadataStore(etcd.endpoint, prefix=PREFIX)
        node = NodeInfo("n1", "127.0.0.1:7070", "127.0.0.1", 7100, 1, {})
        view = ClusterView(
            store, node, cast("Any", None), "g1", node_ttl_ms=10_000, clock_ms=lambda: 1
        )
        try:
            await view.ensure_reachable("CreateQueue")
        finally:
            await store.close()

    asyncio.run(run())


def test_groups_per_size_written_with_etcdctl_is_honoured_and_a_bad_one_refused(
    etcd: EtcdServer,
) -> None:
    key = f"{PREFIX}settings/{GROUPS_PER_SIZE_SETTING}"
    etcdctl_put(etcd, key, " 3 ")
    assert groups_wanted(etcd) == 3
    for written in ("0", "17", "two", "2.5"):
        etcdctl_put(etcd, key, written)
        with pytest.raises(FluxError) as exc:
            groups_wanted(etcd, default=2)
        assert exc.value.reason == "INVALID_CLUSTER_SETTING", written
        assert exc.value.metadata["setting"] == GROUPS_PER_SIZE_SETTING
    etcdctl_put(etcd, key, "2")
    assert groups_wanted(etcd, default=5) == 2
