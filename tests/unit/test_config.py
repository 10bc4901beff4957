"""Node configuration: defaults < FLUXMQ_* environment < flags, validated once."""

from __future__ import annotations

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
    ],
)
def test_bad_setting_stops_start_with_its_name(
    argv: list[str], env: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        load(argv, environ=env)
