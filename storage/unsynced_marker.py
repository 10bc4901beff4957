"""Knowing whether a store written without fsync survived: the boot id marker.

A store that is a cache of a durable log (a Raft shard's state: its snapshot file and journal
are fsync'd, and applying the log again rebuilds it) commits without fsync. A process crash
(kill -9) loses nothing then: the commits are in the operating system's page cache, which
outlives the process. Only a machine crash (power loss, kernel panic) can lose them, and LMDB
without fsync may then be torn, not merely behind. So before the first unsynced commit the store
records the boot id of the running kernel in a marker file (durably), and a clean close removes
it after an fsync. A marker naming another boot at open means the machine went down with commits
that may never have reached the disk: the store is discarded and the log rebuilds it.

A clean machine shutdown after a kill -9 also leaves a marker of an old boot: the store is then
rebuilt though it may have been whole. That costs a rebuild, never a loss.
"""

from __future__ import annotations

import contextlib
import os

MARKER_NAME = "unsynced-since-boot"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
BOOT_ID_CHARS_MAX = 64


def current_boot_id() -> str | None:
    """The running kernel's boot id (Linux); None where the system has none to read."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as f:
            boot_id = f.read(BOOT_ID_CHARS_MAX + 1).strip()
    except (OSError, UnicodeDecodeError):
        return None
    return boot_id if 0 < len(boot_id) <= BOOT_ID_CHARS_MAX else None


def marked_boot_id(directory: str) -> str | None:
    """The boot id the marker in ``directory`` names (None: no marker, the store was synced)."""
    try:
        with open(os.path.join(directory, MARKER_NAME), encoding="ascii", errors="replace") as f:
            return f.read(BOOT_ID_CHARS_MAX + 1).strip()
    except FileNotFoundError:
        return None


def mark(directory: str, boot_id: str) -> None:
    """Record, durably, that the store in ``directory`` commits without fsync during ``boot_id``."""
    path = os.path.join(directory, MARKER_NAME)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, boot_id.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)


def clear(directory: str) -> None:
    """The store was fsync'd and closed: nothing unsynced remains."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(directory, MARKER_NAME))
    fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
