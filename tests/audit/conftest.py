"""Broker data made once per test session (single node and three replicas), copied per test."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.audit.data import build_cluster, build_single

Copier = Callable[[str], list[Path]]


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
