"""The audit on a Spark cluster as the README documents it: a standalone master and two workers
on loopback, `spark-submit --py-files` with the archive `fluxmq-audit --py-files-archive` writes,
and a driver and executors whose Python has the third-party packages but not fluxmq."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest

from fluxmq.audit import job, pyfiles
from fluxmq.audit.job import SparkSettings
from tests.audit import inject
from tests.audit.conftest import Copier
from tests.audit.data import ORDERS
from tests.audit.test_audit_cli import cli
from tests.integration.conftest import free_port

SPARK_HOME = Path(pyspark.__file__).parent
SUBMIT_TIMEOUT_S = 240
CLUSTER_START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 10
OURS = ("fluxmq", "storage", "raft")


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with this one's third-party packages and none of ours: a venv (no system site
    packages) whose one path entry links every site-packages entry but fluxmq's. Installing
    pyspark afresh would cost minutes; what matters is that fluxmq cannot be imported."""
    root = tmp_path_factory.mktemp("bare-python")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    deps = root / "deps"
    deps.mkdir()
    site_dirs = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    for site_dir in site_dirs:
        for entry in os.listdir(site_dir):
            stem = entry.split("-")[0].split(".")[0]
            if stem in OURS or entry.startswith("__editable__") or (deps / entry).exists():
                continue
            (deps / entry).symlink_to(os.path.join(site_dir, entry))
    python = root / "venv" / "bin" / "python"
    venv_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(venv_site) / "deps.pth").write_text(f"{deps}\n")
    probe = subprocess.run(
        [str(python), "-c", f"import {', '.join(pyfiles.THIRD_PARTY)}; import fluxmq"],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert "No module named 'fluxmq'" in probe.stderr, probe.stderr  # the deps import, we do not
    return python


def _archive(tmp_path: Path) -> Path:
    res = cli("--py-files-archive", str(tmp_path / "fluxmq-audit.zip"))
    assert res.returncode == 0, res.stderr
    path = Path(res.stdout.strip())  # printed for --py-files "$(...)"
    assert path == tmp_path / "fluxmq-audit.zip" and zipfile.is_zipfile(path)
    return path


def test_the_archive_holds_every_module_the_audit_imports(
    bare_python: Path, tmp_path: Path
) -> None:
    archive = _archive(tmp_path)
    names = set(zipfile.ZipFile(archive).namelist())
    assert "fluxmq/_pb/v1/queue_pb2.py" in names and "storage/lmdb_inspect.py" in names
    assert not [n for n in names if not n.endswith(".py")]  # no bytecode, no stray files
    # The import graph, walked by Python itself: every module of fluxmq.audit (but the job
    # file, which would run), and what they import of ours, loaded from the archive by a Python
    # that has no fluxmq of its own.
    probe = (
        "import importlib, json, pkgutil, sys\n"
        f"sys.path.insert(0, {str(archive)!r})\n"
        "import fluxmq.audit\n"
        "for m in pkgutil.iter_modules(fluxmq.audit.__path__, 'fluxmq.audit.'):\n"
        "    if m.name != 'fluxmq.audit.__main__':\n"
        "        importlib.import_module(m.name)\n"
        "ours = {n: getattr(m, '__file__', None) for n, m in sys.modules.items()\n"
        f"        if n.split('.')[0] in {OURS!r}}}\n"
        "print(json.dumps(ours))\n"
    )
    res = subprocess.run(
        [str(bare_python), "-c", probe], capture_output=True, text=True, cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr[-3000:]
    loaded = json.loads(res.stdout)
    assert {"fluxmq.audit.job", "fluxmq.audit.source", "fluxmq.audit.rules"} <= set(loaded)
    assert "fluxmq._pb.v1.queue_pb2" in loaded and "storage.lmdb_inspect" in loaded
    outside = {n: f for n, f in loaded.items() if not (f or "").startswith(str(archive))}
    assert outside == {}
    assert {n.split(".")[0] for n in loaded} <= set(pyfiles.PACKAGES)


def test_py_files_archive_needs_one_file_name(tmp_path: Path) -> None:
    for args in (["--py-files-archive"], ["--py-files-archive", str(tmp_path)]):
        res = cli(*args)
        assert res.returncode == 1, res
        assert "--py-files-archive" in res.stderr and "Traceback" not in res.stderr
    res = cli("--py-files-archive", str(tmp_path / "a.zip"), "--out", "x")
    assert res.returncode == 1 and not (tmp_path / "a.zip").exists()


@pytest.mark.parametrize("command", [[], ["export"]])
def test_a_conf_without_equals_is_a_usage_error_naming_it(
    command: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "r"
    res = cli(
        *command,
        "--data-dir",
        str(tmp_path / "n1"),  # missing too: the --conf is what is reported, first
        "--out",
        str(out),
        "--conf",
        "spark.sql.shuffle.partitions=3",
        "--conf",
        "spark.ui.enabled",
    )
    assert res.returncode == 1, res.stderr[-3000:]
    assert "--conf 'spark.ui.enabled'" in res.stderr and "KEY=VALUE" in res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()  # refused before anything started


def test_own_session_has_no_ui_unless_asked_and_spark_submit_settings_stay() -> None:
    own = job.session_conf(SparkSettings(master="local[2]"), None)
    assert own["spark.ui.enabled"] == "false" and own["spark.master"] == "local[2]"
    asked = SparkSettings(conf=(("spark.ui.enabled", "true"), ("spark.ui.port", "4099")))
    assert job.session_conf(asked, None)["spark.ui.enabled"] == "true"
    assert job.session_conf(asked, None)["spark.ui.port"] == "4099"
    submitted = {
        "spark.master": "spark://h:7077",
        "spark.app.name": "nightly",
        "spark.sql.shuffle.partitions": "64",
        "spark.ui.enabled": "false",
    }
    under = job.session_conf(SparkSettings(), submitted)
    assert not set(under) & set(submitted)  # nothing spark-submit was told is replaced
    assert "spark.ui.enabled" not in job.session_conf(SparkSettings(), {})  # Spark's default
    assert under["spark.sql.adaptive.enabled"] == "true"  # the audit's own, where unset
    told = job.session_conf(
        SparkSettings(master="local[1]", conf=(("spark.sql.shuffle.partitions", "5"),)),
        submitted,
    )
    assert told["spark.master"] == "local[1]" and told["spark.sql.shuffle.partitions"] == "5"


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return json.load(resp)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """The process and its children (a worker's executors): they share its process group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[tuple[str, str, list[Path]]]:
    """A master and two workers (one core each) on loopback -> (master URL, its web UI, the
    workers' work directories). The JVMs start while the test does its local run."""
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        # Short-lived JVMs: the C2 compiler would spend more CPU than it saves.
        "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1",
        "SPARK_DAEMON_MEMORY": "256m",
    }
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, ui_port = free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    on_loopback = ["--host", "127.0.0.1"]
    commands = [
        [spark_class, "org.apache.spark.deploy.master.Master", *on_loopback, "--port", str(port)]
    ]
    commands[0] += ["--webui-port", str(ui_port)]
    work_dirs = [tmp_path / f"worker{i}" for i in (1, 2)]
    for work_dir in work_dirs:
        worker = [spark_class, "org.apache.spark.deploy.worker.Worker", master, *on_loopback]
        worker += ["--webui-port", str(free_port()), "--cores", "1", "--memory", "1g"]
        commands.append([*worker, "--work-dir", str(work_dir)])
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, command in enumerate(commands):
            with open(tmp_path / f"spark-daemon-{i}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        command,
                        env=env,
                        cwd=tmp_path,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        yield master, f"http://127.0.0.1:{ui_port}/json/", work_dirs
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _wait_for_workers(master_json: str, tmp_path: Path) -> None:
    deadline = time.monotonic() + CLUSTER_START_TIMEOUT_S
    alive = 0
    while time.monotonic() < deadline:
        try:
            alive = sum(w["state"] == "ALIVE" for w in _json(master_json)["workers"])
        except (OSError, ValueError):
            # ValueError: while the master's web UI is starting, its "/" page (HTML) answers
            # every path until the "/json" handler is attached.
            alive = 0
        if alive == 2:
            return
        time.sleep(0.5)
    logs = "\n".join(p.read_text()[-2000:] for p in sorted(tmp_path.glob("spark-daemon-*.log")))
    raise AssertionError(f"{alive} of 2 workers registered in {CLUSTER_START_TIMEOUT_S} s\n{logs}")


class _UiWatch:
    """Polls a driver's UI (its REST API) while its job runs, for the applications it shows."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/api/v1/applications"
        self.names: list[str] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.is_set():
            try:
                self.names = [app["name"] for app in _json(self.url)]
                return
            except (OSError, ValueError):
                self._done.wait(0.5)

    def stop(self) -> list[str]:
        self._done.set()
        self._thread.join(timeout=STOP_TIMEOUT_S)
        return self.names


def _comparable(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without what differs between two runs of one audit: timings, the master,
    paths; a sample's row order among equal sort keys."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("seconds", "path")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    out: dict[str, Any] = strip(summary)
    out["spark"].pop("master")
    for rule in out["rules"]:
        rule["sample"] = sorted(rule["sample"], key=lambda r: json.dumps(r, sort_keys=True))
    return out


@pytest.mark.slow
def test_spark_submit_with_the_archive_runs_on_the_workers_and_reports_what_a_local_run_does(
    cluster_copy: Copier,
    bare_python: Path,
    standalone: tuple[str, str, list[Path]],
    tmp_path: Path,
) -> None:
    master, master_json, work_dirs = standalone
    dirs = cluster_copy("replicas")
    inject.flip_value_byte(dirs[1], ORDERS, 0, 0)  # findings with rows, not just zero counts
    data_args = [a for d in dirs for a in ("--data-dir", str(d))]

    archive = _archive(tmp_path)
    job_path = cli("--job-path").stdout.strip()
    _wait_for_workers(master_json, tmp_path)
    name = f"fluxmq-audit-{uuid.uuid4().hex[:8]}"
    submit_ui, local_ui = free_port(), free_port()
    jit = "-XX:TieredStopAtLevel=1"  # short-lived JVMs: C2 would cost more CPU than it saves
    cluster_out, local_out = tmp_path / "cluster", tmp_path / "local"
    submit = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--master",
        master,
        "--name",
        name,  # spark-submit's settings stay: the name, the UI it was told to start
        "--conf",
        "spark.ui.enabled=true",
        "--conf",
        f"spark.ui.port={submit_ui}",
        "--conf",
        "spark.port.maxRetries=0",
        # Tasks wait for both executors, so both take some.
        "--conf",
        "spark.scheduler.minRegisteredResourcesRatio=1.0",
        "--driver-java-options",
        jit,
        "--conf",
        f"spark.executor.extraJavaOptions={jit}",
        "--py-files",
        str(archive),
        job_path,
        *data_args,
        "--out",
        str(cluster_out),
        "--shuffle-partitions",
        "2",
        "--conf",
        "spark.executor.memory=600m",  # the job's own --conf: the master sees it
        "--conf",
        "spark.sql.codegen.wholeStage=false",  # less to compile: the data is tiny
    ]
    # Only what a user's shell would hold: no fluxmq on any path, the bare Python for the
    # driver and the executors.
    submit_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYSPARK_", "PYTHON", "SPARK_")) and k != "VIRTUAL_ENV"
    }
    submit_env.update(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1")
    submit_env.update(PYSPARK_PYTHON=str(bare_python), PYSPARK_DRIVER_PYTHON=str(bare_python))
    # The reference, at the same time (each run waits on JVMs and Python workers as much as it
    # computes): fluxmq-audit on local[2] in a session of its own, its UI turned on by --conf.
    local = [
        sys.executable,
        "-m",
        "fluxmq.audit",
        *data_args,
        "--out",
        str(local_out),
        "--master",
        "local[2]",
        "--shuffle-partitions",
        "2",
        "--driver-memory",
        "1g",
        "--conf",
        "spark.ui.enabled=true",
        "--conf",
        f"spark.ui.port={local_ui}",
        "--conf",
        "spark.port.maxRetries=0",
        "--conf",
        f"spark.driver.extraJavaOptions={jit}",
        "--conf",
        "spark.sql.codegen.wholeStage=false",
    ]
    local_env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    local_env["SPARK_LOCAL_IP"] = "127.0.0.1"
    watches = [_UiWatch(submit_ui), _UiWatch(local_ui)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for label, command, env in (("submit", submit, submit_env), ("local", local, local_env)):
            with (
                open(tmp_path / f"{label}.out", "wb") as out,
                open(tmp_path / f"{label}.err", "wb") as err,
            ):
                procs.append(
                    subprocess.Popen(
                        command,
                        env=env,
                        cwd=tmp_path,
                        stdout=out,
                        stderr=err,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + SUBMIT_TIMEOUT_S
        returncodes = [p.wait(timeout=max(0.0, deadline - time.monotonic())) for p in procs]
    finally:
        for proc in procs:
            _stop(proc)
        submit_ui_names, local_ui_names = (w.stop() for w in watches)
    for label, returncode in zip(("submit", "local"), returncodes, strict=True):
        stdout = (tmp_path / f"{label}.out").read_text()
        stderr = (tmp_path / f"{label}.err").read_text()
        assert returncode == 2, (label, stderr[-5000:])  # the flipped byte, found
        assert "FAILED: crc_valid" in stdout, (label, stdout)
    assert submit_ui_names == [name]  # spark-submit's UI and name, not the audit's defaults
    assert local_ui_names == ["fluxmq-audit"]  # --conf turned on the UI the audit keeps off

    # The application ran on the cluster: the master saw it finish, with the job's --conf.
    apps = [a for a in _json(master_json)["completedapps"] if a["name"] == name]
    assert len(apps) == 1, _json(master_json)
    assert apps[0]["state"] == "FINISHED" and apps[0]["memoryperexecutor"] == 600
    # Every worker ran an executor of it, and each executor ran Python tasks (the data source
    # reading the stores, with fluxmq from the archive shipped beside it).
    for work_dir in work_dirs:
        executors = sorted((work_dir / apps[0]["id"]).iterdir())
        assert executors and all((e / archive.name).is_file() for e in executors)
        logs = "".join((e / "stderr").read_text() for e in executors)
        assert "Starting Python task execution" in logs, logs[-3000:]

    on_cluster = json.loads((cluster_out / "summary.json").read_text())
    on_local = json.loads((local_out / "summary.json").read_text())
    assert on_cluster["spark"]["master"] == master and on_local["spark"]["master"] == "local[2]"
    assert on_cluster["violations"] > 0
    assert _comparable(on_cluster) == _comparable(on_local)
