"""Broker data made once per test session (single node and three replicas), copied per test."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.audit.data import build_cluster, build_single

Copier = Callable[[str], list[Path]]

# The audits here are seconds long: the JVM's C2 compiler costs more CPU than it saves (about
# a fifth of each test's time on these 2-core machines). PySpark passes these arguments to the
# spark-submit that starts the driver JVM of a local session: in this process and in the
# fluxmq-audit processes the tests start (they inherit the environment). The audit's own
# settings are untouched; a PYSPARK_SUBMIT_ARGS of the caller's own is kept.
os.environ.setdefault(
    "PYSPARK_SUBMIT_ARGS", "--driver-java-options -XX:TieredStopAtLevel=1 pyspark-shell"
)


def _copier(pristine: list[Path], tmp_path: Path) -> Copier:
    def copy(label: str) -> list[Path]:
        out = []
        for src in pristine:
            dst = tmp_path / label / src.name
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("lock.mdb", "raft"))
            out.append(dst)
        return out

    return copy


@pytest.fixture(scope="session")
def single_pristine(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_single(tmp_path_factory.mktemp("audit-single"))


@pytest.fixture(scope="session")
def cluster_pristine(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_cluster(tmp_path_factory.mktemp("audit-cluster"))


@pytest.fixture
def single_copy(single_pristine: list[Path], tmp_path: Path) -> Copier:
    return _copier(single_pristine, tmp_path)


@pytest.fixture
def cluster_copy(cluster_pristine: list[Path], tmp_path: Path) -> Copier:
    return _copier(cluster_pristine, tmp_path)
