"""One fault schedule against a fresh 3-node cluster of real processes: the load, the faults,
the heal, the drain, and the history the checker judges.

The nodes listen on 127.0.0.11-13, each under a group id of its own (see ``network``), on static
peers or on one etcd (then with API keys, the cluster default). Producers publish unique ids
with idempotency keys round-robin over the nodes and retry a failed publish on the next node
with the same keys, as the SDK does; consumers lease and ack during the run, some with Lease
polls and some on Consume streams (checked out of the group: what they get is assigned at
apply, so a leader killed under them tests that a checkout's leases survive the failover).
Every bound is explicit: messages per producer, seconds per publish, seconds of drain, seconds
per stream.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq._pb.v1 import admin_pb2_grpc, queue_pb2_grpc
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.auth import new_key
from tests.chaos import checker
from tests.chaos.network import Endpoint, Partitions, endpoints, exec_prefix
from tests.chaos.schedule import PARTITION_KINDS, Schedule, Step
from tests.etcd_server import EtcdServer
from tests.integration.conftest import Node, authorized_channel, free_port

SECRET = "chaos-test-secret-0123456789abcdef"
QUEUE = "chaos"
GROUP = "g"
PARTITIONS = 4
PRODUCERS = 3
CONSUMERS = 2  # with Lease polls
STREAMS = 2  # consumers on Consume streams
STREAM_S = 4.0  # a stream's deadline: then it is opened again (on the next node)
STREAM_WINDOW = 50  # max_in_flight of a stream
BATCH = 5  # messages per publish
PUBLISHES_MAX = 2_000  # per producer: bounds the load whatever the speed
PUBLISH_BUDGET_S = 8.0  # per publish, over its retries; then its outcome is unknown
LEASE_MS = 3_000
RPC_TIMEOUT_S = 3.0
SETTLE_S = 60.0  # bound on waiting for a leader, convergence and the drain
STATUS_TIMEOUT_S = 1.0


def _now_ms() -> int:
    return int(time.time() * 1000)


class ChaosNode(Node):
    """A node on its own loopback address, run under its own group id."""

    def __init__(self, endpoint: Endpoint, data_dir: Path, *extra: str) -> None:
        super().__init__(data_dir, *extra)
        self.endpoint = endpoint

    @property
    def address(self) -> str:
        return f"{self.endpoint.host}:{self.port}"

    def command(self) -> list[str]:
        return [*exec_prefix(self.endpoint), *super().command()]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        """To the node and its shard process: SIGSTOP freezes the whole node, Raft included."""
        if self.running:
            assert self.proc is not None
            for pid in (self.proc.pid, *self.shard_pids()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def kill9(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])


class ChaosCluster:
    def __init__(self, root: Path, mode: str, etcd: EtcdServer | None) -> None:
        self.mode = mode
        self.etcd = etcd
        self.endpoints = endpoints(3)
        raft = [f"{e.host}:{free_port()}" for e in self.endpoints]
        extra: list[str] = []
        self.api_key = ""
        if etcd is not None:
            self.api_key = new_key("production")
            key_file = root / "admin.key"
            key_file.write_text(self.api_key + "\n")
            extra += ["--etcd", etcd.endpoint, "--auth-bootstrap-key-file", str(key_file)]
        else:
            extra += ["--auth", "off"]
        self.raft = raft
        self.nodes: list[ChaosNode] = []
        for i, (endpoint, addr) in enumerate(zip(self.endpoints, raft, strict=True)):
            peers = ",".join(a for a in raft if a != addr)
            node = ChaosNode(
                endpoint, root / f"n{i}", "--raft-listen", addr, "--peers", peers, *extra
            )
            node.env = {**os.environ, "FLUXMQ_CLUSTER_SECRET": SECRET}
            node.api_key = self.api_key
            self.nodes.append(node)
        self._channels: dict[str, grpc.Channel] = {}

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()

    def channel(self, node: ChaosNode) -> grpc.Channel:
        ch = self._channels.get(node.address)
        if ch is None:
            ch = self._channels[node.address] = authorized_channel(node.address, self.api_key)
        return ch

    def queue(self, node: ChaosNode) -> queue_pb2_grpc.QueueServiceStub:
        return queue_pb2_grpc.QueueServiceStub(self.channel(node))

    def admin(self, node: ChaosNode) -> admin_pb2_grpc.AdminServiceStub:
        return admin_pb2_grpc.AdminServiceStub(self.channel(node))

    def start(self) -> None:
        for node in self.nodes:
            node.spawn()
        for node in self.nodes:
            node.wait_serving()

    def close(self) -> None:
        for node in self.nodes:
            node.signal(signal.SIGCONT)
            node.kill9()
        for ch in self._channels.values():
            ch.close()

    def shard(self, node: ChaosNode, digest: bool = False) -> apb.ShardInfo | None:
        try:
            status = self.admin(node).GetClusterStatus(
                apb.GetClusterStatusRequest(skip_digest=not digest),
                timeout=10 if digest else STATUS_TIMEOUT_S,
            )
        except grpc.RpcError:
            return None
        return status.shards[0] if status.shards else None

    def leader(self, timeout_s: float = SETTLE_S) -> ChaosNode:
        """The node that leads the shard at the highest term (bounded wait)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            best: tuple[int, ChaosNode] | None = None
            for node in self.nodes:
                if not node.running:
                    continue
                info = self.shard(node)
                leads = info is not None and info.role == "leader"
                if info is not None and leads and (best is None or info.term > best[0]):
                    best = (info.term, node)
            if best is not None:
                return best[1]
            time.sleep(0.1)
        raise AssertionError("no leader within the bound")


@dataclass
class History:
    """What the clients saw: the checker's input, filled by the workload threads."""

    sent: list[checker.Sent] = field(default_factory=list)
    attempts: list[tuple[int, int, bool]] = field(default_factory=list)
    leases: dict[tuple[str, int, int, int], list[int | None]] = field(default_factory=dict)
    acks: list[checker.AckResult] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def lease_records(self) -> list[checker.Lease]:
        return [
            checker.Lease(consumer, p, o, received, int(deadline or 0), settled)
            for (consumer, p, o, received), (deadline, settled) in self.leases.items()
        ]


class Workload:
    def __init__(self, cluster: ChaosCluster, history: History) -> None:
        self.cluster = cluster
        self.history = history
        self.stop = threading.Event()
        self.errors: list[str] = []
        self._threads = (
            [
                threading.Thread(target=self._guard, args=(self._produce, f"p{i}"), daemon=True)
                for i in range(PRODUCERS)
            ]
            + [
                threading.Thread(target=self._guard, args=(self._consume, f"c{i}"), daemon=True)
                for i in range(CONSUMERS)
            ]
            + [
                threading.Thread(target=self._guard, args=(self._stream, f"s{i}"), daemon=True)
                for i in range(STREAMS)
            ]
        )

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(PUBLISH_BUDGET_S + 10)
            if t.is_alive():
                self.errors.append(f"{t.name} did not stop")

    def _guard(self, routine: object, name: str) -> None:
        try:
            routine(name)  # type: ignore[operator]
        except Exception as err:  # a bug of the harness: reported, not swallowed
            self.errors.append(f"{name}: {type(err).__name__}: {err}")

    def _produce(self, producer: str) -> None:
        nodes = self.cluster.nodes
        turn = int(producer[1:])
        for n in range(PUBLISHES_MAX):
            if self.stop.is_set():
                return
            ids = [f"{producer}-{n * BATCH + j:06d}" for j in range(BATCH)]
            request = pb.PublishRequest(
                queue=QUEUE,
                messages=[
                    pb.PublishMessage(key=producer.encode(), value=i.encode(), idempotency_key=i)
                    for i in ids
                ],
                request_timeout_ms=int(RPC_TIMEOUT_S * 1000),
            )
            outcome = "unknown"
            budget = time.monotonic() + PUBLISH_BUDGET_S
            while time.monotonic() < budget:
                node = nodes[turn % len(nodes)]
                turn += 1
                started = _now_ms()
                try:
                    self.cluster.queue(node).Publish(request, timeout=RPC_TIMEOUT_S)
                except grpc.RpcError:
                    with self.history.lock:
                        self.history.attempts.append((started, _now_ms(), False))
                    time.sleep(0.05)
                    continue
                with self.history.lock:
                    self.history.attempts.append((started, _now_ms(), True))
                outcome = "acked"
                break
            with self.history.lock:
                for j, i in enumerate(ids):
                    self.history.sent.append(checker.Sent(i, producer, n * BATCH + j, outcome))

    def _consume(self, consumer: str) -> None:
        nodes = self.cluster.nodes
        turn = int(consumer[1:])
        for _ in range(100_000):
            if self.stop.is_set():
                return
            node = nodes[turn % len(nodes)]
            turn += 1
            lease_once(self.cluster, node, consumer, self.history, wait_ms=300)

    def _stream(self, consumer: str) -> None:
        nodes = self.cluster.nodes
        turn = int(consumer[1:])
        for _ in range(100_000):
            if self.stop.is_set():
                return
            node = nodes[turn % len(nodes)]
            turn += 1
            # A stream's leases last no longer than the stream: when it ends because its client
            # went away (here: its deadline), the broker gives them back at once.
            ends_ms = _now_ms() + int(STREAM_S * 1000)
            received: list[tuple[int, int, int]] = []  # (partition, offset, received_ms)
            stream = self.cluster.queue(node).Consume(
                pb.ConsumeRequest(
                    queue=QUEUE, group=GROUP, consumer_id=consumer,
                    max_in_flight=STREAM_WINDOW, lease_ms=LEASE_MS, batch_max=50,
                ),
                timeout=STREAM_S,
            )  # fmt: skip
            try:
                for response in stream:
                    receipts = [m.receipt for m in response.messages]
                    at = _now_ms()
                    received += [(r.partition, r.offset, at) for r in receipts]
                    ack_leased(self.cluster, node, consumer, self.history, receipts, ends_ms, at)
                    if self.stop.is_set():
                        stream.cancel()
                        end_leases(self.history, consumer, received, _now_ms())
                        return
            except grpc.RpcError:  # deadline, failover, node down: open it again
                end_leases(self.history, consumer, received, _now_ms())
                time.sleep(0.05)


def lease_once(
    cluster: ChaosCluster, node: ChaosNode, consumer: str, history: History, wait_ms: int
) -> int:
    """Lease a batch through ``node`` and ack it; -> messages leased (0 on any failure)."""
    try:
        leased = cluster.queue(node).Lease(
            pb.LeaseRequest(
                queue=QUEUE, group=GROUP, consumer_id=consumer, max_messages=50,
                lease_ms=LEASE_MS, wait_ms=wait_ms,
            ),
            timeout=RPC_TIMEOUT_S + wait_ms / 1000,
        )  # fmt: skip
    except grpc.RpcError:
        time.sleep(0.05)
        return 0
    return ack_leased(cluster, node, consumer, history, [m.receipt for m in leased.messages])


def end_leases(
    history: History, consumer: str, received: list[tuple[int, int, int]], ended_ms: int
) -> None:
    """A Consume stream ended: the leases it brought that no ack settled end with it (the
    broker releases them when it sees the client gone)."""
    with history.lock:
        for partition, offset, at in received:
            lease = history.leases[(consumer, partition, offset, at)]
            if lease[1] is None:
                lease[1] = ended_ms


def ack_leased(
    cluster: ChaosCluster,
    node: ChaosNode,
    consumer: str,
    history: History,
    receipts: list[pb.Receipt],
    until_ms: int | None = None,
    received_ms: int | None = None,
) -> int:
    """Record what ``consumer`` was just given (at ``received_ms``, now if None; valid to its
    lease deadline, or ``until_ms`` if sooner) and ack it through ``node``; -> how many."""
    received = _now_ms() if received_ms is None else received_ms
    with history.lock:
        for r in receipts:
            deadline = r.lease_deadline_ms
            if until_ms is not None:
                deadline = min(deadline, until_ms)
            history.leases[(consumer, r.partition, r.offset, received)] = [deadline, None]
    if not receipts:
        return 0
    try:
        acked = cluster.queue(node).Ack(
            pb.AckRequest(queue=QUEUE, group=GROUP, receipts=receipts), timeout=RPC_TIMEOUT_S
        )
    except grpc.RpcError:
        with history.lock:  # the answer is lost: the ack may or may not have been applied
            for r in receipts:
                history.acks.append(
                    checker.AckResult(r.partition, r.offset, checker.OUTCOME_UNKNOWN)
                )
        return len(receipts)
    settled = _now_ms()
    with history.lock:
        for r, status in zip(receipts, acked.statuses, strict=True):
            name = pb.ReceiptStatus.Name(status).removeprefix("RECEIPT_STATUS_")
            history.acks.append(checker.AckResult(r.partition, r.offset, name))
            if name in ("ACKED", "ALREADY_ACKED"):
                history.leases[(consumer, r.partition, r.offset, received)][1] = settled
    return len(receipts)


@dataclass
class Report:
    schedule: Schedule
    verdict: checker.Verdict | None
    timeline: list[str]
    outage_ms: int
    acked: int
    problems: list[str]
    logs: dict[str, str]

    @property
    def ok(self) -> bool:
        return not self.problems and self.verdict is not None and self.verdict.ok

    def text(self) -> str:
        lines = [
            f"chaos schedule: {self.schedule.describe()}",
            f"replay: pytest tests/chaos --seed {self.schedule.seed}",
            "timeline:",
            *(f"  {t}" for t in self.timeline),
            *(f"problem: {p}" for p in self.problems),
        ]
        if self.verdict is not None:
            lines.append(self.verdict.summary())
        if not self.ok:
            for name, tail in self.logs.items():
                lines += [f"--- tail of {name}'s log ---", tail]
        return "\n".join(lines)


class Injector:
    """Applies the steps of a schedule and writes the timeline."""

    def __init__(self, cluster: ChaosCluster, partitions: Partitions | None, t0: float) -> None:
        self.cluster = cluster
        self.partitions = partitions
        self.t0 = t0
        self.timeline: list[str] = []

    def note(self, what: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.t0:6.2f}s {what}")

    def run(self, step: Step) -> None:
        cluster = self.cluster
        leader = cluster.leader()
        followers = [n for n in cluster.nodes if n is not leader]
        follower = followers[step.pick % len(followers)]
        kind = step.kind
        self.note(f"{kind}: leader {leader.endpoint.name}")
        if kind in ("kill_leader", "kill_follower"):
            victim = leader if kind == "kill_leader" else follower
            victim.kill9()
            self.note(f"killed {victim.endpoint.name}")
            time.sleep(step.hold_s)
            self.restart(victim)
        elif kind == "kill_all":
            for node in cluster.nodes:
                node.kill9()
            self.note("killed every node")
            time.sleep(step.hold_s)
            for node in cluster.nodes:
                node.spawn()
            for node in cluster.nodes:
                node.wait_serving()
            self.note("restarted every node")
        elif kind in ("stop_leader", "stop_follower"):
            victim = leader if kind == "stop_leader" else follower
            victim.signal(signal.SIGSTOP)
            self.note(f"SIGSTOP {victim.endpoint.name}")
            time.sleep(step.hold_s)
            victim.signal(signal.SIGCONT)
            self.note(f"SIGCONT {victim.endpoint.name}")
        elif kind == "restart_storm":
            victim = cluster.nodes[step.pick % len(cluster.nodes)]
            victim.kill9()
            deadline = time.monotonic() + step.hold_s
            storms = 0
            while time.monotonic() < deadline and storms < 6:
                victim.spawn()
                time.sleep(0.2 + (step.pick >> storms) % 7 / 10)
                victim.kill9()
                storms += 1
            self.note(f"killed {victim.endpoint.name} {storms} times while it started")
            self.restart(victim)
        elif kind == "transfer_leader":
            deadline = time.monotonic() + step.hold_s
            for _ in range(3):
                if time.monotonic() >= deadline:
                    break
                current = cluster.leader()
                try:
                    moved = cluster.admin(current).TransferLeadership(
                        apb.TransferLeadershipRequest(shard_id="g1"), timeout=10
                    )
                    self.note(f"leadership {current.endpoint.name} -> {moved.target}")
                except grpc.RpcError as err:
                    self.note(f"transfer refused: {err.code().name}")
                time.sleep(max(0.0, min(1.0, deadline - time.monotonic())))
        elif kind in PARTITION_KINDS or kind == "etcd_cut_leader":
            assert self.partitions is not None
            if kind == "partition_leader":
                self.partitions.isolate(leader.endpoint)
            elif kind == "partition_follower":
                self.partitions.isolate(follower.endpoint)
            elif kind == "partition_bridge":
                self.partitions.cut(leader.endpoint, follower.endpoint)
            else:
                assert cluster.etcd is not None
                etcd = cluster.etcd
                self.partitions.cut_port(leader.endpoint, etcd.host, etcd.client_port)
            self.note(f"{kind} cut")
            time.sleep(step.hold_s)
            self.partitions.heal()
            self.note("healed")
        else:
            raise AssertionError(f"unknown fault {kind!r}")

    def restart(self, node: ChaosNode) -> None:
        node.start()
        self.note(f"restarted {node.endpoint.name}")


@contextlib.contextmanager
def _etcd(mode: str) -> Iterator[EtcdServer | None]:
    if mode != "etcd":
        yield None
        return
    with EtcdServer() as server:
        yield server


def run_schedule(schedule: Schedule, root: Path) -> Report:
    """Run ``schedule`` on a fresh cluster under ``root``; -> its report (never raises for a
    violation: the report says)."""
    root.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    needs_network = any(
        s.kind in PARTITION_KINDS or s.kind == "etcd_cut_leader" for s in schedule.steps
    )
    history = History()
    with _etcd(schedule.mode) as etcd:
        cluster = ChaosCluster(root, schedule.mode, etcd)
        partitions = Partitions(cluster.endpoints) if needs_network else None
        t0 = time.monotonic()
        injector = Injector(cluster, partitions, t0)
        verdict = None
        try:
            cluster.start()
            setup(cluster)
            injector.note("cluster up, queue and group made; load starts")
            workload = Workload(cluster, history)
            workload.start()
            load_t0 = time.monotonic()
            try:
                for step in schedule.steps:
                    time.sleep(max(0.0, load_t0 + step.at_s - time.monotonic()))
                    injector.run(step)
                time.sleep(max(0.0, load_t0 + schedule.load_s - time.monotonic()))
            finally:
                if partitions is not None:
                    partitions.heal()
                for node in cluster.nodes:
                    node.signal(signal.SIGCONT)
                workload.join()
            problems += workload.errors
            injector.note(f"load stopped: {len(history.sent)} messages sent")
            for node in cluster.nodes:
                if not node.running:
                    injector.restart(node)
            reads = drain(cluster, history, injector)
            states = replica_states(cluster, injector)
            verdict = checker.check(
                history.sent, reads, states, history.lease_records(), history.acks
            )
        except Exception as err:
            problems.append(f"the run failed: {type(err).__name__}: {err}")
        finally:
            logs = {n.endpoint.name: n.log_tail() for n in cluster.nodes}
            cluster.close()
            if partitions is not None:
                partitions.close()
    return Report(
        schedule,
        verdict,
        injector.timeline,
        checker.longest_outage_ms(history.attempts),
        sum(1 for s in history.sent if s.outcome == "acked"),
        problems,
        logs,
    )


def setup(cluster: ChaosCluster) -> None:
    leader = cluster.leader()
    stub = cluster.queue(leader)
    config = pb.QueueConfig(
        name=QUEUE, partitions=PARTITIONS, type=pb.QUEUE_TYPE_WORK, dedup_window="10m",
        max_attempts=100, dead_letter_disabled=True,
    )  # fmt: skip
    stub.CreateQueue(pb.CreateQueueRequest(config=config), timeout=15)
    stub.CreateGroup(pb.CreateGroupRequest(queue=QUEUE, group=GROUP), timeout=15)


def drain(cluster: ChaosCluster, history: History, injector: Injector) -> list[checker.Read]:
    """Every record of every partition read from offset 0 through one node, then the group
    leased and acked to its end (bounded)."""
    deadline = time.monotonic() + SETTLE_S
    node = cluster.leader()
    reads: list[checker.Read] = []
    for partition in range(PARTITIONS):
        offset = 0
        while True:
            assert time.monotonic() < deadline, f"reading partition {partition} took too long"
            try:
                fetched = cluster.queue(node).Fetch(
                    pb.FetchRequest(
                        queue=QUEUE, partition=partition, offset=offset, max_messages=1000
                    ),
                    timeout=10,
                )
            except grpc.RpcError:
                time.sleep(0.2)
                continue
            reads += [checker.Read(r.value.decode(), partition, r.offset) for r in fetched.records]
            if fetched.next_offset >= fetched.high_watermark:
                break
            offset = fetched.next_offset
    injector.note(f"read back {len(reads)} records")
    while time.monotonic() < deadline:
        lease_once(cluster, node, "drain", history, wait_ms=200)
        if group_done(cluster, node):
            injector.note("group drained")
            return reads
    raise AssertionError("the group was not drained within the bound")


def group_done(cluster: ChaosCluster, node: ChaosNode) -> bool:
    try:
        described = cluster.queue(node).DescribeGroup(
            pb.DescribeGroupRequest(queue=QUEUE, group=GROUP), timeout=10
        )
    except grpc.RpcError:
        return False
    return all(p.lag == 0 and p.in_flight == 0 for p in described.partitions)


def replica_states(cluster: ChaosCluster, injector: Injector) -> list[checker.ReplicaState]:
    """Each replica's digest once all applied the same index and the sample holds still
    (bounded).

    A replica's status and its digest are read one after the other, and a follower applies a
    commit when it learns the commit index (with the next append, or within commit_notice_ms):
    one sample can pair an index with a state a commit ahead or behind it. Two samples in a row
    with the same index and digest on every replica rule that out; a real divergence holds still
    and is reported."""
    deadline = time.monotonic() + SETTLE_S
    infos: list[apb.ShardInfo | None] = []
    settled: list[apb.ShardInfo | None] | None = None  # the last sample at one applied index
    previous: list[tuple[int, str]] | None = None
    while time.monotonic() < deadline:
        infos = [cluster.shard(n, digest=True) for n in cluster.nodes]
        present = [i for i in infos if i is not None]
        if len(present) == len(infos) and len({i.applied_index for i in present}) == 1:
            settled = infos
            sample = [(i.applied_index, i.digest) for i in present]
            if sample == previous:
                break
            previous = sample
        else:
            previous = None
        time.sleep(0.2)
    else:
        if settled is None:
            raise AssertionError(f"replicas did not reach one applied index: {infos}")
        infos = settled  # never held still (a timer's entries kept coming): the last at one index
    injector.note(f"replicas at applied index {infos[0].applied_index if infos[0] else '?'}")
    return [
        checker.ReplicaState(n.endpoint.name, i.shard_id, i.applied_index, i.digest)
        for n, i in zip(cluster.nodes, infos, strict=True)
        if i is not None
    ]
