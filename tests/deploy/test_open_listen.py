"""The container image does not serve an open broker (issue 20, item 14): a node listening
beyond loopback with authentication off refuses to start, with a one-line reason, unless told
``--insecure-listen``. What ``docker run -p 7070:7070 fluxmq`` does is the image's ENV with no
other setting: that must stop at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fluxmq.config import ConfigError, load
from tests.deploy.compose_topology import final_stage

START_TIMEOUT_S = 30


def image_env() -> dict[str, str]:
    return {k: v for k, v in final_stage().env().items() if k.startswith("FLUXMQ_")}


def run_serve(env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    """``fluxmq serve`` as the image's entrypoint runs it, in a clean FLUXMQ_* environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLUXMQ_")}
    return subprocess.run(
        [sys.executable, "-m", "fluxmq.daemon", "serve", *flags],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )


def test_the_image_as_run_plainly_refuses_to_serve_without_authentication(tmp_path: Path) -> None:
    env = {**image_env(), "FLUXMQ_DATA_DIR": str(tmp_path / "data")}
    assert env["FLUXMQ_LISTEN"].startswith("0.0.0.0:")
    # Port 0: were it to start, it would not take a port another test uses.
    env["FLUXMQ_LISTEN"] = "0.0.0.0:0"
    done = run_serve(env)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "authentication is off" in lines[0] and "--insecure-listen" in lines[0]
    assert not (tmp_path / "data").exists(), "refused before touching the data directory"


@pytest.mark.parametrize("listen", ["0.0.0.0:7070", "10.1.2.3:7070", "fluxmq.example:7070"])
def test_a_node_beyond_loopback_with_auth_off_is_refused(listen: str) -> None:
    with pytest.raises(ConfigError, match="--insecure-listen"):
        load(["--listen", listen], environ={})
    with pytest.raises(ConfigError, match="--insecure-listen"):
        load(["--listen", listen, "--auth", "off"], environ={})


@pytest.mark.parametrize("listen", ["127.0.0.1:7070", "127.0.9.3:7070", "localhost:7070"])
def test_a_loopback_node_without_auth_still_starts_as_the_quickstart(listen: str) -> None:
    assert not load(["--listen", listen], environ={}).auth_enabled


def test_serving_open_beyond_loopback_takes_an_explicit_flag_or_authentication(
    tmp_path: Path,
) -> None:
    assert load(["--listen", "0.0.0.0:7070", "--insecure-listen"], environ={}).insecure_listen
    env = {"FLUXMQ_LISTEN": "0.0.0.0:7070", "FLUXMQ_INSECURE_LISTEN": "true"}
    assert load([], environ=env).insecure_listen
    key_file = tmp_path / "admin.key"
    key_file.write_text("fmq_live_sk_" + "a" * 32 + "\n")
    cfg = load(
        ["--listen", "0.0.0.0:7070", "--auth", "on", "--auth-bootstrap-key-file", str(key_file)],
        environ={},
    )
    assert cfg.auth_enabled and not cfg.insecure_listen
