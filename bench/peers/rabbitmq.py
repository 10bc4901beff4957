"""RabbitMQ as a peer of the comparison: Debian's ``rabbitmq-server`` (3.10, Erlang 25), one node
or a cluster of three, on loopback only, driven through aio-pika.

Every queue of the comparison is a fanout exchange named after it plus one quorum queue per
consumer group (``<queue>.<group>``), replicated to every node, so every group gets every
message. Publishing waits for publisher confirms; consuming uses one long-lived consumer per
(queue, group) with manual acks and a prefetch window.

Ready means: every node's ``cluster_status`` lists every node running (``start``), and, on a
cluster, every quorum queue ``create_queue`` declared lists every node as an online member
(``list_queues name members online``); ``bench.peers.readiness`` holds both judgments.

The cluster runs its own ``epmd`` on a free loopback port (``ERL_EPMD_PORT``), fresh data and log
directories and an Erlang cookie under ``root``, one scheduler thread per node (``+S 1:1``, see
/work/shared/notes/PEERS.md on fairness). ``stop`` leaves no process behind: every process it
started carries a marker in its environment, and whatever still carries it is killed.

    python -m bench.peers.rabbitmq --install
    python -m bench.peers.rabbitmq --smoke [--root DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Literal

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
)

from bench.peers.api import Delivered
from bench.peers.readiness import (
    parse_ctl_json,
    rabbit_cluster_ready,
    rabbit_quorum_queues_ready,
)

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
RABBIT_SERVER = RABBIT_BIN / "rabbitmq-server"
RABBIT_CTL = RABBIT_BIN / "rabbitmqctl"
EPMD = "epmd"
HOST = "127.0.0.1"
MARKER = "FLUXBENCH_RABBIT_ROOT"  # set in every child's environment; what stop() hunts for

NODE_START_TIMEOUT_S = 120.0
CLUSTER_TIMEOUT_S = 90.0
QUORUM_ONLINE_TIMEOUT_S = 60.0  # a declared quorum queue's members must all be online by then
READY_POLL_S = 0.2  # between two rabbitmqctl status calls (each takes ~0.5 s itself)
CTL_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
DEFAULT_PREFETCH = 500

DURABILITY = (
    "publish returns on the publisher confirm of quorum queues (one per group, Raft over all "
    "nodes), sent once the message is appended and fsync'd to the Raft log of a majority; "
    "basic.ack has no reply in AMQP 0-9-1, so ack returns once written to the socket and the "
    "queue settles it through Raft afterwards"
)


def log(msg: str) -> None:
    print(f"[rabbitmq] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# Installation


def install() -> None:
    """Install Debian's ``rabbitmq-server`` (it is not started by apt here). Idempotent."""
    if RABBIT_SERVER.exists():
        log(f"{RABBIT_SERVER} present: nothing to install")
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "rabbitmq-server"]
    log("installing: " + " ".join(cmd))
    result = subprocess.run(cmd, env=env, check=False, timeout=900)
    if result.returncode != 0:
        log("apt-get install failed; running apt-get update and retrying once")
        subprocess.run(["apt-get", "update"], env=env, check=True, timeout=600)
        subprocess.run(cmd, env=env, check=True, timeout=900)
    if not RABBIT_SERVER.exists():
        raise RuntimeError(f"rabbitmq-server installed but {RABBIT_SERVER} is missing")
    log(f"installed rabbitmq-server {_package_version('rabbitmq-server')}")


def _package_version(package: str) -> str:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", package],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    return out.stdout.strip() or "unknown"


# ---------------------------------------------------------------------------------------------
# Processes


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (held open together while picking)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def _amqp_ready(port: int) -> bool:
    """A RabbitMQ AMQP 0-9-1 listener answers the protocol header with connection.start."""
    try:
        with socket.create_connection((HOST, port), timeout=2.0) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            data = b""
            for _ in range(20):  # bounded: connection.start fits in a few segments
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
                if b"RabbitMQ" in data:
                    return data[0] == 1  # a method frame
    except OSError:
        return False
    return False


def _alive(pid: int) -> bool:
    """Running (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _marked_pids(marker_value: str) -> list[int]:
    """Live processes whose environment carries ``MARKER=marker_value``."""
    needle = f"{MARKER}={marker_value}".encode()
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0") and _alive(int(entry)):
            found.append(int(entry))
    return found


def _beam_in_group(pgid: int) -> int | None:
    """The beam.smp process in process group ``pgid`` (the ``rabbitmq-server`` script does not
    exec into the VM when stdin is off: it stays as a shell that forwards SIGTERM)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except (OSError, ValueError):
            continue
        fields = rest.split()
        if head.endswith("(beam.smp") and len(fields) > 2 and int(fields[2]) == pgid:
            return int(entry)
    return None


def _kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # every child was started as the leader of its own group


def _wait_gone(pids: Sequence[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if _alive(p)]
    return left


@dataclass
class RabbitNode:
    index: int  # 1-based
    name: str  # rabbitN@localhost
    amqp_port: int
    dist_port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    beam_pid: int | None = None
    started_at: float = 0.0
    ready_s: float = 0.0  # seconds from launch until its AMQP port answered

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{HOST}:{self.amqp_port}/"


@dataclass
class _CtlResult:
    returncode: int
    output: str
    seconds: float = field(default=0.0)


class RabbitCluster:
    """``nodes`` RabbitMQ nodes on loopback with their own epmd, clustered onto node 1.

    ``join="discovery"`` (default) lets nodes 2..N join node 1 while booting (classic config
    peer discovery), so all nodes boot in parallel; ``join="ctl"`` boots them standalone and
    runs ``stop_app; reset; join_cluster rabbit1@localhost; start_app`` on each.
    """

    name = "rabbitmq"

    def __init__(
        self,
        root: Path,
        nodes: int,
        *,
        join: Literal["discovery", "ctl"] = "discovery",
        schedulers: int = 1,
        prefetch: int = DEFAULT_PREFETCH,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        self.root = Path(root).resolve()
        self.nodes = nodes
        self.join = join
        self.schedulers = schedulers
        self.prefetch = prefetch
        self.home = self.root / "home"
        self.marker = f"{self.root}#{secrets.token_hex(4)}"
        self.epmd_port = 0
        self.node_list: list[RabbitNode] = []
        self._epmd: subprocess.Popen[bytes] | None = None
        self._started: list[subprocess.Popen[bytes]] = []  # every Popen we made, for stop()
        self._lock = threading.Lock()
        self._stopped = True
        self.startup_s = 0.0  # start() wall time
        self.stop_s = 0.0

    # -- environment ---------------------------------------------------------------------------

    def _base_env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        ctl_args = "-kernel inet_dist_use_interface {127,0,0,1} -start_epmd false"
        return {
            **keep,
            "HOME": str(self.home),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": HOST,
            "RABBITMQ_CONF_ENV_FILE": str(self.root / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
            "RABBITMQ_CTL_ERL_ARGS": ctl_args,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            MARKER: self.marker,
        }

    def _node_env(self, node: RabbitNode) -> dict[str, str]:
        erl_args = (
            f"-kernel inet_dist_use_interface {{127,0,0,1}} -start_epmd false "
            f"+S {self.schedulers}:{self.schedulers}"
        )
        return {
            **self._base_env(),
            "RABBITMQ_NODENAME": node.name,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(node.amqp_port),
            "RABBITMQ_DIST_PORT": str(node.dist_port),
            "RABBITMQ_MNESIA_BASE": str(node.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(node.dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(node.dir / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(node.dir / "advanced.config"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": erl_args,
            "ERL_CRASH_DUMP": str(node.dir / "erl_crash.dump"),
        }

    def _ctl_env(self, node: RabbitNode) -> dict[str, str]:
        return {**self._base_env(), "RABBITMQ_NODENAME": node.name}

    def _prepare(self) -> None:
        if self.root.exists():
            shutil.rmtree(self.root)
        self.home.mkdir(parents=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text("".join(secrets.choice(string.ascii_uppercase) for _ in range(20)))
        cookie.chmod(0o400)
        (self.root / "rabbitmq-env.conf").write_text("")  # ignore /etc/rabbitmq/rabbitmq-env.conf
        (self.root / "enabled_plugins").write_text("[].\n")
        ports = _free_ports(1 + 2 * self.nodes)
        self.epmd_port = ports[0]
        self.node_list = []
        for i in range(1, self.nodes + 1):
            node = RabbitNode(
                index=i,
                name=f"rabbit{i}@localhost",
                amqp_port=ports[2 * i - 1],
                dist_port=ports[2 * i],
                dir=self.root / f"node{i}",
            )
            (node.dir / "mnesia").mkdir(parents=True)
            (node.dir / "log").mkdir(parents=True)
            lines = [
                f"listeners.tcp.1 = {HOST}:{node.amqp_port}",
                "log.file.level = info",
                "log.console = false",
            ]
            if self.join == "discovery" and i > 1:
                first = "rabbit1@localhost"
                lines += [
                    "cluster_formation.peer_discovery_backend = classic_config",
                    f"cluster_formation.classic_config.nodes.1 = {first}",
                    "cluster_formation.discovery_retry_limit = 120",
                    "cluster_formation.discovery_retry_interval = 500",
                ]
            (node.dir / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
            self.node_list.append(node)

    # -- processes -----------------------------------------------------------------------------

    def _spawn(self, cmd: list[str], env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
        with open(out, "ab") as sink:
            proc = subprocess.Popen(
                cmd,
                env=env,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: killpg reaches its children
            )
        with self._lock:
            self._started.append(proc)
        return proc

    def _start_epmd(self) -> None:
        env = self._base_env()
        cmd = [EPMD, "-address", HOST, "-port", str(self.epmd_port)]
        self._epmd = self._spawn(cmd, env, self.root / "epmd.log")
        deadline = time.monotonic() + 10
        while not _port_open(self.epmd_port):
            if self._epmd.poll() is not None:
                raise RuntimeError(f"epmd exited with {self._epmd.returncode}: see {self.root}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"epmd did not listen on {HOST}:{self.epmd_port} in 10 s")
            time.sleep(0.05)

    def _start_node(self, node: RabbitNode) -> None:
        node.started_at = time.monotonic()
        node.proc = self._spawn([str(RABBIT_SERVER)], self._node_env(node), node.dir / "out.log")

    def _wait_node(self, node: RabbitNode, timeout_s: float = NODE_START_TIMEOUT_S) -> None:
        """Until the node's AMQP listener answers (the last boot step, after any cluster join)."""
        assert node.proc is not None
        deadline = node.started_at + timeout_s
        while not (_port_open(node.amqp_port) and _amqp_ready(node.amqp_port)):
            if node.proc.poll() is not None:
                raise RuntimeError(
                    f"{node.name} exited with {node.proc.returncode}:\n{self._log_tail(node)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{node.name} not listening after {timeout_s:.0f} s:\n{self._log_tail(node)}"
                )
            time.sleep(0.1)
        node.ready_s = time.monotonic() - node.started_at
        node.beam_pid = _beam_in_group(node.proc.pid)
        if node.beam_pid is None:
            raise RuntimeError(f"{node.name}: no beam.smp in process group {node.proc.pid}")

    def _log_tail(self, node: RabbitNode, lines: int = 30) -> str:
        texts: list[str] = []
        for path in [node.dir / "out.log", node.dir / "log" / f"{node.name}.log"]:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                texts.append(f"--- {path}\n" + "\n".join(tail))
        return "\n".join(texts)

    def ctl(self, node: RabbitNode, *args: str, timeout_s: float = CTL_TIMEOUT_S) -> _CtlResult:
        """``rabbitmqctl -n <node> args...``, bounded; its process group is killed on timeout."""
        t0 = time.monotonic()
        cmd = [str(RABBIT_CTL), "-n", node.name, *args]
        proc = subprocess.Popen(
            cmd,
            env=self._ctl_env(node),
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with self._lock:
            self._started.append(proc)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate(timeout=10)
            return _CtlResult(-9, out.decode(errors="replace") + "\n(timed out)", timeout_s)
        return _CtlResult(proc.returncode, out.decode(errors="replace"), time.monotonic() - t0)

    def _ctl_ok(self, node: RabbitNode, *args: str) -> str:
        res = self.ctl(node, *args)
        if res.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {node.name} {' '.join(args)}: {res.output}")
        return res.output

    def cluster_status(self, node: RabbitNode) -> dict[str, object]:
        """``rabbitmqctl cluster_status`` as ``node`` sees it (parsed JSON)."""
        status = parse_ctl_json(self._ctl_ok(node, "cluster_status", "--formatter", "json"))
        if not isinstance(status, dict):
            raise RuntimeError(f"{node.name}: cluster_status is not a JSON object: {status!r}")
        return status

    def running_nodes(self) -> list[str]:
        running = self.cluster_status(self.node_list[0]).get("running_nodes")
        return sorted(str(n) for n in running) if isinstance(running, list) else []

    def _join_with_ctl(self, node: RabbitNode) -> None:
        first = self.node_list[0].name
        self._ctl_ok(node, "stop_app")
        self._ctl_ok(node, "reset")
        self._ctl_ok(node, "join_cluster", first)
        # "tracked connection table ... node_not_running" errors in the log here are harmless
        self._ctl_ok(node, "start_app")

    def _wait_cluster(self) -> None:
        """Until every node's own cluster_status lists every node as a running member (a node
        that booted is not yet one that node 1 counts as running, and vice versa)."""
        want = [n.name for n in self.node_list]
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        reason = "not polled"
        for _ in range(int(CLUSTER_TIMEOUT_S / READY_POLL_S)):
            reason = self._cluster_reason(want)
            if not reason:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(READY_POLL_S)
        raise RuntimeError(f"rabbitmq cluster not formed after {CLUSTER_TIMEOUT_S:.0f} s: {reason}")

    def _cluster_reason(self, want: Sequence[str]) -> str:
        """What keeps the cluster from being ready, or "" once every node agrees it is."""
        for node in self.node_list:
            try:  # a node still joining may refuse the query: poll again, up to the deadline
                status = self.cluster_status(node)
            except (RuntimeError, ValueError) as e:
                return f"{node.name}: cluster_status failed: {e}"
            ready, reason = rabbit_cluster_ready(status, want)
            if not ready:
                return f"{node.name}: {reason}"
        return ""

    def wait_quorum_online(
        self, queues: Sequence[str], timeout_s: float = QUORUM_ONLINE_TIMEOUT_S
    ) -> None:
        """Until each of ``queues`` (quorum queues) has every node as a member and every member
        online: declare-ok comes once the declaring node's member started, the other members
        may still be starting, and a publish confirm needs a majority of them."""
        want = [n.name for n in self.node_list]
        deadline = time.monotonic() + timeout_s
        reason = "not polled"
        for _ in range(int(timeout_s / READY_POLL_S) + 1):
            try:
                ready, reason = self._quorum_verdict(queues, want)
            except (RuntimeError, ValueError) as e:
                ready, reason = False, f"list_queues failed: {e}"
            if ready:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(READY_POLL_S)
        raise RuntimeError(f"rabbitmq quorum queues not online after {timeout_s:.0f} s: {reason}")

    def _quorum_verdict(self, queues: Sequence[str], want: Sequence[str]) -> tuple[bool, str]:
        out = self._ctl_ok(
            self.node_list[0],
            "list_queues",
            "name",
            "members",
            "online",
            "--formatter",
            "json",
            "--silent",
        )
        rows = parse_ctl_json(out)
        return rabbit_quorum_queues_ready(rows if isinstance(rows, list) else [], queues, want)

    # -- Cluster protocol ----------------------------------------------------------------------

    def start(self) -> None:
        if not RABBIT_SERVER.exists():
            raise RuntimeError(f"{RABBIT_SERVER} missing: run install() first")
        t0 = time.monotonic()
        self._stopped = False
        try:
            self._prepare()
            self._start_epmd()
            # with discovery, node 1 boots alone and 2..N join it while booting; with ctl, all
            # boot standalone and 2..N are joined afterwards
            for node in self.node_list:
                self._start_node(node)
            self._wait_all(self.node_list)
            if self.join == "ctl":
                threads = [
                    _Thread(functools.partial(self._join_with_ctl, node))
                    for node in self.node_list[1:]
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join_checked(CLUSTER_TIMEOUT_S)
            if self.nodes > 1:
                self._wait_cluster()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        ready = ", ".join(f"{n.name} {n.ready_s:.1f}s" for n in self.node_list)
        log(f"{self.nodes} node(s) up in {self.startup_s:.1f} s (AMQP listening: {ready})")

    def _wait_all(self, nodes: Sequence[RabbitNode]) -> None:
        for node in nodes:
            self._wait_node(node)

    def stop(self) -> None:
        """Stop every node and epmd; kill -9 what does not exit; raise if anything survives."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            started = list(self._started)
        t0 = time.monotonic()
        nodes = [n.proc for n in self.node_list if n.proc is not None and n.proc.poll() is None]
        for proc in nodes:  # beam.smp shuts down cleanly on SIGTERM (init:stop)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        beams = [n.beam_pid for n in self.node_list if n.beam_pid is not None]
        left = _wait_gone([p.pid for p in nodes] + beams, STOP_TIMEOUT_S)
        if left:
            log(f"nodes {left} ignored SIGTERM for {STOP_TIMEOUT_S:.0f} s: kill -9")
        for proc in started:  # unreaped leaders only: a reaped pid may belong to someone else
            if proc is not self._epmd and proc.poll() is None:
                _kill_group(proc.pid, signal.SIGKILL)
        if self._epmd is not None and self._epmd.poll() is None:
            self._epmd.terminate()
            if _wait_gone([self._epmd.pid], 5.0):
                _kill_group(self._epmd.pid, signal.SIGKILL)
        for proc in started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        # anything that escaped its group (e.g. a daemonised epmd) still carries the marker
        stray = _wait_gone(_marked_pids(self.marker), 2.0)  # port helpers exit with their VM
        for pid in stray:
            log(f"killing stray process {pid} ({_cmdline(pid)})")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        survivors = _wait_gone(stray, 5.0) + [p.pid for p in started if p.poll() is None]
        self.stop_s = time.monotonic() - t0
        if survivors:
            raise RuntimeError(f"processes still running after stop: {sorted(set(survivors))}")
        log(f"stopped in {self.stop_s:.1f} s; no process left")

    def adapter(self, prefetch: int | None = None) -> RabbitAdapter:
        if not self.node_list or self.node_list[0].proc is None:
            raise RuntimeError("start() first")
        return RabbitAdapter(
            self.node_list[0].url,
            self.nodes,
            self.server_pids(),
            prefetch=prefetch if prefetch is not None else self.prefetch,
            # one node: declare-ok already means its only member runs
            quorum_ready=self.wait_quorum_online if self.nodes > 1 else None,
        )

    def server_pids(self) -> list[int]:
        """The nodes' beam.smp processes (children of the ``rabbitmq-server`` shells)."""
        return [n.beam_pid for n in self.node_list if n.beam_pid is not None]

    def versions(self) -> dict[str, str]:
        return {
            "rabbitmq": _package_version("rabbitmq-server"),
            "erlang": _otp_version(),
            "aio-pika": metadata.version("aio-pika"),
            "aiormq": metadata.version("aiormq"),
        }

    def __enter__(self) -> RabbitCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _otp_version() -> str:
    for path in sorted(Path("/usr/lib/erlang/releases").glob("*/OTP_VERSION")):
        return path.read_text().strip()
    return "unknown"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


class _Thread(threading.Thread):
    """A thread whose exception reaches ``join_checked``."""

    def __init__(self, fn: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self._fn = fn
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._fn()
        except BaseException as e:
            self.error = e

    def join_checked(self, timeout_s: float) -> None:
        self.join(timeout_s)
        if self.is_alive():
            raise RuntimeError(f"{self.name} still running after {timeout_s:.0f} s")
        if self.error is not None:
            raise self.error


# ---------------------------------------------------------------------------------------------
# Adapter


class _Consumer:
    """One long-lived consumer of ``<queue>.<group>`` on its own channel, feeding a buffer.

    Delivery tags on a channel with one consumer are 1, 2, 3, ...; ``outstanding`` holds the
    unacked ones so that ``ack`` can use ``multiple=True`` only when it settles exactly the
    lowest outstanding run (other receivers of the group may hold lower tags)."""

    def __init__(self, channel: AbstractChannel, queue: AbstractQueue) -> None:
        self.channel = channel
        self.queue = queue
        self.buffer: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self.outstanding: set[int] = set()
        self.low = 1  # every tag below it is settled
        self.consumer_tag = ""

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        assert message.delivery_tag is not None
        self.outstanding.add(message.delivery_tag)
        self.buffer.put_nowait(message)

    async def ack(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        tags = sorted(m.delivery_tag for m in messages if m.delivery_tag is not None)
        lo, hi = tags[0], tags[-1]
        while self.low not in self.outstanding and self.low < lo:
            self.low += 1
        contiguous = hi - lo + 1 == len(tags) and len(set(tags)) == len(tags)
        if contiguous and lo == self.low and len(tags) > 1:
            top = max(messages, key=lambda m: m.delivery_tag or 0)
            await top.ack(multiple=True)
        else:
            for m in messages:
                await m.ack()
        self.outstanding.difference_update(tags)


class RabbitAdapter:
    """aio-pika client of node 1 (where the quorum queue leaders live, being declared there).

    Publishing uses a pool of confirm-mode channels (one per concurrent ``publish`` call) on one
    connection; consuming uses a second connection, one channel + consumer per (queue, group)."""

    name = "rabbitmq"
    durability = DURABILITY

    def __init__(
        self,
        url: str,
        nodes: int,
        pids: list[int],
        *,
        prefetch: int = DEFAULT_PREFETCH,
        quorum_ready: Callable[[Sequence[str]], None] | None = None,
    ) -> None:
        self.url = url
        self.nodes = nodes
        self.prefetch = prefetch
        self._quorum_ready = quorum_ready  # blocks until the named quorum queues are online
        self._pids = pids
        self._pub_conn: AbstractConnection | None = None
        self._sub_conn: AbstractConnection | None = None
        self._free_channels: list[AbstractChannel] = []
        self._exchanges: dict[tuple[int, str], AbstractExchange] = {}
        self._consumers: dict[tuple[str, str], _Consumer] = {}
        self._consumer_locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def connect(self) -> None:
        self._pub_conn = await aio_pika.connect(self.url, timeout=30)
        self._sub_conn = await aio_pika.connect(self.url, timeout=30)

    async def close(self) -> None:
        for consumer in self._consumers.values():
            with contextlib.suppress(Exception):
                await consumer.channel.close()
        self._consumers.clear()
        for conn in (self._pub_conn, self._sub_conn):
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
        self._pub_conn = self._sub_conn = None
        self._free_channels.clear()
        self._exchanges.clear()

    def _conn(self, which: Literal["pub", "sub"]) -> AbstractConnection:
        conn = self._pub_conn if which == "pub" else self._sub_conn
        if conn is None:
            raise RuntimeError("connect() first")
        return conn

    async def create_queue(self, queue: str, groups: Sequence[str]) -> None:
        channel = await self._conn("pub").channel()
        try:
            exchange = await channel.declare_exchange(
                queue, aio_pika.ExchangeType.FANOUT, durable=True
            )
            for group in groups:
                q = await channel.declare_queue(
                    f"{queue}.{group}",
                    durable=True,
                    arguments={
                        "x-queue-type": "quorum",
                        "x-quorum-initial-group-size": self.nodes,
                    },
                )
                await q.bind(exchange)
        finally:
            await channel.close()
        if self._quorum_ready is not None:
            await asyncio.to_thread(self._quorum_ready, [f"{queue}.{g}" for g in groups])

    async def _take_channel(self) -> AbstractChannel:
        while self._free_channels:
            channel = self._free_channels.pop()
            if not channel.is_closed:
                return channel
        return await self._conn("pub").channel(publisher_confirms=True, on_return_raises=True)

    async def publish(self, queue: str, payloads: Sequence[bytes]) -> None:
        channel = await self._take_channel()
        ok = False
        try:
            key = (id(channel), queue)
            exchange = self._exchanges.get(key)
            if exchange is None:
                exchange = await channel.get_exchange(queue, ensure=False)
                self._exchanges[key] = exchange
            persistent = aio_pika.DeliveryMode.PERSISTENT
            await asyncio.gather(
                *(
                    exchange.publish(aio_pika.Message(p, delivery_mode=persistent), routing_key="")
                    for p in payloads
                )
            )  # every publish awaits its own confirm; a nack raises DeliveryError
            ok = True
        finally:
            if ok:
                self._free_channels.append(channel)
            else:  # a failed channel may hold confirms we no longer wait for: drop it
                with contextlib.suppress(Exception):
                    await channel.close()

    async def _consumer(self, queue: str, group: str) -> _Consumer:
        key = (queue, group)
        consumer = self._consumers.get(key)
        if consumer is not None:
            return consumer
        lock = self._consumer_locks.setdefault(key, asyncio.Lock())
        async with lock:
            consumer = self._consumers.get(key)
            if consumer is None:
                channel = await self._conn("sub").channel()
                await channel.set_qos(prefetch_count=self.prefetch)
                q = await channel.get_queue(f"{queue}.{group}", ensure=False)
                consumer = _Consumer(channel, q)
                consumer.consumer_tag = await q.consume(consumer.on_message, no_ack=False)
                self._consumers[key] = consumer
        return consumer

    async def receive(
        self, queue: str, group: str, max_messages: int, wait_ms: int
    ) -> list[Delivered]:
        consumer = await self._consumer(queue, group)
        buf = consumer.buffer
        if not buf.empty():
            first = buf.get_nowait()
        else:
            try:
                first = await asyncio.wait_for(buf.get(), timeout=max(wait_ms, 0) / 1000)
            except TimeoutError:
                return []
        out = [Delivered(first.body, first)]
        while len(out) < max_messages and not buf.empty():
            m = buf.get_nowait()
            out.append(Delivered(m.body, m))
        return out

    async def ack(self, queue: str, group: str, messages: Sequence[Delivered]) -> None:
        if not messages:
            return
        consumer = self._consumers[(queue, group)]
        await consumer.ack([m.handle for m in messages])

    def server_pids(self) -> list[int]:
        return list(self._pids)


# ---------------------------------------------------------------------------------------------
# Smoke test


async def _exercise(cluster: RabbitCluster, messages: int = 200, batch: int = 10) -> None:
    adapter = cluster.adapter()
    await adapter.connect()
    try:
        queue, groups = "smoke", ["g1", "g2"]
        await adapter.create_queue(queue, groups)
        t0 = time.monotonic()
        bodies = [i.to_bytes(8, "big") + b"x" * 56 for i in range(messages)]
        for i in range(0, messages, batch):
            await adapter.publish(queue, bodies[i : i + batch])
        pub_s = time.monotonic() - t0
        for group in groups:
            seen: list[int] = []
            deadline = time.monotonic() + 30
            for _ in range(10 * messages):  # bounded in count and time
                if len(seen) >= messages or time.monotonic() > deadline:
                    break
                got = await adapter.receive(queue, group, max_messages=7, wait_ms=1000)
                seen += [int.from_bytes(d.payload[:8], "big") for d in got]
                # ack odd batches one by one through a split, to exercise both ack paths
                if len(got) > 2 and len(seen) % 2:
                    await adapter.ack(queue, group, got[1:])
                    await adapter.ack(queue, group, got[:1])
                else:
                    await adapter.ack(queue, group, got)
            if sorted(seen) != list(range(messages)):
                raise AssertionError(f"{group}: got {len(seen)} messages, wanted {messages}")
            extra = await adapter.receive(queue, group, max_messages=10, wait_ms=300)
            if extra:
                raise AssertionError(f"{group}: {len(extra)} unexpected redeliveries")
        # every group settled everything: the quorum queues are empty on the broker
        channel = await adapter._conn("pub").channel()
        for group in groups:
            depth = 0
            for _ in range(50):  # acks are asynchronous: give the Raft settle a moment
                q = await channel.declare_queue(f"{queue}.{group}", passive=True)
                depth = q.declaration_result.message_count or 0
                if depth == 0:
                    break
                await asyncio.sleep(0.1)
            if depth:
                raise AssertionError(f"{queue}.{group} still holds {depth} messages")
        await channel.close()
        log(
            f"nodes={cluster.nodes}: {messages} msgs in batches of {batch} published in "
            f"{pub_s * 1000:.0f} ms, both groups received and acked all of them"
        )
    finally:
        await adapter.close()


def smoke(root: Path) -> None:
    """1-node then 3-node cluster: queue with 2 groups, 200 msgs in batches of 10, drain both."""
    install()
    for nodes in (1, 3):
        with RabbitCluster(root / f"n{nodes}", nodes) as cluster:
            log(f"versions: {cluster.versions()}; beam pids {cluster.server_pids()}")
            asyncio.run(_exercise(cluster))
        leftovers = _marked_pids(cluster.marker)
        if leftovers:
            raise AssertionError(f"processes left behind: {leftovers}")
    log("smoke OK")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.rabbitmq")
    parser.add_argument("--install", action="store_true", help="apt-get install rabbitmq-server")
    parser.add_argument("--smoke", action="store_true", help="start 1 and 3 nodes, run traffic")
    parser.add_argument("--root", type=Path, default=None, help="work dir (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.install:
        install()
    if args.smoke:
        if args.root is not None:
            smoke(args.root)
        else:
            with tempfile.TemporaryDirectory(prefix="rabbit-smoke-") as tmp:
                smoke(Path(tmp))
    if not (args.install or args.smoke):
        parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
