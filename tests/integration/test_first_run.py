"""The Makefile as a new user meets it: ``make run`` installs only the broker, ``make test`` /
``make lint`` everything, in either order; a Python that cannot build the venv is named in one
line before anything is created. Runs the real Makefile in a scratch directory, with a stand-in
``.venv/bin/python`` that records what it was asked to do (no download)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAKE_TIMEOUT_S = 60

RECORDER = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../calls.log"
"""


def scratch(tmp_path: Path, with_venv: bool = True) -> Path:
    work = tmp_path / "repo"
    work.mkdir()
    shutil.copy(REPO / "Makefile", work / "Makefile")
    shutil.copy(REPO / "pyproject.toml", work / "pyproject.toml")
    if with_venv:
        python = work / ".venv" / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(RECORDER)
        python.chmod(0o755)
    return work


def make(
    work: Path, *targets: str, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", f"PYTHON={python}", *targets],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=MAKE_TIMEOUT_S,
    )


def calls(work: Path) -> list[str]:
    log = work / ".venv" / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_make_run_installs_only_the_broker_and_a_full_install_satisfies_it(
    tmp_path: Path,
) -> None:
    work = scratch(tmp_path)
    proc = make(work, "run")
    assert proc.returncode == 0, proc.stderr
    installs = [c for c in calls(work) if "pip install" in c and "--upgrade pip" not in c]
    assert installs == ["-m pip install --quiet -e ."], calls(work)
    assert calls(work)[-1] == "-m fluxmq serve"

    # then the tests' install: every extra, once
    (work / ".venv" / "calls.log").unlink()
    assert make(work, ".venv/.installed").returncode == 0
    assert "-m pip install --quiet -e .[dev,audit]" in calls(work), calls(work)

    # and `make run` again: nothing to install
    (work / ".venv" / "calls.log").unlink()
    assert make(work, "run").returncode == 0
    assert calls(work) == ["-m fluxmq serve"]


def test_make_after_a_full_install_runs_without_installing(tmp_path: Path) -> None:
    """A venv built by `make test` (its stamp newer than pyproject.toml) serves `make run`."""
    work = scratch(tmp_path)
    assert make(work, ".venv/.installed").returncode == 0
    (work / ".venv" / ".installed-run").unlink()  # as a venv built before the run stamp existed
    (work / ".venv" / "calls.log").unlink()
    assert make(work, "run").returncode == 0
    assert calls(work) == ["-m fluxmq serve"]


def fake_python(tmp_path: Path, sitecustomize: str) -> str:
    """This interpreter, made to look like another machine's by a sitecustomize."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sitecustomize)
    return f"env PYTHONPATH={site} {sys.executable}"


def one_line_refusal(proc: subprocess.CompletedProcess[str], work: Path) -> str:
    assert proc.returncode != 0
    ours = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(ours) == 1, proc.stdout
    assert not (work / ".venv").exists(), "nothing is created when the Python cannot build it"
    assert "Traceback" not in proc.stdout + proc.stderr
    return ours[0]


def test_make_names_the_python_version_it_needs(tmp_path: Path) -> None:
    work = scratch(tmp_path, with_venv=False)
    old = fake_python(tmp_path, "import sys\nsys.version_info = (3, 9, 2, 'final', 0)\n")
    line = one_line_refusal(make(work, "run", python=old), work)
    assert "needs Python 3.11 or newer" in line, line


def test_make_names_python3_venv_when_the_venv_module_is_missing(tmp_path: Path) -> None:
    work = scratch(tmp_path, with_venv=False)
    # Debian's python3 without python3-venv: `import ensurepip` fails, so `-m venv` would too.
    no_venv = fake_python(tmp_path, "import sys\nsys.modules['ensurepip'] = None\n")
    line = one_line_refusal(make(work, "run", python=no_venv), work)
    assert "python3-venv" in line, line
