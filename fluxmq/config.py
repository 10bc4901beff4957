"""Node configuration: defaults, then a TOML file (``--config`` / ``FLUXMQ_CONFIG``), then
``FLUXMQ_*`` environment variables, then command-line flags. Validated once at start; a bad value
stops the node with a message naming the setting and where it came from."""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

from fluxmq.core.auth import ENVIRONMENTS, kind_of, parse_key
from fluxmq.core.errors import FluxError
from fluxmq.core.units import parse_bytes


class ConfigError(Exception):
    pass


# Room for what a command adds to its request (partition, timestamp, ids: tens of bytes for
# each of at most 1000 messages), with a wide margin.
RAFT_ENTRY_STAMP_BYTES_MAX = 1024 * 1024
SHARD_PROCESSES_MAX = 64  # one per core of a large machine
GROUPS_PER_SIZE_MAX = 16  # a node hosts at most 16 groups (cluster_view.SHARDS_PER_NODE_MAX)


@dataclass(frozen=True, slots=True)
class NodeConfig:
    data_dir: str = "./data"
    listen: str = "127.0.0.1:7070"
    # Serve without authentication on an address beyond loopback: refused unless said so.
    insecure_listen: bool = False
    # Concurrent Tail, Consume and PublishStream streams of this node (RESOURCE_EXHAUSTED beyond).
    streams_max: int = 200
    # The shards run in shard processes under a front end that owns the gRPC port (0: all in
    # one process). One by default: see HELP and the README's Processes for why not per core.
    shard_processes: int = 1
    metrics_listen: str = "127.0.0.1:7071"  # empty: no metrics endpoint
    # Bounds of /metrics: partitions given per-partition series, queues named in queue series.
    metrics_partition_series_max: int = 4096
    metrics_queue_series_max: int = 1000
    # Environments other than the operators' whose queue names /metrics shows (comma-separated;
    # /metrics takes no key, so other environments' names are opt-in).
    metrics_named_environments: str = ""
    request_bytes_max: str = "64MiB"
    # Bytes of calls this node works on at once (requests, and Fetch responses reserved at
    # their max_bytes); one key may hold half. Beyond: RESOURCE_EXHAUSTED / NODE_BUSY.
    inflight_bytes_max: str = "256MiB"
    storage_map_size: str = "64GiB"  # LMDB map size: the most the store may grow to
    retention_interval_ms: int = 1000
    log_level: str = "INFO"
    log_json: bool = False
    # Cluster mode (a Raft replication group over static peers) when raft_listen is set.
    raft_listen: str = ""
    raft_bind: str = ""  # host:port the Raft endpoint binds (default: raft_listen)
    peers: str = ""  # comma-separated raft addresses of the other replicas
    # Cluster mode without a static home group: runs only the replicas placement gives it.
    join: bool = False
    # Required in cluster mode; prefer FLUXMQ_CLUSTER_SECRET. Never in a repr (nor a log line).
    cluster_secret: str = field(default="", repr=False)
    cluster_secret_file: str = ""  # or a file holding it (a mounted Kubernetes Secret)
    shard_id: str = "g1"
    ack_timeout_ms: int = 10_000
    raft_compaction_entries: int = 20_000  # log entries kept before a snapshot replaces them
    # Cluster metadata (etcd). Without it a cluster runs on static peers and knows no directory.
    etcd: str = ""  # host:port of an etcd v3 endpoint
    etcd_prefix: str = "/fluxmq/"
    # etcd's authentication and TLS: whoever can write to etcd could otherwise change the cluster
    # (API key records are sealed with the cluster secret too, see fluxmq/metadata/metadata.py).
    etcd_user: str = ""
    etcd_password: str = field(default="", repr=False)
    etcd_password_file: str = ""
    etcd_ca_file: str = ""  # set: speak TLS to etcd, trusting this CA
    etcd_cert_file: str = ""  # client certificate (etcd --client-cert-auth)
    etcd_key_file: str = ""
    node_id: str = ""  # default: "node-" + the raft port
    advertise: str = ""  # gRPC host:port other nodes and clients use; default: listen
    node_ttl_ms: int = 5_000  # a node that stops refreshing disappears after this long
    # The placement controller replaces a group's member missing this long (0: never).
    node_dead_after_ms: int = 300_000
    placement_moves_max: int = 2  # groups one pass of the controller changes, at most
    # Default of the cluster setting auto_provision_groups (etcd's value wins when set).
    auto_provision_groups: bool = False
    # Default of the cluster setting groups_per_size (etcd's value wins when set).
    groups_per_size: int = 1
    shutdown_grace_ms: int = 20_000  # SIGTERM: hand leadership over and finish in-flight calls
    # Client authentication with API keys (see fluxmq/core/auth.py): "on", "off", or "auto":
    # on in cluster mode (keys live in etcd), off on a single node (the quickstart).
    auth: str = "auto"
    # An admin key registered at start when its environment has no active admin key yet: how
    # an operator gets the first key. Given as a file (keep it in a Secret) or as the value
    # (FLUXMQ_AUTH_BOOTSTRAP_KEY; a flag would show in `ps`).
    auth_bootstrap_key: str = field(default="", repr=False)
    auth_bootstrap_key_file: str = ""
    auth_bootstrap_environment: str = "production"
    # Token-bucket tiers: "tier:class=rate/burst,...;tier:..." with classes publish (messages/s),
    # consume and admin (calls/s), and optionally bytes (request bytes/s, every call; absent:
    # no byte limit). Every key names a tier; "default" must exist.
    rate_limit_tiers: str = (
        "default:publish=200000/400000,consume=50000/100000,admin=100/200,"
        "bytes=134217728/268435456;"
        "bulk:publish=1000000/2000000,consume=500000/1000000,admin=100/200,"
        "bytes=536870912/1073741824"
    )
    # TLS for client and node-to-node gRPC (PEM files). With a cert, the port speaks only TLS.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""  # verifies other nodes' certificates (and clients' with mTLS)
    tls_client_auth: bool = False  # mTLS: require a client certificate signed by tls_ca_file
    # Mutual TLS on the Raft links too, with the same certificate and CA bundle.
    raft_tls: bool = False

    @property
    def cluster_mode(self) -> bool:
        return bool(self.raft_listen)

    @property
    def auth_enabled(self) -> bool:
        return self.auth == "on" or (self.auth == "auto" and self.cluster_mode)

    @property
    def node_name(self) -> str:
        if self.node_id:
            return self.node_id
        return "node-" + self.raft_listen.rpartition(":")[2] if self.cluster_mode else "local"

    @property
    def advertised(self) -> str:
        return self.advertise or self.listen

    def named_environment_list(self) -> tuple[str, ...]:
        return tuple(e.strip() for e in self.metrics_named_environments.split(",") if e.strip())

    @property
    def peer_list(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.peers.split(",") if p.strip())

    @property
    def request_bytes_max_value(self) -> int:
        return parse_bytes(self.request_bytes_max, "request_bytes_max")

    @property
    def inflight_bytes_max_value(self) -> int:
        return parse_bytes(self.inflight_bytes_max, "inflight_bytes_max")

    @property
    def storage_map_size_bytes(self) -> int:
        return parse_bytes(self.storage_map_size, "storage_map_size")

    @property
    def raft_entry_bytes_max(self) -> int:
        """The largest replicated command: any request the gRPC port accepts plus what the
        leader stamps on it, so a cluster takes every publish a single node takes."""
        return self.request_bytes_max_value + RAFT_ENTRY_STAMP_BYTES_MAX


HELP = {
    "data_dir": "directory of the node's LMDB store",
    "listen": "host:port of the gRPC server",
    "insecure_listen": "serve without authentication on a listen address beyond loopback "
    "(e.g. 0.0.0.0): anyone who reaches the port can use every queue; refused without it",
    "shard_processes": "processes that run this node's shards under the front end that owns "
    "the gRPC port: 1 (the default) runs them in one shard process (restarted when it dies), "
    "0 in the node's one process; N > 1 runs its shards in N shard processes: a single node "
    "gets a local shard per shard process (new queues placed by a hash of their name; a "
    "transaction spans one local shard), a cluster node (with etcd) shares the groups "
    "placement gives it out over them",
    "streams_max": "concurrent Tail, Consume and PublishStream streams this node serves or "
    "relays; more are refused with RESOURCE_EXHAUSTED / TOO_MANY_STREAMS (retriable)",
    "metrics_listen": "host:port of the Prometheus /metrics endpoint ('' to disable)",
    "metrics_partition_series_max": "most partitions of this node with per-partition series "
    "in /metrics (smallest queues first; the others are counted in fluxmq_metrics_series_folded)",
    "metrics_queue_series_max": "most queues of this node named in /metrics series (by name; "
    "the others are counted in fluxmq_metrics_series_folded)",
    "metrics_named_environments": "environments besides the operators' "
    "(auth_bootstrap_environment) whose queue and group names /metrics shows, comma-separated "
    "(default none: /metrics takes no key, so their queues are only counted, as "
    "fluxmq_metrics_series_folded{kind=environment})",
    "request_bytes_max": "largest request the server accepts (e.g. 64MiB)",
    "inflight_bytes_max": "bytes of calls the node works on at once (requests, and Fetch "
    "responses at their max_bytes); one API key may hold half; beyond: RESOURCE_EXHAUSTED / "
    "NODE_BUSY (retriable)",
    "storage_map_size": "largest size the store may grow to (e.g. 64GiB)",
    "retention_interval_ms": "how often the leader checks retention and dedup expiry",
    "log_level": "DEBUG, INFO, WARNING or ERROR",
    "log_json": "log one JSON object per line",
    "raft_listen": "host:port of this node's Raft endpoint; setting it starts cluster mode",
    "raft_bind": "cluster mode: host:port the Raft endpoint binds, e.g. 0.0.0.0:7100 when "
    "raft_listen is a name (default: raft_listen)",
    "peers": "comma-separated Raft host:port of the other replicas (cluster mode)",
    "join": "cluster mode, with etcd: join without a static home group (no peers); the node "
    "registers and runs the replicas the placement controller moves to it (scale out)",
    "cluster_secret": "shared secret of the cluster (prefer the FLUXMQ_CLUSTER_SECRET variable: "
    "flags are visible to other users of the machine)",
    "cluster_secret_file": "cluster mode: file holding the cluster secret (e.g. a mounted "
    "Kubernetes Secret); trailing whitespace is ignored",
    "shard_id": "name of the replication group this node serves (cluster mode)",
    "ack_timeout_ms": "cluster mode: how long a write waits for a majority before UNAVAILABLE",
    "raft_compaction_entries": "cluster mode: log entries kept before a snapshot replaces them",
    "etcd": "cluster mode: host:port of etcd, which holds nodes, queue placement and leaders",
    "etcd_prefix": "cluster mode: key prefix of this cluster in etcd",
    "etcd_user": "cluster mode: etcd user the node authenticates as (with etcd_password_file)",
    "etcd_password": "password of etcd_user (prefer etcd_password_file or FLUXMQ_ETCD_PASSWORD: "
    "flags are visible to other users of the machine)",
    "etcd_password_file": "file holding the password of etcd_user (e.g. a mounted Kubernetes "
    "Secret); trailing whitespace is ignored",
    "etcd_ca_file": "PEM CA bundle that signs etcd's certificate: setting it makes the node speak "
    "TLS to etcd",
    "etcd_cert_file": "PEM client certificate the node presents to etcd (etcd "
    "--client-cert-auth; its common name is the etcd user when no etcd_user is set)",
    "etcd_key_file": "PEM private key of etcd_cert_file",
    "node_id": "cluster mode: this node's id (default node-<raft port>)",
    "advertise": "cluster mode: gRPC host:port other nodes and clients reach this node at "
    "(default: listen)",
    "node_ttl_ms": "cluster mode: a node whose registration is not refreshed for this long is "
    "considered gone",
    "node_dead_after_ms": "cluster mode, with etcd: the placement controller replaces a "
    "replication group's member that has been missing from the directory this long, by a live "
    "node (0: never; 10000..86400000)",
    "placement_moves_max": "cluster mode, with etcd: replication groups one pass of the "
    "placement controller moves at most (1..64), so that a rebalance never swamps the cluster",
    "auto_provision_groups": "cluster mode: CreateQueue makes a new replication group when none "
    "has the queue's factor (the etcd setting auto_provision_groups overrides it)",
    "groups_per_size": "cluster mode, with auto_provision_groups: CreateQueue makes new "
    "replication groups of the queue's factor until this many exist, then places queues on the "
    "least loaded (1..16; e.g. the nodes' shard_processes, so that every shard process runs "
    "groups; the etcd setting groups_per_size overrides it)",
    "auth": "client authentication with API keys: on, off, or auto (on in cluster mode, off on "
    "a single node)",
    "auth_bootstrap_key": "an admin API key to register at start when its environment has no "
    "active admin key (prefer auth_bootstrap_key_file or FLUXMQ_AUTH_BOOTSTRAP_KEY: flags are "
    "visible to other users of the machine)",
    "auth_bootstrap_key_file": "file holding an admin API key to register at start when its "
    "environment has no active admin key (the operator's first key)",
    "auth_bootstrap_environment": "environment of the bootstrap key: development, staging or "
    "production",
    "rate_limit_tiers": "token-bucket tiers of API keys: 'tier:publish=rate/burst,"
    "consume=rate/burst,admin=rate/burst[,bytes=rate/burst];...' (publish counts messages, "
    "consume and admin calls, bytes the bytes of every request)",
    "tls_cert_file": "PEM certificate (chain) of this node: gRPC then speaks TLS only",
    "tls_key_file": "PEM private key of tls_cert_file",
    "tls_ca_file": "PEM CA bundle that signs the other nodes' certificates (and clients' with "
    "tls_client_auth)",
    "tls_client_auth": "mutual TLS: require a client certificate signed by tls_ca_file",
    "raft_tls": "cluster mode: mutual TLS on the Raft links too, with tls_cert_file, "
    "tls_key_file and tls_ca_file (every node must turn it on; the cluster secret still "
    "authenticates peers inside TLS)",
    "shutdown_grace_ms": "on SIGTERM: how long to hand leadership over and finish in-flight "
    "calls before stopping",
}

CONFIG_ENV = "FLUXMQ_CONFIG"


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_of(name: str) -> str:
    return f"FLUXMQ_{name.upper()}"


def where_set(name: str) -> str:
    """How an operator changes a setting, for messages: ``--listen / FLUXMQ_LISTEN``."""
    return f"{flag_of(name)} / {env_of(name)}"


def help_of(name: str, default: object) -> str:
    """A setting's --help line: what it is, its default and its variable (from the settings
    table, so a new setting cannot be documented without them)."""
    if isinstance(default, bool):
        shown = "on" if default else "off"
    else:
        shown = repr(default) if default != "" else "unset"
    if name in ("cluster_secret", "auth_bootstrap_key", "etcd_password"):
        shown = "unset"  # a secret's default is never a value worth printing
    text = f"{HELP[name]} (default: {shown}; env {env_of(name)})"
    return text.replace("%", "%%")  # argparse formats help with %


def _host_port(value: str, name: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{name}: {value!r} is not host:port")


def _coerce(name: str, raw: str, kind: type) -> object:
    if kind is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{name}: {raw!r} is not a boolean")
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name}: {raw!r} is not a whole number") from None
    return raw


def _from_file(path: str, kinds: Mapping[str, type]) -> dict[str, object]:
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"config: cannot read {path!r}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config: {path!r} is not valid TOML: {e}") from None
    values: dict[str, object] = {}
    for name, raw in table.items():
        kind = kinds.get(name)
        where = f"{path}: {name}"
        if kind is None:
            raise ConfigError(f"{where}: not a setting (see `fluxmq serve --help`)")
        if kind is bool and not isinstance(raw, bool):
            raise ConfigError(f"{where}: {raw!r} is not true or false")
        if kind is int and (isinstance(raw, bool) or not isinstance(raw, int)):
            raise ConfigError(f"{where}: {raw!r} is not a whole number")
        if kind is str and not isinstance(raw, str):
            raise ConfigError(f"{where}: {raw!r} is not a string (quote it)")
        values[name] = raw
    return values


def _read_secret_file(values: dict[str, object], name: str) -> None:
    """``<name>_file`` supplies ``<name>`` (a mounted Secret rather than a variable)."""
    path = str(values.get(name + "_file", ""))
    if not path:
        return
    if values.get(name):
        raise ConfigError(f"{name}_file: set either it or {name}, not both")
    try:
        with open(path) as f:
            values[name] = f.read().strip()
    except OSError as e:
        raise ConfigError(f"{name}_file: cannot read {path!r}: {e.strerror}") from None


def load(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> NodeConfig:
    environ = os.environ if environ is None else environ
    kinds = {f.name: type(getattr(NodeConfig(), f.name)) for f in fields(NodeConfig)}
    parser = argparse.ArgumentParser(
        prog="fluxmq serve",
        description="Run a FluxMQ node. Each setting comes from, last one winning: its default, "
        "the --config TOML file, its FLUXMQ_<SETTING> environment variable, its flag.",
    )
    parser.add_argument(
        "--config",
        default=None,
        help=f'TOML file of settings (keys as below, e.g. listen = "0.0.0.0:7070"); '
        f"environment variables FLUXMQ_<SETTING> and flags override it (also {CONFIG_ENV})",
    )
    defaults = NodeConfig()
    for name, kind in kinds.items():
        flag = flag_of(name)
        text = help_of(name, getattr(defaults, name))
        if kind is bool:
            parser.add_argument(flag, dest=name, action="store_true", default=None, help=text)
        else:
            parser.add_argument(flag, dest=name, default=None, help=text)
    args = parser.parse_args(list(argv))
    path = args.config if args.config is not None else environ.get(CONFIG_ENV, "")
    values: dict[str, object] = _from_file(path, kinds) if path else {}
    for name, kind in kinds.items():
        env = environ.get(f"FLUXMQ_{name.upper()}")
        if env is not None:
            values[name] = _coerce(f"FLUXMQ_{name.upper()}", env, kind)
    for name, kind in kinds.items():
        raw = getattr(args, name)
        if raw is not None:
            values[name] = (
                raw if kind is bool else _coerce("--" + name.replace("_", "-"), raw, kind)
            )
    for name in ("cluster_secret", "auth_bootstrap_key", "etcd_password"):
        _read_secret_file(values, name)
    config = NodeConfig(**values)  # type: ignore[arg-type]
    validate(config)
    return config


RATE_CLASSES = ("publish", "consume", "admin")
# Optional in a tier: without it, the tier's keys have no byte rate.
BYTES_CLASS = "bytes"


def parse_tiers(text: str) -> dict[str, dict[str, tuple[float, int]]]:
    """``tier:class=rate/burst,...;...`` -> {tier: {class: (rate per s, burst)}}.

    >>> parse_tiers("default:publish=10/20,consume=5/5,admin=1/2")["default"]["publish"]
    (10.0, 20)
    """
    tiers: dict[str, dict[str, tuple[float, int]]] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, sep, body = part.partition(":")
        if not sep or not re.fullmatch(r"[a-z0-9_-]{1,32}", name.strip()):
            raise ConfigError(f"rate_limit_tiers: {part!r} is not tier:class=rate/burst,...")
        limits: dict[str, tuple[float, int]] = {}
        for item in body.split(","):
            cls, sep, value = item.strip().partition("=")
            rate, sep2, burst = value.partition("/")
            try:
                parsed = (float(rate), int(burst))
            except ValueError:
                parsed = (0.0, 0)
            known = cls in RATE_CLASSES or cls == BYTES_CLASS
            if not sep or not sep2 or not known or parsed[0] <= 0 or parsed[1] < 1:
                raise ConfigError(
                    f"rate_limit_tiers: {item.strip()!r} in tier {name.strip()!r} is not "
                    f"class=rate/burst with class one of {', '.join(RATE_CLASSES)}, "
                    f"{BYTES_CLASS}, rate > 0, burst >= 1"
                )
            limits[cls] = parsed
        missing = [c for c in RATE_CLASSES if c not in limits]
        if missing:
            raise ConfigError(f"rate_limit_tiers: tier {name.strip()!r} lacks {', '.join(missing)}")
        tiers[name.strip()] = limits
    if "default" not in tiers:
        raise ConfigError("rate_limit_tiers: a tier named 'default' is required")
    return tiers


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (of host:port) only reaches this machine: localhost, 127.0.0.0/8, ::1."""
    host = host.strip("[]").lower()
    if host in ("localhost", "::1"):
        return True
    parts = host.split(".")
    return len(parts) == 4 and parts[0] == "127" and all(p.isdigit() for p in parts)


def _check_open_listen(config: NodeConfig) -> None:
    """An unauthenticated broker reachable from the network is an open broker: refuse it unless
    the operator says so. Mutual TLS authenticates clients too (a CA-signed certificate)."""
    host = config.listen.rpartition(":")[0]
    if config.auth_enabled or config.tls_client_auth or config.insecure_listen:
        return
    if is_loopback_host(host):
        return
    raise ConfigError(
        f"listen: {config.listen} is reachable from other machines and authentication is off, "
        "so anyone could use every queue; set auth = on with auth_bootstrap_key_file (or "
        "FLUXMQ_AUTH=on and FLUXMQ_AUTH_BOOTSTRAP_KEY_FILE), listen on 127.0.0.1, or pass "
        "--insecure-listen (FLUXMQ_INSECURE_LISTEN=true) to serve it open on purpose"
    )


_ETCD_SECURITY = (
    "etcd_user",
    "etcd_password",
    "etcd_ca_file",
    "etcd_cert_file",
    "etcd_key_file",
)


def _check_etcd_security(config: NodeConfig) -> None:
    what = "etcd_password" + ("_file" if config.etcd_password_file else "")
    if bool(config.etcd_user) != bool(config.etcd_password):
        raise ConfigError(
            f"etcd_user and {what}: set both or neither"
            if config.etcd_user or config.etcd_password_file
            else "etcd_password: needs etcd_user"
        )
    if config.etcd_user and not re.fullmatch(r"[A-Za-z0-9._@-]{1,128}", config.etcd_user):
        raise ConfigError("etcd_user: 1-128 of A-Z a-z 0-9 . _ @ -")
    if bool(config.etcd_cert_file) != bool(config.etcd_key_file):
        raise ConfigError("etcd_cert_file and etcd_key_file: set both or neither")
    if config.etcd_cert_file and not config.etcd_ca_file:
        raise ConfigError("etcd_cert_file: needs etcd_ca_file (the client certificate is TLS)")
    for name in ("etcd_ca_file", "etcd_cert_file", "etcd_key_file"):
        path = getattr(config, name)
        if path and not os.access(path, os.R_OK):
            raise ConfigError(f"{name}: cannot read {path!r}")


def _check_raft_tls(config: NodeConfig) -> None:
    if not config.raft_tls:
        return
    missing = [
        n for n in ("tls_cert_file", "tls_key_file", "tls_ca_file") if not getattr(config, n)
    ]
    if missing:
        raise ConfigError(
            f"raft_tls: needs tls_cert_file, tls_key_file and tls_ca_file (missing: "
            f"{', '.join(missing)}): each node presents its certificate to the others and "
            "verifies theirs with the CA bundle"
        )
    if not config.cluster_mode:
        raise ConfigError("raft_tls: needs raft_listen (cluster mode)")


def validate(config: NodeConfig) -> None:
    _host_port(config.listen, "listen")
    if not 0 <= config.shard_processes <= SHARD_PROCESSES_MAX:
        raise ConfigError(
            f"shard_processes: {config.shard_processes}: must be 0 (shards in the node's "
            f"process) to {SHARD_PROCESSES_MAX}"
        )
    if config.shard_processes > 1 and config.cluster_mode and not config.etcd:
        raise ConfigError(
            f"shard_processes: {config.shard_processes}: a cluster node without etcd runs one "
            "replication group, so at most 1 shard process (with etcd, placement gives it "
            "groups to share out)"
        )
    if not 1 <= config.groups_per_size <= GROUPS_PER_SIZE_MAX:
        raise ConfigError(f"groups_per_size: must be 1..{GROUPS_PER_SIZE_MAX}")
    if not 1 <= config.streams_max <= 100_000:
        raise ConfigError("streams_max: must be 1..100000")
    if config.metrics_listen:
        _host_port(config.metrics_listen, "metrics_listen")
    try:
        if config.request_bytes_max_value < 1024 * 1024:
            raise ConfigError("request_bytes_max: at least 1MiB")
        if config.inflight_bytes_max_value < 1024 * 1024:
            raise ConfigError("inflight_bytes_max: at least 1MiB")
        if config.storage_map_size_bytes < 16 * 1024 * 1024:
            raise ConfigError("storage_map_size: at least 16MiB")
    except FluxError as err:
        raise ConfigError(err.message) from None
    if not 0 <= config.metrics_partition_series_max <= 1_000_000:
        raise ConfigError("metrics_partition_series_max: must be 0..1000000")
    if not 0 <= config.metrics_queue_series_max <= 100_000:
        raise ConfigError("metrics_queue_series_max: must be 0..100000")
    for environment in config.named_environment_list():
        if environment not in ENVIRONMENTS:
            raise ConfigError(
                f"metrics_named_environments: {environment!r} is not one of "
                f"{', '.join(ENVIRONMENTS)}"
            )
    if not 10 <= config.retention_interval_ms <= 3_600_000:
        raise ConfigError("retention_interval_ms: must be 10..3600000")
    if config.auth not in ("auto", "on", "off"):
        raise ConfigError(f"auth: {config.auth!r} is not auto, on or off")
    _check_open_listen(config)
    if config.auth_bootstrap_environment not in ENVIRONMENTS:
        raise ConfigError("auth_bootstrap_environment: development, staging or production")
    if config.auth_bootstrap_key:
        what = "auth_bootstrap_key" + ("_file" if config.auth_bootstrap_key_file else "")
        if not config.auth_enabled:
            raise ConfigError(
                f"{what}: needs authentication (auth = on; a single node runs open unless told)"
            )
        presented = parse_key(config.auth_bootstrap_key)
        kind = kind_of(config.auth_bootstrap_environment)
        if presented is None or presented.kind != kind:
            raise ConfigError(
                f"{what}: not a fmq_{kind}_sk_<32 characters> key (an admin key of "
                f"{config.auth_bootstrap_environment}, the auth_bootstrap_environment)"
            )
    parse_tiers(config.rate_limit_tiers)
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        raise ConfigError("tls_cert_file and tls_key_file: set both or neither")
    if config.tls_client_auth and not (config.tls_cert_file and config.tls_ca_file):
        raise ConfigError("tls_client_auth: needs tls_cert_file, tls_key_file and tls_ca_file")
    for name in ("tls_cert_file", "tls_key_file", "tls_ca_file"):
        path = getattr(config, name)
        if path and not os.access(path, os.R_OK):
            raise ConfigError(f"{name}: cannot read {path!r}")
    _check_raft_tls(config)
    if not 0 <= config.shutdown_grace_ms <= 600_000:
        raise ConfigError("shutdown_grace_ms: must be 0..600000")
    if config.cluster_mode:
        _host_port(config.raft_listen, "raft_listen")
        if config.raft_bind:
            _host_port(config.raft_bind, "raft_bind")
        if config.join and config.peer_list:
            raise ConfigError(
                "join: a joining node has no static home group, so no peers: give --peers (a "
                "member of the home group) or --join, not both"
            )
        if config.join and not config.etcd:
            raise ConfigError(
                "join: needs etcd (the node learns its replicas from the placement there)"
            )
        if not config.peer_list and not config.join:
            raise ConfigError(
                "peers: cluster mode needs the Raft addresses of the other replicas "
                "(e.g. --peers 127.0.0.1:7101,127.0.0.1:7102), or --join with etcd to join "
                "an existing cluster without a home group"
            )
        for peer in config.peer_list:
            _host_port(peer, "peers")
        if config.raft_listen in config.peer_list:
            raise ConfigError("peers: list the other replicas, not this node's raft_listen")
        if len(set(config.peer_list)) != len(config.peer_list):
            raise ConfigError("peers: a replica is listed twice")
        if not config.cluster_secret:
            raise ConfigError(
                "cluster_secret: cluster mode requires a shared secret (set "
                "FLUXMQ_CLUSTER_SECRET): Raft messages between nodes are only safe between "
                "holders of the secret"
            )
        if len(config.cluster_secret) < 16:
            raise ConfigError("cluster_secret: use at least 16 characters")
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", config.shard_id):
            raise ConfigError("shard_id: 1-64 of A-Z a-z 0-9 . _ -")
        if not 10 <= config.raft_compaction_entries <= 10_000_000:
            raise ConfigError("raft_compaction_entries: must be 10..10000000")
        if not 100 <= config.ack_timeout_ms <= 600_000:
            raise ConfigError("ack_timeout_ms: must be 100..600000")
        if config.etcd:
            _host_port(config.etcd, "etcd")
            _check_etcd_security(config)
        elif config.auth_enabled:
            raise ConfigError(
                "auth: a cluster keeps its API keys in etcd, and this one has none: set etcd, "
                "or auth = off to run the cluster without authentication"
                + ("" if config.auth == "on" else " (auth is on by default in cluster mode)")
            )
        if config.node_id and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", config.node_id):
            raise ConfigError("node_id: 1-64 of A-Z a-z 0-9 . _ -")
        if config.advertise:
            _host_port(config.advertise, "advertise")
        if not 1_000 <= config.node_ttl_ms <= 300_000:
            raise ConfigError("node_ttl_ms: must be 1000..300000")
        if config.node_dead_after_ms and not 10_000 <= config.node_dead_after_ms <= 86_400_000:
            raise ConfigError("node_dead_after_ms: 0 (never) or 10000..86400000")
        if not 1 <= config.placement_moves_max <= 64:
            raise ConfigError("placement_moves_max: must be 1..64")
    elif config.peers:
        raise ConfigError("peers: needs raft_listen (cluster mode)")
    elif config.raft_bind:
        raise ConfigError("raft_bind: needs raft_listen (cluster mode)")
    elif config.etcd:
        raise ConfigError(
            "etcd: needs raft_listen (cluster mode); a single node keeps its metadata embedded"
        )
    if not config.etcd:
        for name in _ETCD_SECURITY:
            if getattr(config, name):
                raise ConfigError(f"{name}: needs etcd (cluster mode)")
    if config.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"log_level: {config.log_level!r} is not DEBUG, INFO, WARNING or ERROR")
