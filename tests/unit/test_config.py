"""Node configuration: defaults < TOML file < FLUXMQ_* environment < flags, validated once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fluxmq.config import ConfigError, NodeConfig, load


def test_defaults_are_the_single_node_quickstart() -> None:
    cfg = load([], environ={})
    assert cfg == NodeConfig()
    assert (cfg.listen, cfg.metrics_listen, cfg.data_dir) == (
        "127.0.0.1:7070",
        "127.0.0.1:7071",
        "./data",
    )


def test_environment_overrides_defaults_and_flags_override_environment() -> None:
    env = {"FLUXMQ_DATA_DIR": "/env", "FLUXMQ_RETENTION_INTERVAL_MS": "250", "FLUXMQ_LOG_JSON": "1"}
    cfg = load(["--data-dir", "/flag"], environ=env)
    assert (cfg.data_dir, cfg.retention_interval_ms, cfg.log_json) == ("/flag", 250, True)


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--listen", "7070"], {}, "listen"),
        ([], {"FLUXMQ_RETENTION_INTERVAL_MS": "soon"}, "FLUXMQ_RETENTION_INTERVAL_MS"),
        (["--retention-interval-ms", "1"], {}, "retention_interval_ms"),
        (["--request-bytes-max", "lots"], {}, "request_bytes_max"),
        (["--storage-map-size", "1MiB"], {}, "storage_map_size"),
        (["--log-level", "LOUD"], {}, "log_level"),
        ([], {"FLUXMQ_LOG_JSON": "maybe"}, "FLUXMQ_LOG_JSON"),
        (["--shard-processes", "65"], {}, "shard_processes: 65: must be 0"),
        (["--groups-per-size", "0"], {}, "groups_per_size: must be 1..16"),
        ([], {"FLUXMQ_SHARD_PROCESSES": "-1"}, "shard_processes"),
    ],
)
def test_bad_setting_stops_start_with_its_name(
    argv: list[str], env: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        load(argv, environ=env)


CLUSTER_ENV = {
    "FLUXMQ_RAFT_LISTEN": "fluxmq-0.fluxmq-headless:7100",
    "FLUXMQ_PEERS": "fluxmq-1.fluxmq-headless:7100,fluxmq-2.fluxmq-headless:7100",
    "FLUXMQ_ETCD": "etcd:2379",
}


def test_file_is_overridden_by_environment_and_environment_by_flags(tmp_path: Path) -> None:
    path = tmp_path / "fluxmq.toml"
    path.write_text(
        'data_dir = "/file"\nlisten = "0.0.0.0:7070"\ninsecure_listen = true\nlog_json = true\n'
        "retention_interval_ms = 500\n"
    )
    cfg = load(["--config", str(path), "--data-dir", "/flag"], environ={"FLUXMQ_LISTEN": "h:1"})
    assert (cfg.data_dir, cfg.listen, cfg.log_json, cfg.retention_interval_ms) == (
        "/flag",
        "h:1",
        True,
        500,
    )
    # FLUXMQ_CONFIG names the file when --config does not.
    assert load([], environ={"FLUXMQ_CONFIG": str(path)}).data_dir == "/file"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('lisen = "0.0.0.0:7070"\n', "lisen: not a setting"),
        ('retention_interval_ms = "soon"\n', "retention_interval_ms: 'soon' is not a whole"),
        ("log_json = 1\n", "log_json: 1 is not true or false"),
        ("listen = 7070\n", "listen: 7070 is not a string"),
        ("listen = \n", "not valid TOML"),
    ],
)
def test_bad_file_stops_start_naming_the_file_and_setting(
    tmp_path: Path, text: str, named: str
) -> None:
    path = tmp_path / "fluxmq.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(named)) as err:
        load(["--config", str(path)], environ={})
    assert str(path) in str(err.value)


def test_missing_config_file_is_an_error_not_silence(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load([], environ={"FLUXMQ_CONFIG": str(tmp_path / "absent.toml")})


def test_cluster_secret_file_supplies_the_secret(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s" * 32 + "\n")
    cfg = load([], environ={**CLUSTER_ENV, "FLUXMQ_CLUSTER_SECRET_FILE": str(secret)})
    assert cfg.cluster_secret == "s" * 32
    assert cfg.raft_listen.startswith("fluxmq-0.")  # DNS names are Raft identities
    with pytest.raises(ConfigError, match="either it or cluster_secret"):
        load(
            [],
            environ={
                **CLUSTER_ENV,
                "FLUXMQ_CLUSTER_SECRET_FILE": str(secret),
                "FLUXMQ_CLUSTER_SECRET": "t" * 32,
            },
        )
    with pytest.raises(ConfigError, match="cluster_secret_file: cannot read"):
        load([], environ={**CLUSTER_ENV, "FLUXMQ_CLUSTER_SECRET_FILE": str(tmp_path / "no")})


def test_raft_bind_is_validated_and_needs_cluster_mode() -> None:
    env = {**CLUSTER_ENV, "FLUXMQ_CLUSTER_SECRET": "s" * 32}
    assert load(["--raft-bind", "0.0.0.0:7100"], environ=env).raft_bind == "0.0.0.0:7100"
    with pytest.raises(ConfigError, match="raft_bind"):
        load(["--raft-bind", "7100"], environ=env)
    with pytest.raises(ConfigError, match="raft_bind: needs raft_listen"):
        load(["--raft-bind", "0.0.0.0:7100"], environ={})


def test_auth_is_on_by_default_in_cluster_mode_and_off_on_a_single_node() -> None:
    env = {**CLUSTER_ENV, "FLUXMQ_CLUSTER_SECRET": "s" * 32}
    assert load([], environ=env).auth_enabled
    assert not load([], environ={}).auth_enabled
    assert load(["--auth", "on"], environ={}).auth_enabled
    assert not load(["--auth", "off"], environ=env).auth_enabled


def test_cluster_without_etcd_must_turn_auth_off_explicitly() -> None:
    static = {k: v for k, v in CLUSTER_ENV.items() if k != "FLUXMQ_ETCD"}
    env = {**static, "FLUXMQ_CLUSTER_SECRET": "s" * 32}
    with pytest.raises(ConfigError, match="auth: a cluster keeps its API keys in etcd"):
        load([], environ=env)
    with pytest.raises(ConfigError, match="auth: a cluster keeps its API keys in etcd"):
        load(["--auth", "on"], environ=env)
    assert load(["--auth", "off"], environ=env).auth == "off"


def test_bootstrap_key_file_without_authentication_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("fmq_live_sk_" + "a" * 32 + "\n")
    with pytest.raises(ConfigError, match="auth_bootstrap_key_file: needs authentication"):
        load(["--auth-bootstrap-key-file", str(key)], environ={})
    with pytest.raises(ConfigError, match="auth: 'maybe' is not auto, on or off"):
        load(["--auth", "maybe"], environ={})


def test_a_node_runs_its_shards_in_a_shard_process_by_default_and_zero_keeps_one() -> None:
    assert load([], environ={}).shard_processes == 1
    static = {**CLUSTER_ENV, "FLUXMQ_CLUSTER_SECRET": "s" * 32, "FLUXMQ_ETCD": ""}
    assert load(["--auth", "off"], environ=static).shard_processes == 1  # valid on static peers
    assert load(["--shard-processes", "0"], environ={}).shard_processes == 0


def test_several_shard_processes_are_refused_where_they_are_not_built() -> None:
    assert load(["--shard-processes", "4"], environ={}).shard_processes == 4
    cluster = {**CLUSTER_ENV, "FLUXMQ_CLUSTER_SECRET": "s" * 32}
    with pytest.raises(ConfigError, match="a cluster node without etcd runs one"):
        load(["--shard-processes", "2"], environ={**cluster, "FLUXMQ_ETCD": ""})
    assert load(["--shard-processes", "2"], environ=cluster).shard_processes == 2
    assert load(["--shard-processes", "1"], environ=cluster).shard_processes == 1
    assert load(["--shard-processes", "2", "--auth", "on"], environ={}).shard_processes == 2


def test_a_joining_node_has_no_peers_and_needs_etcd() -> None:
    """--join: cluster mode without a static home group (a StatefulSet pod beyond the home
    group's size); it learns its replicas from the placement in etcd."""
    joining = {"FLUXMQ_RAFT_LISTEN": "fluxmq-3.fluxmq-headless:7100", "FLUXMQ_ETCD": "etcd:2379"}
    env = {**joining, "FLUXMQ_CLUSTER_SECRET": "s" * 32}
    cfg = load(["--join"], environ=env)
    assert cfg.join and cfg.cluster_mode and cfg.peer_list == ()
    with pytest.raises(ConfigError, match="join: a joining node has no static home group"):
        load(["--join", "--peers", "fluxmq-0.fluxmq-headless:7100"], environ=env)
    with pytest.raises(ConfigError, match="join: needs etcd"):
        load(["--join", "--auth", "off"], environ={**env, "FLUXMQ_ETCD": ""})
    with pytest.raises(ConfigError, match="or --join with etcd"):
        load([], environ=env)  # neither peers nor --join
    assert load([], environ={**env, "FLUXMQ_JOIN": "true"}).join
