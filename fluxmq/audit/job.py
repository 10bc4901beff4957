"""The audit and export jobs: Spark session, tables, rules, report.

Both run wherever Spark runs. Alone (``fluxmq-audit``), the job starts its own session on
``local[*]`` unless ``--master`` says otherwise; under ``spark-submit`` it joins the session
spark-submit made (its master, its memory settings).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from fluxmq.audit import report, rules, store_check, tables
from fluxmq.audit.layout import AuditUsageError, StoreRef, discover

ARCHIVE_MANIFEST = "manifest.json"
ARCHIVE_FORMAT = "fluxmq-audit-archive"
# 2: the records table has the producer and dead-letter index columns, logs the applied index
ARCHIVE_VERSION = 2

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SparkSettings:
    master: str | None = None  # None: spark-submit's, else local[*]
    shuffle_partitions: int = 8
    driver_memory: str = "4g"
    split_records: int = 1_000_000
    # --conf KEY=VALUE, in the order given: applied last, so each wins over everything else.
    conf: tuple[tuple[str, str], ...] = ()


def under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


def session_conf(settings: SparkSettings, submitted: dict[str, str] | None) -> dict[str, str]:
    """What the audit sets on the session it gets. ``submitted``: the settings spark-submit was
    given (its flags, --conf and spark-defaults.conf), None when the audit starts its own.

    The builder's settings replace spark-submit's (the context is made from both, the builder's
    last), so under spark-submit the audit's defaults only fill what spark-submit was not told:
    its UI stays as spark-submit has it (Spark's default: on). Its own session has no UI unless
    --conf spark.ui.enabled=true. --conf KEY=VALUE always applies.
    """
    conf = {
        "spark.app.name": "fluxmq-audit",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.sql.adaptive.enabled": "true",
    }
    if submitted is None:
        conf["spark.master"] = settings.master or "local[*]"
        conf["spark.driver.memory"] = settings.driver_memory
    else:
        del conf["spark.ui.enabled"]
        conf = {k: v for k, v in conf.items() if k not in submitted}
        if settings.master:
            conf["spark.master"] = settings.master
    conf.update(settings.conf)
    return conf


def session(settings: SparkSettings) -> Any:
    """The SparkSession, with the FluxMQ data source registered."""
    # Workers must run this interpreter: it is the one with fluxmq, lmdb and pyarrow (or, under
    # spark-submit --py-files, the one spark-submit runs, with the archive on its path).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    from fluxmq.audit.source import FluxDataSource

    submitted = None
    if under_spark_submit():
        # Without the gateway SparkConf() is an empty dict, not what spark-submit was told.
        SparkContext._ensure_initialized()
        submitted = dict(SparkConf().getAll())
        if submitted.get("spark.app.name") == os.path.basename(sys.argv[0]):
            # spark-submit's name when not told --name (the job file's) is no choice to keep.
            del submitted["spark.app.name"]
    conf = session_conf(settings, submitted)
    if submitted is None and conf["spark.master"].startswith("local"):
        # Local only: on a cluster the executors must reach the driver at a routable address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(FluxDataSource)
    return spark


def _read(
    spark: Any,
    paths: list[str],
    table: str,
    columns: list[str],
    split: int,
    exclude: Collection[str] = (),
) -> Any:
    types = dict(tables.TABLES[table])
    ddl = tables.spark_ddl([(c, types[c]) for c in columns])
    return (
        spark.read.format("fluxmq")
        .schema(ddl)
        .option("paths", json.dumps(paths))
        .option("exclude", json.dumps(sorted(exclude)))
        .option("table", table)
        .option("split_records", str(split))
        .load()
    )


class NoStoreReadable(Exception):
    """Not one of the stores could be read (exit code 3); the message names each and why."""


@dataclass(frozen=True)
class CheckedStores:
    readable: list[StoreRef]
    unreadable: list[dict[str, str]]  # node, replication_group, path, reason


def check_stores(stores: list[StoreRef], progress: Progress) -> CheckedStores:
    """Every store checked in a child process (``store_check``) before Spark reads any: a
    usage error for a store of record format 1, the others sorted into readable and not."""
    started = time.monotonic()
    progress(f"checking {len(stores)} stores (each in a process of its own)")
    verdicts = store_check.check_stores([s.path for s in stores])
    old = [v for v in verdicts if v.old_format]
    if old:
        raise AuditUsageError(f"--data-dir {old[0].path!r}: {old[0].reason}")
    unreadable = []
    for store, verdict in zip(stores, verdicts, strict=True):
        if not verdict.ok:
            unreadable.append(_unreadable(store, verdict.reason))
            progress(f"store {store.node} {store.path}: UNREADABLE: {verdict.reason}")
    readable = [s for s, v in zip(stores, verdicts, strict=True) if v.ok]
    progress(
        f"checked {len(stores)} stores: {len(readable)} readable "
        f"({time.monotonic() - started:.1f} s)"
    )
    return CheckedStores(readable, unreadable)


def _unreadable(store: StoreRef, reason: str) -> dict[str, str]:
    return {
        "node": store.node,
        "replication_group": store.replication_group,
        "path": store.path,
        "reason": reason,
    }


def _none_readable(unreadable: list[dict[str, str]]) -> NoStoreReadable:
    return NoStoreReadable(
        "no store could be read: "
        + "; ".join(f"{u['node']} {u['path']}: {u['reason']}" for u in unreadable)
    )


SPARK_ERROR_CHARS_MAX = 400


def _first_line(err: BaseException) -> str:
    """What a Spark failure says happened, in a line (its JVM stack trace is not for an
    operator): a Python worker that crashed, else the Python exception, else the first line."""
    text = str(err)
    if "Python worker exited unexpectedly" in text:
        return "its Python worker crashed (killed by a signal, or LMDB aborted it)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "Error:" in line or "Exception:" in line:
            return line.rsplit("Exception: ", 1)[-1][:SPARK_ERROR_CHARS_MAX]
    return (lines[0] if lines else type(err).__name__)[:SPARK_ERROR_CHARS_MAX]


def read_manifest(archive: str) -> dict[str, Any]:
    path = os.path.join(archive, ARCHIVE_MANIFEST)
    if not os.path.isdir(archive):
        raise AuditUsageError(f"--archive {archive!r}: no such directory")
    try:
        with open(path) as f:
            manifest: dict[str, Any] = json.load(f)
    except (OSError, ValueError) as err:
        raise AuditUsageError(
            f"--archive {archive!r} is not a FluxMQ audit archive (no readable "
            f"{ARCHIVE_MANIFEST}: {err}); make one with `fluxmq-audit export`"
        ) from None
    if manifest.get("format") != ARCHIVE_FORMAT or manifest.get("version") != ARCHIVE_VERSION:
        raise AuditUsageError(
            f"--archive {archive!r}: {ARCHIVE_MANIFEST} is not a version {ARCHIVE_VERSION} "
            f"{ARCHIVE_FORMAT} (an older fluxmq-audit wrote it: export the data directories "
            "again with this one)"
        )
    return manifest


def check_out(out: str, overwrite: bool) -> None:
    """A usage error for an --out that is in the way, before any store is checked or read."""
    in_the_way = os.path.exists(out) and (not os.path.isdir(out) or bool(os.listdir(out)))
    if in_the_way and not overwrite:
        raise AuditUsageError(f"--out {out!r} exists and is not empty (add --overwrite)")


def prepare_out(out: str, overwrite: bool) -> None:
    check_out(out, overwrite)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        shutil.rmtree(out) if os.path.isdir(out) else os.remove(out)
    os.makedirs(out, exist_ok=True)


def _store_rows(stores: list[StoreRef]) -> list[dict[str, str]]:
    return [
        {"node": s.node, "replication_group": s.replication_group, "path": s.path} for s in stores
    ]


def export(
    data_dirs: list[str], out: str, settings: SparkSettings, progress: Progress, overwrite: bool
) -> dict[str, Any]:
    """Write the three tables of ``data_dirs`` as Parquet under ``out`` (an archive the audit
    reads with ``--archive``)."""
    stores = discover(data_dirs)
    check_out(out, overwrite)
    checked = check_stores(stores, progress)
    if not checked.readable:
        raise _none_readable(checked.unreadable)
    exclude = {u["path"] for u in checked.unreadable}
    prepare_out(out, overwrite)
    spark = session(settings)
    counts: dict[str, int] = {}
    started = time.monotonic()
    for table, columns in tables.TABLES.items():
        t0 = time.monotonic()
        df = _read(
            spark, data_dirs, table, [c for c, _ in columns], settings.split_records, exclude
        )
        df.write.parquet(os.path.join(out, table))
        counts[table] = spark.read.parquet(os.path.join(out, table)).count()
        progress(f"exported {table}: {counts[table]:,} rows ({time.monotonic() - t0:.1f} s)")
    manifest = {
        "format": ARCHIVE_FORMAT,
        "version": ARCHIVE_VERSION,
        "created_ms": int(time.time() * 1000),
        "stores": _store_rows(checked.readable),
        # Left out, and why: an audit of the archive reports them under store_readable.
        "unreadable": checked.unreadable,
        "rows": counts,
        "seconds": round(time.monotonic() - started, 3),
    }
    with open(os.path.join(out, ARCHIVE_MANIFEST), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    return manifest


def audit(
    out: str,
    settings: SparkSettings,
    progress: Progress,
    *,
    data_dirs: list[str] | None = None,
    archive: str | None = None,
    sample_rows: int = report.SAMPLE_ROWS_DEFAULT,
    overwrite: bool = False,
) -> report.Summary:
    """Run every rule and write the report under ``out``; the summary says whether it is
    clean. Stores that cannot be read are findings of ``store_readable`` (the audit goes on
    with the others); with none readable the report holds only those (``stores_read`` 0)."""
    if (data_dirs is None) == (archive is None):
        raise AuditUsageError("give --data-dir (one or more) or --archive, not both")
    started = time.monotonic()
    if archive is not None:
        manifest = read_manifest(archive)
        inputs: list[dict[str, str]] = list(manifest["stores"])
        unreadable: list[dict[str, str]] = list(manifest.get("unreadable", []))
        readable_count = len(inputs)
    else:
        assert data_dirs is not None
        stores = discover(data_dirs)
        check_out(out, overwrite)
        checked = check_stores(stores, progress)
        inputs = _store_rows(stores)
        unreadable = list(checked.unreadable)
        readable_count = len(checked.readable)
    prepare_out(out, overwrite)
    if readable_count == 0:
        return _write_unread(out, inputs, unreadable, archive is not None, started, progress)
    spark = session(settings)
    from pyspark import StorageLevel

    if archive is not None:
        columns = list(tables.AUDIT_RECORD_COLUMNS)
        records = spark.read.parquet(os.path.join(archive, "records")).select(*columns)
        logs = spark.read.parquet(os.path.join(archive, "logs"))
        groups = spark.read.parquet(os.path.join(archive, "groups"))
        progress(f"reading {len(inputs)} stores (archive)")
        records = records.persist(StorageLevel.MEMORY_AND_DISK)
        logs, groups = logs.cache(), groups.cache()
        counts = (records.count(), logs.count(), groups.count())
    else:
        assert data_dirs is not None
        progress(f"reading {readable_count} stores (data dirs)")
        read = _read_stores(spark, settings, data_dirs, stores, unreadable, progress)
        if read is None:
            return _write_unread(out, inputs, unreadable, False, started, progress)
        records, logs, groups, counts = read
    n_records, n_logs, n_groups = counts
    progress(
        f"read {n_records:,} records, {n_logs:,} logs, {n_groups:,} group partitions "
        f"({time.monotonic() - started:.1f} s)"
    )
    results = [_store_result(out, unreadable, sample_rows)]
    t = rules.Tables(records, logs, groups)
    for i, rule in enumerate(rules.RULES, 1):
        t0 = time.monotonic()
        violations = rule.check(t).persist(StorageLevel.MEMORY_AND_DISK)
        count = violations.count()
        sample = [
            r.asDict()
            for r in violations.orderBy("node", "queue", "partition", "offset")
            .limit(sample_rows)
            .collect()
        ]
        violations.write.parquet(os.path.join(out, "violations", rule.name))
        violations.unpersist()
        seconds = time.monotonic() - t0
        results.append(report.RuleResult(rule.name, rule.title, count, round(seconds, 3), sample))
        progress(
            f"[{i}/{len(rules.RULES)}] {rule.name}: "
            f"{'ok' if count == 0 else f'{count:,} VIOLATIONS'} ({seconds:.1f} s)"
        )
    group_rows = [r.asDict() for r in rules.group_totals(t).collect()]
    partitions = _partition_rows(logs, groups)
    records.unpersist()
    summary = report.Summary(
        clean=all(r.ok for r in results),
        source="archive" if archive else "data-dirs",
        inputs=inputs,
        records=n_records,
        logs=n_logs,
        group_partitions=n_groups,
        rules=results,
        groups=group_rows,
        partitions=partitions,
        seconds=round(time.monotonic() - started, 3),
        spark={"version": spark.version, "master": spark.sparkContext.master},
        stores_read=len(inputs) - len(unreadable) if archive is None else len(inputs),
    )
    report.write(out, summary)
    progress(f"report written to {out} ({summary.seconds:.1f} s)")
    return summary


def _read_stores(
    spark: Any,
    settings: SparkSettings,
    data_dirs: list[str],
    stores: list[StoreRef],
    unreadable: list[dict[str, str]],
    progress: Progress,
) -> tuple[Any, Any, Any, tuple[int, int, int]] | None:
    """The three tables of the readable stores, cached and counted. A Spark worker that dies
    on a store the check passed fails the read: then each store is read once more alone, a
    store that fails again joins ``unreadable`` (in place), and the rest is read again. None:
    no store is left to read."""
    from pyspark import StorageLevel

    split = settings.split_records
    columns = list(tables.AUDIT_RECORD_COLUMNS)
    for attempt in (1, 2):
        exclude = {u["path"] for u in unreadable}
        records = _read(spark, data_dirs, "records", columns, split, exclude)
        logs = _read(spark, data_dirs, "logs", [c for c, _ in tables.LOGS], split, exclude)
        groups = _read(spark, data_dirs, "groups", [c for c, _ in tables.GROUPS], split, exclude)
        records = records.persist(StorageLevel.MEMORY_AND_DISK)
        logs, groups = logs.cache(), groups.cache()
        try:
            return records, logs, groups, (records.count(), logs.count(), groups.count())
        except AuditUsageError:
            raise
        except Exception as err:
            for frame in (records, logs, groups):
                frame.unpersist()
            if attempt == 2:
                raise
            progress(f"reading failed: {_first_line(err)}; reading each store alone once more")
        others = [s for s in stores if s.path not in exclude]
        for store in others:
            alone = {s.path for s in stores if s.path != store.path}
            try:
                for table, cols in (
                    ("records", ["offset"]),
                    ("logs", ["node"]),
                    ("groups", ["node"]),
                ):
                    _read(spark, data_dirs, table, cols, split, alone).count()
            except Exception as err:  # the worker died on this store twice: it is the culprit
                reason = f"reading it failed twice in Spark: {_first_line(err)}"
                # Spark can only say that a worker died; the check, run again, says of what
                # when the damage came after the first check (LMDB's assertion, the cut).
                again = store_check.check_store(store.path)
                if not again.ok:
                    reason += f"; checked again: {again.reason}"
                unreadable.append(_unreadable(store, reason))
                progress(f"store {store.node} {store.path}: UNREADABLE: {reason}")
        if len(unreadable) == len(stores):
            return None
    raise AssertionError("unreachable: the second attempt returns or raises")


def _store_result(
    out: str, unreadable: list[dict[str, str]], sample_rows: int
) -> report.RuleResult:
    """``store_readable``'s result, its violations written as the rules' are (Parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "rule": store_check.RULE_NAME,
            "node": u["node"],
            "replication_group": u["replication_group"],
            "queue": None,
            "partition": None,
            "offset": None,
            "detail": f"{u['path']}: {u['reason']}",
        }
        for u in sorted(unreadable, key=lambda u: (u["node"], u["path"]))
    ]
    schema = pa.schema(
        [
            ("rule", pa.string()),
            ("node", pa.string()),
            ("replication_group", pa.string()),
            ("queue", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("detail", pa.string()),
        ]
    )
    folder = os.path.join(out, "violations", store_check.RULE_NAME)
    os.makedirs(folder, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema), os.path.join(folder, "part-0.parquet"))
    return report.RuleResult(
        store_check.RULE_NAME, store_check.RULE_TITLE, len(rows), 0.0, rows[:sample_rows]
    )


def _write_unread(
    out: str,
    inputs: list[dict[str, str]],
    unreadable: list[dict[str, str]],
    from_archive: bool,
    started: float,
    progress: Progress,
) -> report.Summary:
    """The report when no store could be read: store_readable's findings only, no Spark."""
    summary = report.Summary(
        clean=False,
        source="archive" if from_archive else "data-dirs",
        inputs=inputs,
        records=0,
        logs=0,
        group_partitions=0,
        rules=[_store_result(out, unreadable, len(unreadable))],
        groups=[],
        partitions=[],
        seconds=round(time.monotonic() - started, 3),
        spark={},
        stores_read=0,
    )
    report.write(out, summary)
    progress(f"no store could be read; report written to {out}")
    return summary


def _partition_rows(logs: Any, groups: Any) -> list[dict[str, Any]]:
    """Per (node, queue, partition): records stored, and each group's lag there."""
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in logs.select("node", "queue", "partition", "low", "high").collect():
        key = (r["node"], r["queue"] or "?", r["partition"])
        out[key] = {
            "node": key[0],
            "queue": key[1],
            "partition": key[2],
            "records": r["high"] - r["low"],
            "lag": {},
        }
    for r in groups.select("node", "queue", "partition", "group", "committed", "high").collect():
        key = (r["node"], r["queue"] or "?", r["partition"])
        if key in out and r["high"] is not None:
            out[key]["lag"][r["group"] or "?"] = max(0, r["high"] - r["committed"])
    return [out[k] for k in sorted(out)]
