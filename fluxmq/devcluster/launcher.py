"""A local cluster on loopback: one etcd and N ``fluxmq serve`` replicas, each with its own data
directory, ports and log, for users (``fluxmq cluster up/status/down``), tests and benchmarks.

Layout of the cluster directory ``DIR``::

    DIR/cluster.json   what is running: pids, ports, data directories, logs (written by ``up``)
    DIR/secret         the cluster secret (32 url-safe characters, mode 0600; generated once)
    DIR/admin.key      a production admin API key (mode 0600; generated once), registered by
                       the nodes at start: ``export FLUXMQ_API_KEY=$(cat DIR/admin.key)``
    DIR/etcd/          etcd's data        DIR/etcd.log     its log
    DIR/node{i}/       node i's data      DIR/node{i}.log  its log (i = 1..N)

Node i listens for gRPC on ``base_port + 10*(i-1)``, serves metrics on the next port and Raft on
the one after; its peers are the other nodes' Raft addresses. Processes are started in their own
session (Ctrl-C in the shell that ran ``up`` does not reach them) and outlive the launcher; the
pids in ``cluster.json`` are how ``down`` and ``status`` find them again.

Only loopback addresses are used: the cluster is for one machine. Clients authenticate with API
keys, as in every cluster: the admin key in ``DIR/admin.key`` creates the others.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fluxmq._pb.v1 import admin_pb2, admin_pb2_grpc
from fluxmq.core.auth import new_key, parse_key
from fluxmq.metadata import EtcdMetadataStore

HOST = "127.0.0.1"
NODE_REMOVE_TIMEOUT_S = 600.0  # decommission: every replica moved (catch-up included)
PORT_STRIDE = 10  # node i uses base + 10*(i-1) + {0: gRPC, 1: metrics, 2: Raft}
STATE_FILE = "cluster.json"
SECRET_FILE = "secret"
ADMIN_KEY_FILE = "admin.key"
SECRET_ENV = "FLUXMQ_CLUSTER_SECRET"
ETCD_START_TIMEOUT_S = 15.0
CLUSTER_START_TIMEOUT_S = 60.0
NODE_START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
RPC_TIMEOUT_S = 2.0
LOG_TAIL_LINES = 25
_CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]  # loopback: never through a proxy


class LauncherError(Exception):
    """Something the user can act on: a port in use, a cluster already running, a node that did
    not start (the message carries the tail of its log)."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """Where node ``index`` (1-based) lives: its id, ports, data directory and log."""

    index: int
    node_id: str
    grpc_port: int
    metrics_port: int
    raft_port: int
    data_dir: str
    log: str
    # Added after `up` (`add_node`): no static home group (--join); it runs what placement
    # gives it.
    joined: bool = False

    @property
    def address(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def metrics_address(self) -> str:
        return f"{HOST}:{self.metrics_port}"

    @property
    def raft_address(self) -> str:
        return f"{HOST}:{self.raft_port}"

    @property
    def ports(self) -> tuple[int, int, int]:
        return (self.grpc_port, self.metrics_port, self.raft_port)


def node_specs(root: Path, nodes: int, base_port: int) -> list[NodeSpec]:
    """The port and directory layout of an ``nodes``-node cluster in ``root``."""
    if nodes < 1:
        raise LauncherError("--nodes: at least 1")
    if base_port < 1 or base_port + PORT_STRIDE * (nodes - 1) + 2 > 65535:
        raise LauncherError(
            f"--base-port: {base_port} leaves no room for {nodes} nodes "
            f"({PORT_STRIDE} ports each, ending at 65535)"
        )
    out = []
    for i in range(1, nodes + 1):
        port = base_port + PORT_STRIDE * (i - 1)
        out.append(
            NodeSpec(
                index=i,
                node_id=f"node{i}",
                grpc_port=port,
                metrics_port=port + 1,
                raft_port=port + 2,
                data_dir=str(root / f"node{i}"),
                log=str(root / f"node{i}.log"),
            )
        )
    return out


def port_free(port: int, host: str = HOST) -> bool:
    """Whether a server could listen on ``host:port`` now (SO_REUSEADDR, as servers bind: a port
    in TIME_WAIT after a previous run counts as free, one with a listener does not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
    return port


def pid_alive(pid: int, marker: str = "") -> bool:
    """Whether process ``pid`` runs (a zombie does not count). With ``marker``, and where /proc
    exists, its command line must also contain ``marker`` (a recycled pid is not ours)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, belongs to someone else
    proc = Path(f"/proc/{pid}")
    if not proc.is_dir():
        return True  # no procfs (not Linux): trust kill(0)
    try:
        stat = (proc / "stat").read_text()
        # "pid (comm) S ...": the state follows the last ')' (comm may hold spaces or parens)
        if stat[stat.rindex(")") + 1 :].split()[0] in ("Z", "X"):
            return False
        if marker:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            want = marker.encode()
            return any(a == want or a.endswith(b"=" + want) for a in args)
    except (OSError, ValueError, IndexError):
        return False
    return True


def log_tail(path: str | Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _etcd_binary() -> str:
    path = shutil.which("etcd") or next(
        (p for p in ("/usr/bin/etcd", "/usr/local/bin/etcd") if os.access(p, os.X_OK)), None
    )
    if path is None:
        raise LauncherError(
            "etcd is not installed: `make sysdeps` (or apt-get install etcd-server) installs it"
        )
    return path


def etcd_healthy(port: int, timeout_s: float = 1.0) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{HOST}:{port}/health", timeout=timeout_s) as response:
            body: bytes = response.read()
    except (OSError, urllib.error.URLError, ValueError):
        return False
    return b'"health":"true"' in body


def health_status(address: str, timeout_s: float = RPC_TIMEOUT_S) -> str:
    """The node's gRPC health ("SERVING", "NOT_SERVING", ...) or "UNREACHABLE"."""
    try:
        with grpc.insecure_channel(address, options=_CHANNEL_OPTIONS) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout_s
            )
    except grpc.RpcError:
        return "UNREACHABLE"
    name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return name


def cluster_status(
    address: str, timeout_s: float = RPC_TIMEOUT_S, api_key: str = ""
) -> dict[str, Any]:
    """AdminService.GetClusterStatus of one node as a dict: node_id and shards (shard_id, role,
    leader, term, commit_index, applied_index, members); raises grpc.RpcError."""
    metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
    with grpc.insecure_channel(address, options=_CHANNEL_OPTIONS) as ch:
        st = admin_pb2_grpc.AdminServiceStub(ch).GetClusterStatus(  # type: ignore[no-untyped-call]
            admin_pb2.GetClusterStatusRequest(), timeout=timeout_s, metadata=metadata
        )
    return {
        "node_id": st.node_id,
        "shards": [
            {
                "shard_id": s.shard_id,
                "role": s.role,
                "leader": s.leader,
                "term": s.term,
                "commit_index": s.commit_index,
                "applied_index": s.applied_index,
                "members": list(s.members),
            }
            for s in st.shards
        ],
    }


def _leader_known(status: dict[str, Any]) -> bool:
    shards = status["shards"]
    return bool(shards) and all(s["leader"] for s in shards)


class LocalCluster:
    """etcd plus ``nodes`` replicas on loopback, in the directory ``dir``.

    ``up()`` starts them and waits until every node is SERVING and a shard leader is known;
    ``down(purge)`` stops them (``purge`` deletes the data); ``status()`` reports. Nodes are
    numbered from 1 (``node1`` ...), in ``kill9(i)`` and ``restart(i)`` too; ``node_addresses``
    lists their gRPC addresses in that order (index 0 is node1).

    A cluster started by another process (``fluxmq cluster up``) is found through
    ``DIR/cluster.json``: ``LocalCluster(dir).status()`` / ``.down()`` act on it; the other
    arguments only matter to ``up()``. ``etcd_port=0`` picks a free port.
    """

    def __init__(
        self,
        dir: str | os.PathLike[str] = "./cluster",
        nodes: int = 3,
        base_port: int = 7070,
        etcd_port: int = 2379,
        *,
        quiet: bool = True,
    ) -> None:
        self.dir = Path(dir).absolute()
        self.nodes = nodes
        self.base_port = base_port
        self.etcd_port = etcd_port
        self.quiet = quiet
        self._procs: dict[int, subprocess.Popen[bytes]] = {}  # pid -> the child we started
        self._state: dict[str, Any] | None = None

    # -- state file ---------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.dir / STATE_FILE

    def load_state(self) -> dict[str, Any] | None:
        """``cluster.json`` as written by ``up`` (None if there is none)."""
        try:
            raw = self.state_path.read_text()
        except FileNotFoundError:
            return None
        try:
            state = json.loads(raw)
        except json.JSONDecodeError as err:
            raise LauncherError(f"{self.state_path} is not valid JSON ({err}); remove it") from None
        if not isinstance(state, dict) or "nodes" not in state or "etcd" not in state:
            raise LauncherError(f"{self.state_path} is not a cluster state file; remove it")
        return state

    def _save_state(self, state: dict[str, Any]) -> None:
        tmp = self.state_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_path)
        self._state = state

    def _current(self) -> dict[str, Any]:
        state = self._state if self._state is not None else self.load_state()
        if state is None:
            raise LauncherError(f"no cluster in {self.dir} (no {STATE_FILE}); run up first")
        self._state = state
        return state

    def specs(self) -> list[NodeSpec]:
        """The nodes of the running cluster (from cluster.json), else of the one ``up`` starts."""
        state = self._state if self._state is not None else self.load_state()
        if state is not None:
            return [_spec_from_json(n) for n in state["nodes"]]
        return node_specs(self.dir, self.nodes, self.base_port)

    @property
    def node_addresses(self) -> list[str]:
        """gRPC ``host:port`` of node1, node2, ... ."""
        return [s.address for s in self.specs()]

    @property
    def etcd_endpoint(self) -> str:
        return f"{HOST}:{self._current()['etcd']['client_port']}"

    def metadata_store(self) -> EtcdMetadataStore:
        """The cluster's etcd, with its secret: the records placement acts on are sealed with
        it (a store without it writes records the nodes ignore). Close it after use."""
        return EtcdMetadataStore(self.etcd_endpoint, record_secret=self.secret())

    def running_pids(self, state: dict[str, Any] | None = None) -> list[int]:
        """The pids recorded in cluster.json that still run."""
        state = state if state is not None else self.load_state()
        if state is None:
            return []
        out = []
        etcd = state["etcd"]
        if pid_alive(int(etcd["pid"]), etcd["data_dir"]):
            out.append(int(etcd["pid"]))
        out.extend(int(n["pid"]) for n in state["nodes"] if pid_alive(int(n["pid"]), n["data_dir"]))
        return out

    # -- up -----------------------------------------------------------------------------------

    def secret(self) -> str:
        """The cluster secret from ``DIR/secret``, generated (mode 0600) the first time."""
        return self._private_file(
            SECRET_FILE,
            lambda: secrets.token_urlsafe(24),  # 24 random bytes -> 32 url-safe characters
            lambda value: len(value) >= 16,
            "the secret is shorter than 16 characters",
        )

    def api_key(self) -> str:
        """The production admin key from ``DIR/admin.key``, generated (mode 0600) the first
        time. Every node registers it at start while production has no active admin key."""
        return self._private_file(
            ADMIN_KEY_FILE,
            lambda: new_key("production"),
            lambda value: (p := parse_key(value)) is not None and p.kind == "live",
            "not a production key (fmq_live_sk_<32 characters>); remove it",
        )

    def _private_file(
        self, name: str, make: Callable[[], str], valid: Callable[[str], bool], invalid: str
    ) -> str:
        """``DIR/name``'s value; made (mode 0600, created exclusively: two launchers never
        write different values) when there is none."""
        path = self.dir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            value = path.read_text().strip()
            if not valid(value):
                raise LauncherError(f"{path}: {invalid}") from None
            return value
        value = make()
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        return value

    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(msg, flush=True)

    def up(self, timeout_s: float = CLUSTER_START_TIMEOUT_S) -> dict[str, Any]:
        """Starts etcd and the nodes, waits (at most ``timeout_s``) until every node is SERVING
        and a shard leader is known, and returns the state written to cluster.json. On failure
        stops what it started and raises LauncherError with the tail of the logs."""
        self.dir.mkdir(parents=True, exist_ok=True)
        old = self.load_state()
        if old is not None and self.running_pids(old):
            raise LauncherError(
                f"a cluster is already running in {self.dir} (pids "
                f"{', '.join(map(str, self.running_pids(old)))}): "
                f"see `fluxmq cluster status --dir {self.dir}`, "
                f"stop it with `fluxmq cluster down --dir {self.dir}`"
            )
        self._state = None
        specs = node_specs(self.dir, self.nodes, self.base_port)
        self._check_ports(specs)
        etcd_bin = _etcd_binary()
        secret = self.secret()
        self.api_key()

        state: dict[str, Any] = {
            "version": 1,
            "dir": str(self.dir),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "base_port": self.base_port,
            "etcd": {},
            "nodes": [],
        }
        try:
            state["etcd"] = self._start_etcd(etcd_bin)
            self._save_state(state)
            self._say(f"etcd on {HOST}:{state['etcd']['client_port']}")
            etcd_addr = f"{HOST}:{state['etcd']['client_port']}"
            for spec in specs:
                proc = self._spawn_node(spec, specs, etcd_addr, secret)
                state["nodes"].append({**asdict(spec), "pid": proc.pid})
                self._save_state(state)
            self._say(f"started {len(specs)} node(s); waiting for them to serve and elect a leader")
            self._wait_ready(state, time.monotonic() + timeout_s)
        except BaseException as err:
            if isinstance(err, _WithEtcd):
                state["etcd"] = err.info
            tails = self._log_tails(state)
            self._stop_state(state)
            with contextlib.suppress(FileNotFoundError):
                self.state_path.unlink()
            self._state = None
            if isinstance(err, LauncherError):
                raise LauncherError(f"{err}\n{tails}") from None
            raise
        return state

    def _check_ports(self, specs: list[NodeSpec]) -> None:
        wanted = [(p, f"{s.node_id} {kind}") for s in specs for p, kind in zip(
            s.ports, ("gRPC", "metrics", "Raft"), strict=True
        )]  # fmt: skip
        if self.etcd_port:
            wanted += [(self.etcd_port, "etcd client"), (self.etcd_port + 1, "etcd peer")]
        seen: dict[int, str] = {}
        for port, what in wanted:
            if port in seen:
                raise LauncherError(f"port {port} would serve both {seen[port]} and {what}")
            seen[port] = what
        busy = [f"{port} ({what})" for port, what in wanted if not port_free(port)]
        if busy:
            raise LauncherError(
                f"ports in use on {HOST}: {', '.join(busy)}; pick others with --base-port"
                + (" / --etcd-port (0 = a free one)" if self.etcd_port else "")
            )

    def _start_etcd(self, binary: str) -> dict[str, Any]:
        if self.etcd_port:
            client_port, peer_port = self.etcd_port, self.etcd_port + 1
        else:
            client_port = free_port()
            peer_port = free_port()
            while peer_port == client_port:
                peer_port = free_port()
        data_dir = self.dir / "etcd"
        log = self.dir / "etcd.log"
        client_url = f"http://{HOST}:{client_port}"
        peer_url = f"http://{HOST}:{peer_port}"
        cmd = [
            binary,
            "--name=fluxmq",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=fluxmq={peer_url}",
            "--initial-cluster-state=new",
            "--logger=zap",
            "--log-level=warn",
        ]
        # ETCD_* variables would override or clash with the flags (etcd refuses both).
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self._procs[proc.pid] = proc
        info = {
            "pid": proc.pid,
            "client_port": client_port,
            "peer_port": peer_port,
            "data_dir": str(data_dir),
            "log": str(log),
        }
        deadline = time.monotonic() + ETCD_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise _WithEtcd(info, f"etcd exited with {proc.returncode} at start")
            if etcd_healthy(client_port):
                return info
            time.sleep(0.05)
        raise _WithEtcd(info, f"etcd was not healthy within {ETCD_START_TIMEOUT_S:.0f} s")

    def _node_command(self, spec: NodeSpec, specs: list[NodeSpec], etcd_addr: str) -> list[str]:
        # The home group is the nodes `up` started; nodes added later join without one.
        peers = ",".join(s.raft_address for s in specs if s.index != spec.index and not s.joined)
        cmd = [
            sys.executable, "-m", "fluxmq", "serve",
            "--data-dir", spec.data_dir,
            "--listen", spec.address,
            "--metrics-listen", spec.metrics_address,
            "--raft-listen", spec.raft_address,
            "--etcd", etcd_addr,
            "--node-id", spec.node_id,
            "--auth-bootstrap-key-file", str(self.dir / ADMIN_KEY_FILE),
        ]  # fmt: skip
        if spec.joined:
            cmd += ["--join"]
        elif peers:
            cmd += ["--peers", peers]
        return cmd

    def _spawn_node(
        self, spec: NodeSpec, specs: list[NodeSpec], etcd_addr: str, secret: str
    ) -> subprocess.Popen[bytes]:
        env = {**os.environ, SECRET_ENV: secret, "PYTHONUNBUFFERED": "1"}
        with open(spec.log, "ab") as out:
            proc = subprocess.Popen(
                self._node_command(spec, specs, etcd_addr),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self._procs[proc.pid] = proc
        return proc

    def _exit_code(self, pid: int) -> int | None:
        proc = self._procs.get(pid)
        return proc.poll() if proc is not None else None

    def _wait_ready(self, state: dict[str, Any], deadline: float) -> None:
        serving: set[str] = set()
        while True:
            for n in state["nodes"]:
                if not pid_alive(int(n["pid"]), n["data_dir"]):
                    code = self._exit_code(int(n["pid"]))
                    raise LauncherError(
                        f"{n['node_id']} exited at start"
                        + (f" with code {code}" if code is not None else "")
                    )
                if n["node_id"] not in serving and health_status(n_address(n), 1.0) == "SERVING":
                    serving.add(n["node_id"])
            if len(serving) == len(state["nodes"]):
                for n in state["nodes"]:
                    try:
                        if _leader_known(cluster_status(n_address(n), 1.0, self.api_key())):
                            return
                    except grpc.RpcError:
                        continue
            if time.monotonic() > deadline:
                missing = [n["node_id"] for n in state["nodes"] if n["node_id"] not in serving]
                raise LauncherError(
                    "timed out: "
                    + (
                        f"{', '.join(missing)} not SERVING"
                        if missing
                        else "no node reports a shard leader"
                    )
                )
            time.sleep(0.1)

    def _log_tails(self, state: dict[str, Any]) -> str:
        parts = []
        for entry in [*state["nodes"], state["etcd"]]:
            if entry.get("log"):
                name = entry.get("node_id", "etcd")
                parts.append(
                    f"--- {name}: {entry['log']} (last lines) ---\n{log_tail(entry['log'])}"
                )
        return "\n".join(parts)

    # -- down ---------------------------------------------------------------------------------

    def _terminate(self, entries: list[dict[str, Any]]) -> list[str]:
        """SIGTERM each running process, then SIGKILL those still running STOP_TIMEOUT_S later;
        returns what had to be killed."""
        live = [e for e in entries if pid_alive(int(e["pid"]), e["data_dir"])]
        for e in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(e["pid"]), signal.SIGCONT)  # a stopped process ignores SIGTERM
                os.kill(int(e["pid"]), signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        killed = []
        for e in live:
            if not self._wait_gone(int(e["pid"]), e["data_dir"], deadline):
                killed.append(str(e.get("node_id", "etcd")))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(e["pid"]), signal.SIGKILL)
                self._wait_gone(int(e["pid"]), e["data_dir"], time.monotonic() + 5)
        return killed

    def _wait_gone(self, pid: int, marker: str, deadline: float) -> bool:
        while True:
            proc = self._procs.get(pid)
            if proc is not None:
                proc.poll()  # reaps our own child
            if not pid_alive(pid, marker):
                self._procs.pop(pid, None)
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def _stop_state(self, state: dict[str, Any]) -> list[str]:
        killed = self._terminate(list(state["nodes"]))
        if state["etcd"]:
            killed += self._terminate([state["etcd"]])
        return killed

    def down(self, purge: bool = False) -> list[str]:
        """Stops every node (SIGTERM; SIGKILL after 20 s), then etcd, and removes cluster.json;
        ``purge`` also deletes the data directories. Returns the names of processes that had to
        be SIGKILLed. Without a cluster.json there is nothing to stop (purge still applies)."""
        state = self.load_state()
        killed: list[str] = []
        if state is not None:
            killed = self._stop_state(state)
            with contextlib.suppress(FileNotFoundError):
                self.state_path.unlink()
        self._state = None
        if purge:
            specs = [_spec_from_json(n) for n in state["nodes"]] if state else []
            dirs = {Path(s.data_dir) for s in specs}
            dirs |= {p for p in self.dir.glob("node*") if p.is_dir()}
            dirs.add(
                Path(state["etcd"]["data_dir"]) if state and state["etcd"] else self.dir / "etcd"
            )
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
        return killed

    # -- single nodes -------------------------------------------------------------------------

    def _node_entry(self, i: int) -> dict[str, Any]:
        nodes = self._current()["nodes"]
        if not 1 <= i <= len(nodes):
            raise LauncherError(f"no node {i}: nodes are numbered 1..{len(nodes)}")
        entry: dict[str, Any] = nodes[i - 1]
        return entry

    def kill9(self, i: int) -> None:
        """SIGKILL node ``i`` (1-based) and wait until it is gone."""
        entry = self._node_entry(i)
        pid = int(entry["pid"])
        if pid_alive(pid, entry["data_dir"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not self._wait_gone(pid, entry["data_dir"], time.monotonic() + 10):
            raise LauncherError(f"node{i} (pid {pid}) survived SIGKILL")

    def wipe_node(self, i: int) -> None:
        """Delete node ``i``'s data directory (it must not run): its disk is lost."""
        entry = self._node_entry(i)
        if pid_alive(int(entry["pid"]), entry["data_dir"]):
            raise LauncherError(f"node{i} runs: stop or kill it before wiping its data")
        shutil.rmtree(entry["data_dir"], ignore_errors=True)
        os.makedirs(entry["data_dir"], exist_ok=True)

    def stop_node(self, i: int) -> None:
        """SIGTERM node ``i`` (1-based); SIGKILL after 20 s."""
        self._terminate([self._node_entry(i)])

    def restart(self, i: int, timeout_s: float = NODE_START_TIMEOUT_S) -> None:
        """(Re)starts node ``i`` (1-based) with its data and ports, stopping it first if it runs,
        and waits until it is SERVING."""
        state = self._current()
        entry = self._node_entry(i)
        if entry.get("removed"):
            raise LauncherError(f"node{i} was removed (add a node instead)")
        self._terminate([entry])
        specs = [_spec_from_json(n) for n in state["nodes"]]
        spec = specs[i - 1]
        if not all(port_free(p) for p in spec.ports):
            time.sleep(0.5)  # a listener of the old process may linger a moment
        proc = self._spawn_node(
            spec, specs, f"{HOST}:{state['etcd']['client_port']}", self.secret()
        )
        entry["pid"] = proc.pid
        self._save_state(state)
        self._wait_serving(spec, proc, time.monotonic() + timeout_s)

    def add_node(self, timeout_s: float = NODE_START_TIMEOUT_S) -> int:
        """Starts one more node (the next number, the next ports) that joins without a home
        group: the placement controller gives it replicas (rebalance) and leadership. Waits
        until it is SERVING. -> its number."""
        state = self._current()
        nodes = state["nodes"]
        i = len(nodes) + 1
        base = int(state.get("base_port", self.base_port))
        port = base + PORT_STRIDE * (i - 1)
        if port + PORT_STRIDE > 65535:
            raise LauncherError(f"no ports left for node{i} above {base}")
        spec = NodeSpec(
            index=i,
            node_id=f"node{i}",
            grpc_port=port,
            metrics_port=port + 1,
            raft_port=port + 2,
            data_dir=str(self.dir / f"node{i}"),
            log=str(self.dir / f"node{i}.log"),
            joined=True,
        )
        self._check_ports([spec])
        specs = [*(_spec_from_json(n) for n in nodes), spec]
        proc = self._spawn_node(spec, specs, self.etcd_endpoint, self.secret())
        nodes.append({**asdict(spec), "pid": proc.pid})
        self._save_state(state)
        self._wait_serving(spec, proc, time.monotonic() + timeout_s)
        return i

    def remove_node(self, i: int, timeout_s: float = NODE_REMOVE_TIMEOUT_S) -> None:
        """Takes node ``i`` out for good: decommissioned (the placement controller moves its
        replicas and leadership to the others), stopped once no group lists it, and left out
        of the cluster from then on (its data directory is deleted). Only a node added with
        ``add_node``: the first nodes make up the static home group."""
        state = self._current()
        entry = self._node_entry(i)
        if not entry.get("joined"):
            raise LauncherError(
                f"node{i} is a member of the home group (started by `up`, static --peers): it "
                "can be stopped, killed and restarted, not removed"
            )
        if entry.get("removed"):
            raise LauncherError(f"node{i} was removed already")
        node_id = str(entry["node_id"])
        others = [n for n in state["nodes"] if n is not entry and not n.get("removed")]
        admin = next((n for n in others if pid_alive(int(n["pid"]), n["data_dir"])), None)
        if admin is None:
            raise LauncherError("no other node runs to decommission it through")
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(n_address(admin)) as ch:
            stub = admin_pb2_grpc.AdminServiceStub(ch)  # type: ignore[no-untyped-call]
            md = (("authorization", f"Bearer {self.api_key()}"),)
            stub.DecommissionNode(
                admin_pb2.DecommissionNodeRequest(node_id=node_id),
                metadata=md,
                timeout=RPC_TIMEOUT_S,
            )
            while True:
                nodes = stub.ListNodes(
                    admin_pb2.ListNodesRequest(), metadata=md, timeout=RPC_TIMEOUT_S
                ).nodes
                me = next((n for n in nodes if n.node_id == node_id), None)
                if me is None or (not me.groups and not me.leading):
                    break
                if time.monotonic() > deadline:
                    raise LauncherError(
                        f"node{i} still holds replicas of {', '.join(me.groups) or '-'} after "
                        f"{timeout_s:.0f} s; it keeps running (decommissioned: the controller "
                        "goes on moving them)"
                    )
                time.sleep(0.5)
        self._terminate([entry])
        shutil.rmtree(entry["data_dir"], ignore_errors=True)
        entry["removed"] = True
        self._save_state(state)

    def _wait_serving(self, spec: NodeSpec, proc: subprocess.Popen[bytes], deadline: float) -> None:
        while health_status(spec.address, 1.0) != "SERVING":
            if proc.poll() is not None or time.monotonic() > deadline:
                why = f"exited with {proc.returncode}" if proc.poll() is not None else "timed out"
                raise LauncherError(
                    f"{spec.node_id} did not start ({why}); {spec.log}:\n{log_tail(spec.log)}"
                )
            time.sleep(0.1)

    # -- status -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What runs: ``ok`` (everything up: etcd healthy, every node alive and SERVING, a
        leader for every shard), ``etcd`` and per node pid/alive/health/node_id/shards."""
        state = self.load_state()
        if state is None:
            return {"dir": str(self.dir), "ok": False, "running": False, "etcd": None, "nodes": []}
        etcd = state["etcd"]
        etcd_alive = pid_alive(int(etcd["pid"]), etcd["data_dir"])
        etcd_info = {
            "pid": etcd["pid"],
            "endpoint": f"{HOST}:{etcd['client_port']}",
            "alive": etcd_alive,
            "healthy": etcd_alive and etcd_healthy(int(etcd["client_port"])),
            "log": etcd["log"],
        }
        ok = bool(etcd_info["healthy"])
        leader_seen = False
        nodes = []
        for n in state["nodes"]:
            if n.get("removed"):
                continue
            alive = pid_alive(int(n["pid"]), n["data_dir"])
            info: dict[str, Any] = {
                "index": n["index"],
                "name": n["node_id"],
                "pid": n["pid"],
                "alive": alive,
                "address": n_address(n),
                "metrics": f"{HOST}:{n['metrics_port']}",
                "raft": f"{HOST}:{n['raft_port']}",
                "data_dir": n["data_dir"],
                "log": n["log"],
                "health": health_status(n_address(n)) if alive else "DOWN",
                "node_id": "",
                "shards": [],
                "error": "",
            }
            if alive:
                try:
                    st = cluster_status(n_address(n), api_key=self.api_key())
                except grpc.RpcError as err:
                    info["error"] = f"{err.code().name}: {err.details()}"
                else:
                    info["node_id"] = st["node_id"]
                    info["shards"] = st["shards"]
                    leader_seen = leader_seen or _leader_known(st)
            ok = ok and alive and info["health"] == "SERVING" and not info["error"]
            nodes.append(info)
        return {
            "dir": str(self.dir),
            "running": True,
            "ok": ok and leader_seen,
            "started_at": state.get("started_at", ""),
            "etcd": etcd_info,
            "nodes": nodes,
        }

    # -- context manager ----------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.up()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()


class _WithEtcd(LauncherError):
    """etcd failed to start; carries what was started so the caller stops it."""

    def __init__(self, info: dict[str, Any], msg: str) -> None:
        super().__init__(msg)
        self.info = info


def n_address(entry: dict[str, Any]) -> str:
    return f"{HOST}:{entry['grpc_port']}"


def _spec_from_json(entry: dict[str, Any]) -> NodeSpec:
    return NodeSpec(
        index=int(entry["index"]),
        node_id=str(entry["node_id"]),
        grpc_port=int(entry["grpc_port"]),
        metrics_port=int(entry["metrics_port"]),
        raft_port=int(entry["raft_port"]),
        data_dir=str(entry["data_dir"]),
        log=str(entry["log"]),
        joined=bool(entry.get("joined", False)),
    )
