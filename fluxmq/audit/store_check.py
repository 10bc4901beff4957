"""Is a store safe to read? Checked in a child process, before Spark touches it.

LMDB maps its file into memory and trusts it: a ``data.mdb`` cut short kills the reading
process with SIGBUS when a page past the end is touched, a zeroed page fails an assertion
inside LMDB (``abort()``), and neither can be caught in Python. So every store is checked first
in a child process of its own (``python -m fluxmq.audit.store_check PATH``), which the parent
watches from outside: whatever happens to the child, the parent learns which store and why, and
the audit goes on with the stores that passed. The child

1. refuses a ``data.mdb`` that is empty or shorter than the pages LMDB's meta page claims
   (``(last_pgno + 1) * page size``), before any page is touched;
2. opens it read-only without a lock file (``lock=False``: a copy on read-only media can be
   audited, and nothing else may write a store under audit), refuses record format 1 (see
   ``storage.lmdb_inspect``), and needs the three databases a FluxMQ store has;
3. walks every database, every key and every value (copied, so overflow pages are read too).

A child that exits cleanly prints one JSON line; one killed by a signal is reported with the
signal's name and the last line it wrote (LMDB's assertion, say); one that runs past its time
is killed and reported so. Stores are checked ``CHECKS_PARALLEL`` at a time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

RULE_NAME = "store_readable"
RULE_TITLE = "every store opens, is as long as LMDB says, and every database reads to its end"
DATA_FILE = "data.mdb"
DATABASES = (b"batches", b"logmeta", b"kv")
FORMAT_1_DATABASE = b"log"
CHECKS_PARALLEL = 2
# A walk reads the whole file: allow for a slow disk (20 MB/s) on top of a fixed start-up.
CHECK_TIMEOUT_BASE_S = 60.0
CHECK_SECONDS_PER_GIB = 50.0
STDERR_TAIL_LINES = 3
MAX_DBS = 16


@dataclass(frozen=True, slots=True)
class StoreVerdict:
    path: str
    ok: bool
    reason: str = ""  # why not, for an operator
    old_format: bool = False  # record format 1: a usage error (fluxmq migrate), not damage


class _Refused(Exception):
    def __init__(self, reason: str, old_format: bool = False) -> None:
        super().__init__(reason)
        self.old_format = old_format


def check_in_process(path: str) -> None:
    """The checks, in this process (the child's part): _Refused when the store fails one; a
    signal or an abort ends the process. Never writes to the store."""
    import lmdb

    data = os.path.join(path, DATA_FILE)
    size = os.path.getsize(data)
    if size == 0:
        raise _Refused(f"{DATA_FILE} is empty (0 bytes)")
    try:
        env = lmdb.open(path, readonly=True, lock=False, subdir=True, max_dbs=MAX_DBS, create=False)
    except lmdb.Error as err:
        raise _Refused(f"not a readable LMDB environment ({size:,} bytes): {err}") from None
    try:
        page_bytes = int(env.stat()["psize"])
        claimed = (int(env.info()["last_pgno"]) + 1) * page_bytes
        # Measured again after the meta page was read: a file only grows, so a writer that
        # appended pages meanwhile cannot make a whole store look cut short.
        size = os.path.getsize(data)
        if size < claimed:
            raise _Refused(
                f"{DATA_FILE} is {size:,} bytes, but LMDB's meta page says it holds "
                f"{claimed // page_bytes:,} pages of {page_bytes:,} ({claimed:,} bytes): "
                "the file was cut short"
            )
        with env.begin(buffers=False) as txn:
            names = [key for key, _value in txn.cursor()]
        if FORMAT_1_DATABASE in names:
            raise _Refused(
                f"the store at {path!r} was written by FluxMQ's record format 1 (one row per "
                "message); this version reads record batches (format 2) only. With the node "
                "stopped, run `fluxmq migrate --data-dir <the node's data directory>` to "
                "rewrite it in place, then audit it",
                old_format=True,
            )
        missing = [n.decode() for n in DATABASES if n not in names]
        if missing:
            raise _Refused(f"not a FluxMQ store: no database {', '.join(missing)}")
        for name in DATABASES:
            _walk(env, name)
    except lmdb.Error as err:
        raise _Refused(f"LMDB refused to read it: {err}") from None
    finally:
        env.close()


def _walk(env: object, name: bytes) -> None:
    import lmdb

    db = env.open_db(name, create=False)  # type: ignore[attr-defined]
    entries = 0
    with env.begin(db=db, buffers=False) as txn:  # type: ignore[attr-defined]
        expected = int(txn.stat(db)["entries"])
        for _key_and_value in txn.cursor():  # bytes, copied: every page is read
            entries += 1
    if entries != expected:
        raise lmdb.CorruptedError(
            f"database {name.decode()} walked {entries:,} entries, its header says {expected:,}"
        )


def _child_main(argv: Sequence[str]) -> int:
    (path,) = argv
    try:
        check_in_process(path)
    except _Refused as refused:
        print(json.dumps({"ok": False, "reason": str(refused), "old_format": refused.old_format}))
        return 0
    except OSError as err:
        print(json.dumps({"ok": False, "reason": f"cannot read it: {err}", "old_format": False}))
        return 0
    print(json.dumps({"ok": True}))
    return 0


def _timeout_s(path: str) -> float:
    try:
        size = os.path.getsize(os.path.join(path, DATA_FILE))
    except OSError:
        size = 0
    return CHECK_TIMEOUT_BASE_S + CHECK_SECONDS_PER_GIB * size / 2**30


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _child_env() -> dict[str, str]:
    """This environment, with the directory (or zip) this fluxmq was imported from first on
    the child's path: the child must run this very module, also when fluxmq came from a
    ``--py-files`` archive or a path set up in-process rather than from an installation."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def check_store(path: str) -> StoreVerdict:
    """Check one store in a child process (see the module docstring)."""
    timeout_s = _timeout_s(path)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fluxmq.audit.store_check", path],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=_child_env(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return StoreVerdict(path, False, f"the check did not finish in {timeout_s:.0f} s")
    tail = " | ".join(done.stderr.strip().splitlines()[-STDERR_TAIL_LINES:])
    if done.returncode < 0:
        why = f"reading it killed the checking process ({_signal_name(-done.returncode)})"
        return StoreVerdict(path, False, f"{why}: {tail}" if tail else why)
    lines = done.stdout.strip().splitlines()
    try:
        verdict = json.loads(lines[-1]) if lines else None
    except ValueError:
        verdict = None
    if done.returncode != 0 or not isinstance(verdict, dict):
        why = f"the check exited with {done.returncode}"
        return StoreVerdict(path, False, f"{why}: {tail}" if tail else why)
    if verdict.get("ok"):
        return StoreVerdict(path, True)
    return StoreVerdict(
        path, False, str(verdict.get("reason")), bool(verdict.get("old_format", False))
    )


def check_stores(
    paths: Sequence[str], on_verdict: Callable[[StoreVerdict], None] | None = None
) -> list[StoreVerdict]:
    """Every store checked, CHECKS_PARALLEL at a time; verdicts in the order of ``paths``."""
    with ThreadPoolExecutor(max_workers=CHECKS_PARALLEL) as pool:
        verdicts = list(pool.map(check_store, paths))
    if on_verdict is not None:
        for v in verdicts:
            on_verdict(v)
    return verdicts


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
