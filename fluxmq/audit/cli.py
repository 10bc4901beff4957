"""``fluxmq-audit``: audit node data directories (or an export archive) with Spark.

    fluxmq-audit --data-dir n1 --data-dir n2 --data-dir n3 --out report/
    fluxmq-audit --archive archive/ --out report/
    fluxmq-audit export --data-dir n1 --data-dir n2 --out archive/
    spark-submit --master spark://host:7077 "$(python -m fluxmq.audit --job-path)" \\
        --archive /shared/archive --out /shared/report/
    fluxmq-audit --py-files-archive fluxmq-audit.zip   # for a Python without fluxmq:
    spark-submit --master spark://host:7077 --py-files fluxmq-audit.zip \\
        "$(fluxmq-audit --job-path)" --data-dir /shared/n1 --out /shared/report/

``--conf KEY=VALUE`` (repeatable) sets a Spark setting on the session the audit starts, or on
top of spark-submit's.

Exit codes: 0 clean, 2 when any rule found violations (a store that cannot be read is one,
of ``store_readable``: the others are audited), 1 on usage errors (a missing or non-FluxMQ data
directory, a store of record format 1, a bad option, an --out that is not empty), 3 when no
store could be read at all (the report then holds only store_readable's findings).
``export`` exits 2 when it left unreadable stores out of the archive (the manifest names them,
and an audit of the archive reports them), 3 when it could read none (no archive).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from fluxmq.audit.layout import AuditUsageError

EXIT_CLEAN, EXIT_USAGE, EXIT_VIOLATIONS, EXIT_NOTHING_READ = 0, 1, 2, 3
PY_FILES_ARCHIVE = "--py-files-archive"


def _parser(export: bool) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fluxmq-audit export" if export else "fluxmq-audit",
        description=(
            "Write the records, logs and groups tables of node data directories to Parquet."
            if export
            else "Replay FluxMQ partition logs with Spark and check their integrity."
        ),
        epilog=None
        if export
        else (
            "For spark-submit: `fluxmq-audit --job-path` prints the job file to submit, and "
            f"`fluxmq-audit {PY_FILES_ARCHIVE} ZIP` writes FluxMQ's packages to ZIP for its "
            "--py-files (then the driver's and the executors' Python need only the third-party "
            "packages)."
        ),
    )
    p.add_argument(
        "--data-dir",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="a node's data directory (repeat for every replica); NAME defaults to its base name",
    )
    if not export:
        p.add_argument("--archive", help="audit an archive written by `fluxmq-audit export`")
        p.add_argument(
            "--sample", type=int, default=20, help="violations listed per rule (default 20)"
        )
    p.add_argument("--out", required=True, help="the directory to write (must be empty or new)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it has content")
    p.add_argument("--master", help="Spark master (default: local[*], or spark-submit's)")
    p.add_argument("--shuffle-partitions", type=int, default=8, help="default 8")
    p.add_argument("--driver-memory", default="4g", help="for a session this starts (default 4g)")
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting (repeat for more), over the audit's own and spark-submit's; "
        "e.g. spark.ui.enabled=true (the UI of a session this starts is off by default)",
    )
    p.add_argument(
        "--split-records",
        type=int,
        default=1_000_000,
        help="offsets per Spark partition when reading logs (default 1000000)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    return p


def parse_conf(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``--conf KEY=VALUE`` arguments -> (key, value) pairs, in order (the value may hold '=',
    as with spark-submit); AuditUsageError naming a bad one."""
    pairs: list[tuple[str, str]] = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise AuditUsageError(f"--conf {item!r}: give KEY=VALUE, e.g. spark.ui.enabled=true")
        pairs.append((key, value))
    return tuple(pairs)


def _write_py_files_archive(rest: list[str]) -> int:
    """``fluxmq-audit --py-files-archive ZIP``: write the archive, print its absolute path (for
    ``--py-files "$(...)"``)."""
    if len(rest) != 1 or rest[0].startswith("-"):
        print(
            f"fluxmq-audit: {PY_FILES_ARCHIVE} takes one argument, the zip file to write, "
            "and no other options",
            file=sys.stderr,
        )
        return EXIT_USAGE
    from fluxmq.audit.pyfiles import write_archive

    try:
        write_archive(rest[0])
    except AuditUsageError as err:
        print(f"fluxmq-audit: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(os.path.abspath(rest[0]))
    return EXIT_CLEAN


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in == ["--job-path"]:
        print(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py"))
        return EXIT_CLEAN
    if args_in[:1] == [PY_FILES_ARCHIVE]:
        return _write_py_files_archive(args_in[1:])
    if args_in and args_in[0].startswith(PY_FILES_ARCHIVE + "="):
        return _write_py_files_archive([args_in[0].partition("=")[2], *args_in[1:]])
    export = bool(args_in) and args_in[0] == "export"
    parser = _parser(export)
    try:
        args = parser.parse_args(args_in[1:] if export else args_in)
    except SystemExit as exit_:
        return EXIT_CLEAN if exit_.code == 0 else EXIT_USAGE
    started = time.monotonic()

    def progress(line: str) -> None:
        if not args.quiet:
            print(f"fluxmq-audit [{time.monotonic() - started:6.1f}s] {line}", file=sys.stderr)

    try:
        from fluxmq.audit.job import NoStoreReadable, SparkSettings, audit
        from fluxmq.audit.job import export as run_export

        if args.shuffle_partitions < 1:
            raise AuditUsageError("--shuffle-partitions must be at least 1")
        if args.split_records < 1:
            raise AuditUsageError("--split-records must be at least 1")
        settings = SparkSettings(
            master=args.master,
            shuffle_partitions=args.shuffle_partitions,
            driver_memory=args.driver_memory,
            split_records=args.split_records,
            conf=parse_conf(args.conf),
        )
        if export:
            try:
                manifest = run_export(args.data_dir, args.out, settings, progress, args.overwrite)
            except NoStoreReadable as err:
                print(f"fluxmq-audit: {err}; no archive written", file=sys.stderr)
                return EXIT_NOTHING_READ
            progress(f"archive written to {args.out}: {manifest['rows']}")
            for u in manifest["unreadable"]:
                print(
                    f"fluxmq-audit: left out of the archive: {u['node']} {u['path']}: {u['reason']}"
                )
            return EXIT_VIOLATIONS if manifest["unreadable"] else EXIT_CLEAN
        if args.sample < 0:
            raise AuditUsageError("--sample must not be negative")
        summary = audit(
            args.out,
            settings,
            progress,
            data_dirs=args.data_dir or None,
            archive=args.archive,
            sample_rows=args.sample,
            overwrite=args.overwrite,
        )
    except AuditUsageError as err:
        print(f"fluxmq-audit: {err}", file=sys.stderr)
        return EXIT_USAGE
    except ImportError as err:
        print(
            f"fluxmq-audit: {err}; install the audit extra: pip install 'fluxmq[audit]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    failed = [r for r in summary.rules if not r.ok]
    for r in summary.rules:
        if r.name == "store_readable":
            for v in r.sample:
                print(f"fluxmq-audit: store_readable: {v['node']} {v['detail']}")
    if summary.stores_read == 0:
        print(
            "fluxmq-audit: FAILED: no store could be read; "
            f"see {os.path.join(args.out, 'report.md')}"
        )
        return EXIT_NOTHING_READ
    if failed:
        print(
            "fluxmq-audit: FAILED: "
            + ", ".join(f"{r.name} ({r.violations})" for r in failed)
            + f"; see {os.path.join(args.out, 'report.md')}"
        )
        return EXIT_VIOLATIONS
    print(f"fluxmq-audit: clean ({summary.records:,} records); see {args.out}/report.md")
    return EXIT_CLEAN
