"""The composition root: builds a node from its configuration and runs it until SIGTERM/SIGINT.

``fluxmq serve`` with no flags is a single node on embedded defaults: LocalShard, data in
./data, gRPC on 127.0.0.1:7070, metrics on 127.0.0.1:7071.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from grpc_health.v1 import health_pb2
from prometheus_client import (
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from fluxmq import config as config_mod
from fluxmq import logging_setup, metrics
from fluxmq.cluster_metadata import etcd_metadata_store
from fluxmq.core.errors import FluxError
from fluxmq.core.ratelimit import InflightBudget
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.core.text import printable
from fluxmq.metadata import EmbeddedMetadataStore, NodeInfo
from fluxmq.metadata.metadata import MetadataError
from fluxmq.server.app import (
    GrpcEdge,
    add_health_and_reflection,
    bind,
    build_server,
    interceptors,
    public_server,
    register_services,
    set_serving,
)
from fluxmq.server.cluster_view import ClusterView
from fluxmq.server.forwarding import RESPONSE_BYTES_MAX, Forwarder
from fluxmq.server.guard import Guard, KeyCache
from fluxmq.server.health import CatchUp, HealthState, HttpEndpoint, Verdict, judge, refresh
from fluxmq.server.key_admin import KeyAdmin, ensure_bootstrap_key
from fluxmq.server.key_admin import translate as translate_key_error
from fluxmq.server.node_stats import dead_letter_rows as _dead_letter_rows
from fluxmq.server.node_stats import group_rows as _group_rows
from fluxmq.server.node_stats import hosted_queues as _hosted_queues
from fluxmq.server.node_stats import partition_rows as _partition_rows
from fluxmq.server.placement.controller import PlacementSettings
from fluxmq.server.router import Router
from fluxmq.server.shard.host import OpenedShard, ShardHost, ShardSpec
from fluxmq.server.shard.runtime import ShardRuntime, wall_clock_ms
from fluxmq.server.shard_process import shard_edge
from fluxmq.server.shard_process.frames import FRAME_METADATA_BYTES_MAX
from fluxmq.server.shard_process.front import (
    RELAYED_SERVICES,
    FrontEndInterceptor,
    QueueReports,
    RelayHandler,
    ShardProcessLink,
)
from fluxmq.server.shard_process.front_metrics import ShardProcessMetrics
from fluxmq.server.shard_process.routing import CallRouting
from fluxmq.server.shard_process.shard_edge import FramedEdge, QueueReporter
from fluxmq.server.shard_process.shard_server import FramedServer
from fluxmq.server.shard_process.siblings import Siblings, decode_report, local_shard_id
from fluxmq.server.shard_process.supervisor import (
    LOCAL_SHARDS_DIR,
    ShardProcessExited,
    ShardProcessSupervisor,
    node_data_dir,
    process_config,
    wait_previous_gone,
)
from fluxmq.server.stream_slots import StreamSlots
from fluxmq.server.tls import TlsConfig
from fluxmq.server.tls import describe as describe_tls
from fluxmq.server.tls import from_config as load_tls
from raft import LocalShard, Shard, ShardError
from raft.driver import RaftDriver
from raft.pysyncobj_shard import PySyncObjShard, ShardConfig, ShardStartError
from raft.wire_transport import WireTls
from storage import LmdbStore, OldFormatError, StorageError

log = logging.getLogger("fluxmq")
READINESS_INTERVAL_S = 0.2
AUTH_START_TIMEOUT_S = 30.0


def _register_collectors(router: Router, health: HealthState, operators: str) -> None:
    """Every metric covers every replication group the node hosts (queue names are unique
    across groups, so their series never collide)."""

    def runtimes() -> list[ShardRuntime]:
        return list(router.shards.values())

    def storage() -> tuple[int, int]:
        stats = [b.state.store.stat() for b in runtimes()]
        return sum(s.file_bytes for s in stats), sum(s.used_bytes for s in stats)

    def applied() -> tuple[int, int]:
        shards = [b.shard for b in runtimes()]
        return (
            sum(getattr(s, "batches_applied", 0) for s in shards),
            sum(getattr(s, "entries_applied", 0) for s in shards),
        )

    def hosted() -> list[tuple[str, int, str]]:
        return _hosted_queues(runtimes(), operators)

    metrics.REGISTRY.register(
        metrics.StateCollector(
            lambda only: (row for b in runtimes() for row in _partition_rows(b.state, only)),
            storage,
            applied,
            hosted,
        )
    )
    metrics.REGISTRY.register(
        metrics.DeliveryCollector(
            lambda only: (row for b in runtimes() for row in _group_rows(b, only)),
            lambda only: (row for b in runtimes() for row in _dead_letter_rows(b, only)),
            lambda: sum(b.state.dead_letters_dropped for b in runtimes()),
            hosted,
        )
    )
    metrics.REGISTRY.register(metrics.QueueCollector(hosted))
    metrics.REGISTRY.register(
        metrics.ShardCollector(lambda: [b.shard.status() for b in runtimes()])
    )
    metrics.REGISTRY.register(
        metrics.NodeCollector(
            lambda: health.verdict.ready,
            lambda: router.view is not None and router.view.session_up,
        )
    )
    ProcessCollector(registry=metrics.REGISTRY)
    PlatformCollector(registry=metrics.REGISTRY)


def observe_disk(shard_id: str, store: LmdbStore, shard: Shard) -> None:
    """Feed the fsync and snapshot histograms of one replication group (set before start)."""
    store.on_commit = metrics.APPLY_COMMIT.labels(shard_id).observe
    if isinstance(shard, PySyncObjShard):
        shard.on_journal_flush = metrics.JOURNAL_FLUSH.labels(shard_id).observe
        shard.on_stage = metrics.observe_raft_stage
        shard.on_snapshot = lambda kind, size, seconds: metrics.observe_snapshot(
            shard_id, kind, size, seconds
        )


GIL_SWITCH_INTERVAL_S = 0.0005


class StartupError(Exception):
    """The node cannot start: one line naming what failed, the setting that decides it and what
    to do (``main`` prints it, exit code 1, no traceback)."""


_LISTEN_HINTS = {
    errno.EADDRINUSE: "another process holds that port: stop it or choose another port",
    errno.EADDRNOTAVAIL: "no interface of this machine has that address: use one it has "
    "(or 0.0.0.0)",
    errno.EACCES: "ports below 1024 need privileges: choose a higher port",
}


def listen_failure(address: str, purpose: str, setting: str, err: OSError) -> StartupError:
    reason = (err.strerror or str(err)).lower()
    hint = _LISTEN_HINTS.get(err.errno or 0, "check the address")
    return StartupError(
        f"cannot listen on {address} for {purpose} ({config_mod.where_set(setting)}): "
        f"{reason}; {hint}"
    )


def check_listen(address: str, purpose: str, setting: str) -> None:
    """Binds ``address`` once and lets it go, before anything starts: a port in use stops the
    node with one line instead of a traceback from deep in gRPC, http.server or Raft. Like
    gRPC, it passes when any of the host's addresses binds."""
    host, _, port_text = address.rpartition(":")
    port = int(port_text)
    if port == 0:
        return  # the system picks a free port
    try:
        infos = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as err:
        raise listen_failure(address, purpose, setting, OSError(err.errno, err.strerror)) from None
    first: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
            try:
                probe.bind(sockaddr)
                return
            except OSError as err:
                first = first or err
    if first is not None:
        raise listen_failure(address, purpose, setting, first)


def check_listen_addresses(
    cfg: config_mod.NodeConfig, *, grpc_port: bool = True, raft_port: bool = True
) -> None:
    """``grpc_port`` False: a shard process, whose front end holds the gRPC port;
    ``raft_port`` False: a shard process without the home group."""
    if grpc_port:
        check_listen(cfg.listen, "grpc", "listen")
    if cfg.metrics_listen:
        check_listen(cfg.metrics_listen, "metrics and health", "metrics_listen")
    if cfg.cluster_mode and raft_port:
        setting = "raft_bind" if cfg.raft_bind else "raft_listen"
        check_listen(cfg.raft_bind or cfg.raft_listen, "raft", setting)


MODE_FILE = "MODE"


def check_mode(cfg: config_mod.NodeConfig) -> None:
    """A data directory serves one mode for life: the applied index of a single node and of a
    Raft replica mean different things, so switching would corrupt the state silently."""
    mode = f"cluster {cfg.shard_id}" if cfg.cluster_mode else "single"
    os.makedirs(cfg.data_dir, exist_ok=True)
    path = os.path.join(cfg.data_dir, MODE_FILE)
    try:
        with open(path) as f:
            found = f.read().strip()
    except FileNotFoundError:
        if os.path.exists(os.path.join(cfg.data_dir, "data.mdb")):
            found = "single"  # written before the mode file existed
        else:
            with open(path, "w") as f:
                f.write(mode + "\n")
            return
    if found != mode:
        raise config_mod.ConfigError(
            f"data_dir {cfg.data_dir!r} belongs to a {found!r} node; this node is {mode!r}: "
            "use another data directory"
        )


@functools.lru_cache(maxsize=1)
def _wire_tls(cert_file: str, key_file: str, ca_file: str) -> WireTls:
    # Loaded once, as the gRPC port's material is: every group of the node shares the contexts,
    # and a group started later cannot fail on files the home shard already loaded.
    return WireTls.from_files(cert_file, key_file, ca_file)


def raft_tls_of(cfg: config_mod.NodeConfig) -> WireTls | None:
    """The Raft links' TLS contexts (raft_tls), from the files the gRPC port uses."""
    if not cfg.raft_tls:
        return None
    try:
        return _wire_tls(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_ca_file)
    except (OSError, ssl.SSLError) as err:
        raise config_mod.ConfigError(
            f"raft_tls: cannot load tls_cert_file {cfg.tls_cert_file!r}, tls_key_file "
            f"{cfg.tls_key_file!r} or tls_ca_file {cfg.tls_ca_file!r}: {err}"
        ) from None


def build_shard(
    cfg: config_mod.NodeConfig, state: QueueStateMachine
) -> LocalShard | PySyncObjShard:
    if not cfg.cluster_mode:
        return LocalShard(state, shard_id=local_shard_id(shard_edge.shard_index()))
    shard_cfg = ShardConfig(
        shard_id=cfg.shard_id,
        self_address=cfg.raft_listen,
        peers=cfg.peer_list,
        data_dir=cfg.data_dir,
        secret=cfg.cluster_secret,
        entry_bytes_max=cfg.raft_entry_bytes_max,
        ack_timeout_ms=cfg.ack_timeout_ms,
        compaction_entries_min=cfg.raft_compaction_entries,
        bind_address=cfg.raft_bind,
        tls=raft_tls_of(cfg),
    )
    return PySyncObjShard(state, shard_cfg, RaftDriver())


def advertised_grpc_address(cfg: config_mod.NodeConfig, port: int) -> str:
    """Where other nodes and clients reach this node's gRPC (``port``: the one bound)."""
    host, _, listen_port = cfg.advertised.rpartition(":")
    return f"{host}:{port if listen_port == '0' else listen_port}"


def build_cluster_view(
    cfg: config_mod.NodeConfig,
    shard: Shard | None,
    port: int,
    clock_ms: Callable[[], int],
    owns: Callable[[str], bool] = lambda group_id: True,
) -> ClusterView:
    raft_host, _, raft_port = cfg.raft_listen.rpartition(":")
    node = NodeInfo(
        node_id=cfg.node_name,
        grpc_address=advertised_grpc_address(cfg, port),
        raft_host=raft_host,
        raft_port_base=int(raft_port),
        started_ms=clock_ms(),
    )
    return ClusterView(
        etcd_metadata_store(cfg),
        node,
        shard,
        cfg.shard_id,
        registers=shard_edge.shard_index() == 0,
        node_ttl_ms=cfg.node_ttl_ms,
        clock_ms=clock_ms,
        peers=cfg.peer_list,
        auto_provision_groups=cfg.auto_provision_groups,
        groups_per_size=cfg.groups_per_size,
        owns=owns,
        placement=(
            PlacementSettings(
                node_dead_after_ms=cfg.node_dead_after_ms, moves_max=cfg.placement_moves_max
            )
            if cfg.node_dead_after_ms
            else None
        ),
    )


def _bind_for(cfg: config_mod.NodeConfig, raft_address: str) -> str:
    """An extra group's Raft endpoint binds where the home one does, on its own port."""
    if not cfg.raft_bind:
        return ""
    return f"{cfg.raft_bind.rpartition(':')[0]}:{raft_address.rpartition(':')[2]}"


def open_placed_shard(
    cfg: config_mod.NodeConfig, driver: RaftDriver, spec: ShardSpec, directory: str
) -> OpenedShard | None:
    """The store and Raft shard of a shard placement gave this node, on the node's driver
    thread, its store under ``directory`` (None: it cannot open, and the log says why)."""
    try:
        store = LmdbStore(
            directory,
            map_size_bytes=cfg.storage_map_size_bytes,
            cache_of_log=True,  # a Raft shard's state: its snapshot and journal rebuild it
        )
    except StorageError as err:
        log.error("cannot open the store of replication group %s: %s", spec.shard_id, err)
        return None
    warn_if_discarded(store, f"replication group {spec.shard_id}")
    state = QueueStateMachine(store)
    shard_cfg = ShardConfig(
        shard_id=spec.shard_id,
        self_address=spec.raft_address,
        peers=spec.peers,
        data_dir=cfg.data_dir,
        secret=cfg.cluster_secret,
        entry_bytes_max=cfg.raft_entry_bytes_max,
        ack_timeout_ms=cfg.ack_timeout_ms,
        compaction_entries_min=cfg.raft_compaction_entries,
        bind_address=_bind_for(cfg, spec.raft_address),
        tls=raft_tls_of(cfg),
    )
    try:
        shard = PySyncObjShard(state, shard_cfg, driver)
    except ShardStartError as err:
        log.error("cannot start replication group %s: %s", spec.shard_id, err)
        store.close()
        return None
    observe_disk(spec.shard_id, store, shard)
    return OpenedShard(state, shard, store.close)


async def readiness_routine(
    router: Router,
    health: HealthState,
    serving: asyncio.Event,
    stopping: asyncio.Event,
    on_change: Callable[[bool], Awaitable[None]],
) -> None:
    catch_up = CatchUp()
    while True:
        verdict = judge(
            serving=serving.is_set(),
            stopping=stopping.is_set(),
            shards=[r.shard.status() for r in list(router.shards.values())],
            catch_up=catch_up,
            etcd_configured=router.view is not None,
            etcd_joined=router.view is not None and router.view.joined,
        )
        if refresh(health, verdict):
            await on_change(verdict.ready)
        await asyncio.sleep(READINESS_INTERVAL_S)


def drain(router: Router) -> None:
    """SIGTERM: every shard this node hosts ends its long polls, Consume and Tail streams with
    NODE_SHUTTING_DOWN and refuses new ones, and so do the ones this node relays to another
    node; writes (publishes, acks) are still served."""
    router.drain()


async def hand_over_leadership(router: Router, timeout_s: float) -> None:
    """Before stopping: every group this node leads gets a caught-up follower as its leader,
    so writes pause for one round trip instead of an election timeout."""

    async def one(group_id: str, runtime: ShardRuntime) -> None:
        shard = runtime.shard
        if not shard.is_leader or len(shard.status().members) < 2:
            return
        if shard.status().in_sync < 2:  # no follower connected and caught up: nobody to take it
            log.warning("no caught-up follower of %s to hand leadership to", group_id)
            return
        term = shard.status().term
        try:
            target = await asyncio.wait_for(shard.transfer_leadership(), timeout_s)
        except (ShardError, TimeoutError) as err:
            log.warning("could not hand leadership of %s over (%s): stopping anyway", group_id, err)
            return
        log.info(
            "handed leadership of %s to %s (term %d -> %d)",
            group_id,
            target,
            term,
            shard.status().term,
        )

    await asyncio.gather(*(one(g, r) for g, r in list(router.shards.items())))


def auth_line(cfg: config_mod.NodeConfig) -> str:
    if cfg.auth_enabled:
        return f"Clients authenticate with API keys (auth = {cfg.auth})."
    return (
        "AUTHENTICATION IS OFF: anyone who can reach the gRPC port can use every queue "
        "(set auth = on, and auth_bootstrap_key_file or FLUXMQ_AUTH_BOOTSTRAP_KEY)."
    )


async def start_auth(
    cfg: config_mod.NodeConfig, router: Router, now_ms: Callable[[], int]
) -> EmbeddedMetadataStore | None:
    """API keys from etcd (a cluster) or the node's own embedded store (a single node); the
    bootstrap key registered first; the guard in place before the server starts. -> the
    embedded store when this node owns one (closed at shutdown)."""
    owned: EmbeddedMetadataStore | None = None
    store: Any
    if router.view is not None:
        store = router.view.store
    else:
        assert not cfg.cluster_mode, "validate() refuses a cluster with auth and without etcd"
        # One file for the node: its shard processes share it (each sees the others' writes).
        shared_dir = node_data_dir(cfg.data_dir, shard_edge.shard_index())
        owned = store = EmbeddedMetadataStore(os.path.join(shared_dir, "auth"))
    tiers = config_mod.parse_tiers(cfg.rate_limit_tiers)
    key = cfg.auth_bootstrap_key
    deadline = asyncio.get_running_loop().time() + AUTH_START_TIMEOUT_S
    while True:
        try:
            if key:
                await ensure_bootstrap_key(store, key, cfg.auth_bootstrap_environment, now_ms())
            cache = KeyCache(store, now_ms)
            await cache.start()
            break
        except (FluxError, MetadataError) as caught:
            # Reading the keys may fail in the store itself (etcd refusing the node's
            # credentials): one line at start, like every other start-up failure.
            err = translate_key_error(caught)
            if not err.retriable or asyncio.get_running_loop().time() > deadline:
                raise config_mod.ConfigError(f"auth: {err.message}") from None
            log.warning("API keys not readable yet (%s); retrying", err.message)
            await asyncio.sleep(1.0)
    router.guard = Guard(
        cache, tiers, router.queue_environment, now_ms, cfg.auth_bootstrap_environment
    )
    router.key_admin = KeyAdmin(store, cache, tiers, now_ms)
    log.info("authentication on: %d API keys known", len(cache.records))
    legacy = router.unscoped_queues_of_other_environments(cfg.auth_bootstrap_environment)
    if legacy:
        log.warning(
            "%d queues of other environments than %s were created before environments were "
            "namespaces and keep names of the %s namespace (e.g. %s): their environment's keys "
            "no longer reach them by name; move their messages to a queue created now "
            "(README, Security)",
            len(legacy), cfg.auth_bootstrap_environment, cfg.auth_bootstrap_environment,
            printable(", ".join(legacy[:5]), 200),
        )  # fmt: skip
    if not any(r.active and r.role == "admin" for r in cache.records.values()):
        log.warning(
            "authentication is on and no admin API key exists: no client can create queues or "
            "keys (give the nodes auth_bootstrap_key_file or FLUXMQ_AUTH_BOOTSTRAP_KEY; see the "
            "README, Security)"
        )
    return owned


def warn_if_discarded(store: LmdbStore, what: str) -> None:
    if store.discarded_after_machine_crash:
        log.warning(
            "the state of %s was written without fsync before the machine restarted, so it may "
            "be torn: it starts empty and is rebuilt from the Raft snapshot and journal",
            what,
        )


async def serve(cfg: config_mod.NodeConfig) -> None:
    """Run a node: in this process, or (``shard_processes``) as a front end that owns the
    gRPC port and a shard process under it that runs this same function for its shards."""
    if not shard_edge.is_shard_process():
        check_local_shards(cfg)
    if cfg.shard_processes and not shard_edge.is_shard_process():
        await serve_front(cfg, tls=load_tls(cfg))
    else:
        await serve_node(cfg)


def check_local_shards(cfg: config_mod.NodeConfig) -> None:
    """A queue stays in the local shard it was created in: a data directory whose node ran more
    shard processes than this one would leave some of its queues unserved, so it stops here."""
    root = os.path.join(cfg.data_dir, LOCAL_SHARDS_DIR)
    found = [
        int(name)
        for name in (os.listdir(root) if os.path.isdir(root) else ())
        if name.isdigit() and os.path.exists(os.path.join(root, name, "data.mdb"))
    ]
    needed = max(found, default=0) + 1
    if needed > max(cfg.shard_processes, 1):
        raise StartupError(
            f"the data directory {cfg.data_dir!r} holds the queues of {needed} local shards "
            f"(a node with shard_processes = {needed} created them) and this node runs "
            f"{max(cfg.shard_processes, 1)} ({config_mod.where_set('shard_processes')}): set "
            f"shard_processes to at least {needed}, or some queues would not be served"
        )


def open_edge(
    cfg: config_mod.NodeConfig, router: Router, tls: TlsConfig | None
) -> GrpcEdge | FramedEdge:
    """Where this node's calls come in: its gRPC port, or in a shard process the front end's
    channel (the same interceptors and services either way)."""
    if shard_edge.is_shard_process():
        framed = FramedServer(interceptors(router), frame_bytes_max=frame_bytes_max(cfg))
        register_services(framed, router, cfg.node_name)
        return FramedEdge(framed)
    try:
        server, health_servicer, port = build_server(
            router,
            cfg.listen,
            request_bytes_max=cfg.request_bytes_max_value,
            node_id=cfg.node_name,
            tls=tls,
        )
    except (RuntimeError, OSError) as err:
        raise grpc_listen_failure(cfg, err) from None
    return GrpcEdge(server, health_servicer, port)


def join_siblings(
    cfg: config_mod.NodeConfig, edge: GrpcEdge | FramedEdge, router: Router
) -> QueueReporter | None:
    """One of several shard processes: the router learns where the others' queues are (to
    forward what reaches it by mistake) and the front end learns this one's."""
    count = shard_edge.shard_count()
    if not isinstance(edge, FramedEdge) or count < 2:
        return None
    home_group = cfg.shard_id if cfg.cluster_mode else ""
    siblings = Siblings(shard_edge.shard_index(), count, shard_edge.front_socket(), home_group)
    router.siblings = siblings

    def on_routes(payload: memoryview) -> None:
        index, report = decode_report(payload)
        if index is not None:
            siblings.update(index, report)

    edge.server.on_routes = on_routes
    reporter = QueueReporter(edge.server, lambda: router.shards)
    edge.server.before_end = reporter.maybe_report
    return reporter


def grpc_listen_failure(cfg: config_mod.NodeConfig, err: Exception) -> StartupError:
    # Taken since check_listen passed: probe again for the reason, which gRPC's error lacks.
    check_listen(cfg.listen, "grpc", "listen")
    return StartupError(
        f"cannot listen on {cfg.listen} for grpc ({config_mod.where_set('listen')}): {err}"
    )


def frame_bytes_max(cfg: config_mod.NodeConfig) -> int:
    """The largest frame between front end and shard process: a request or an answer the
    gRPC port takes or gives, and room for its metadata."""
    return max(cfg.request_bytes_max_value, RESPONSE_BYTES_MAX) + FRAME_METADATA_BYTES_MAX


async def serve_front(cfg: config_mod.NodeConfig, *, tls: TlsConfig | None) -> None:
    """The front end of a node with shard processes: it owns the gRPC port (TLS included),
    serves health and reflection itself and relays every QueueService and AdminService call,
    unopened, to a shard process (which authenticates, routes and serves it as a node in one
    process would): with several, the one that holds the call's queue. It restarts a shard
    process that dies."""
    count = cfg.shard_processes
    for index in range(count):
        data_dir = process_config(cfg, index).data_dir
        ensure_data_dir(cfg, data_dir)  # the pid file goes there before the shard process runs
        if not wait_previous_gone(data_dir, index=index):
            raise StartupError(
                f"the shard process of the last node on {data_dir!r} "
                f"({config_mod.where_set('data_dir')}) still runs; stop it first"
            )
    check_listen_addresses(cfg)  # all of them, before anything starts: one clear line
    links = [
        ShardProcessLink(frame_bytes_max(cfg), cfg.inflight_bytes_max_value) for _ in range(count)
    ]
    reports = QueueReports(links)
    routing = CallRouting(reports.table, RELAYED_SERVICES) if count > 1 else None
    server = public_server(cfg.request_bytes_max_value, [FrontEndInterceptor()])
    streams = StreamSlots(cfg.streams_max) if count > 1 else None
    server.add_generic_rpc_handlers((RelayHandler(links, RELAYED_SERVICES, routing, streams),))
    health_servicer = add_health_and_reflection(server)
    try:
        port = bind(server, cfg.listen, tls)
    except (RuntimeError, OSError) as err:
        raise grpc_listen_failure(cfg, err) from None
    loop = asyncio.get_running_loop()
    health_updates: set[asyncio.Task[None]] = set()
    statuses: list[dict[str, int]] = [{} for _ in range(count)]
    # Several shard processes: the front end serves the metrics port (each shard process's
    # series, labelled with it) and /readyz (ready while every shard process is).
    http: HttpEndpoint | None = None
    readiness = HealthState()
    if count > 1 and cfg.metrics_listen:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ShardProcessMetrics(links, loop))
        metrics_host, _, mport = cfg.metrics_listen.rpartition(":")
        try:
            http = HttpEndpoint(metrics_host, int(mport), registry, readiness)
        except OSError as err:
            where = cfg.metrics_listen
            raise listen_failure(where, "metrics and health", "metrics_listen", err) from None
        http.start()
    # Where shard processes forward to one another (a call that reached the wrong one): a
    # socket in a directory only this user can open, plaintext (it never leaves the machine).
    socket_dir = tempfile.mkdtemp(prefix="fluxmq-front-") if count > 1 else ""
    front_socket = os.path.join(socket_dir, "front.sock") if socket_dir else ""
    if front_socket:
        try:
            server.add_insecure_port(f"unix:{front_socket}")
        except RuntimeError as err:
            shutil.rmtree(socket_dir, ignore_errors=True)
            if http is not None:
                http.close()
            raise StartupError(
                f"cannot listen on the internal socket {front_socket} ({err}): set TMPDIR to "
                "a shorter directory this user can write"
            ) from None

    async def mirror_now(combined: dict[str, int]) -> None:
        for service, status in combined.items():
            await health_servicer.set(service, status)  # type: ignore[arg-type]

    def mirror_combined() -> None:
        combined = combined_health(statuses)
        queue_service = RELAYED_SERVICES[0].full_name
        ready = combined.get(queue_service) == health_pb2.HealthCheckResponse.SERVING
        if count > 1:  # with one, the shard process serves /readyz and says when it changes
            refresh(readiness, Verdict(ready, "" if ready else "a shard process is not ready"))
        task = loop.create_task(mirror_now(combined))
        health_updates.add(task)
        task.add_done_callback(health_updates.discard)

    def on_health(index: int, reported: dict[str, int]) -> None:
        statuses[index] = reported
        mirror_combined()

    def on_down(index: int) -> None:
        # The front end runs (""), nothing behind it answers until the shard process is back.
        statuses[index] = {"": health_pb2.HealthCheckResponse.SERVING} | {
            s.full_name: health_pb2.HealthCheckResponse.NOT_SERVING for s in RELAYED_SERVICES
        }
        mirror_combined()

    supervisors = []
    for index, link in enumerate(links):
        supervisor = ShardProcessSupervisor(
            cfg,
            port,
            link,
            on_down=functools.partial(on_down, index),
            index=index,
            front_socket=front_socket,
        )
        supervisor.on_health = functools.partial(on_health, index)
        supervisor.on_attached = functools.partial(reports.on_attached, index)
        supervisors.append(supervisor)
    try:
        await asyncio.gather(*(s.start() for s in supervisors))
        await server.start()
        if count > 1 and not cfg.cluster_mode:  # a cluster node's first shard process says it
            http_where = f"{cfg.metrics_listen.rpartition(':')[0]}:{http.port}" if http else "off"
            log.warning(
                "FluxMQ single node serving on %s over %s with %d shard processes (data: %s, "
                "metrics/health: %s). %s",
                f"{cfg.listen.rpartition(':')[0]}:{port}",
                describe_tls(tls),
                count,
                cfg.data_dir,
                http_where,
                auth_line(cfg),
            )
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        # The shard processes drain, hand leadership over and finish their calls while this
        # port still relays (calls in flight finish; new ones meet their refusals), then the
        # port closes.
        await asyncio.gather(*(s.stop(cfg.shutdown_grace_ms / 1000) for s in supervisors))
        await server.stop(0.5)
        if http is not None:
            http.close()
        if socket_dir:
            shutil.rmtree(socket_dir, ignore_errors=True)


def ensure_data_dir(cfg: config_mod.NodeConfig, path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise data_dir_failure(cfg, err) from None


def data_dir_failure(cfg: config_mod.NodeConfig, err: OSError | StorageError) -> StartupError:
    detail = (err.strerror or str(err)).lower() if isinstance(err, OSError) else str(err)
    return StartupError(
        f"cannot use the data directory {cfg.data_dir!r} ({config_mod.where_set('data_dir')}): "
        f"{detail}; choose a directory this user can create and write"
    )


def combined_health(statuses: list[dict[str, int]]) -> dict[str, int]:
    """What the port reports for each service: serving only when every shard process does
    (a node serves a queue only when the shard process that holds it runs)."""
    serving = health_pb2.HealthCheckResponse.SERVING
    services = {service for reported in statuses for service in reported}
    return {
        service: serving
        if all(reported.get(service) == serving for reported in statuses)
        else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in services
    }


def open_home_store(cfg: config_mod.NodeConfig) -> LmdbStore:
    try:
        check_mode(cfg)
        return LmdbStore(
            cfg.data_dir,
            map_size_bytes=cfg.storage_map_size_bytes,
            # In cluster mode the Raft snapshot and journal rebuild the state after a machine
            # crash; alone, the store is the only copy.
            cache_of_log=cfg.cluster_mode,
        )
    except OldFormatError as err:
        # The way forward is in the message; "choose another directory" would lose the data.
        raise StartupError(
            f"cannot use the data directory {cfg.data_dir!r} ({config_mod.where_set('data_dir')}): "
            f"{err}"
        ) from None
    except (OSError, StorageError) as err:
        raise data_dir_failure(cfg, err) from None


async def serve_node(cfg: config_mod.NodeConfig) -> None:
    tls = load_tls(cfg)  # checked before anything starts: a bad file stops the node here
    in_shard_process = shard_edge.is_shard_process()
    if in_shard_process:
        shard_edge.die_with_front_end()
    # A cluster node's further shard processes run placed groups only: the first runs the
    # home group (its store, its Raft port) and registers the node. A joining node (--join)
    # has no home group: its first shard process only registers it.
    hosts_home = not (cfg.cluster_mode and (shard_edge.shard_index() > 0 or cfg.join))
    check_listen_addresses(cfg, grpc_port=not in_shard_process, raft_port=hosts_home)
    store = open_home_store(cfg) if hosts_home else None
    if not hosts_home:
        check_mode(cfg)
    state: QueueStateMachine | None = None
    shard: LocalShard | PySyncObjShard | None = None
    if store is not None:
        warn_if_discarded(store, "this node's replication group")
        state = QueueStateMachine(store)
        shard = build_shard(cfg, state)
        observe_disk(shard.shard_id, store, shard)
    driver: RaftDriver | None = None
    if isinstance(shard, PySyncObjShard):
        driver = shard.driver
    elif cfg.cluster_mode:
        driver = RaftDriver()
    forwarder = Forwarder(
        tls,
        request_bytes_max=cfg.request_bytes_max_value,
        streams=StreamSlots(cfg.streams_max),
    )
    router = Router(cfg.shard_id if shard is None else shard.shard_id, forwarder)
    router.inflight = InflightBudget(
        cfg.inflight_bytes_max_value, cfg.inflight_bytes_max_value // 2
    )
    edge = open_edge(cfg, router, tls)
    port = edge.port
    reporter = join_siblings(cfg, edge, router)
    siblings = router.siblings
    owns = siblings.owns_group if siblings is not None else lambda group_id: True
    directory: ClusterView | None = None
    if cfg.etcd:
        assert shard is None or isinstance(shard, PySyncObjShard)
        directory = router.view = build_cluster_view(cfg, shard, port, wall_clock_ms, owns)
    host = ShardHost(
        router,
        clock_ms=wall_clock_ms,
        retention_interval_ms=cfg.retention_interval_ms,
        # With an address, every replica can name the leader's gRPC address, etcd or not.
        grpc_address=advertised_grpc_address(cfg, port) if cfg.cluster_mode else None,
        directory=directory,
        shards_dir=os.path.join(cfg.data_dir, "groups"),
        open_shard=(
            functools.partial(open_placed_shard, cfg, driver) if driver is not None else None
        ),
        owns=owns,
    )
    if directory is not None:
        directory.host_shard = host.host
        directory.unhost_shard = host.unhost
    # In the router before it starts: what the node checks at start (auth) sees its queues.
    home = None
    if state is not None and shard is not None:
        home = host.build(state, shard, cfg.raft_listen if cfg.cluster_mode else None)
        router.add_shard(home)
    auth_store = await start_auth(cfg, router, wall_clock_ms) if cfg.auth_enabled else None
    health = HealthState()
    http: HttpEndpoint | None = None
    if cfg.metrics_listen or reporter is not None:
        # One of several shard processes: its front end serves the port and asks for these.
        metrics.set_series_limits(
            cfg.metrics_partition_series_max,
            cfg.metrics_queue_series_max,
            cfg.named_environment_list(),
        )
        _register_collectors(router, health, cfg.auth_bootstrap_environment)
    if reporter is not None and isinstance(edge, FramedEdge):
        edge.server.metrics_text = functools.partial(
            asyncio.to_thread, generate_latest, metrics.REGISTRY
        )
    if cfg.metrics_listen:
        metrics_host, _, mport = cfg.metrics_listen.rpartition(":")
        try:
            http = HttpEndpoint(metrics_host, int(mport), metrics.REGISTRY, health)
        except OSError as err:
            where = cfg.metrics_listen
            raise listen_failure(where, "metrics and health", "metrics_listen", err) from None
        http.start()
    if home is not None:
        await host.run(home)
    if directory is not None:
        await host.restore()
        await directory.start()
    await edge.start()
    reporting: asyncio.Task[None] | None = None
    if reporter is not None:
        reporter.maybe_report()  # the front end's table is whole before this one serves
        reporting = asyncio.create_task(reporter.report_routine(), name="queue-report")
    await set_serving(edge.health, True, queue_service=False)
    serving, stopping = asyncio.Event(), asyncio.Event()
    serving.set()
    readiness = asyncio.create_task(
        readiness_routine(
            router,
            health,
            serving,
            stopping,
            lambda ready: set_serving(edge.health, True, queue_service=ready),
        ),
        name="readiness",
    )
    where = cfg.listen.rpartition(":")[0] + f":{port} over {describe_tls(tls)}"
    http_where = f"{cfg.metrics_listen.rpartition(':')[0]}:{http.port}" if http else "off"
    applied = state.last_applied_index() if state is not None else 0
    if cfg.join and shard_edge.shard_index() == 0:
        log.warning(
            "FluxMQ node %s joined without a home group, serving on %s (raft %s and up, "
            "data: %s, metrics/health: %s): it runs the replicas placement gives it (%s). %s",
            cfg.node_name,
            where,
            cfg.raft_listen,
            cfg.data_dir,
            http_where,
            ", ".join(sorted(router.shards)) or "none yet",
            auth_line(cfg),
        )
    elif not hosts_home:
        log.warning(
            "shard process %d of %d serving the placed groups it runs (%s) of this node",
            shard_edge.shard_index(),
            shard_edge.shard_count(),
            ", ".join(sorted(router.shards)) or "none yet",
        )
    elif cfg.cluster_mode:
        log.warning(
            "FluxMQ replica of %s serving on %s (raft %s, peers %s, data: %s, "
            "metrics/health: %s). %s",
            cfg.shard_id,
            where,
            cfg.raft_listen,
            ",".join(cfg.peer_list),
            cfg.data_dir,
            http_where,
            auth_line(cfg),
        )
    elif shard_edge.shard_count() > 1:
        log.warning(
            "shard process %d of %d serving local shard %s (data: %s, applied index %d)",
            shard_edge.shard_index(),
            shard_edge.shard_count(),
            router.home_shard_id,
            cfg.data_dir,
            applied,
        )
    else:
        log.warning(
            "FluxMQ single node serving on %s (data: %s, metrics/health: %s, applied index %d). %s",
            where,
            cfg.data_dir,
            http_where,
            applied,
            auth_line(cfg),
        )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if isinstance(edge, FramedEdge):
        # The front end is gone (it stopped, or died and the kernel has not killed us yet).
        front_end_gone = asyncio.create_task(edge.front_end_gone.wait(), name="front-end-gone")
        front_end_gone.add_done_callback(lambda _: stop.set())
    await stop.wait()

    # Order matters: the calls that wait for messages end at once (their clients go to another
    # node now, not when the grace period cancels them), out of load balancers, then
    # leadership away while this node still serves (in-flight proposals continue to the new
    # leader), then the in-flight calls finish, then leave.
    grace_s = cfg.shutdown_grace_ms / 1000
    started = loop.time()
    log.info(
        "shutting down: ending waiting calls, not ready, handing leadership over, finishing "
        "in-flight calls"
    )
    drain(router)
    stopping.set()
    refresh(health, Verdict(False, "shutting down"))
    await set_serving(edge.health, True, queue_service=False)
    await hand_over_leadership(router, max(0.5, grace_s / 2))
    await edge.stop(max(0.5, grace_s - (loop.time() - started)))
    readiness.cancel()
    if reporting is not None:
        reporting.cancel()
    if directory is not None:
        await directory.close()
    if router.guard is not None:
        await router.guard.keys.close()
    if auth_store is not None:
        await auth_store.close()
    await router.close()
    await host.close()
    if driver is not None:
        driver.stop()
    if store is not None:
        store.close()
    if http is not None:
        http.close()
    log.info("stopped cleanly")


USAGE = """\
usage: fluxmq serve [--help] | fluxmq cluster COMMAND [--help]
       | fluxmq migrate --data-dir DIR | fluxmq seal-records [--help] | fluxmq --version

  serve     run a node (single node by default; `fluxmq serve --help` lists every setting,
            its default and its FLUXMQ_* variable)
  cluster   a local cluster on etcd for development (up, down, status, stop-node,
            kill-node, start-node, add-node, remove-node)
  migrate   rewrite a stopped node's data directory from record format 1 to record batches
  seal-records  seal, with the cluster secret, the etcd records an older version wrote
            unsealed (`fluxmq seal-records [the node's settings]`, once, when upgrading)"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "cluster":
        from fluxmq.devcluster.cli import main as cluster_main

        return cluster_main(args[1:])
    if args and args[0] == "migrate":
        from fluxmq.migrate_cli import main as migrate_main

        return migrate_main(args[1:])
    if args and args[0] == "seal-records":
        from fluxmq.seal_records_cli import main as seal_main

        return seal_main(args[1:])
    if args and args[0] in ("--version", "-V"):
        print(f"fluxmq {metrics.package_version()}")
        return 0
    if args and args[0] in ("--help", "-h"):
        print(USAGE)
        return 0
    if not args or args[0] != "serve":
        print(USAGE, file=sys.stderr)
        return 1
    try:
        if shard_edge.is_shard_process():
            cfg = config_mod.NodeConfig(**shard_edge.node_config_settings())
        else:
            cfg = config_mod.load(args[1:])
    except config_mod.ConfigError as err:
        print(f"fluxmq: configuration error: {err}", file=sys.stderr)
        return 1
    logging_setup.setup(cfg.log_level, cfg.log_json)
    # A write crosses three threads (event loop, Raft driver, apply). A thread woken while
    # another runs Python waits for the GIL up to the switch interval (5 ms by default): the
    # latency budget (bench.stages) showed those waits in every hand-off.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        try:
            import uvloop
        except ImportError:  # uvloop is a dependency; this only keeps odd platforms running
            asyncio.run(serve(cfg))
        else:
            uvloop.run(serve(cfg))
    except config_mod.ConfigError as err:
        print(f"fluxmq: configuration error: {err}", file=sys.stderr)
        return 1
    except ShardStartError as err:
        print(f"fluxmq: cannot start: {err}", file=sys.stderr)
        return 1
    except StartupError as err:
        print(f"fluxmq: {err}", file=sys.stderr)
        return 1
    except ShardProcessExited as err:
        return err.code  # it printed why
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
