"""``fluxmqctl cluster status``: every node it can reach (the ``--server`` addresses, then the
nodes they list), their shards (role, leader, term, commit / applied index, replica lag, queues)
and whether the replicas' state digests agree at equal applied indexes. Exit 0 when healthy:
every node answered, every replica of every shard was reached and knows the same leader, and no
two replicas at the same applied index differ; 1 otherwise (3 when no node answered)."""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq.cli.conn import EXIT_UNREACHABLE, CliError, Connection, Context
from fluxmq.cli.output import message_dict

ROUNDS = 5  # status rounds while writes keep replicas at different applied indexes
ROUND_PAUSE_S = 0.2
QUEUES_SHOWN = 10
DIGEST_SHOWN = 12

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
        "static peers (no etcd) nodes do not list each other: pass every node to --server.",
    )
    p.set_defaults(handler=status)


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


def _fetch(address: str, timeout_s: float) -> NodeView:
    conn = Connection([address], timeout_s)
    try:
        st = conn.call(conn.admin.GetClusterStatus, apb.GetClusterStatusRequest())
        return NodeView(address, st)
    except CliError as err:
        return NodeView(address, None, str(err))
    finally:
        conn.close()


def _discover(seeds: list[str], timeout_s: float) -> list[NodeView]:
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
        view = _fetch(address, timeout_s)
        if view.status is not None:
            if view.status.node_id in node_ids:
                continue  # the same node under another address
            node_ids.add(view.status.node_id)
            todo.extend(n.grpc_address for n in view.status.nodes if n.grpc_address)
        views.append(view)
    return views


def _refresh(views: list[NodeView], timeout_s: float) -> list[NodeView]:
    with ThreadPoolExecutor(max_workers=min(8, len(views))) as pool:
        return list(pool.map(lambda v: _fetch(v.address, timeout_s), views))


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


def _settled(shards: list[ShardView]) -> bool:
    """Every shard's replicas were compared at one applied index (or there is one replica)."""
    for s in shards:
        if len(s.replicas) >= 2 and len({i.applied_index for _, i in s.replicas}) > 1:
            return False
        if s.verdict == DIFFER:
            return False
    return True


def status(args: argparse.Namespace, ctx: Context) -> int:
    views = _discover(ctx.servers, ctx.timeout_s)
    shards = _shards(views)
    for _ in range(ROUNDS - 1):
        if _settled(shards) or not any(v.status is not None for v in views):
            break
        time.sleep(ROUND_PAUSE_S)
        views = _refresh(views, ctx.timeout_s)
        shards = _shards(views)
    if not any(v.status is not None for v in views):
        errors = "; ".join(v.error for v in views)
        raise CliError(f"no node answered: {errors}", EXIT_UNREACHABLE)
    problems = [f"node {v.address}: {v.error}" for v in views if v.status is None]
    problems += [
        f"node {v.status.node_id}: metadata store: {v.status.metadata_error}"
        for v in views
        if v.status is not None and v.status.metadata_error
    ]
    for s in shards:
        problems.extend(s.problems)
    healthy = not problems
    if ctx.out.json:
        ctx.out.doc(_document(views, shards, problems))
    else:
        _print(ctx, views, shards, problems)
    return 0 if healthy else 1


def _document(
    views: list[NodeView], shards: list[ShardView], problems: list[str]
) -> dict[str, Any]:
    return {
        "healthy": not problems,
        "problems": problems,
        "nodes": [
            {
                "address": v.address,
                "node_id": v.status.node_id if v.status else "",
                "reachable": v.status is not None,
                "error": v.error,
                "metadata_error": v.status.metadata_error if v.status else "",
                "listed_nodes": [message_dict(n) for n in v.status.nodes] if v.status else [],
            }
            for v in views
        ],
        "shards": [
            {
                "shard_id": s.shard_id,
                "leader": s.leader,
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
    }


def _print(
    ctx: Context, views: list[NodeView], shards: list[ShardView], problems: list[str]
) -> None:
    out = ctx.out
    out.table(
        ["NODE", "ADDRESS", "STATUS"],
        [
            [v.status.node_id if v.status else "?", v.address, "ok" if v.status else "unreachable"]
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
                    v.status.node_id if v.status else "?",
                    i.role,
                    i.leader or "-",
                    i.term,
                    i.commit_index,
                    i.applied_index,
                    "-" if lag is None else lag,
                    i.pending_proposals,
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
                s.leader or "-",
                s.verdict,
                _queues(s.queues),
            ]
            for s in shards
        ],
    )
    out.line()
    if problems:
        out.line("unhealthy:")
        for p in problems:
            out.line(f"  - {p}")
    else:
        out.line("healthy")


def _queues(names: list[str]) -> str:
    if not names:
        return "-"
    shown = ",".join(names[:QUEUES_SHOWN])
    return shown + (f",... ({len(names)})" if len(names) > QUEUES_SHOWN else "")
