"""``fluxmq-audit``: audit node data directories (or an export archive) with Spark.

    fluxmq-audit --data-dir n1 --data-dir n2 --data-dir n3 --out report/
    fluxmq-audit --archive archive/ --out report/
    fluxmq-audit export --data-dir n1 --data-dir n2 --out archive/
    spark-submit --master spark://host:7077 "$(python -m fluxmq.audit --job-path)" \\
        --archive hdfs-or-shared/archive --out report/

Exit codes: 0 clean, 2 when any rule found violations, 1 on usage errors (a missing or
non-FluxMQ data directory, a bad option, an --out that is not empty).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from fluxmq.audit.layout import AuditUsageError

EXIT_CLEAN, EXIT_USAGE, EXIT_VIOLATIONS = 0, 1, 2


def _parser(export: bool) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fluxmq-audit export" if export else "fluxmq-audit",
        description=(
            "Write the records, logs and groups tables of node data directories to Parquet."
            if export
            else "Replay FluxMQ partition logs with Spark and check their integrity."
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
        "--split-records",
        type=int,
        default=1_000_000,
        help="offsets per Spark partition when reading logs (default 1000000)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in == ["--job-path"]:
        print(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py"))
        return EXIT_CLEAN
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
        from fluxmq.audit.job import SparkSettings, audit
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
        )
        if export:
            manifest = run_export(args.data_dir, args.out, settings, progress, args.overwrite)
            progress(f"archive written to {args.out}: {manifest['rows']}")
            return EXIT_CLEAN
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
    if failed:
        print(
            "fluxmq-audit: FAILED: "
            + ", ".join(f"{r.name} ({r.violations})" for r in failed)
            + f"; see {os.path.join(args.out, 'report.md')}"
        )
        return EXIT_VIOLATIONS
    print(f"fluxmq-audit: clean ({summary.records:,} records); see {args.out}/report.md")
    return EXIT_CLEAN
