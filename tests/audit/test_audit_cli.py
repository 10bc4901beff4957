"""`fluxmq-audit` as operators run it: exit codes, the report files, spark-submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from fluxmq.audit import rules
from tests.audit import inject
from tests.audit.conftest import Copier
from tests.audit.data import ORDERS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CLI_TIMEOUT_S = 300


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fluxmq.audit", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )


def check_report(out: Path, clean: bool) -> dict[str, object]:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["clean"] is clean
    md = (out / "report.md").read_text()
    for r in summary["rules"]:  # every rule, with its count
        assert f"| `{r['name']}` | {r['title']} | {r['violations']:,} |" in md
    names = {"store_readable"} | {r.name for r in rules.RULES}
    assert {r["name"] for r in summary["rules"]} == names
    png = (out / "chart.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(out / "chart.png"))  # it opens and decodes
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert "![records and lag per partition](chart.png)" in md
    return summary


@pytest.mark.slow
def test_violations_exit_2_and_the_report_lists_them(single_copy: Copier, tmp_path: Path) -> None:
    (d,) = single_copy("bad")
    inject.flip_value_byte(d, ORDERS, 0, 0)
    out = tmp_path / "report"
    res = cli("--data-dir", f"east={d}", "--out", str(out), "--master", "local[2]")
    assert res.returncode == 2, res.stderr[-3000:]
    assert "FAILED: crc_valid (1)" in res.stdout
    # progress on the console, rule by rule
    n = len(rules.RULES)
    assert "crc_valid: 1 VIOLATIONS" in res.stderr and f"[{n}/{n}] totals: ok" in res.stderr
    summary = check_report(out, clean=False)
    assert summary["failed_rules"] == ["crc_valid"]
    assert summary["inputs"][0]["node"] == "east"  # type: ignore[index]
    md = (out / "report.md").read_text()
    assert "### `crc_valid`: 1 violations" in md and "crc32c mismatch" in md


@pytest.mark.slow
def test_spark_submit_runs_the_job_on_an_archive_and_clean_data_exits_0_with_the_report(
    single_copy: Copier, tmp_path: Path
) -> None:
    # (One Spark start-up for both: the job is the same whether spark-submit or fluxmq-audit
    # starts it; the test above runs fluxmq-audit on a data directory, with its progress.)
    (d,) = single_copy("submit")
    archive, out = tmp_path / "archive", tmp_path / "report"
    res = cli("export", "--data-dir", str(d), "--out", str(archive), "--master", "local[2]", "-q")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "fluxmq-audit [" not in res.stderr  # -q: no progress lines
    job_path = cli("--job-path").stdout.strip()
    assert job_path.endswith(os.path.join("fluxmq", "audit", "__main__.py"))
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    res = subprocess.run(
        [
            str(submit),
            "--master",
            "local[2]",
            "--driver-java-options",
            "-XX:TieredStopAtLevel=1",  # a short job: C2 would cost more CPU than it saves
            job_path,
            "--archive",
            str(archive),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "clean" in res.stdout
    summary = check_report(out, clean=True)
    assert summary["source"] == "archive"
    assert summary["spark"]["master"] == "local[2]"  # type: ignore[index]


def test_a_missing_data_dir_is_a_usage_error(tmp_path: Path) -> None:
    res = cli("--data-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "r"))
    assert res.returncode == 1
    assert "no such directory" in res.stderr
    assert not (tmp_path / "r").exists()


def test_a_directory_that_is_not_a_fluxmq_data_dir_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    res = cli("--data-dir", str(tmp_path / "photos"), "--out", str(tmp_path / "r"))
    assert res.returncode == 1
    assert "is not a FluxMQ data directory" in res.stderr


def test_a_data_dir_of_record_format_1_is_a_usage_error_naming_fluxmq_migrate(
    tmp_path: Path,
) -> None:
    old = tmp_path / "old"
    old.mkdir()
    env = lmdb.open(str(old), subdir=True, max_dbs=8)
    for name in (b"log", b"logmeta", b"kv"):  # what a format-1 node created
        env.open_db(name)
    env.close()
    res = cli("--data-dir", str(old), "--out", str(tmp_path / "r"))
    assert res.returncode == 1, res.stderr[-3000:]
    assert "record format 1" in res.stderr and "fluxmq migrate --data-dir" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "r").exists()


def test_a_non_empty_out_dir_is_refused_unless_overwrite(
    single_pristine: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "r"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    res = cli("--data-dir", str(single_pristine[0]), "--out", str(out))
    assert res.returncode == 1
    assert "--overwrite" in res.stderr
    assert "checking" not in res.stderr  # refused before any store is read
    assert (out / "keep.txt").read_text() == "mine"


def test_an_archive_without_a_manifest_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    res = cli("--archive", str(tmp_path / "a"), "--out", str(tmp_path / "r"))
    assert res.returncode == 1
    assert "not a FluxMQ audit archive" in res.stderr


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--out", "r"],
        ["--data-dir", "x", "--archive", "y", "--out", "r"],
        ["--data-dir", "x", "--out", "r", "--split-records", "0"],
        ["--bogus"],
    ],
)
def test_bad_arguments_exit_1(args: list[str], tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    res = subprocess.run(
        [sys.executable, "-m", "fluxmq.audit", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        cwd=tmp_path,
    )
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert res.stderr.strip()
