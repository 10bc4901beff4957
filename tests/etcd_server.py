"""A real single-member etcd on loopback for tests (not a test module).

``EtcdServer`` picks free ports and a temporary data directory, starts the ``etcd`` binary, waits
(bounded) until ``/health`` answers, and stops it with SIGTERM, then SIGKILL. ``stop()`` followed
by ``start()`` restarts it on the same ports and data directory, so tests can check what clients
see while etcd is down and that the data survives; ``pause()``/``resume()`` (SIGSTOP/SIGCONT)
make it hang instead.

The binary is required, never skipped: ``make sysdeps`` installs Debian's ``etcd-server``. Election
timings are shortened so etcd's minimum lease TTL is 1 s (etcd raises shorter TTLs to
1.5 x election timeout, rounded up to whole seconds), which keeps lease-expiry tests short.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
MIN_VERSION = (3, 4)


class EtcdUnavailableError(RuntimeError):
    """The etcd binary is missing, too old, or the server did not become healthy in time."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def etcd_binary() -> str:
    """The path of ``etcd`` (3.4+); raises EtcdUnavailableError with the fix if it is missing."""
    path = shutil.which("etcd") or next(
        (p for p in ("/usr/bin/etcd", "/usr/local/bin/etcd") if os.access(p, os.X_OK)), None
    )
    if path is None:
        raise EtcdUnavailableError(
            "the etcd binary is not installed; run `make sysdeps` (Debian package etcd-server)"
        )
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    version = next((line.split()[-1] for line in out.splitlines() if "etcd Version" in line), "")
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if len(parts) != 2 or parts < MIN_VERSION:
        raise EtcdUnavailableError(f"etcd at {path} reports version {version!r}; need 3.4 or later")
    return path


class EtcdServer:
    """One etcd process; ``with EtcdServer() as etcd:`` starts it and removes it afterwards."""

    def __init__(self) -> None:
        self.binary = etcd_binary()
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self.host = "127.0.0.1"
        self._tmp = tempfile.mkdtemp(prefix="fluxmq-etcd-")
        self.data_dir = Path(self._tmp) / "data"
        self.log_path = Path(self._tmp) / "etcd.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _command(self) -> list[str]:
        client_url = f"http://{self.host}:{self.client_port}"
        peer_url = f"http://{self.host}:{self.peer_port}"
        return [
            self.binary,
            "--name=test",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=test={peer_url}",
            "--initial-cluster-state=new",
            "--heartbeat-interval=50",
            "--election-timeout=500",
            "--logger=zap",
            "--log-level=warn",
        ]

    def start(self) -> None:
        """Starts etcd (again, on the same ports and data) and waits until it is healthy."""
        if self.running:
            return
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self._command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        url = f"http://{self.endpoint}/health"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EtcdUnavailableError(
                    f"etcd exited with {self._proc.returncode} at start; log:\n{self._log_tail()}"
                )
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(url, timeout=1) as response,
            ):
                if b'"health":"true"' in response.read():
                    return
            time.sleep(0.05)
        self.stop()
        raise EtcdUnavailableError(
            f"etcd was not healthy within {START_TIMEOUT_S} s; log:\n{self._log_tail()}"
        )

    def stop(self) -> None:
        """Stops etcd (SIGTERM, then SIGKILL after STOP_TIMEOUT_S); the data directory stays."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)  # a paused etcd would ignore SIGTERM until resumed
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing answers (a hung etcd, not a dead one)."""
        assert self._proc is not None and self.running, "etcd is not running"
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None and self.running, "etcd is not running"
        self._proc.send_signal(signal.SIGCONT)

    def cleanup(self) -> None:
        """Stops etcd and removes its data directory."""
        self.stop()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> EtcdServer:
        try:
            self.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
