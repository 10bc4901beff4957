"""``fluxmq serve`` as an operator meets its failures: every start-up failure is one line on
stderr naming the setting and what to do, exit code 1, never a traceback. And its front door:
``--help``, ``--version`` and ``serve --help`` (every setting's default and variable)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from importlib import metadata
from pathlib import Path

import pytest

from fluxmq.config import NodeConfig

from .conftest import free_port

START_TIMEOUT_S = 30.0


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port another process (here: a listening socket) already holds."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def python(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """This interpreter run with ``args``, none of our FLUXMQ_* variables but those of ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLUXMQ")}
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        env={**clean, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def fluxmq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return python("-m", "fluxmq", *args, env=env)


def serve(
    data_dir: Path, listen: str, metrics_listen: str, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``fluxmq serve`` on these addresses (metrics_listen '' for none), run to its exit."""
    return fluxmq(
        "serve",
        "--data-dir",
        str(data_dir),
        "--listen",
        listen,
        "--metrics-listen",
        metrics_listen,
        *extra,
        env=env,
    )


def assert_one_line_failure(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_grpc_port_in_use_is_one_line_naming_listen(held_port: int, tmp_path: Path) -> None:
    proc = serve(tmp_path / "d", f"127.0.0.1:{held_port}", f"127.0.0.1:{free_port()}")
    line = assert_one_line_failure(
        proc,
        f"cannot listen on 127.0.0.1:{held_port} for grpc",
        "--listen / FLUXMQ_LISTEN",
        "address already in use",
        "choose another port",
    )
    assert line.startswith("fluxmq: ")


def test_metrics_port_in_use_is_one_line_naming_metrics_listen(
    held_port: int, tmp_path: Path
) -> None:
    proc = serve(tmp_path / "d", f"127.0.0.1:{free_port()}", f"127.0.0.1:{held_port}")
    assert_one_line_failure(
        proc,
        f"cannot listen on 127.0.0.1:{held_port}",
        "--metrics-listen / FLUXMQ_METRICS_LISTEN",
        "address already in use",
    )


def test_raft_port_in_use_is_one_line_naming_raft_listen(held_port: int, tmp_path: Path) -> None:
    proc = serve(
        tmp_path / "d",
        f"127.0.0.1:{free_port()}",
        f"127.0.0.1:{free_port()}",
        "--raft-listen",
        f"127.0.0.1:{held_port}",
        "--peers",
        f"127.0.0.1:{free_port()}",
        "--auth",
        "off",
        env={"FLUXMQ_CLUSTER_SECRET": "startup-test-secret-0123"},
    )
    assert_one_line_failure(
        proc,
        f"cannot listen on 127.0.0.1:{held_port} for raft",
        "--raft-listen / FLUXMQ_RAFT_LISTEN",
        "address already in use",
    )


def test_address_of_no_interface_is_one_line(tmp_path: Path) -> None:
    proc = serve(
        tmp_path / "d",
        "192.0.2.1:7070",  # TEST-NET-1: never an address of this machine
        "",
        "--insecure-listen",  # past the open-broker check, to the bind that fails
    )
    assert_one_line_failure(proc, "for grpc (--listen / FLUXMQ_LISTEN)", "cannot assign")


def test_unusable_data_dir_is_one_line_naming_data_dir(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    proc = serve(not_a_dir / "data", f"127.0.0.1:{free_port()}", "")
    assert_one_line_failure(proc, "--data-dir / FLUXMQ_DATA_DIR", "not a directory")


def test_fluxmq_help_and_version_exit_zero() -> None:
    helped = fluxmq("--help")
    assert helped.returncode == 0 and "fluxmq serve" in helped.stdout, helped
    version = fluxmq("--version")
    assert version.returncode == 0, version
    assert version.stdout.strip() == f"fluxmq {metadata.version('fluxmq')}"
    assert fluxmq("no-such-command").returncode == 1


def test_serve_help_shows_every_settings_default_and_variable() -> None:
    proc = fluxmq("serve", "--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # argparse wraps lines
    defaults = NodeConfig()
    for f in fields(NodeConfig):
        flag = "--" + f.name.replace("_", "-")
        env = f"FLUXMQ_{f.name.upper()}"
        assert flag in text and f"env {env})" in text, f.name
    assert "(default: '127.0.0.1:7070'; env FLUXMQ_LISTEN)" in text
    assert f"(default: {defaults.shutdown_grace_ms}; env FLUXMQ_SHUTDOWN_GRACE_MS)" in text
    assert "(default: off; env FLUXMQ_LOG_JSON)" in text


def test_grpc_port_taken_after_the_check_still_exits_1_without_traceback(
    held_port: int, tmp_path: Path
) -> None:
    """A port taken between the up-front check and gRPC's own bind (a race) still ends in
    fluxmq's line naming the setting, exit code 1, no traceback (gRPC's C core may add its own
    log line before it)."""
    skip_check = (
        "import fluxmq.daemon as d; d.check_listen_addresses = lambda cfg, **_: None; "
        "raise SystemExit(d.main())"
    )
    args = ["serve", "--data-dir", str(tmp_path / "d"), "--listen", f"127.0.0.1:{held_port}"]
    proc = python("-c", skip_check, *args, "--metrics-listen", "")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"fluxmq: cannot listen on 127.0.0.1:{held_port} for grpc"), last
    assert "(--listen / FLUXMQ_LISTEN): address already in use" in last, last
