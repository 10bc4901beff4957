"""A real single-member etcd on loopback for tests (not a test module).

``EtcdServer`` picks free ports and a temporary data directory, starts the ``etcd`` binary, waits
(bounded) until ``/health`` answers, and stops it with SIGTERM, then SIGKILL. ``stop()`` followed
by ``start()`` restarts it on the same ports and data directory, so tests can check what clients
see while etcd is down and that the data survives; ``pause()``/``resume()`` (SIGSTOP/SIGCONT)
make it hang instead.

``EtcdServer(secure=True)`` runs etcd as production should: TLS on the client port with
``--client-cert-auth`` (certificates from tests/certs.py, made per server) and authentication
enabled, with a ``root`` user and a ``fluxmq`` user whose role may read and write every key;
``ca_file``, ``client_cert(user)`` and ``etcdctl(...)`` give tests what a node or operator has.

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
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from tests.certs import LOCAL_SANS, Authority, CertFiles

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
MIN_VERSION = (3, 4)
ETCDCTL_TIMEOUT_S = 15.0
ROOT_PASSWORD = "root-pw-0123456789"
USER = "fluxmq"
PASSWORD = "fluxmq-pw-0123456789"


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

    def __init__(self, *, secure: bool = False, enable_auth: bool = True) -> None:
        """``secure``: TLS with client certificates; then ``enable_auth`` (default) turns etcd's
        authentication on with the users of the module docstring at the first start."""
        self.binary = etcd_binary()
        self.secure = secure
        self._wants_auth = secure and enable_auth
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self.host = "127.0.0.1"
        self._tmp = tempfile.mkdtemp(prefix="fluxmq-etcd-")
        self.data_dir = Path(self._tmp) / "data"
        self.log_path = Path(self._tmp) / "etcd.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._auth_enabled = False
        self._certs = Path(self._tmp) / "certs"
        if secure:
            self._certs.mkdir()
            self._ca = Authority("etcd test CA")
            self.ca_file = self._ca.write(self._certs / "ca.pem")
            self._server = self._ca.issue("etcd", sans=LOCAL_SANS, server=True, client=True).write(
                self._certs, "server"
            )

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.endpoint}"

    def client_cert(self, user: str) -> CertFiles:
        """A client certificate whose common name is ``user`` (etcd's user when it carries no
        password token), signed by this server's CA."""
        assert self.secure, "a plaintext etcd has no CA"
        path = self._certs / f"user-{user}.crt"
        if path.exists():
            return CertFiles(path, self._certs / f"user-{user}.key")
        return self._ca.issue(user, client=True).write(self._certs, f"user-{user}")

    def etcdctl(self, *args: str, user: str = "root", check: bool = True) -> str:
        """Runs ``etcdctl`` against this server (as ``user`` by its client certificate when
        secure; ``user=""``: with no certificate at all) -> its output."""
        command = ["etcdctl", f"--endpoints={self.url}", "--dial-timeout=5s"]
        if self.secure:
            command.append(f"--cacert={self.ca_file}")
            if user:
                cert = self.client_cert(user)
                command += [f"--cert={cert.cert}", f"--key={cert.key}"]
        proc = subprocess.run(
            [*command, *args],
            capture_output=True,
            text=True,
            timeout=ETCDCTL_TIMEOUT_S,
            env={**os.environ, "ETCDCTL_API": "3"},
            stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout + proc.stderr

    def _enable_auth(self) -> None:
        """Users root and fluxmq (read-write on every key), then authentication on."""
        self.etcdctl("user", "add", f"root:{ROOT_PASSWORD}")
        self.etcdctl("role", "add", USER)
        self.etcdctl("role", "grant-permission", USER, "--prefix=true", "readwrite", "/")
        self.etcdctl("user", "add", f"{USER}:{PASSWORD}")
        self.etcdctl("user", "grant-role", USER, USER)
        self.etcdctl("auth", "enable")
        self._auth_enabled = True

    def _health_context(self) -> ssl.SSLContext | None:
        if not self.secure:
            return None
        context = ssl.create_default_context(cafile=str(self.ca_file))
        root = self.client_cert("root")
        context.load_cert_chain(str(root.cert), str(root.key))
        return context

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _command(self) -> list[str]:
        client_url = self.url
        peer_url = f"http://{self.host}:{self.peer_port}"
        tls = (
            [
                f"--cert-file={self._server.cert}",
                f"--key-file={self._server.key}",
                f"--trusted-ca-file={self.ca_file}",
                "--client-cert-auth",
            ]
            if self.secure
            else []
        )
        return [
            self.binary,
            *tls,
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
        url = f"{self.url}/health"
        context = self._health_context()
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EtcdUnavailableError(
                    f"etcd exited with {self._proc.returncode} at start; log:\n{self._log_tail()}"
                )
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(url, timeout=1, context=context) as response,
            ):
                if b'"health":"true"' in response.read():
                    if self._wants_auth and not self._auth_enabled:
                        self._enable_auth()
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
        # kill() returns before the signal has stopped every thread: a thread running on the
        # other core can still answer a request, so wait until all of them are stopped.
        deadline_s = time.monotonic() + 5.0
        while not _all_threads_stopped(self._proc.pid):
            assert time.monotonic() < deadline_s, "etcd did not stop within 5 s of SIGSTOP"
            time.sleep(0.005)

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


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` in state T (stopped), from /proc/<pid>/task/*/stat."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = []
        for tid in tasks:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                # The state follows the command name, which is in parentheses.
                states.append(f.read().rsplit(")", 1)[1].split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return False
    return bool(states) and all(state in ("T", "t") for state in states)
