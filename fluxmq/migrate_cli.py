"""``fluxmq migrate --data-dir DIR``: rewrite a stopped node's data directory from record
format 1 (one row per message) to record batches (format 2), in place.

Everything under DIR is found and rewritten: each LMDB store (a directory holding ``data.mdb``:
the node's own, ``groups/<id>``) by ``storage.migrate.migrate_environment`` in one write
transaction, and each Raft snapshot (``raft/<shard>/snapshot``) whose state copy is still
format 1 by writing a new snapshot beside it (same entries and members, migrated state) that
replaces it with one rename. A crash at any point leaves each store and snapshot either old or
new, never half done, and running the command again finishes the job: what is format 2 already
is left alone. The node must be stopped: a store another process holds open is refused before
anything changes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence

from raft import snapshot_file
from storage.api import StorageError
from storage.migrate import (
    TEMP_PREFIX,
    MigrationError,
    copy_format,
    environment_in_use,
    migrate_copy,
    migrate_environment,
)

SNAPSHOT_NAME = "snapshot"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fluxmq migrate",
        description=(
            "Rewrite a data directory written by record format 1 (one row per message) as "
            "record batches (format 2), in place. Stop the node first. Each store and Raft "
            "snapshot is rewritten all at once or not at all; running it again is harmless."
        ),
    )
    parser.add_argument(
        "--data-dir", required=True, help="the node's data directory (data_dir of fluxmq serve)"
    )
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    root: str = args.data_dir
    try:
        for line in migrate_data_dir(root):
            print(line, flush=True)
    except (MigrationError, StorageError, snapshot_file.SnapshotFileError, OSError) as err:
        print(f"fluxmq migrate: {err}", file=sys.stderr)
        return 1
    return 0


def migrate_data_dir(root: str) -> Iterator[str]:
    """Migrate everything under ``root``, yielding one line per store and snapshot as it is
    done. Raises on the first refusal (what was migrated before it stays migrated, the rest is
    untouched); nothing changes before every store was found free."""
    if not os.path.isdir(root):
        raise MigrationError(f"{root!r} is not a directory")
    stores, snapshots, leftovers = _find(root)
    held = [path for path in stores if environment_in_use(path)]
    if held:
        raise MigrationError(
            f"a process holds the store(s) {', '.join(held)} open (a running node?): stop the "
            "node first; nothing was changed"
        )
    for path in leftovers:  # work directories of a migration that was interrupted
        shutil.rmtree(path, ignore_errors=True)
    if not stores and not snapshots:
        yield f"{root}: no FluxMQ store or Raft snapshot found, nothing to do"
    for path in stores:
        yield migrate_environment(path).describe()
    for path in snapshots:
        yield migrate_snapshot(path)


def _find(root: str) -> tuple[list[str], list[str], list[str]]:
    """(store directories, snapshot files, leftover work directories) under ``root``."""
    stores: list[str] = []
    snapshots: list[str] = []
    leftovers: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        leftovers.extend(os.path.join(dirpath, d) for d in dirnames if d.startswith(TEMP_PREFIX))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(TEMP_PREFIX))
        if "data.mdb" in filenames:
            stores.append(dirpath)
        if SNAPSHOT_NAME in filenames and _is_snapshot(os.path.join(dirpath, SNAPSHOT_NAME)):
            snapshots.append(os.path.join(dirpath, SNAPSHOT_NAME))
    return stores, snapshots, leftovers


def _is_snapshot(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(len(snapshot_file.MAGIC)) == snapshot_file.MAGIC


def migrate_snapshot(path: str) -> str:
    """Rewrite the snapshot file ``path`` with its state copy migrated (when it is format 1):
    a complete new file beside it, fsync'd, renamed over it, the directory fsync'd."""
    info = snapshot_file.read_info(path)
    directory = os.path.dirname(os.path.abspath(path))
    work = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=directory)
    try:
        state = os.path.join(work, "state-1")
        snapshot_file.extract_state(path, info, state)
        if copy_format(state) == 2:
            return f"{path}: snapshot state already format 2, nothing to do"
        migrated = os.path.join(work, "state-2")
        report = migrate_copy(state, migrated)
        rewritten = os.path.join(work, SNAPSHOT_NAME)
        snapshot_file.write(rewritten, info.last, info.prev, list(info.members), migrated)
        snapshot_file.read_info(rewritten)  # what pysyncobj will read at start
        os.replace(rewritten, path)
        snapshot_file.fsync_dir(directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return (
        f"{path}: snapshot at log index {info.index} rewritten with its state in format 2: "
        f"{report.logs} logs, {report.records} records in {report.batches} batches"
    )
