"""Which stores a set of node data directories holds (no Spark here).

A node's data directory holds its own replication group's store at the top (``data.mdb``, with a
``MODE`` file saying ``single`` or ``cluster <group id>``) and one store per further group it
hosts under ``groups/<group id>/``; a single node with several shard processes has one more store
per further local shard under ``local-shards/<i>/``. Stores of the same group on different nodes
are replicas of each other; a single node's store, and each of its local shards, is a group of
its own (nothing to compare it with).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DATA_FILE = "data.mdb"
MODE_FILE = "MODE"
GROUPS_DIR = "groups"
LOCAL_SHARDS_DIR = "local-shards"  # the shard process supervisor's layout (a test checks)
SINGLE_GROUP_PREFIX = "single:"


class AuditUsageError(Exception):
    """What the audit was asked cannot be done as asked (exit code 1)."""


@dataclass(frozen=True, slots=True)
class StoreRef:
    node: str  # a name for the data directory, unique within one audit
    replication_group: str  # replicas of one group share this
    path: str  # the directory holding data.mdb


def parse_data_dir(arg: str) -> tuple[str | None, str]:
    """``NAME=PATH`` or ``PATH`` -> (name or None, path)."""
    name, sep, path = arg.partition("=")
    if sep and name and os.sep not in name and not os.path.exists(arg):
        return name, path
    return None, arg


def node_names(data_dirs: list[str]) -> list[tuple[str, str]]:
    """(node name, path) per argument: the given name, else the directory's base name, made
    unique with a suffix when two directories share one.

    >>> node_names(["a/n1", "b/n1", "main=c/x"])
    [('n1', 'a/n1'), ('n1-2', 'b/n1'), ('main', 'c/x')]
    """
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for arg in data_dirs:
        name, path = parse_data_dir(arg)
        base = name or os.path.basename(os.path.normpath(path)) or "node"
        candidate, n = base, 1
        while candidate in seen:
            n += 1
            candidate = f"{base}-{n}"
        if name is not None and candidate != name:
            raise AuditUsageError(f"--data-dir: the node name {name!r} is given twice")
        seen.add(candidate)
        out.append((candidate, path))
    return out


def home_group(node: str, path: str) -> str:
    """The replication group of a data directory's own store."""
    try:
        with open(os.path.join(path, MODE_FILE)) as f:
            mode = f.read().strip()
    except FileNotFoundError:
        mode = "single"  # written before the mode file existed
    except OSError as err:
        raise AuditUsageError(f"cannot read {os.path.join(path, MODE_FILE)}: {err}") from err
    kind, _, group = mode.partition(" ")
    if kind == "cluster" and group:
        return group
    if kind == "single":
        return SINGLE_GROUP_PREFIX + node
    raise AuditUsageError(
        f"{path!r}: its {MODE_FILE} file says {mode!r}; not a FluxMQ data directory"
    )


def discover(data_dirs: list[str]) -> list[StoreRef]:
    """Every store of the given node data directories; AuditUsageError for a directory that is
    missing or is not a FluxMQ data directory."""
    if not data_dirs:
        raise AuditUsageError("no --data-dir given (or use --archive)")
    stores: list[StoreRef] = []
    for node, path in node_names(data_dirs):
        if not os.path.exists(path):
            raise AuditUsageError(f"--data-dir {path!r}: no such directory")
        if not os.path.isdir(path):
            raise AuditUsageError(f"--data-dir {path!r}: not a directory")
        if not os.path.isfile(os.path.join(path, DATA_FILE)):
            raise AuditUsageError(
                f"--data-dir {path!r} is not a FluxMQ data directory (it has no {DATA_FILE}; "
                "point at the directory a node was started with --data-dir)"
            )
        stores.append(StoreRef(node, home_group(node, path), os.path.abspath(path)))
        groups_dir = os.path.join(path, GROUPS_DIR)
        if os.path.isdir(groups_dir):
            for group in sorted(os.listdir(groups_dir)):
                sub = os.path.join(groups_dir, group)
                if os.path.isfile(os.path.join(sub, DATA_FILE)):
                    stores.append(StoreRef(node, group, os.path.abspath(sub)))
        local_dir = os.path.join(path, LOCAL_SHARDS_DIR)
        if os.path.isdir(local_dir):
            for index in sorted(os.listdir(local_dir)):
                sub = os.path.join(local_dir, index)
                if os.path.isfile(os.path.join(sub, DATA_FILE)):
                    group = f"{SINGLE_GROUP_PREFIX}{node}/local-{index}"
                    stores.append(StoreRef(node, group, os.path.abspath(sub)))
    # No store is opened here: a damaged one can kill the process that maps it, so the audit
    # checks each in a child process first (store_check, which also refuses record format 1).
    return stores
