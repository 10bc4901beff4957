"""The node's etcd credentials and TLS settings: each refused at start with a line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fluxmq import config as config_mod
from fluxmq.config import ConfigError

CLUSTER = [
    "--raft-listen", "127.0.0.1:7100",
    "--peers", "127.0.0.1:7101,127.0.0.1:7102",
    "--cluster-secret", "0123456789abcdef-secret",
]  # fmt: skip


def load(*argv: str, environ: dict[str, str] | None = None) -> config_mod.NodeConfig:
    return config_mod.load([*CLUSTER, *argv], environ or {})


@pytest.fixture
def pem(tmp_path: Path) -> str:
    path = tmp_path / "x.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return str(path)


def test_etcd_credentials_and_tls_files_load_and_the_password_stays_out_of_the_repr(
    tmp_path: Path, pem: str
) -> None:
    password = tmp_path / "etcd-password"
    password.write_text("s3cret-etcd-password\n")
    cfg = load(
        "--etcd", "etcd:2379", "--etcd-user", "fluxmq",
        "--etcd-password-file", str(password),
        "--etcd-ca-file", pem, "--etcd-cert-file", pem, "--etcd-key-file", pem,
    )  # fmt: skip
    assert (cfg.etcd_user, cfg.etcd_password) == ("fluxmq", "s3cret-etcd-password")
    assert "s3cret" not in repr(cfg)
    from_env = load("--etcd", "etcd:2379", environ={
        "FLUXMQ_ETCD_USER": "fluxmq", "FLUXMQ_ETCD_PASSWORD": "pw-from-env"})  # fmt: skip
    assert from_env.etcd_password == "pw-from-env"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--etcd-user", "fluxmq"], "etcd_password"),
        (["--etcd-password", "pw"], "etcd_password: needs etcd_user"),
        (["--etcd-user", "bad user", "--etcd-password", "pw"], "etcd_user"),
        (["--etcd-cert-file", "{pem}", "--etcd-ca-file", "{pem}"], "etcd_key_file"),
        (["--etcd-cert-file", "{pem}", "--etcd-key-file", "{pem}"], "needs etcd_ca_file"),
        (["--etcd-ca-file", "/nonexistent/ca.pem"], "etcd_ca_file: cannot read"),
    ],
    ids=["user-no-password", "password-no-user", "bad-user", "cert-no-key", "cert-no-ca",
         "unreadable-ca"],
)  # fmt: skip
def test_a_bad_etcd_security_setting_stops_the_node_naming_it(
    argv: list[str], named: str, pem: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load("--etcd", "etcd:2379", *(a.replace("{pem}", pem) for a in argv))
    assert named in str(err.value)


def test_etcd_security_settings_without_etcd_are_refused(pem: str) -> None:
    with pytest.raises(ConfigError, match="etcd_ca_file: needs etcd"):
        load("--auth", "off", "--etcd-ca-file", pem)
