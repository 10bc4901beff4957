"""End-to-end tests of the installed ``fluxmqctl``: it runs as a subprocess, as a user would run
it, against real ``fluxmq serve`` processes (one broker per test module, to keep them quick)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Node

CLI_TIMEOUT_S = 30.0


def fluxmqctl_path() -> str:
    """The console script of this environment (``pip install -e .`` creates it)."""
    found = shutil.which("fluxmqctl", path=os.path.dirname(sys.executable)) or shutil.which(
        "fluxmqctl"
    )
    if found is None:
        pytest.fail("fluxmqctl is not installed: run `.venv/bin/pip install -e . --no-deps`")
    return found


class Ctl:
    """Runs ``fluxmqctl`` against one broker, with a clean environment (no profile, no
    FLUXMQ_ADDR unless given); never a traceback."""

    def __init__(self, address: str, home: Path, api_key: str = "") -> None:
        self.address = address
        self.home = home
        self.api_key = api_key  # FLUXMQ_API_KEY of every run (a cluster authenticates)
        self.exe = fluxmqctl_path()

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLUXMQ", "FLUXMQCTL"))}
        env.update(HOME=str(self.home), FLUXMQ_ADDR=self.address, PYTHONUNBUFFERED="1")
        if self.api_key:
            env["FLUXMQ_API_KEY"] = self.api_key
        env.update(extra)
        return env

    def run(
        self, *args: str, input: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.exe, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            env=env if env is not None else self.env(),
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def ok(self, *args: str, input: str | None = None) -> str:
        proc = self.run(*args, input=input)
        assert proc.returncode == 0, (args, proc.returncode, proc.stderr)
        return proc.stdout

    def json(self, *args: str, input: str | None = None) -> Any:
        return json.loads(self.ok("-o", "json", *args, input=input))

    def fails(self, code: int, *args: str, input: str | None = None) -> str:
        """Runs a command expected to exit with ``code``; returns its one stderr line."""
        proc = self.run(*args, input=input)
        assert proc.returncode == code, (args, proc.returncode, proc.stdout, proc.stderr)
        return proc.stderr.strip()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(tmp_path_factory.mktemp("cli") / "node1")
    n.start()
    yield n
    n.stop()


@pytest.fixture(scope="module")
def ctl(node: Node, tmp_path_factory: pytest.TempPathFactory) -> Ctl:
    return Ctl(node.address, tmp_path_factory.mktemp("home"))
