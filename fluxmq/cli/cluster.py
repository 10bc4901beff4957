"""``fluxmqctl cluster status``: every node it can reach (the ``--server`` addresses, then the
nodes they list), their readiness and etcd session, their shards (role, leader, term, commit /
applied index, replica lag, in-sync replicas, queues) and whether the replicas' state digests
agree at equal applied indexes; then what the dashboard shows, in text: per queue the messages
published and delivered (totals, and rates over the sampling window), dead letters and their
alert; per consumer group lag, in-flight, scheduled and dead-lettered messages; per node and
method the calls, errors and latency quantiles. Exit 0 when healthy: every node answered, every
replica of every shard was reached and knows the same leader, and no two replicas at the same
applied index differ; 1 otherwise (3 when no node answered)."""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq.cli.conn import EXIT_UNREACHABLE, CliError, Connection, Context, Security
from fluxmq.cli.output import message_dict
from fluxmq.cli.values import positive

ROUNDS = 5  # status rounds while writes keep replicas at different applied indexes
ROUND_PAUSE_S = 0.2
QUEUES_SHOWN = 10
DIGEST_SHOWN = 12
WINDOW_DEFAULT_S = 1.0  # rates are measured between the first answer and one this much later
WINDOW_MAX_S = 300.0
TOP_DEFAULT = 20  # rows of the QUEUES, GROUPS and RPCS tables (-o json has them all)
# QueueCounters fields summed over nodes, with their rates (the cluster's: a sum over nodes).
RATED = (
    "published_messages",
    "published_bytes",
    "delivered_messages",
    "delivered_bytes",
    "redelivered_messages",
    "acked_messages",
    "nacked_messages",
)
READY_SHOWN = {"ready": "yes", "not_ready": "no"}

AGREE, DIFFER, UNCHECKED, SINGLE = "AGREE", "DIFFER", "UNCHECKED", "-"


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    noun = sub.add_parser("cluster", help="cluster health: nodes, shards, leaders, digests")
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser(
        "status",
        parents=[common],
        help="nodes, shards, leaders, lag, digests; exit 0 only when healthy",
        description="Asks every node it can reach (--server, comma-separated, then the nodes "
        "they list) for its shards. DIGESTS is AGREE when replicas at the same applied index "
        "have the same state digest, DIFFER when not, UNCHECKED when writes kept them at "
        "different indexes. Exit 0 when healthy, 1 otherwise, 3 when no node answered. With "
        "static peers (no etcd) nodes do not list each other: pass every node to --server. "
        "QUEUES (reported by each shard's leader): PUBLISHED is every message appended since "
        "the queue was made, DELIVERED and REDELIVERED the leases the nodes handed out since "
        "they started; the /s columns are rates between the first answer and one --window "
        "later (- with --window 0). RPCS: calls since each node started, latency quantiles "
        "estimated from the histogram buckets.",
    )
    p.add_argument(
        "--window",
        type=_window,
        default=WINDOW_DEFAULT_S,
        metavar="SECONDS",
        help=f"measure rates over this long ({WINDOW_DEFAULT_S:g}; 0 = one sample, no rates)",
    )
    p.add_argument(
        "--top",
        type=positive,
        default=TOP_DEFAULT,
        metavar="N",
        help=f"rows of the QUEUES, GROUPS and RPCS tables ({TOP_DEFAULT}; -o json has all)",
    )
    p.set_defaults(handler=status)


def _window(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= WINDOW_MAX_S:
        raise argparse.ArgumentTypeError(f"must be within 0..{WINDOW_MAX_S:g} seconds")
    return value


@dataclass
class NodeView:
    address: str
    status: apb.ClusterStatus | None = None
    error: str = ""


@dataclass
class ShardView:
    shard_id: str
    replicas: list[tuple[NodeView, apb.ShardInfo]] = field(default_factory=list)
    verdict: str = SINGLE
    leader: str = ""
    members: list[str] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def lag(self, info: apb.ShardInfo) -> int | None:
        """How far the replica's applied index is behind the leader's commit index."""
        leaders = [i for _, i in self.replicas if i.role == "leader"]
        if not leaders:
            return None
        return max(0, leaders[0].commit_index - info.applied_index)


def _fetch(
    address: str, timeout_s: float, security: Security, skip_digest: bool = False
) -> NodeView:
    conn = Connection([address], timeout_s, security)
    try:
        request = apb.GetClusterStatusRequest(skip_digest=skip_digest)
        st = conn.call(conn.admin.GetClusterStatus, request)
        return NodeView(address, st)
    except CliError as err:
        if not skip_digest and err.reason in ("PERMISSION_DENIED", "DIGEST_BUSY"):
            # Digests take an admin key and are rate limited: the status without them (the
            # shard's verdict is then UNCHECKED).
            return _fetch(address, timeout_s, security, skip_digest=True)
        return NodeView(address, None, str(err))
    finally:
        conn.close()


def _discover(seeds: list[str], timeout_s: float, security: Security) -> list[NodeView]:
    """Breadth first from the seeds through the node lists; one view per node id."""
    todo = list(seeds)
    asked: set[str] = set()
    node_ids: set[str] = set()
    views: list[NodeView] = []
    while todo:
        address = todo.pop(0)
        if address in asked:
            continue
        asked.add(address)
        view = _fetch(address, timeout_s, security)
        if view.status is not None:
            if view.status.node_id in node_ids:
                continue  # the same node under another address
            node_ids.add(view.status.node_id)
            todo.extend(n.grpc_address for n in view.status.nodes if n.grpc_address)
        views.append(view)
    return views


def _refresh(
    views: list[NodeView], timeout_s: float, security: Security, skip_digest: bool = False
) -> list[NodeView]:
    with ThreadPoolExecutor(max_workers=min(8, len(views))) as pool:
        return list(pool.map(lambda v: _fetch(v.address, timeout_s, security, skip_digest), views))


def _shards(views: list[NodeView]) -> list[ShardView]:
    shards: dict[str, ShardView] = {}
    for view in views:
        if view.status is None:
            continue
        for info in view.status.shards:
            shards.setdefault(info.shard_id, ShardView(info.shard_id)).replicas.append((view, info))
    for shard in shards.values():
        _judge(shard)
    return [shards[k] for k in sorted(shards)]


def _judge(shard: ShardView) -> None:
    infos = [i for _, i in shard.replicas]
    by_index: dict[int, set[str]] = defaultdict(set)
    counts: dict[int, int] = defaultdict(int)
    for info in infos:
        if info.digest:  # "" when the node gave none (no admin key, or busy)
            by_index[info.applied_index].add(info.digest)
            counts[info.applied_index] += 1
    if len(infos) < 2:
        shard.verdict = SINGLE
    elif any(len(d) > 1 for d in by_index.values()):
        shard.verdict = DIFFER
    elif any(c >= 2 for c in counts.values()):
        shard.verdict = AGREE
    else:
        shard.verdict = UNCHECKED
    leaders = {i.leader for i in infos}
    shard.leader = next(iter(leaders)) if len(leaders) == 1 else ""
    members: set[str] = set()
    for info in infos:
        members.update(info.members)
    shard.members = sorted(members)
    shard.queues = sorted({q for i in infos for q in i.queues})
    if "" in leaders:
        shard.problems.append(f"shard {shard.shard_id}: a replica knows no leader")
    elif len(leaders) > 1:
        shard.problems.append(
            f"shard {shard.shard_id}: replicas name different leaders: "
            + ", ".join(sorted(leaders))
        )
    expected = max(len(shard.members), 1)
    if len(infos) < expected:
        shard.problems.append(
            f"shard {shard.shard_id}: {len(infos)} of {expected} replicas reached"
        )
    if shard.verdict == DIFFER:
        shard.problems.append(
            f"shard {shard.shard_id}: replicas at the same applied index have different digests"
        )


def _node_names(views: list[NodeView]) -> dict[str, str]:
    """gRPC and Raft addresses -> node ids, from what the nodes that answered said: the
    directory (so a node that does not answer is named too) and each replica's own address
    (``members[0]``; placed groups use Raft ports above the node's base)."""
    names: dict[str, str] = {}
    for v in views:
        if v.status is None:
            continue
        for n in v.status.nodes:
            if n.grpc_address:
                names[n.grpc_address] = n.node_id
            if n.raft_address:
                names[n.raft_address] = n.node_id
        for info in v.status.shards:
            if info.members and v.status.node_id:
                names[info.members[0]] = v.status.node_id
        if v.status.node_id:
            names[v.address] = v.status.node_id
    return names


def _named(names: dict[str, str], address: str) -> str:
    """``address`` as its node id (the address itself when no node said whose it is)."""
    return names.get(address, address)


def _settled(shards: list[ShardView]) -> bool:
    """Every shard's replicas were compared at one applied index (or there is one replica)."""
    for s in shards:
        if len(s.replicas) >= 2 and len({i.applied_index for _, i in s.replicas}) > 1:
            return False
        if s.verdict == DIFFER:
            return False
    return True


@dataclass
class QueueView:
    """One queue across the cluster: its state as its shard's leader reports it, and the sum
    over nodes of the nodes' own counters, with rates over the sampling window."""

    name: str
    state: apb.QueueStatus | None = None  # None: no node reported it (its shard has no leader)
    reported_by: str = ""
    published_rate: float | None = None
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RATED, 0))
    rates: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(RATED))

    @property
    def published(self) -> int:
        return self.state.published_messages if self.state is not None else 0

    def activity(self) -> tuple[float, int, int]:
        """What the table shows first: the busiest (by rate, then by totals)."""
        rate = (self.published_rate or 0.0) + (self.rates["delivered_messages"] or 0.0)
        return (-rate, -self.published, -self.counters["delivered_messages"])


@dataclass
class Sample:
    """The answers of one status round, by node id."""

    statuses: dict[str, apb.ClusterStatus]

    @classmethod
    def of(cls, views: list[NodeView]) -> Sample:
        return cls({v.status.node_id: v.status for v in views if v.status is not None})

    def queues(self) -> dict[str, tuple[str, apb.QueueStatus, int]]:
        """queue -> (node id, state, sampled ms). Two nodes may report one queue while a
        leadership changes hands: the most advanced answer wins."""
        out: dict[str, tuple[str, apb.QueueStatus, int]] = {}
        for node_id, st in sorted(self.statuses.items()):
            for q in st.queues:
                seen = out.get(q.name)
                if seen is None or q.published_messages > seen[1].published_messages:
                    out[q.name] = (node_id, q, st.sampled_ms)
        return out


def _rate(before: int, after: int, elapsed_ms: int) -> float | None:
    """Per second between two readings of a counter; a counter that went down was reset (the
    node restarted, the queue was made again): it counted ``after`` since."""
    if elapsed_ms <= 0:
        return None
    delta = after - before if after >= before else after
    return delta * 1000.0 / elapsed_ms


def _queue_views(first: Sample, last: Sample, rated: bool) -> list[QueueView]:
    """Every queue a node reported state or counters for; with ``rated`` (two samples), the
    rates between ``first`` and ``last``."""
    views: dict[str, QueueView] = {}

    def view(name: str) -> QueueView:
        return views.setdefault(name, QueueView(name))

    before = first.queues()
    for name, (node_id, q, sampled_ms) in last.queues().items():
        v = view(name)
        v.state, v.reported_by = q, node_id
        if rated and name in before:
            _, q0, sampled0_ms = before[name]
            v.published_rate = _rate(
                q0.published_messages, q.published_messages, sampled_ms - sampled0_ms
            )
    paired = False  # some node answered both samples
    for node_id, st in last.statuses.items():
        earlier = first.statuses.get(node_id) if rated else None
        if earlier is None or st.sampled_ms <= earlier.sampled_ms:
            earlier = None
        paired = paired or earlier is not None
        counters0 = {c.queue: c for c in earlier.queue_counters} if earlier is not None else {}
        for c in st.queue_counters:
            v = view(c.queue)
            c0 = counters0.get(c.queue)
            for name in RATED:
                after = int(getattr(c, name))
                v.counters[name] += after
                if earlier is None:
                    continue
                rate = _rate(
                    int(getattr(c0, name)) if c0 is not None else 0,
                    after,
                    st.sampled_ms - earlier.sampled_ms,
                )
                v.rates[name] = (v.rates[name] or 0.0) + (rate or 0.0)
    if paired:
        # A queue no answering node counted anything for moved at rate 0, not "unknown".
        for v in views.values():
            for name in RATED:
                if v.rates[name] is None:
                    v.rates[name] = 0.0
    return sorted(views.values(), key=lambda v: v.name)


def status(args: argparse.Namespace, ctx: Context) -> int:
    started = time.monotonic()
    views = _discover(ctx.servers, ctx.timeout_s, ctx.security)
    first = Sample.of(views)
    samples = 1
    shards = _shards(views)
    for _ in range(ROUNDS - 1):
        if _settled(shards) or not any(v.status is not None for v in views):
            break
        time.sleep(ROUND_PAUSE_S)
        views = _refresh(views, ctx.timeout_s, ctx.security)
        shards = _shards(views)
        samples += 1
    if not any(v.status is not None for v in views):
        errors = "; ".join(v.error for v in views)
        raise CliError(f"no node answered: {errors}", EXIT_UNREACHABLE)
    last = Sample.of(views)
    final: list[NodeView] = []
    if args.window > 0:
        # The counters once more, a window after the first answer; without digests: the
        # shards are judged on the rounds above.
        time.sleep(max(0.0, args.window - (time.monotonic() - started)))
        final = _refresh(views, ctx.timeout_s, ctx.security, skip_digest=True)
        last = Sample({**last.statuses, **Sample.of(final).statuses})
        samples += 1
    names = _node_names(views)
    problems = [f"node {_shown(names, v.address)}: {v.error}" for v in views if v.status is None]
    if final:
        problems += [
            f"node {_shown(names, f.address)}: {f.error}"
            for v, f in zip(views, final, strict=True)
            if v.status is not None and f.status is None
        ]
    problems += [
        f"node {v.status.node_id}: metadata store: {v.status.metadata_error}"
        for v in views
        if v.status is not None and v.status.metadata_error
    ]
    for s in shards:
        problems.extend(
            p.replace(s.leader, _named(names, s.leader)) if s.leader else p for p in s.problems
        )
    healthy = not problems
    queues = _queue_views(first, last, samples > 1)
    if ctx.out.json:
        ctx.out.doc(_document(views, shards, problems, queues, last))
    else:
        _print(ctx, views, shards, problems, queues, last, args.top)
    return 0 if healthy else 1


def _shown(names: dict[str, str], address: str) -> str:
    name = names.get(address)
    return address if name is None else f"{name} ({address})"


def _document(
    views: list[NodeView],
    shards: list[ShardView],
    problems: list[str],
    queues: list[QueueView],
    last: Sample,
) -> dict[str, Any]:
    def latest(v: NodeView) -> apb.ClusterStatus | None:
        return last.statuses.get(v.status.node_id, v.status) if v.status else None

    names = _node_names(views)
    return {
        "healthy": not problems,
        "problems": problems,
        "nodes": [
            {
                "address": v.address,
                "node_id": v.status.node_id if v.status else names.get(v.address, ""),
                "reachable": v.status is not None,
                "error": v.error,
                "metadata_error": v.status.metadata_error if v.status else "",
                "readiness": v.status.readiness if v.status else "",
                "etcd_session": v.status.etcd_session if v.status else "",
                "listed_nodes": [message_dict(n) for n in v.status.nodes] if v.status else [],
                "rpcs": [message_dict(r) for r in st.rpcs] if (st := latest(v)) else [],
            }
            for v in views
        ],
        "shards": [
            {
                "shard_id": s.shard_id,
                "leader": s.leader,
                "leader_node": names.get(s.leader, "") if s.leader else "",
                "members": s.members,
                "replicas_reached": len(s.replicas),
                "digests": s.verdict,
                "queues": s.queues,
                "replicas": [
                    {
                        "node_id": v.status.node_id if v.status else "",
                        "address": v.address,
                        "lag": s.lag(info),
                        **message_dict(info),
                    }
                    for v, info in s.replicas
                ],
            }
            for s in shards
        ],
        "queues": [
            {
                "name": q.name,
                "reported_by": q.reported_by,
                "state": message_dict(q.state) if q.state is not None else None,
                # Messages appended per second (from the state: high watermarks).
                "published_per_s": q.published_rate,
                # Sums over nodes of the nodes' counters since they started, and their rates.
                "counters": q.counters,
                "counters_per_s": q.rates,
            }
            for q in queues
        ],
    }


def _print(
    ctx: Context,
    views: list[NodeView],
    shards: list[ShardView],
    problems: list[str],
    queues: list[QueueView],
    last: Sample,
    top: int,
) -> None:
    out = ctx.out
    names = _node_names(views)
    out.table(
        ["NODE", "ADDRESS", "STATUS", "READY", "ETCD"],
        [
            [
                v.status.node_id if v.status else names.get(v.address, "?"),
                v.address,
                "ok" if v.status else "unreachable",
                READY_SHOWN.get(v.status.readiness, "-") if v.status else "-",
                (v.status.etcd_session or "-") if v.status else "-",
            ]
            for v in views
        ],
    )
    out.line()
    rows = []
    for s in shards:
        for v, i in s.replicas:
            lag = s.lag(i)
            rows.append(
                [
                    s.shard_id,
                    v.status.node_id if v.status else names.get(v.address, "?"),
                    f"{i.role} (probation)" if i.on_probation else i.role,
                    _named(names, i.leader) if i.leader else "-",
                    i.term,
                    i.commit_index,
                    i.applied_index,
                    "-" if lag is None else lag,
                    i.pending_proposals,
                    i.in_sync_replicas,
                    i.digest[:DIGEST_SHOWN] or "-",
                ]
            )
    out.table(
        [
            "SHARD",
            "NODE",
            "ROLE",
            "LEADER",
            "TERM",
            "COMMIT",
            "APPLIED",
            "LAG",
            "PENDING",
            "IN_SYNC",
            "DIGEST",
        ],
        rows,
    )
    out.line()
    out.table(
        ["SHARD", "REPLICAS", "LEADER", "DIGESTS", "QUEUES"],
        [
            [
                s.shard_id,
                f"{len(s.replicas)}/{max(len(s.members), 1)}",
                _named(names, s.leader) if s.leader else "-",
                s.verdict,
                _queues(s.queues),
            ]
            for s in shards
        ],
    )
    out.line()
    _print_queues(ctx, queues, top)
    out.line()
    _print_groups(ctx, queues, top)
    out.line()
    _print_rpcs(ctx, last, top)
    out.line()
    if problems:
        out.line("unhealthy:")
        for p in problems:
            out.line(f"  - {p}")
    else:
        out.line("healthy")


def _per_s(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _more(ctx: Context, total: int, shown: int, what: str) -> None:
    if total > shown:
        ctx.out.line(f"({total - shown} more {what}: raise --top or use -o json)")


def _print_queues(ctx: Context, queues: list[QueueView], top: int) -> None:
    if not queues:
        ctx.out.line("queues: none")
        return
    shown = sorted(queues, key=lambda q: (*q.activity(), q.name))[:top]
    rows = []
    for q in shown:
        st = q.state
        dlq = st is not None and bool(st.dead_letter_queue)
        rows.append(
            [
                q.name,
                st.shard_id if st is not None else "-",
                st.published_messages if st is not None else "-",
                _per_s(q.published_rate),
                _per_s(q.rates["published_bytes"], 0),
                q.counters["delivered_messages"],
                _per_s(q.rates["delivered_messages"]),
                _per_s(q.rates["delivered_bytes"], 0),
                q.counters["redelivered_messages"],
                st.dead_letters if st is not None and dlq else "-",
                ("RAISED" if st.dead_letter_alert else "ok") if st is not None and dlq else "-",
            ]
        )
    ctx.out.table(
        [
            "QUEUE",
            "SHARD",
            "PUBLISHED",
            "PUB/S",
            "PUB_B/S",
            "DELIVERED",
            "DEL/S",
            "DEL_B/S",
            "REDELIVERED",
            "DLQ",
            "ALERT",
        ],
        rows,
    )
    _more(ctx, len(queues), len(shown), "queues")


def _print_groups(ctx: Context, queues: list[QueueView], top: int) -> None:
    groups = [(q.name, g) for q in queues if q.state is not None for g in q.state.groups]
    if not groups:
        ctx.out.line("consumer groups: none")
        return
    shown = sorted(groups, key=lambda x: (-x[1].lag, -x[1].in_flight, x[0], x[1].name))[:top]
    ctx.out.table(
        ["QUEUE", "GROUP", "LAG", "IN_FLIGHT", "SCHEDULED", "DEAD"],
        [[q, g.name, g.lag, g.in_flight, g.scheduled, g.dead_lettered] for q, g in shown],
    )
    _more(ctx, len(groups), len(shown), "consumer groups")


def _print_rpcs(ctx: Context, last: Sample, top: int) -> None:
    rpcs = [(node_id, r) for node_id, st in sorted(last.statuses.items()) for r in st.rpcs]
    if not rpcs:
        ctx.out.line("rpcs: none")
        return
    shown = sorted(rpcs, key=lambda x: (-x[1].calls, x[0], x[1].method))[:top]
    ctx.out.table(
        ["NODE", "METHOD", "CALLS", "ERRORS", "CODES", "P50_MS", "P99_MS"],
        [
            [
                node_id,
                r.method,
                r.calls,
                sum(r.errors_by_code.values()),
                ",".join(f"{c}={n}" for c, n in sorted(r.errors_by_code.items())) or "-",
                f"{r.p50_ms:.2f}",
                f"{r.p99_ms:.2f}",
            ]
            for node_id, r in shown
        ],
    )
    _more(ctx, len(rpcs), len(shown), "methods")


def _queues(names: list[str]) -> str:
    if not names:
        return "-"
    shown = ",".join(names[:QUEUES_SHOWN])
    return shown + (f",... ({len(names)})" if len(names) > QUEUES_SHOWN else "")
