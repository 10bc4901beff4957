"""``fluxmqctl node list|drain|decommission|undrain`` and ``fluxmqctl shard move|rebalance``:
where replication groups live, in a cluster with etcd. The commands write what they ask into
the group records and node states in etcd; the placement controller and each group's leader
carry it out, so they can be given to any node. ``drain`` and ``decommission`` wait
(``--wait``) and show progress until nothing is left on the node."""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq.cli.conn import CliError, Connection, Context
from fluxmq.cli.output import message_dict
from fluxmq.cli.values import positive

WAIT_DEFAULT_S = 600
POLL_S = 1.0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    noun = sub.add_parser(
        "node", help="nodes: list, drain, decommission, undrain (clusters with etcd)"
    )
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser(
        "list",
        parents=[common],
        help="every node: live or not, state, the groups it holds and leads, its lag",
        description="STATE is active, draining (its replicas and leadership are moving away), "
        "leaving (the same, for the node's own stop: active again when it starts), drained "
        "(nothing left on it) or decommissioned (never placed on again). GROUPS are "
        "the placed groups whose record lists the node; LEADS the groups it leads; LAG how many "
        "entries its replicas are behind their leaders' commit (the largest; - when it does "
        "not answer).",
    )
    p.set_defaults(handler=list_nodes)
    for verb, what in (
        ("drain", "move every placed replica and leadership off NODE"),
        ("decommission", "drain NODE for good: nothing is placed on it again"),
    ):
        p = verbs.add_parser(verb, parents=[common], help=what, description=what.capitalize())
        p.add_argument("node_id", metavar="NODE")
        if verb == "drain":
            p.add_argument(
                "--until-restart",
                action="store_true",
                help="the node's own stop (a Kubernetes preStop hook): state 'leaving', "
                "cleared when the node starts again (a plain drain lasts until undrain)",
            )
        p.add_argument(
            "--wait",
            dest="wait_s",
            type=positive,
            default=WAIT_DEFAULT_S,
            metavar="SECONDS",
            help=f"wait this long for the node to be drained ({WAIT_DEFAULT_S})",
        )
        p.add_argument("--no-wait", action="store_true", help="return once it is asked")
        p.set_defaults(handler=drain if verb == "drain" else decommission)

    p = verbs.add_parser(
        "undrain",
        parents=[common],
        help="make a draining or drained NODE active again (not a decommissioned one)",
        description="Clears the node's draining (or leaving) state: placement may give it "
        "replicas and leadership again (the rebalance after a join, leaders spread).",
    )
    p.add_argument("node_id", metavar="NODE")
    p.set_defaults(handler=undrain)

    noun = sub.add_parser("shard", help="replication groups: move a replica (clusters with etcd)")
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser(
        "move",
        parents=[common],
        help="move SHARD's replica from one node to another",
        description="Writes the group's record with --to in --from's place (a Raft port of --to "
        "is claimed with it). The group's leader adds the new replica, lets it catch up, then "
        "removes the old one; a missing old one is removed first. Refused, with the reason, "
        "when the group would have to wait for the new replica (another member missing).",
    )
    p.add_argument("shard_id", metavar="SHARD")
    p.add_argument("--from", dest="from_node", required=True, metavar="NODE")
    p.add_argument("--to", dest="to_node", required=True, metavar="NODE")
    p.set_defaults(handler=move)
    p = verbs.add_parser(
        "rebalance",
        parents=[common],
        help="even placed replicas out over the nodes (--dry-run: only show the moves)",
        description="Shows the moves that bring every live node (not draining) within one "
        "replica of the others and, without --dry-run, writes the first ones (as many as the "
        "nodes' placement_moves_max); the placement controller goes on with the rest.",
    )
    p.add_argument("--dry-run", action="store_true", help="show the moves, change nothing")
    p.set_defaults(handler=rebalance)


def _rows(nodes: list[apb.NodeSummary], lags: dict[str, int | None]) -> list[list[object]]:
    return [
        [
            n.node_id,
            "yes" if n.live else "no",
            n.state,
            len(n.groups),
            ",".join(n.groups) or "-",
            ",".join(n.leading) or "-",
            "-" if (lag := lags.get(n.node_id)) is None else lag,
            n.grpc_address or "-",
        ]
        for n in nodes
    ]


HEADERS = ["NODE", "LIVE", "STATE", "REPLICAS", "GROUPS", "LEADS", "LAG", "ADDRESS"]


def _status(ctx: Context, address: str) -> apb.ClusterStatus | None:
    conn = Connection([address], ctx.conn.timeout_s, ctx.conn.security)
    try:
        st: apb.ClusterStatus = conn.call(
            conn.admin.GetClusterStatus, apb.GetClusterStatusRequest(skip_digest=True)
        )
        return st
    except CliError:
        return None
    finally:
        conn.close()


def lags(ctx: Context, nodes: list[apb.NodeSummary]) -> dict[str, int | None]:
    """Node id -> how far its replicas are behind, in entries: the largest (commit index of
    the group's leader - applied index of the node's replica) over the groups it runs, as the
    live nodes say (asked at once). None: not live, or it did not answer."""
    live = [n for n in nodes if n.live and n.grpc_address]
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(live)))) as pool:
        statuses = dict(zip((n.node_id for n in live), pool.map(
            lambda n: _status(ctx, n.grpc_address), live), strict=True))  # fmt: skip
    commits = {
        s.shard_id: s.commit_index
        for st in statuses.values()
        if st is not None
        for s in st.shards
        if s.role == "leader"
    }
    out: dict[str, int | None] = {}
    for node_id, st in statuses.items():
        if st is None:
            continue
        behind = [
            max(0, commits[s.shard_id] - s.applied_index)
            for s in st.shards
            if s.shard_id in commits
        ]
        out[node_id] = max(behind, default=0)
    return out


def list_nodes(args: argparse.Namespace, ctx: Context) -> int:
    resp: apb.ListNodesResponse = ctx.conn.call(ctx.conn.admin.ListNodes, apb.ListNodesRequest())
    behind = lags(ctx, list(resp.nodes))
    if ctx.out.json:
        doc = message_dict(resp)
        for n in doc.get("nodes", []):
            n["lag"] = behind.get(n["node_id"])
        ctx.out.doc(doc)
        return 0
    ctx.out.table(HEADERS, _rows(list(resp.nodes), behind))
    return 0


def drain(args: argparse.Namespace, ctx: Context) -> int:
    summary = ctx.conn.call(
        ctx.conn.admin.DrainNode,
        apb.DrainNodeRequest(node_id=args.node_id, until_restart=args.until_restart),
    )
    return _follow(args, ctx, summary)


def undrain(args: argparse.Namespace, ctx: Context) -> int:
    summary: apb.NodeSummary = ctx.conn.call(
        ctx.conn.admin.UndrainNode, apb.UndrainNodeRequest(node_id=args.node_id)
    )
    if ctx.out.json:
        ctx.out.doc(message_dict(summary))
        return 0
    ctx.out.line(
        f"{summary.node_id}: {summary.state}; placement may give it replicas and leadership "
        "again (`fluxmqctl shard rebalance --dry-run` shows what would move)"
    )
    return 0


def decommission(args: argparse.Namespace, ctx: Context) -> int:
    summary = ctx.conn.call(
        ctx.conn.admin.DecommissionNode, apb.DecommissionNodeRequest(node_id=args.node_id)
    )
    return _follow(args, ctx, summary)


def _hosted(ctx: Context, n: apb.NodeSummary, placed: set[str]) -> list[str]:
    """The placed groups ``n`` still runs a replica of, as it says itself (a replica runs on
    until its group's leader has removed it, whatever the records say)."""
    if not n.live or not n.grpc_address:
        return []
    conn = Connection([n.grpc_address], ctx.conn.timeout_s, ctx.conn.security)
    try:
        st: apb.ClusterStatus = conn.call(
            conn.admin.GetClusterStatus, apb.GetClusterStatusRequest(skip_digest=True)
        )
    except CliError:
        return ["?"]  # cannot tell yet: keep waiting
    finally:
        conn.close()
    return sorted(s.shard_id for s in st.shards if s.shard_id in placed)


def _follow(args: argparse.Namespace, ctx: Context, summary: apb.NodeSummary) -> int:
    """Show progress until nothing placed is left on the node, in the records and on the node
    itself (exit 0), or until ``--wait`` ran out (exit 1)."""
    deadline = time.monotonic() + args.wait_s
    shown = ""
    while True:
        resp: apb.ListNodesResponse = ctx.conn.call(
            ctx.conn.admin.ListNodes, apb.ListNodesRequest()
        )
        summary = next((n for n in resp.nodes if n.node_id == summary.node_id), summary)
        placed = {g for n in resp.nodes for g in n.groups}
        running = [] if args.no_wait else _hosted(ctx, summary, placed)
        done = not summary.groups and summary.state not in ("draining", "leaving") and not running
        line = (
            f"{summary.node_id}: {summary.state if done or args.no_wait else 'draining'}; "
            f"replicas left: {','.join(summary.groups) or 'none'}; still running: "
            f"{','.join(running) or 'none'}; leads: {','.join(summary.leading) or 'none'}"
        )
        if line != shown and not ctx.out.json:
            ctx.out.line(line)
            ctx.out.flush()
            shown = line
        if args.no_wait or done:
            break
        if time.monotonic() >= deadline:
            if ctx.out.json:
                ctx.out.doc(message_dict(summary))
            else:
                ctx.out.line(f"not drained within {args.wait_s} s (it goes on in the background)")
            return 1
        time.sleep(POLL_S)
    if ctx.out.json:
        ctx.out.doc(message_dict(summary))
    return 0


def move(args: argparse.Namespace, ctx: Context) -> int:
    resp: apb.MoveReplicaResponse = ctx.conn.call(
        ctx.conn.admin.MoveReplica,
        apb.MoveReplicaRequest(
            shard_id=args.shard_id, from_node=args.from_node, to_node=args.to_node
        ),
    )
    if ctx.out.json:
        ctx.out.doc(message_dict(resp))
        return 0
    ctx.out.line(
        f"{resp.shard_id}: members now {', '.join(resp.members)} ({args.to_node} on raft port "
        f"{resp.raft_port}); its leader adds {args.to_node}, lets it catch up, then removes "
        f"{args.from_node}: follow with `fluxmqctl cluster status`"
    )
    return 0


def rebalance(args: argparse.Namespace, ctx: Context) -> int:
    resp: apb.RebalanceShardsResponse = ctx.conn.call(
        ctx.conn.admin.RebalanceShards, apb.RebalanceShardsRequest(dry_run=args.dry_run)
    )
    if ctx.out.json:
        ctx.out.doc(message_dict(resp))
        return 0
    if not resp.moves:
        ctx.out.line("replicas are even: nothing to move")
        return 0
    rows = [
        [m.shard_id, m.from_node, m.to_node, "written" if m.written else "planned"]
        for m in resp.moves
    ]
    ctx.out.table(["SHARD", "FROM", "TO", "STATUS"], rows)
    return 0
