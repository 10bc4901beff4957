"""Audit benchmark (issue 7): ``fluxmq-audit`` over N records of 256 bytes x 3 replicas.

For each size N of ``--sizes`` (default 1M, 3M, 10M):

- data: one store written by the broker's own state machine (``QueueStateMachine`` over
  ``LmdbStore``, fed Append / CreateGroup / Lease / Ack commands the way a shard applies them),
  so the format is exactly the broker's: one work queue of 4 partitions; N messages of 256-byte
  values in publishes of 1,000, each with one of 1,000 keys; every other publish goes through a
  producer session to one partition, and in the others every 10th message has an idempotency key;
  a shared group that leased and acked the first 10% and holds 1,000 more leased. The store is
  then copied to the data directories ``n1``, ``n2``, ``n3`` of one replication group
  (``MODE`` = ``cluster g-bench``). Generated once per N under ``--data-root`` and reused.
- audit: ``python -m fluxmq.audit --master local[2] --data-dir n1 --data-dir n2 --data-dir n3``
  as a subprocess, timed wall clock from start to exit (JVM start included). It must exit 0
  with a clean report; the per-rule seconds come from its ``summary.json`` and the read phase
  (decoding every record into the cached table) from its progress lines.

records/s = 3N / wall. Linearity: wall(N) / wall(smallest N) next to N / smallest N. The goal:
10M x 3 in under 10 minutes.

    python -m bench.audit [--sizes 1000000,3000000,10000000] [--write-results]
    python -m bench.audit --sizes 100000    # a quick smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.results_md import write_section
from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import commands
from fluxmq.core.commands.results import AppendResult, LeaseResult, SettleResult
from fluxmq.core.partitioner import prepare_append
from fluxmq.core.producers import ProducerGrant
from fluxmq.core.queue_config import normalize_new, policy_of
from fluxmq.core.state_machine import QueueStateMachine
from raft.api import Entry
from storage import LmdbStore

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# The code a run measures: a result is tied to these files' digest, and a run fails if they
# change while it runs (the audit's worker processes would import a mix of versions).
AUDIT_SOURCES = (
    "fluxmq/audit/*.py",
    "storage/lmdb_inspect.py",
    "storage/codec.py",
    "storage/records.py",
    "storage/record_batch.py",
)
# bench/results is tracked by git, so the generated stores (GBs) live outside the repository.
DATA_ROOT_DEFAULT = Path(tempfile.gettempdir()) / "fluxmq-bench-audit"
SIZES_DEFAULT = "1000000,3000000,10000000"

# Bump when the generated data changes: cached data of another format is rebuilt. 2: record
# batches (one stored batch per partition per Append command), format-1 stores are refused.
# 3: every other publish goes through a producer session (the SDK's way), to one partition.
FORMAT = 3
REPLICAS = ("n1", "n2", "n3")
REPLICATION_GROUP = "g-bench"
QUEUE = "audit-bench"
GROUP = "workers"
PARTITIONS = 4
VALUE_BYTES = 256
KEYS = 1000
PUBLISH_BATCH = 1000  # messages per Append command (the publish limit)
COMMANDS_PER_APPLY = 10  # Append commands per apply_batch (one LMDB transaction)
IDEMPOTENCY_EVERY = 10  # every 10th message carries an idempotency key
ACKED_FRACTION = 0.1  # leased and acked by the group
LEASED_OPEN = 1000  # leased after that and left leased
LEASE_BATCH = 1000
LEASE_MS = 3_600_000
T0 = 1_700_000_000_000
MASTER = "local[2]"
GOAL_S = 600.0


class Feeder:
    """Feeds commands with consecutive indexes to a state machine, like a shard would."""

    def __init__(self, sm: QueueStateMachine) -> None:
        self.sm = sm
        self.index = sm.last_applied_index()

    def apply(self, cmds: list[Any]) -> list[object]:
        entries = []
        for cmd in cmds:
            self.index += 1
            entries.append(Entry(self.index, commands.encode(cmd)))
        return self.sm.apply_batch(entries)

    def one(self, cmd: Any) -> object:
        return self.apply([cmd])[0]


def publish_all(f: Feeder, q: pb.Queue, n: int) -> int:
    """Append ``n`` messages; returns the last command's time (ms). One ms per publish: the
    even ones keyed over all partitions with idempotency keys, the odd ones through one producer
    session, each to the next partition in turn (as the SDK sends)."""
    policy = policy_of(q.config)
    value = os.urandom(VALUE_BYTES - 8)
    grant = f.one(cpb.InitProducerCmd(queue=q.config.name, queue_id=q.queue_id, now_ms=T0))
    if not isinstance(grant, ProducerGrant):
        raise RuntimeError(f"InitProducer refused: {grant!r}")
    sequences = [0] * PARTITIONS
    now, cursor, done, pending = T0, 0, 0, []
    for round_ in range(-(-n // PUBLISH_BATCH)):  # bounded: one round per publish
        msgs = []
        session = round_ % 2 == 1
        partition = (round_ // 2) % PARTITIONS
        for i in range(done, min(n, done + PUBLISH_BATCH)):
            msg = pb.PublishMessage(value=value + i.to_bytes(8, "big"), key=b"k%04d" % (i % KEYS))
            if session:
                msg.partition = partition
            elif i % IDEMPOTENCY_EVERY == 0:
                msg.idempotency_key = f"m-{i}"
            msgs.append(msg)
        done += len(msgs)
        now += 1
        producer = None
        if session:
            producer = pb.ProducerSession(
                producer_id=grant.producer_id,
                producer_epoch=grant.producer_epoch,
                first_sequence=sequences[partition],
            )
            sequences[partition] += len(msgs)
        prepared = prepare_append(q.config.name, q.queue_id, policy, msgs, cursor, now, producer)
        cursor = prepared.cursor
        pending.append(prepared.command)
        if len(pending) == COMMANDS_PER_APPLY or done == n:
            for res in f.apply(pending):
                if not isinstance(res, AppendResult):
                    raise RuntimeError(f"append refused: {res!r}")
            pending = []
    return now


def lease(f: Feeder, q: pb.Queue, count: int, now: int) -> list[pb.Receipt]:
    res = f.one(
        cpb.LeaseCmd(
            queue=q.config.name,
            queue_id=q.queue_id,
            group=GROUP,
            consumer_id="bench",
            max_messages=count,
            lease_ms=LEASE_MS,
            now_ms=now,
        )
    )
    if not isinstance(res, LeaseResult) or len(res.deliveries) != count:
        raise RuntimeError(f"lease of {count} got {res!r}")
    return [
        pb.Receipt(
            partition=d.partition,
            offset=d.record.offset,
            attempt=d.attempt,
            lease_deadline_ms=d.deadline_ms,
            lease_id=d.lease_id,
            group_id=res.group_id,
        )
        for d in res.deliveries
    ]


def consume(f: Feeder, q: pb.Queue, n: int, now: int) -> tuple[int, int]:
    """The group leases and acks the first ACKED_FRACTION of ``n``, then leases LEASED_OPEN
    more and keeps them. -> (acked, leased)."""
    to_ack = int(n * ACKED_FRACTION)
    acked = 0
    for _ in range(-(-to_ack // LEASE_BATCH)):  # bounded
        receipts = lease(f, q, min(LEASE_BATCH, to_ack - acked), now)
        res = f.one(
            cpb.AckCmd(
                queue=q.config.name,
                queue_id=q.queue_id,
                group=GROUP,
                receipts=receipts,
                now_ms=now,
            )
        )
        if not isinstance(res, SettleResult) or set(res.statuses) != {pb.RECEIPT_STATUS_ACKED}:
            raise RuntimeError(f"ack refused: {res!r}")
        acked += len(receipts)
    leased = min(LEASED_OPEN, n - acked)
    if leased:
        lease(f, q, leased, now)
    return acked, leased


def build_store(path: Path, n: int) -> dict[str, Any]:
    """One replica's store, written by the state machine (no fsync: data is complete on disk
    once the store is closed, which is all the audit needs)."""
    path.mkdir(parents=True)
    store = LmdbStore(str(path), sync=False)
    try:
        f = Feeder(QueueStateMachine(store))
        cfg = normalize_new(
            pb.QueueConfig(name=QUEUE, partitions=PARTITIONS, type=pb.QUEUE_TYPE_WORK)
        )
        q = f.one(cpb.CreateQueueCmd(config=cfg, now_ms=T0))
        if not isinstance(q, pb.Queue):
            raise RuntimeError(f"create queue refused: {q!r}")
        g = f.one(cpb.CreateGroupCmd(queue=QUEUE, queue_id=q.queue_id, group=GROUP, now_ms=T0))
        if not isinstance(g, pb.Group):
            raise RuntimeError(f"create group refused: {g!r}")
        now = publish_all(f, q, n)
        acked, leased = consume(f, q, n, now + 1)
    finally:
        store.close()
    return {"acked": acked, "leased": leased, "commands": f.index}


def generate(root: Path, n: int) -> dict[str, Any]:
    """The three replica directories of size ``n`` under ``root``, built unless a complete
    build of the same format is there (``meta.json`` is written last)."""
    meta_path = root / "meta.json"
    if meta_path.exists():
        meta: dict[str, Any] = json.loads(meta_path.read_text())
        if meta.get("format") == FORMAT and meta.get("records") == n:
            meta["reused"] = True
            return meta
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    t0 = time.monotonic()
    first = root / REPLICAS[0]
    counts = build_store(first, n)
    built_s = time.monotonic() - t0
    (first / "lock.mdb").unlink(missing_ok=True)
    # Replicas of one group apply the same commands to the same state machine, so their stores
    # hold the same records, group rows and catalog, byte for byte in content: copying one
    # store is an honest stand-in for three nodes that replicated it (and far faster to make).
    for name in REPLICAS:
        d = root / name
        d.mkdir(exist_ok=True)
        if d != first:
            shutil.copyfile(first / "data.mdb", d / "data.mdb")
        (d / "MODE").write_text(f"cluster {REPLICATION_GROUP}\n")
    meta = {
        "format": FORMAT,
        "records": n,
        "store_bytes": (first / "data.mdb").stat().st_size,
        "build_s": round(built_s, 1),
        "copy_s": round(time.monotonic() - t0 - built_s, 1),
        **counts,
    }
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    # The store was written without fsync: flush it now, or the kernel writes GBs back while
    # the audit runs and throttles the audit's own writes (its shuffle files).
    os.sync()
    meta["reused"] = False
    return meta


def sources_digest() -> str:
    h = hashlib.sha256()
    for pattern in AUDIT_SOURCES:
        for path in sorted(REPO.glob(pattern)):
            h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


READ_LINE = re.compile(r"\] read ([\d,]+) records.*\(([\d.]+) s\)")
CHECK_LINE = re.compile(r"\] checked \d+ stores: \d+ readable \(([\d.]+) s\)")


def run_audit(root: Path, timeout_s: float) -> dict[str, Any]:
    """One audit of the replicas under ``root``; RuntimeError unless it exits 0, clean."""
    out = root / "report"
    cmd = [
        sys.executable,
        "-m",
        "fluxmq.audit",
        "--master",
        MASTER,
        *[a for name in REPLICAS for a in ("--data-dir", str(root / name))],
        "--out",
        str(out),
        "--overwrite",
    ]
    # Not -q: the progress lines (a handful, on stderr) say how long the read phase took.
    digest = sources_digest()
    load_before = os.getloadavg()[0]  # anything else running would show here
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    wall = time.monotonic() - t0
    if sources_digest() != digest:
        raise RuntimeError("the audit's sources changed during the run: measure again")
    summary_path = out / "summary.json"
    if proc.returncode != 0 or not summary_path.exists():
        raise RuntimeError(
            f"the audit exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}"
        )
    summary = json.loads(summary_path.read_text())
    if not summary["clean"] or summary["violations"]:
        raise RuntimeError(f"the audit is not clean: {summary['failed_rules']}")
    read = READ_LINE.search(proc.stderr)
    check = CHECK_LINE.search(proc.stderr)
    return {
        "wall_s": round(wall, 2),
        "job_s": summary["seconds"],
        "read_s": float(read.group(2)) if read else None,  # the store check included
        "check_s": float(check.group(1)) if check else None,
        "records_read": summary["records"],
        "logs": summary["logs"],
        "group_partitions": summary["group_partitions"],
        "rules_s": {r["name"]: r["seconds"] for r in summary["rules"]},
        "spark": summary["spark"],
        "sources": digest,
        "load_1min_before": round(load_before, 2),
    }


def markdown(runs: list[dict[str, Any]], info: dict[str, str]) -> str:
    base = runs[0]
    largest = runs[-1]
    lines = [
        "## Audit (issue 7)",
        "",
        f"`python -m bench.audit` ({time.strftime('%Y-%m-%d %H:%M')}): `fluxmq-audit --master "
        f"'{MASTER}'` over 3 replica data directories of one work queue ({PARTITIONS} "
        f"partitions, {VALUE_BYTES}-byte values, {KEYS:,} keys; every other publish of "
        f"{PUBLISH_BATCH:,} through a producer session, in the others every "
        f"{IDEMPOTENCY_EVERY}th message with an idempotency key; a group that acked the first "
        f"{ACKED_FRACTION:.0%}), written by the broker's state machine. Wall time is the "
        "subprocess from start to exit (JVM start included); the audit came out clean every "
        f"time. Machine: {info['cpus']} cores, Python {info['python']}, Spark "
        f"{base['spark'].get('version', '?')}"
        + (
            f"; audit sources {base['sources']} (sha256 of {', '.join(AUDIT_SOURCES)})."
            if base.get("sources")
            else "."
        ),
        "",
        "| records | replicas | records read | wall s | records/s | wall / first | size / first |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r['records']:,} | {len(REPLICAS)} | {r['records_read']:,} | {r['wall_s']:.1f} "
            f"| {r['records_per_s']:,.0f} | {r['wall_s'] / base['wall_s']:.2f} "
            f"| {r['records'] / base['records']:.2f} |"
        )
    if len(runs) >= 2:
        a, b = linear_fit([r["records"] / 1e6 for r in runs], [r["wall_s"] for r in runs])
        worst = max(abs(r["wall_s"] - (a + b * r["records"] / 1e6)) / r["wall_s"] for r in runs)
        lines += [
            "",
            f"Least-squares line: wall = {a:.1f} s + {b:.1f} s per million records (x "
            f"{len(REPLICAS)} replicas), {1e6 * len(REPLICAS) / b:,.0f} records/s at the margin; "
            f"the runs are within {worst:.0%} of it. The constant is the JVM, Spark session and "
            "Python workers starting, and the per-job overhead of the rules.",
        ]
    lines += [
        "",
        f"Where the time goes at {largest['records']:,} records x {len(REPLICAS)} "
        f"(wall {largest['wall_s']:.1f} s):",
        "",
        "| phase | seconds | share of wall |",
        "|---|---:|---:|",
    ]
    phases: list[tuple[str, float]] = []
    rules_total = sum(largest["rules_s"].values())
    check_s = largest.get("check_s") or 0.0
    if check_s:
        phases.append(("store check (each store read to its end in a child process)", check_s))
    if largest["read_s"] is not None:
        read = "Spark start + read (decode every record, cache the tables)"
        phases.append((read, largest["read_s"] - check_s))
    phases += [(f"rule {name}", s) for name, s in largest["rules_s"].items()]
    rest = largest["wall_s"] - rules_total - (largest["read_s"] or 0.0)
    phases.append(("other (process start, group totals, report, exit)", rest))
    for name, s in phases:
        lines.append(f"| {name} | {s:.1f} | {s / largest['wall_s']:.0%} |")
    ten_m = [r for r in runs if r["records"] == 10_000_000]
    if ten_m:
        w = ten_m[0]["wall_s"]
        met = "met" if w < GOAL_S else "NOT met"
        lines += ["", f"- 10M x 3 replicas: {w:.0f} s (goal < {GOAL_S:.0f} s: {met})"]
    return "\n".join(lines) + "\n"


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x -> (a, b)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


def write_results(md: str) -> None:
    write_section("audit", md)


def parse_sizes(text: str) -> list[int]:
    sizes = sorted({int(s.replace("_", "")) for s in text.split(",") if s.strip()})
    if not sizes or sizes[0] < PUBLISH_BATCH:
        raise argparse.ArgumentTypeError(f"sizes are record counts >= {PUBLISH_BATCH}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.audit", description=__doc__)
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes(SIZES_DEFAULT))
    ap.add_argument(
        "--data-root",
        default=str(DATA_ROOT_DEFAULT),
        help="generated stores, one directory per size, reused when present",
    )
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per audit run")
    ap.add_argument("--out", default=str(HERE / "results" / "audit.json"))
    ap.add_argument("--write-results", action="store_true", help="update bench/RESULTS.md")
    args = ap.parse_args(argv)
    info = {"cpus": str(os.cpu_count()), "python": platform.python_version()}
    runs: list[dict[str, Any]] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for n in args.sizes:
        root = Path(args.data_root) / str(n)
        data = generate(root, n)
        print(
            f"{n:,} records: data {'reused' if data['reused'] else 'generated'} in {root} "
            f"({data['store_bytes'] / 1e9:.2f} GB per replica, built in {data['build_s']} s)",
            flush=True,
        )
        res = run_audit(root, args.timeout)
        if res["records_read"] != n * len(REPLICAS):
            raise RuntimeError(f"the audit read {res['records_read']:,}, not {n * 3:,} records")
        res = {
            "records": n,
            "replicas": len(REPLICAS),
            **res,
            "records_per_s": round(n * len(REPLICAS) / res["wall_s"]),
            "data": data,
        }
        runs.append(res)
        print(
            f"{n:,} x {len(REPLICAS)}: wall {res['wall_s']:.1f} s, "
            f"{res['records_per_s']:,} records/s, read {res['read_s']} s, "
            f"rules {json.dumps(res['rules_s'])}",
            flush=True,
        )
        # Written after every size: a later size that fails leaves the earlier ones on record.
        out.write_text(
            json.dumps({"machine": info, "master": MASTER, "runs": runs}, indent=2) + "\n"
        )
    if len({r["sources"] for r in runs}) > 1:
        raise RuntimeError("the audit's sources changed between sizes: measure again")
    md = markdown(runs, info)
    print()
    print(md)
    if args.write_results:
        write_results(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
