"""deploy/compose and deploy/Dockerfile as data, and the compose topology run as plain processes
(there is no Docker engine here). Not a test module: tests/deploy/test_compose.py uses it.

``compose_config`` is what ``docker-compose config`` makes of compose.yaml (anchors merged,
variables interpolated). ``parse_dockerfile`` reads the Dockerfile's stages and instructions.

``Topology`` starts etcd and the FluxMQ nodes of the compose file with their commands and
environments taken from it unchanged except for three things a container gets from Docker:

- its own IP: each compose service gets a loopback address (127.0.9.x) and ``0.0.0.0`` in its
  command and environment becomes that address;
- names: the service names resolve to those addresses through a private /etc/hosts
  (each process runs in a user + mount namespace with a hosts file bind-mounted over
  /etc/hosts: what Docker's DNS does on the compose network);
- volumes: each named volume's container path (/var/lib/fluxmq, etcd's data dir) becomes a
  temporary directory; a bind mount (etcd's certificates from deploy/etcd-pki.sh) becomes its
  host path.

etcd speaks TLS with client certificates and authentication on: ``load_compose(pki=...)``
points FLUXMQ_ETCD_PKI at a directory of certificates (``make_pki`` runs deploy/etcd-pki.sh,
naming etcd's loopback address too), and the one-shot ``etcd-auth`` service runs, as compose
runs it, after etcd is healthy and before the nodes start.

The nodes authenticate clients (auth is on by default in cluster mode): ``compose_config`` is given
the host variables the compose file demands, the cluster secret and ``FLUXMQ_API_KEY`` (the
first admin key, a fresh ``TEST_API_KEY``), which the nodes receive as their bootstrap key.

A node's command is the image's ENTRYPOINT (the ``fluxmq`` console script, run as
``<this python> -m fluxmq``) plus the service's ``command``; its environment is the image's
``FLUXMQ_*`` ENV overlaid with the service's ``environment``, as Docker does.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fluxmq.core.auth import new_key

REPO = Path(__file__).resolve().parents[2]
PKI_SCRIPT = REPO / "deploy" / "etcd-pki.sh"
PKI_ENV = "FLUXMQ_ETCD_PKI"
COMPOSE_FILE = REPO / "deploy" / "compose" / "compose.yaml"
PROMETHEUS_FILE = REPO / "deploy" / "compose" / "prometheus.yml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
SECRET_ENV = "FLUXMQ_CLUSTER_SECRET"
TEST_SECRET = "compose-test-secret-0123456789abcdef"
# The host's variable (what fluxmqctl and the SDK present) and the node setting it feeds.
API_KEY_ENV = "FLUXMQ_API_KEY"
BOOTSTRAP_KEY_ENV = "FLUXMQ_AUTH_BOOTSTRAP_KEY"
TEST_API_KEY = new_key("production")  # as `fluxmqctl key generate` makes it
SUBNET = "127.0.9."  # loopback addresses of the compose services (unusual: no clash)
ETCD_IMAGE = "quay.io/coreos/etcd"
NODE_IMAGE = "fluxmq:latest"
STOP_TIMEOUT_S = 10.0
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# Not what a container would see: the test machine's proxies (a container has none).
_PROXY_VARS = {"http_proxy", "https_proxy", "grpc_proxy", "no_proxy", "all_proxy"}


# -- compose --------------------------------------------------------------------------------


def compose_config(env: Mapping[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    """``docker-compose -f deploy/compose/compose.yaml config [extra]`` with ``env``."""
    binary = shutil.which("docker-compose")
    if binary is None:
        raise AssertionError(
            "docker-compose is not installed: `make sysdeps` installs Debian's docker-compose"
        )
    return subprocess.run(
        [binary, "-f", str(COMPOSE_FILE), "config", *extra],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without FLUXMQ_* and COMPOSE_* variables, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FLUXMQ_", "COMPOSE_", "GRAFANA_")) and k.lower() not in _PROXY_VARS
    }
    env.update(extra)
    return env


def host_env(secret: str = TEST_SECRET, api_key: str = TEST_API_KEY) -> dict[str, str]:
    """``clean_env`` plus what the operator exports before ``up``: the secret and the key."""
    return clean_env(**{SECRET_ENV: secret, API_KEY_ENV: api_key})


def load_compose(
    secret: str = TEST_SECRET, api_key: str = TEST_API_KEY, pki: Path | None = None
) -> dict[str, Any]:
    """The resolved compose model (``docker-compose config``) with ``secret`` as the cluster
    secret, ``api_key`` as FLUXMQ_API_KEY and ``pki`` (if given) as FLUXMQ_ETCD_PKI."""
    env = host_env(secret, api_key)
    if pki is not None:
        env[PKI_ENV] = str(pki)
    done = compose_config(env)
    assert done.returncode == 0, done.stderr
    model: dict[str, Any] = yaml.safe_load(done.stdout)
    return model


def node_services(model: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The FluxMQ nodes (image fluxmq:latest, its entrypoint), by name, in name order."""
    services: dict[str, dict[str, Any]] = model["services"]
    return {
        n: s
        for n, s in sorted(services.items())
        if s.get("image") == NODE_IMAGE and "entrypoint" not in s
    }


def job_services(model: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """One-shot services of the node image with their own entrypoint (etcd-auth)."""
    services: dict[str, dict[str, Any]] = model["services"]
    return {
        n: s
        for n, s in sorted(services.items())
        if s.get("image") == NODE_IMAGE and "entrypoint" in s
    }


def make_pki(directory: Path, *extra_sans: str) -> None:
    """deploy/etcd-pki.sh ``directory`` ``extra_sans``: what the operator runs once."""
    done = subprocess.run(
        ["sh", str(PKI_SCRIPT), str(directory), *extra_sans],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def etcd_service(model: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    found = [
        (n, s)
        for n, s in model["services"].items()
        if str(s.get("image", "")).startswith(ETCD_IMAGE + ":")
    ]
    assert len(found) == 1, f"one etcd service expected, found {[n for n, _ in found]}"
    return found[0]


def interpolation_error(stderr: str) -> str:
    """What ``docker-compose config`` says about a missing required variable, without the
    unresolved ``${VAR:?message}`` templates docker-compose 1.x echoes (it dumps the whole
    environment mapping, so every template's text would otherwise seem to be in the error)."""
    return re.sub(r"\$\{[^}]*\}", "${...}", stderr)


def volume_source(entry: str | Mapping[str, Any]) -> str:
    """The host side of a compose volume entry: a named volume or (bind mount) a path."""
    if isinstance(entry, Mapping):
        return str(entry.get("source", ""))
    parts = entry.split(":")
    return parts[0] if len(parts) > 1 else ""


def volume_target(entry: str | Mapping[str, Any]) -> str:
    """The container path of a compose volume entry (short or long syntax)."""
    if isinstance(entry, Mapping):
        return str(entry["target"])
    parts = entry.split(":")
    return parts[1] if len(parts) > 1 else parts[0]


def as_list(command: str | list[str] | None) -> list[str]:
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


# -- Dockerfile -----------------------------------------------------------------------------


@dataclass(slots=True)
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, arguments)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        """Every ENV of the stage, later ones winning (``$VAR`` left unexpanded)."""
        out: dict[str, str] = {}
        for args in self.all("ENV"):
            out.update(parse_env(args))
        return out


def parse_dockerfile(text: str) -> list[Stage]:
    """The stages of a Dockerfile: joins continuation lines, drops comments and directives.
    ARG values before the first FROM are substituted into FROM lines."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append((current + stripped).strip())
        current = ""
    if current.strip():
        logical.append(current.strip())
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(base, name))
        else:
            assert stages, f"instruction before FROM: {line!r}"
            stages[-1].instructions.append((keyword, rest))
    return stages


def parse_env(args: str) -> dict[str, str]:
    """``ENV a=1 b="two words"`` (or the legacy ``ENV key value``)."""
    words = shlex.split(args)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) for w in words)


def exec_form(args: str) -> list[str] | None:
    """The JSON array of an exec-form instruction (ENTRYPOINT, CMD, HEALTHCHECK CMD), or None."""
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def final_stage() -> Stage:
    return parse_dockerfile(DOCKERFILE.read_text())[-1]


# -- processes ------------------------------------------------------------------------------


@functools.cache
def hosts_wrapper(hosts_file: Path) -> list[str]:
    """The command prefix that runs a command with ``hosts_file`` as its /etc/hosts: a user and
    mount namespace (no privileges needed), or as root a mount namespace only."""
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare (util-linux) is needed to give processes a hosts file"
    probe_cmd = ["/bin/sh", "-c", script, str(hosts_file), "true"]
    tried = []
    for prefix in ([unshare, "--user", "--map-root-user", "--mount"], [unshare, "--mount"]):
        probe = subprocess.run(
            [*prefix, "--", *probe_cmd], capture_output=True, text=True, timeout=10
        )
        if probe.returncode == 0:
            return [*prefix, "--", "/bin/sh", "-c", script, str(hosts_file)]
        tried.append(f"{shlex.join(prefix)}: {probe.stderr.strip()}")
    raise AssertionError(
        "cannot run a process with its own /etc/hosts (needs user namespaces, or root):\n"
        + "\n".join(tried)
    )


def port_free(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


def http_get(address: str, path: str, timeout_s: float = 3.0) -> tuple[int, str]:
    """(status, body) of GET http://address/path, without proxies; (0, error) if unreachable."""
    try:
        with _NO_PROXY.open(f"http://{address}{path}", timeout=timeout_s) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode(errors="replace")
    except (OSError, urllib.error.URLError) as err:
        return 0, str(err)


def wait_until(
    what: str, check: Callable[[], bool], timeout_s: float, diagnose: Callable[[], str]
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}\n{diagnose()}")


@dataclass(slots=True)
class Proc:
    """One compose service run as a process."""

    service: str
    ip: str
    argv: list[str]
    env: dict[str, str]  # what the service's container would have (before PATH etc.)
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class Topology:
    """The compose services ``etcd`` and the FluxMQ nodes as processes under ``root``."""

    def __init__(self, model: Mapping[str, Any], root: Path) -> None:
        self.model = model
        self.root = root
        services: dict[str, Any] = model["services"]
        # Every compose service has its own address, like a container on the compose network.
        self.ips = {name: f"{SUBNET}{i + 1}" for i, name in enumerate(services)}
        self.hosts_file = root / "hosts"
        self.hosts_file.write_text(
            "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
            + "".join(f"{ip} {name}\n" for name, ip in self.ips.items())
        )
        self.volumes: dict[str, dict[str, Path]] = {}  # service -> container path -> host dir
        self.etcd_name, etcd = etcd_service(model)
        self.etcd = self._etcd_proc(etcd)
        image_env = {k: v for k, v in final_stage().env().items() if k.startswith("FLUXMQ_")}
        self.nodes = [self._node_proc(n, s, image_env) for n, s in node_services(model).items()]
        self.jobs = [self._job_proc(n, s) for n, s in job_services(model).items()]

    # -- building the processes from the model ------------------------------------------------

    def _localize(self, service: str, value: str) -> str:
        """0.0.0.0 -> the service's address; a volume's container path -> its host directory."""
        value = value.replace("0.0.0.0", self.ips[service])
        for target, host in self.volumes.get(service, {}).items():
            value = re.sub(rf"(^|=){re.escape(target)}(?=/|$)", rf"\g<1>{host}", value)
        return value

    def _mount_volumes(self, service: str, spec: Mapping[str, Any]) -> None:
        mounts: dict[str, Path] = {}
        for i, entry in enumerate(spec.get("volumes", [])):
            source = volume_source(entry)
            if source.startswith("/"):  # a bind mount: the host's file, as Docker mounts it
                mounts[volume_target(entry)] = Path(source)
                continue
            host = self.root / service / f"volume{i}"
            host.mkdir(parents=True, mode=0o700)
            mounts[volume_target(entry)] = host
        self.volumes[service] = mounts

    def _etcd_proc(self, spec: Mapping[str, Any]) -> Proc:
        name = self.etcd_name
        self._mount_volumes(name, spec)
        command = as_list(spec.get("command"))
        assert command and Path(command[0]).name == "etcd", (
            f"the etcd service's command must start with the etcd binary: {command}"
        )
        binary = shutil.which("etcd")
        assert binary is not None, "etcd is not installed: `make sysdeps` installs etcd-server"
        env = {k: self._localize(name, str(v)) for k, v in (spec.get("environment") or {}).items()}
        argv = [binary, *(self._localize(name, a) for a in command[1:])]
        return Proc(name, self.ips[name], argv, env, self.root / f"{name}.log")

    def _node_proc(self, name: str, spec: Mapping[str, Any], image_env: Mapping[str, str]) -> Proc:
        self._mount_volumes(name, spec)
        stage = final_stage()
        entrypoint = exec_form(stage.last("ENTRYPOINT") or "")
        assert entrypoint == ["fluxmq"], f"ENTRYPOINT is not the fluxmq script: {entrypoint}"
        command = as_list(spec.get("command")) or exec_form(stage.last("CMD") or "") or []
        env = {**image_env, **{k: str(v) for k, v in (spec.get("environment") or {}).items()}}
        env = {k: self._localize(name, v) for k, v in env.items()}
        argv = [sys.executable, "-m", "fluxmq", *(self._localize(name, a) for a in command)]
        return Proc(name, self.ips[name], argv, env, self.root / f"{name}.log")

    def _job_proc(self, name: str, spec: Mapping[str, Any]) -> Proc:
        self._mount_volumes(name, spec)
        entrypoint = as_list(spec.get("entrypoint"))
        assert entrypoint[:1] == ["python"], f"{name}: entrypoint is not python: {entrypoint}"
        command = [*entrypoint[1:], *as_list(spec.get("command"))]
        env = {k: self._localize(name, str(v)) for k, v in (spec.get("environment") or {}).items()}
        argv = [sys.executable, *(self._localize(name, a) for a in command)]
        return Proc(name, self.ips[name], argv, env, self.root / f"{name}.log")

    def localize(self, service: str, value: str) -> str:
        """A value of ``service`` as this machine sees it (its address, its mounts)."""
        return self._localize(service, value)

    # -- running -------------------------------------------------------------------------------

    def address(self, proc: Proc, key: str) -> str:
        """A host:port setting of a node as this machine reaches it (its own loopback IP)."""
        host, _, port = proc.env[key].rpartition(":")
        assert host in (proc.ip, proc.service), f"{proc.service} {key}={proc.env[key]}"
        return f"{proc.ip}:{port}"

    def processes(self) -> list[Proc]:
        return [self.etcd, *self.jobs, *self.nodes]

    def check_ports(self, ports: Mapping[str, list[int]]) -> None:
        busy = [
            f"{self.ips[s]}:{p}"
            for s, ps in ports.items()
            for p in ps
            if not port_free(self.ips[s], p)
        ]
        assert not busy, f"ports in use (another run still up?): {', '.join(busy)}"

    def start(self, proc: Proc) -> None:
        env = clean_env(PYTHONUNBUFFERED="1", **proc.env)
        with proc.log.open("ab") as log:
            proc.popen = subprocess.Popen(
                [*hosts_wrapper(self.hosts_file), *proc.argv],
                env=env,
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stopped as a whole
            )

    def diagnose(self) -> str:
        return "\n".join(
            f"--- {p.service} ({'running' if p.alive() else 'exited'}) {p.log}:\n{p.tail()}"
            for p in self.processes()
        )

    def signal(self, proc: Proc, sig: int) -> None:
        if proc.popen is not None and proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, sig)

    def stop_all(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every process group, SIGKILL what is left after ``timeout_s``; never hangs."""
        for proc in [*self.nodes, *self.jobs, self.etcd]:
            self.signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in [*self.nodes, *self.jobs, self.etcd]:
            if proc.popen is None:
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            self.signal(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(5)


@contextlib.contextmanager
def running(model: Mapping[str, Any], root: Path) -> Iterator[Topology]:
    """A Topology whose processes are all stopped on the way out, whatever happens."""
    topo = Topology(model, root)
    try:
        yield topo
    finally:
        topo.stop_all()
