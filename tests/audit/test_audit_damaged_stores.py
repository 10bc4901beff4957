"""A damaged store is a finding, not the end of the audit: each is checked in a process of its
own first (fluxmq/audit/store_check.py), reported under ``store_readable`` naming the node, the
path and what is wrong, and the other stores are audited. The damage is done with plain file
operations (cut, zeroed pages, random bytes), as a disk or an operator would do it."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fluxmq.audit import job, pyfiles, store_check
from fluxmq.audit.job import SparkSettings
from fluxmq.audit.store_check import check_store
from tests.audit import test_audit_spark_cluster
from tests.audit.conftest import Copier
from tests.audit.data import ORDERS
from tests.audit.test_audit_cli import CLI_TIMEOUT_S, check_report

PAGE_BYTES = 4096  # LMDB's page size on these machines (the store's own: env.stat()["psize"])
P_LEAF = 0x02  # LMDB page flags (mdb.c): a leaf page of a B-tree
META_PAGES = 2

# A Python with fluxmq's third-party packages and not fluxmq (a fixture of that module).
bare_python = test_audit_spark_cluster.bare_python


def cut_to(store: Path, fraction: float) -> int:
    data = store / "data.mdb"
    size = data.stat().st_size
    os.truncate(data, int(size * fraction))
    return size


def zero_leaf_page(store: Path, nth: int = 0) -> int:
    """Zero the ``nth`` leaf page after the meta pages (LMDB's page header: pgno u64, pad u16,
    flags u16). -> its page number."""
    data = store / "data.mdb"
    raw = bytearray(data.read_bytes())
    leaves = [
        page
        for page in range(META_PAGES, len(raw) // PAGE_BYTES)
        if struct.unpack_from("<H", raw, page * PAGE_BYTES + 10)[0] & P_LEAF
    ]
    page = leaves[nth]
    raw[page * PAGE_BYTES : (page + 1) * PAGE_BYTES] = bytes(PAGE_BYTES)
    data.write_bytes(bytes(raw))
    return page


def zero_leaf_pages_holding(store: Path, needle: bytes) -> int:
    """Zero every leaf page that holds ``needle`` (the live one among them: LMDB also keeps
    stale copies of pages on its free list, which no reader visits). -> pages zeroed."""
    data = store / "data.mdb"
    raw = bytearray(data.read_bytes())
    zeroed = 0
    for page in range(META_PAGES, len(raw) // PAGE_BYTES):
        at = page * PAGE_BYTES
        flags = struct.unpack_from("<H", raw, at + 10)[0]
        if flags & P_LEAF and needle in raw[at : at + PAGE_BYTES]:
            raw[at : at + PAGE_BYTES] = bytes(PAGE_BYTES)
            zeroed += 1
    data.write_bytes(bytes(raw))
    assert zeroed, f"no leaf page holds {needle!r}"
    return zeroed


def deep_store(path: Path) -> None:
    """A store whose databases are several pages deep (so a cursor walks from leaf to leaf)."""
    import lmdb

    env = lmdb.open(str(path), max_dbs=8, map_size=64 * 2**20)
    with env.begin(write=True) as txn:
        for name in store_check.DATABASES:
            db = env.open_db(name, txn=txn)
            for i in range(2000):
                txn.put(b"%08d" % i, os.urandom(300), db=db)
    env.close()


def garbage(store: Path) -> None:
    data = store / "data.mdb"
    data.write_bytes(os.urandom(data.stat().st_size))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fluxmq.audit", *args, "--master", "local[2]"],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )


def test_each_kind_of_damage_is_named_by_the_check_in_its_own_process(
    single_copy: Copier,
) -> None:
    """Run in this process, the truncated stores would kill it with SIGBUS and the zeroed page
    may abort it inside LMDB: the checks run in child processes, and this test survives."""
    (good,) = single_copy("kinds")
    half, tenth, empty, rubbish, meta, leaf = (
        single_copy(name)[0] for name in ("half", "tenth", "empty", "rubbish", "meta", "leaf")
    )
    size = cut_to(half, 0.5)
    cut_to(tenth, 0.9)
    (empty / "data.mdb").write_bytes(b"")
    garbage(rubbish)
    with open(meta / "data.mdb", "r+b") as f:
        f.write(bytes(META_PAGES * PAGE_BYTES))
    zero_leaf_pages_holding(leaf, b"Q/" + ORDERS.encode())

    assert check_store(str(good)).ok
    verdicts = {
        p.parent.name: check_store(str(p)) for p in (half, tenth, empty, rubbish, meta, leaf)
    }
    assert not any(v.ok for v in verdicts.values())
    assert f"data.mdb is {size // 2:,} bytes" in verdicts["half"].reason
    assert f"({size:,} bytes): the file was cut short" in verdicts["half"].reason
    assert "the file was cut short" in verdicts["tenth"].reason
    assert verdicts["empty"].reason == "data.mdb is empty (0 bytes)"
    assert "not a readable LMDB environment" in verdicts["rubbish"].reason
    assert "not a readable LMDB environment" in verdicts["meta"].reason
    # LMDB notices a zeroed page either as MDB_CORRUPTED or by aborting the reader.
    assert (
        "MDB_CORRUPTED" in verdicts["leaf"].reason
        or "killed the checking process (SIGABRT)" in verdicts["leaf"].reason
    ), verdicts["leaf"].reason
    assert not any(v.old_format for v in verdicts.values())


def test_a_zeroed_page_inside_a_database_aborts_lmdb_and_is_reported_with_its_assertion(
    tmp_path: Path,
) -> None:
    """A cursor stepping from a leaf to a zeroed sibling fails LMDB's assertion and abort()s
    the process (what killed the audit's Spark worker): the checking child dies, the parent
    names the signal and LMDB's last words."""
    store = tmp_path / "s"
    deep_store(store)
    zero_leaf_page(store, nth=5)
    verdict = check_store(str(store))
    assert not verdict.ok
    assert "reading it killed the checking process (SIGABRT)" in verdict.reason, verdict
    assert "Assertion 'IS_LEAF(mp)' failed" in verdict.reason


def test_a_store_cut_short_kills_a_reader_that_maps_it_and_the_check_names_it_first(
    tmp_path: Path,
) -> None:
    """Why the check measures the file before it reads a page: a walk of a store cut after
    LMDB opened it faults (SIGBUS), which no Python code can catch."""
    store = tmp_path / "s"
    deep_store(store)
    script = (
        "import lmdb, os, sys\n"
        "from fluxmq.audit import store_check\n"
        f"path = {str(store)!r}\n"
        "env = lmdb.open(path, readonly=True, lock=False, max_dbs=16)\n"
        "os.truncate(os.path.join(path, 'data.mdb'), 3 * 4096)\n"
        "store_check._walk(env, b'batches')\n"
    )
    child = tmp_path / "walk_cut.py"
    child.write_text(script)
    done = subprocess.run([sys.executable, str(child)], capture_output=True, timeout=60)
    assert done.returncode == -7, (done.returncode, done.stderr[-2000:])  # SIGBUS
    # The same store, checked: named, not a signal in the parent.
    verdict = check_store(str(store))
    assert not verdict.ok and "the file was cut short" in verdict.reason


def test_a_check_that_runs_past_its_time_is_killed_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store on a disk that hangs must not hang the audit: its check has a bound."""
    store = tmp_path / "s"
    deep_store(store)
    monkeypatch.setattr(store_check, "CHECK_TIMEOUT_BASE_S", 0.001)
    monkeypatch.setattr(store_check, "CHECK_SECONDS_PER_GIB", 0.0)
    verdict = check_store(str(store))
    assert not verdict.ok and verdict.reason == "the check did not finish in 0 s", verdict


def test_a_store_of_record_format_1_is_told_apart_from_damage(tmp_path: Path) -> None:
    """Format 1 is a usage error naming `fluxmq migrate` (the audit refuses the run), not a
    damaged store to leave out."""
    import lmdb

    old = tmp_path / "old"
    env = lmdb.open(str(old), max_dbs=8)
    for name in (store_check.FORMAT_1_DATABASE, b"logmeta", b"kv"):
        env.open_db(name)
    env.close()
    verdict = check_store(str(old))
    assert not verdict.ok and verdict.old_format
    assert "fluxmq migrate --data-dir" in verdict.reason


def test_the_check_runs_where_fluxmq_came_from_an_archive_on_sys_path(
    bare_python: Path, tmp_path: Path
) -> None:
    """A driver that put the --py-files archive on its own sys.path (a notebook, a script)
    has no fluxmq its child could import by name: the child is told where this one came from.
    Told nothing more than the environment, it could not start (the first verdict)."""
    archive = tmp_path / "fluxmq-audit.zip"
    pyfiles.write_archive(str(archive))
    store = tmp_path / "s"
    deep_store(store)
    probe = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(archive)!r})\n"
        "from fluxmq.audit import store_check\n"
        "child_env = store_check._child_env\n"
        "store_check._child_env = lambda: dict(os.environ)\n"
        f"print(store_check.check_store({str(store)!r}).reason)\n"
        "store_check._child_env = child_env\n"
        f"print(store_check.check_store({str(store)!r}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [str(bare_python), "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert res.returncode == 0, res.stderr[-3000:]
    without, with_path = res.stdout.strip().splitlines()
    assert "No module named 'fluxmq'" in without, without
    assert "ok=True" in with_path, with_path


@pytest.mark.slow
def test_damaged_replicas_are_reported_by_name_and_the_others_audited(
    cluster_copy: Copier, tmp_path: Path
) -> None:
    n0, n1, n2 = cluster_copy("damaged")
    cut_to(n1, 0.5)
    zero_leaf_pages_holding(n2, b"Q/" + ORDERS.encode())  # the catalog's page
    out = tmp_path / "report"
    res = cli(
        "--data-dir", str(n0), "--data-dir", str(n1), "--data-dir", str(n2), "--out", str(out)
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr + res.stdout
    assert f"store_readable: n1 {n1}: data.mdb is" in res.stdout
    assert f"store_readable: n2 {n2}:" in res.stdout
    assert "FAILED: store_readable (2)" in res.stdout
    # Found before Spark read a page of them: no Spark task died on them (its 185 lines).
    assert "Exception in task" not in res.stderr and "worker exited" not in res.stderr
    summary = check_report(out, clean=False)
    assert summary["failed_rules"] == ["store_readable"]
    records = summary["records"]
    assert summary["stores_read"] == 1 and isinstance(records, int) and records > 100  # n0's
    stored = pq.read_table(out / "violations" / "store_readable").to_pylist()
    assert {(v["node"], v["replication_group"] != "") for v in stored} == {
        ("n1", True),
        ("n2", True),
    }
    assert "### `store_readable`: 2 violations" in (out / "report.md").read_text()


@pytest.mark.slow
def test_with_no_store_readable_the_audit_exits_3_and_names_each(
    single_copy: Copier, tmp_path: Path
) -> None:
    (a,) = single_copy("rubbish")
    (b,) = single_copy("empty")
    garbage(a)
    (b / "data.mdb").write_bytes(b"")
    out = tmp_path / "report"
    res = cli("--data-dir", f"east={a}", "--data-dir", f"west={b}", "--out", str(out))
    assert res.returncode == 3, res.stderr[-3000:]
    assert "Traceback" not in res.stderr + res.stdout
    assert f"store_readable: east {a}: not a readable LMDB environment" in res.stdout
    assert f"store_readable: west {b}: data.mdb is empty (0 bytes)" in res.stdout
    assert "no store could be read" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stores_read"] == 0 and summary["failed_rules"] == ["store_readable"]
    # A single node whose only store is damaged: the same.
    res = cli("--data-dir", str(b), "--out", str(tmp_path / "single"))
    assert res.returncode == 3, res.stderr[-3000:]
    assert f"store_readable: {b.name} {b}: data.mdb is empty" in res.stdout
    assert "Traceback" not in res.stderr + res.stdout
    assert "store_readable" in (tmp_path / "single" / "report.md").read_text()
    # export: nothing to write, same exit code
    res = subprocess.run(
        [sys.executable, "-m", "fluxmq.audit", "export", "--data-dir", str(a), "--out", "x"],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        cwd=tmp_path,
    )
    assert res.returncode == 3 and "no store could be read" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "x").exists()


@pytest.mark.slow
def test_export_leaves_an_unreadable_store_out_and_its_archive_audit_reports_it(
    single_copy: Copier, tmp_path: Path
) -> None:
    (good,) = single_copy("good")
    (bad,) = single_copy("bad")
    cut_to(bad, 0.9)
    archive = tmp_path / "archive"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "fluxmq.audit",
            "export",
            "--data-dir",
            f"ok={good}",
            "--data-dir",
            f"cut={bad}",
            "--out",
            str(archive),
            "--master",
            "local[2]",
        ],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert f"left out of the archive: cut {bad}: data.mdb is" in res.stdout
    assert "the file was cut short" in res.stdout  # its last tenth
    assert "Traceback" not in res.stderr + res.stdout
    manifest = json.loads((archive / "manifest.json").read_text())
    assert [s["node"] for s in manifest["stores"]] == ["ok"]
    assert [u["node"] for u in manifest["unreadable"]] == ["cut"]
    summary = job.audit(
        str(tmp_path / "report"),
        SparkSettings(master="local[2]", shuffle_partitions=2, driver_memory="1g"),
        print,
        archive=str(archive),
    )
    (readable,) = [r for r in summary.rules if r.name == "store_readable"]
    assert readable.violations == 1 and readable.sample[0]["node"] == "cut"
    assert {r.name for r in summary.rules if not r.ok} == {"store_readable"}


@pytest.mark.slow
def test_a_worker_that_dies_on_a_store_the_check_passed_is_retried_once_then_reported(
    cluster_copy: Copier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check is the first line; a worker that dies anyway (damage the check did not see,
    or that came after it) must not end the audit either. Here the check is told to pass a
    store cut short, so that Spark's worker is the one that dies on it (SIGBUS)."""
    n0, n1, n2 = cluster_copy("worker")
    cut_to(n2, 0.5)

    def passes(paths: list[str], on_verdict: object = None) -> list[store_check.StoreVerdict]:
        return [store_check.StoreVerdict(p, True) for p in paths]

    monkeypatch.setattr(store_check, "check_stores", passes)
    lines: list[str] = []
    summary = job.audit(
        str(tmp_path / "report"),
        SparkSettings(master="local[2]", shuffle_partitions=2, driver_memory="1g"),
        lines.append,
        data_dirs=[str(n0), str(n1), str(n2)],
    )
    assert any("reading each store alone once more" in line for line in lines), lines
    (readable,) = [r for r in summary.rules if r.name == "store_readable"]
    assert [v["node"] for v in readable.sample] == ["n2"]
    assert "reading it failed twice in Spark" in readable.sample[0]["detail"]
    assert "Python worker crashed" in readable.sample[0]["detail"]
    assert "checked again: data.mdb is" in readable.sample[0]["detail"]  # the check's words
    assert summary.stores_read == 2 and summary.records > 100
    assert {r.name for r in summary.rules if not r.ok} == {"store_readable"}
