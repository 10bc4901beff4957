"""Liveness and readiness of a node, for Kubernetes probes and load balancers.

``/healthz`` answers 200 while the process serves HTTP at all (liveness: restart it when not).
``/readyz`` answers 200 only when the node can do useful work: gRPC is serving, every Raft shard
it hosts has a leader and has applied what was committed when it first saw one, and, when it
has etcd, it has joined the cluster (registered once). Losing etcd later does not make it
unready: the data plane keeps working without etcd, and taking every node out of its Service
because etcd blinked would turn a metadata outage into a full one. A rolling restart waits on
this, so the next pod stops only once the previous one has caught up.

The policy is a plain function over snapshots (time and state are inputs); the daemon's
``readiness_routine`` evaluates it on the event loop and publishes the verdict, which the HTTP
thread only reads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from raft import ShardStatus

log = logging.getLogger("fluxmq.health")


@dataclass(frozen=True, slots=True)
class Verdict:
    ready: bool
    reason: str  # why not ready ("" when ready); one line


@dataclass(slots=True)
class CatchUp:
    """Per shard: the commit index seen with the first known leader, and whether the replica
    applied up to it. Latched: a replica that caught up once stays caught up (apply lag under
    load must not take a serving node out of its Service)."""

    targets: dict[str, int] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)

    def observe(self, status: ShardStatus) -> bool:
        sid = status.shard_id
        if sid in self.done:
            return True
        if status.leader is None:
            return False
        target = self.targets.setdefault(sid, status.commit_index)
        if status.applied_index >= target:
            self.done.add(sid)
            return True
        return False


def judge(
    *,
    serving: bool,
    stopping: bool,
    shards: Iterable[ShardStatus],
    catch_up: CatchUp,
    etcd_configured: bool,
    etcd_joined: bool,
) -> Verdict:
    """Readiness of a node from what it sees now.

    >>> from raft import ShardStatus
    >>> s = ShardStatus("g1", "follower", 3, 10, 4, ("a", "b", "c"), "b", 0)
    >>> cu = CatchUp()
    >>> judge(serving=True, stopping=False, shards=[s], catch_up=cu,
    ...       etcd_configured=False, etcd_joined=False).reason
    'shard g1 is catching up (applied 4 of 10)'
    >>> s2 = ShardStatus("g1", "follower", 3, 12, 10, ("a", "b", "c"), "b", 0)
    >>> judge(serving=True, stopping=False, shards=[s2], catch_up=cu,
    ...       etcd_configured=False, etcd_joined=False).ready
    True
    """
    if stopping:
        return Verdict(False, "shutting down")
    if not serving:
        return Verdict(False, "gRPC server not serving yet")
    for status in shards:
        if status.leader is None:
            return Verdict(False, f"shard {status.shard_id} has no leader")
        if not catch_up.observe(status):
            target = catch_up.targets.get(status.shard_id, status.commit_index)
            return Verdict(
                False,
                f"shard {status.shard_id} is catching up "
                f"(applied {status.applied_index} of {target})",
            )
    if etcd_configured and not etcd_joined:
        return Verdict(False, "not registered in etcd yet (cluster metadata unreachable)")
    return Verdict(True, "")


class HealthState:
    """The verdict the HTTP thread reads. A reference swap is atomic under the GIL."""

    def __init__(self) -> None:
        self.verdict = Verdict(False, "starting")


class _Rendering:
    __slots__ = ("body", "done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.body = b""
        self.error: BaseException | None = None


class Exposition:
    """Renders /metrics at most once at a time per format: a request that arrives while a
    rendering runs waits for it and gets the same body. Scrapers that poll faster than a
    scrape takes (or many of them at once) then cost one rendering, not one each."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._running: dict[str, _Rendering] = {}
        self.renderings = 0  # how many ran
        self.joined = 0  # requests answered by another request's rendering

    def render(self, accept: str) -> tuple[bytes, str]:
        """-> (body, content type) for a request's Accept header."""
        encoder, content_type = choose_encoder(accept)
        with self._lock:
            rendering = self._running.get(content_type)
            owner = rendering is None
            if rendering is None:
                rendering = self._running[content_type] = _Rendering()
                self.renderings += 1
            else:
                self.joined += 1
        if owner:
            try:
                rendering.body = encoder(self._registry)
            except BaseException as err:
                rendering.error = err
            finally:
                with self._lock:
                    del self._running[content_type]
                rendering.done.set()
        else:
            rendering.done.wait()
        if rendering.error is not None:
            raise rendering.error
        return rendering.body, content_type


def _handler(exposition: Exposition, state: HealthState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, content_type = exposition.render(self.headers.get("Accept", ""))
                self._reply(200, body, content_type)
            elif path == "/healthz":
                self._reply(200, b"ok\n")
            elif path == "/readyz":
                verdict = state.verdict
                if verdict.ready:
                    self._reply(200, b"ready\n")
                else:
                    self._reply(503, f"not ready: {verdict.reason}\n".encode())
            else:
                self._reply(404, b"not found: try /metrics, /healthz or /readyz\n")

        def _reply(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would flood the log

    return Handler


class HttpEndpoint:
    """/metrics, /healthz and /readyz on one port, served from a daemon thread."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, state: HealthState):
        self.exposition = Exposition(registry)
        self._server = ThreadingHTTPServer((host, port), _handler(self.exposition, state))
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="http-endpoint", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def refresh(state: HealthState, verdict: Verdict) -> bool:
    """Publish ``verdict``; -> whether readiness flipped (logged when it did)."""
    before = state.verdict
    state.verdict = verdict
    if before.ready == verdict.ready:
        return False
    if verdict.ready:
        log.info("node is ready")
    else:
        log.warning("node is not ready: %s", verdict.reason)
    return True
