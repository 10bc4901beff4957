"""Exit codes and one-line errors of ``fluxmqctl``; where the address comes from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fluxmq.cli.queue
from fluxmq.cli.main import main
from tests.integration.conftest import free_port

from .conftest import Ctl

ONE_LINE_ERROR = re.compile(r"error: [A-Z_]+: .+ \(request id [0-9a-f]+\)")


def test_broker_refusals_are_one_line_with_reason_and_request_id(ctl: Ctl) -> None:
    for args in (
        ("queue", "describe", "missing"),
        ("queue", "stats", "missing"),
        ("-o", "json", "queue", "delete", "missing", "--yes"),
        ("publish", "missing", "x"),
        ("tail", "missing", "--from", "earliest"),
        ("group", "list", "missing"),
        ("offsets", "get", "missing", "g"),
        ("dlq", "list", "missing"),
    ):
        proc = ctl.run(*args)
        assert proc.returncode == 1, (args, proc.stderr)
        assert proc.stdout == "", args  # nothing half-printed, not even JSON
        line = proc.stderr.strip()
        assert "\n" not in line and ONE_LINE_ERROR.fullmatch(line), (args, line)
        assert line.startswith("error: QUEUE_NOT_FOUND: "), line

    # a bad value the broker rejects: its reason and the field violation on the same line
    err = ctl.fails(1, "queue", "create", "bad name!")
    assert err.startswith("error: INVALID_ARGUMENT: ") and "config.name" in err
    ctl.ok("queue", "create", "twice")
    assert ctl.fails(1, "queue", "create", "twice").startswith("error: QUEUE_EXISTS: ")
    err = ctl.fails(1, "publish", "twice", "x", "--partition", "5")
    assert err.startswith("error: PARTITION_OUT_OF_RANGE: ")


def test_bad_usage_exits_2(ctl: Ctl) -> None:
    for args in (
        ("queue", "list", "--bogus"),
        ("queue",),
        ("nonsense",),
        (),
        ("queue", "create", "q", "--partitions", "many"),
        ("queue", "create", "q", "--type", "fifo"),
        ("queue", "purge", "q"),  # --scope is required
        ("-o", "yaml", "queue", "list"),
        ("--timeout", "0", "queue", "list"),
        ("consume", "q"),  # --group is required
        ("tail", "q", "--from", "offset:-1"),
        ("publish", "q", "x", "--header", "novalue"),
        ("--server", "no-port", "queue", "list"),
    ):
        proc = ctl.run(*args)
        assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
        assert "error" in proc.stderr.lower(), args


def test_unreachable_broker_exits_3(ctl: Ctl) -> None:
    dead = f"127.0.0.1:{free_port()}"
    err = ctl.fails(3, "--server", dead, "queue", "list")
    assert err.startswith(f"error: UNAVAILABLE: cannot reach the broker at {dead}")
    assert "\n" not in err
    err = ctl.fails(3, "cluster", "status", "--server", dead)
    assert err.startswith("error: no node answered")
    # several addresses: the first that accepts a connection is used
    ctl.ok("queue", "list", "--server", f"{dead},{ctl.address}")


def test_address_and_settings_resolution(ctl: Ctl, tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    # --server beats FLUXMQ_ADDR
    proc = ctl.run("--server", ctl.address, "queue", "list", env=ctl.env(FLUXMQ_ADDR=dead))
    assert proc.returncode == 0, proc.stderr
    # the profile file in ~/.config/fluxmq: server and output
    env = ctl.env()
    del env["FLUXMQ_ADDR"]
    home = Path(env["HOME"])
    (home / ".config" / "fluxmq").mkdir(parents=True, exist_ok=True)
    profile = home / ".config" / "fluxmq" / "profile.toml"
    profile.write_text(f'server = "{ctl.address}"\noutput = "json"\ntimeout = 5\n')
    try:
        proc = ctl.run("queue", "list", env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.lstrip().startswith("{")  # output = "json"
        assert ctl.run("-o", "table", "queue", "list", env=env).stdout.startswith("NAME")
        # FLUXMQ_ADDR beats the profile
        proc = ctl.run("queue", "list", env={**env, "FLUXMQ_ADDR": dead})
        assert proc.returncode == 3
    finally:
        profile.unlink()
    # FLUXMQ_PROFILE names another file; a broken one is a usage error
    other = tmp_path / "p.toml"
    other.write_text(f'server = "{dead}"\n')
    assert ctl.run("queue", "list", env={**env, "FLUXMQ_PROFILE": str(other)}).returncode == 3
    other.write_text("sever = 'typo'\n")
    proc = ctl.run("queue", "list", env={**env, "FLUXMQ_PROFILE": str(other)})
    assert proc.returncode == 2 and "unknown key(s) sever" in proc.stderr
    proc = ctl.run("queue", "list", env={**env, "FLUXMQ_PROFILE": str(tmp_path / "none")})
    assert proc.returncode == 2
    # no flag, no variable, no profile: 127.0.0.1:7070 (whatever answers there, the name shows)
    proc = ctl.run("--timeout", "1", "group", "list", "no-such-queue-here", env=env)
    assert proc.returncode in (1, 3)
    assert "127.0.0.1:7070" in proc.stderr or "request id" in proc.stderr


def test_help_documents_exit_codes(ctl: Ctl) -> None:
    out = ctl.ok("--help")
    for code in ("0 ", "1 ", "2 ", "3 ", "130"):
        assert re.search(rf"^\s+{code}", out, re.M), code
    assert "FLUXMQ_ADDR" in out and "profile.toml" in out
    for command in ("queue", "publish", "consume", "tail", "group", "offsets", "dlq", "cluster"):
        assert command in out


def test_unexpected_errors_are_one_line_unless_debugging(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(*_: object) -> int:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(fluxmq.cli.queue, "list_queues", boom)
    monkeypatch.delenv("FLUXMQCTL_DEBUG", raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")
    assert main(["--server", "127.0.0.1:1", "queue", "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: RuntimeError: boom second line (a bug? FLUXMQCTL_DEBUG=1")
    assert err.count("\n") == 1
    monkeypatch.setenv("FLUXMQCTL_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(["--server", "127.0.0.1:1", "queue", "list"])
