"""``fluxmq cluster up|down|status|stop-node|kill-node|start-node|add-node|remove-node``: a
local cluster (etcd + N nodes on loopback) for trying FluxMQ, tests and benchmarks: one node can
be stopped, killed (kill -9) and started again, with its data or on an empty data directory
(``--wipe``: a lost disk); nodes can be added (they join without a home group and placement
gives them replicas) and removed again (decommissioned, then stopped). The work is done by
``fluxmq.devcluster.launcher.LocalCluster``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from fluxmq.devcluster.launcher import ADMIN_KEY_FILE, LauncherError, LocalCluster

DEFAULT_DIR = "./cluster"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fluxmq cluster",
        description="A local FluxMQ cluster on 127.0.0.1: etcd plus N nodes, each with its own "
        "data directory, ports and log under --dir.",
    )
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{up,down,status,stop-node,kill-node,start-node,add-node,remove-node}",
    )

    up = sub.add_parser("up", help="start etcd and the nodes; wait until a leader is elected")
    up.add_argument("--nodes", type=int, default=3, help="number of nodes (default 3)")
    up.add_argument("--dir", default=DEFAULT_DIR, help=f"cluster directory (default {DEFAULT_DIR})")
    up.add_argument(
        "--base-port",
        type=int,
        default=7070,
        help="node i uses base+10*(i-1) for gRPC, +1 for metrics, +2 for Raft (default 7070)",
    )
    up.add_argument(
        "--etcd-port",
        type=int,
        default=2379,
        help="etcd client port, peer port is the next one; 0 = pick free ports (default 2379)",
    )
    up.add_argument(
        "--timeout", type=float, default=60.0, help="longest wait for the cluster, s (default 60)"
    )

    down = sub.add_parser("down", help="stop the nodes, then etcd")
    down.add_argument(
        "--dir", default=DEFAULT_DIR, help=f"cluster directory (default {DEFAULT_DIR})"
    )
    down.add_argument("--purge", action="store_true", help="also delete the data directories")

    status = sub.add_parser("status", help="what runs; exit code 0 only when everything is up")
    status.add_argument(
        "--dir", default=DEFAULT_DIR, help=f"cluster directory (default {DEFAULT_DIR})"
    )
    status.add_argument("--json", action="store_true", help="print the status as JSON")

    for name, what in (
        ("stop-node", "stop node N (SIGTERM: it hands its leadership over first)"),
        ("kill-node", "kill node N with SIGKILL (a crash: nothing is handed over)"),
        ("start-node", "start node N again under its name and ports (restart it if it runs)"),
        (
            "remove-node",
            "take node N (one added with add-node) out for good: decommission it, wait until "
            "its replicas moved, stop it, delete its data",
        ),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument("index", type=int, metavar="N", help="the node's number, 1..nodes")
        p.add_argument(
            "--dir", default=DEFAULT_DIR, help=f"cluster directory (default {DEFAULT_DIR})"
        )
        if name == "start-node":
            p.add_argument(
                "--wipe",
                action="store_true",
                help="delete its data directory first (a lost disk: it rejoins on probation "
                "and is refilled by the leaders)",
            )
    add = sub.add_parser(
        "add-node",
        help="start one more node (next number and ports) that joins without a home group; "
        "the placement controller moves replicas and leadership to it",
    )
    add.add_argument(
        "--dir", default=DEFAULT_DIR, help=f"cluster directory (default {DEFAULT_DIR})"
    )
    return parser


def _node_command(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.dir)
    if cluster.load_state() is None:
        print(f"no cluster in {cluster.dir}: `fluxmq cluster up --dir {args.dir}`", file=sys.stderr)
        return 1
    if args.command == "add-node":
        i = cluster.add_node()
        spec = cluster.specs()[i - 1]
        print(
            f"node{i} serving on {spec.address} (joined without a home group; the placement "
            "controller gives it replicas: `fluxmqctl node list`)"
        )
    elif args.command == "remove-node":
        cluster.remove_node(args.index)
        print(f"node{args.index} decommissioned, its replicas moved, stopped and removed")
    elif args.command == "stop-node":
        cluster.stop_node(args.index)
        print(f"node{args.index} stopped")
    elif args.command == "kill-node":
        cluster.kill9(args.index)
        print(f"node{args.index} killed (SIGKILL)")
    else:
        if args.wipe:
            cluster.kill9(args.index)
            cluster.wipe_node(args.index)
        cluster.restart(args.index)
        print(
            f"node{args.index} serving"
            + (" (started on an empty data directory)" if args.wipe else "")
        )
    return 0


def _up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(
        args.dir, nodes=args.nodes, base_port=args.base_port, etcd_port=args.etcd_port, quiet=False
    )
    state = cluster.up(timeout_s=args.timeout)
    nodes = state["nodes"]
    etcd = state["etcd"]
    leader = _leader(cluster.status())
    print(f"\nFluxMQ cluster of {len(nodes)} nodes up in {cluster.dir}")
    print(f"  etcd     127.0.0.1:{etcd['client_port']}  (pid {etcd['pid']}, log {etcd['log']})")
    for n in nodes:
        print(
            f"  {n['node_id']:<8} gRPC 127.0.0.1:{n['grpc_port']}  metrics :{n['metrics_port']}  "
            f"raft :{n['raft_port']}  (pid {n['pid']})"
        )
    if leader:
        print(f"  shard leader: {leader}")
    first = f"127.0.0.1:{nodes[0]['grpc_port']}"
    key_file = cluster.dir / ADMIN_KEY_FILE
    print(f"\nClients authenticate with API keys. The production admin key is in {key_file}:")
    print(f"  export FLUXMQ_ADDR={first} FLUXMQ_API_KEY=$(cat {key_file})")
    print("  fluxmqctl key create --environment production --role producer --name my-app")
    print(f'  grpcurl -plaintext -H "authorization: Bearer $FLUXMQ_API_KEY" {first} list')
    print(f"Logs: {cluster.dir}/node{{1..{len(nodes)}}}.log and {etcd['log']}")
    print(f"Status: fluxmq cluster status --dir {args.dir}")
    print(f"Stop:   fluxmq cluster down --dir {args.dir} [--purge]")
    return 0


def _leader(status: dict[str, Any]) -> str:
    for n in status["nodes"]:
        for s in n["shards"]:
            if s["leader"]:
                return f"{s['leader']} (shard {s['shard_id']}, term {s['term']})"
    return ""


def _down(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.dir)
    had = cluster.load_state() is not None
    killed = cluster.down(purge=args.purge)
    if had:
        print(f"cluster in {cluster.dir} stopped" + (" and its data deleted" if args.purge else ""))
    else:
        print(
            f"no cluster running in {cluster.dir}"
            + ("; data directories deleted" if args.purge else "")
        )
    if killed:
        print(f"did not stop within 20 s, killed: {', '.join(killed)}", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.dir)
    st = cluster.status()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0 if st["ok"] else 1
    if not st["running"]:
        print(
            f"no cluster in {cluster.dir} (no cluster.json): `fluxmq cluster up --dir {args.dir}`"
        )
        return 1
    nodes = st["nodes"]
    up = sum(1 for n in nodes if n["alive"] and n["health"] == "SERVING")
    print(f"cluster in {st['dir']}: {len(nodes)} nodes, {up} serving (started {st['started_at']})")
    etcd = st["etcd"]
    print(
        f"  etcd     {etcd['endpoint']:<16} pid {etcd['pid']:<8} "
        + ("running" if etcd["alive"] else "NOT RUNNING")
        + (", healthy" if etcd["healthy"] else ", NOT HEALTHY" if etcd["alive"] else "")
    )
    for n in nodes:
        line = (
            f"  {n['name']:<8} {n['address']:<16} pid {n['pid']:<8} "
            f"{'running' if n['alive'] else 'NOT RUNNING'}, {n['health']}"
        )
        if n["node_id"]:
            line += f", node id {n['node_id']}"
        print(line)
        if n["error"]:
            print(f"           GetClusterStatus failed: {n['error']}")
        for s in n["shards"]:
            print(
                f"           shard {s['shard_id']}: {s['role'] or '?'}, "
                f"leader {s['leader'] or 'NONE'}, term {s['term']}, "
                f"commit {s['commit_index']}, applied {s['applied_index']}"
            )
    print("everything up" if st["ok"] else "NOT everything is up")
    return 0 if st["ok"] else 1


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        if args.command == "up":
            return _up(args)
        if args.command == "down":
            return _down(args)
        if args.command == "status":
            return _status(args)
        return _node_command(args)
    except LauncherError as err:
        print(f"fluxmq cluster {args.command}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
