"""CPU per message, per process and per thread: ``python -m bench.threads``.

A fresh 3-node cluster on loopback; one-message publishes through the SDK at each concurrency
(c=1 and c=16 by default) for ``--duration`` seconds each. Around each run every thread of every
node (``/proc/<pid>/task/*/stat``) and of this client process is sampled; the table gives
microseconds of CPU per acknowledged message for each (process role, thread name) and per
process, and the rounds per second the leader's driver ran.

Threads are told apart by their OS names (raft/os_thread.py names the Raft driver, the apply
and the journal threads; the event loop is the process's main thread, ``fluxmq``/``python``;
gRPC names its own). Bounded: each run stops at its duration or ``--messages-max``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench.cluster import FluxCluster
from bench.fluxmq_driver import descendants
from bench.peers import workloads
from bench.peers.fluxmq import FluxAdapter
from bench.results_md import write_section

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# (pid, tid) -> (thread name, user CPU seconds, system CPU seconds)
Sample = dict[tuple[int, int], tuple[str, float, float]]


def thread_cpu(pid: int) -> dict[int, tuple[str, float, float]]:
    """tid -> (OS thread name, user CPU s, system CPU s) for every live thread of ``pid``."""
    out: dict[int, tuple[str, float, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue  # the thread ended between listing and reading
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        out[int(tid)] = (name, int(fields[11]) / TICKS_PER_S, int(fields[12]) / TICKS_PER_S)
    return out


def sample(pids: dict[int, str]) -> Sample:
    return {(pid, tid): value for pid in pids for tid, value in thread_cpu(pid).items()}


def per_thread(
    before: Sample, after: Sample, roles: dict[int, str]
) -> dict[tuple[str, str], tuple[float, float]]:
    """(process role, thread name) -> (user, system) CPU seconds between the samples. Threads
    that started in between count from zero; those that ended are lost (none should, under
    steady load)."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for (pid, tid), (name, user_s, sys_s) in after.items():
        _, user_before_s, sys_before_s = before.get((pid, tid), (name, 0.0, 0.0))
        user, system = user_s - user_before_s, sys_s - sys_before_s
        if user + system > 0:
            u, s = out.get((roles[pid], name), (0.0, 0.0))
            out[(roles[pid], name)] = (u + user, s + system)
    return out


async def measure(
    cluster: FluxCluster, concurrency: int, duration_s: float, messages_max: int
) -> dict[str, object]:
    leader = await cluster.wait_leader()
    roles: dict[int, str] = {}
    followers = 0
    for node in cluster.nodes:
        assert node.proc is not None
        if node is leader:
            role = "leader"
        else:
            followers += 1
            role = f"follower {followers}"
        roles[node.proc.pid] = role
        for child in descendants(node.proc.pid):  # its shard process (shard_processes = 1)
            roles[child] = f"{role} shards"
    roles[os.getpid()] = "client"
    adapter = FluxAdapter(leader.address, len(cluster.nodes), [], sdk=True)
    await adapter.connect()
    try:
        queue = f"threads-c{concurrency}-{int(time.time() * 1000)}"
        await adapter.create_queue(queue, ["g"])
        await adapter.publish(queue, [b"warm"] * 16)
        before = sample(roles)
        result = await workloads.publish(
            adapter,
            queue,
            size=256,
            batch=1,
            concurrency=concurrency,
            duration_s=duration_s,
            messages_max=messages_max,
        )
        after = sample(roles)
    finally:
        await adapter.close()
    spent = per_thread(before, after, roles)
    messages = max(1, result.messages)
    return {
        "concurrency": concurrency,
        "messages": result.messages,
        "rate": result.rate,
        "p50_ms": result.percentile(0.5),
        "us_per_message": {
            f"{r}|{t}": 1e6 * (u + s) / messages for (r, t), (u, s) in sorted(spent.items())
        },
        "system_us_per_message": {
            f"{r}|{t}": 1e6 * s / messages for (r, t), (_u, s) in sorted(spent.items())
        },
    }


def markdown(label: str, runs: list[dict[str, object]]) -> str:
    rows: dict[str, dict[int, float]] = defaultdict(dict)
    kernel: dict[str, dict[int, float]] = defaultdict(dict)
    processes: dict[str, dict[int, float]] = defaultdict(dict)
    for run in runs:
        c = int(str(run["concurrency"]))
        per, system = run["us_per_message"], run["system_us_per_message"]
        assert isinstance(per, dict) and isinstance(system, dict)
        for key, us in per.items():
            role, _thread = key.split("|", 1)
            rows[key][c] = us
            kernel[key][c] = system[key]
            processes[role][c] = processes[role].get(c, 0.0) + us
    cs = [int(str(r["concurrency"])) for r in runs]
    head = "| process | thread | " + " | ".join(f"c={c} us/msg" for c in cs) + " |"
    lines = [
        f"### CPU per message by thread, 3 nodes, one 256 B message per publish ({label})",
        "",
        head,
        "|---|---|" + "---:|" * len(cs),
    ]
    for key in sorted(rows, key=lambda k: (k.split("|")[0], -max(rows[k].values()))):
        role, thread = key.split("|", 1)
        if max(rows[key].values()) < 1.0:
            continue  # threads that did (almost) nothing: named in the JSON only
        lines.append(
            f"| {role} | {thread} | "
            + " | ".join(f"{rows[key].get(c, 0.0):.1f} ({kernel[key].get(c, 0.0):.0f})" for c in cs)
            + " |"
        )
    for role in sorted(processes):
        lines.append(
            f"| **{role}** | **all threads** | "
            + " | ".join(f"**{processes[role].get(c, 0.0):.1f}**" for c in cs)
            + " |"
        )
    lines.append(
        "| | rate msg/s, client p50 ms | "
        + " | ".join(f"{float(str(r['rate'])):.0f}, {float(str(r['p50_ms'])):.2f}" for r in runs)
        + " |"
    )
    lines += [
        "",
        "CPU from /proc/<pid>/task/*/stat (10 ms ticks) around each run, divided by the messages "
        "acknowledged in it; in brackets the part spent in the kernel (system time: fsyncs, "
        "sockets, polls). Threads under 1 us/msg are left out of the table.",
    ]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="fluxmq-threads-") as tmp:
        cluster = FluxCluster(Path(tmp), 3)
        cluster.start()
        try:
            runs = []
            for c in args.concurrency:
                runs.append(await measure(cluster, c, args.duration, args.messages_max))
            return runs
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.threads", description=__doc__)
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16]
    )
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--messages-max", type=int, default=200_000)
    parser.add_argument("--label", default="now")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    runs = asyncio.run(main_async(args))
    text = markdown(args.label, runs)
    print(text)
    if args.out:
        args.out.write_text(json.dumps(runs, indent=1))
    if args.write_results:
        write_section(f"threads-{args.label}", text)


if __name__ == "__main__":
    main()
