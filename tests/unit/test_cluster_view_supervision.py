"""A background routine of the cluster view that fails on a bug is logged and restarted, so a
node never goes blind to directory, group and placement changes until it restarts."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fluxmq.server import cluster_view


def test_a_failing_cluster_routine_is_logged_and_restarted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cluster_view, "ROUTINE_RESTART_MS", 1)
    runs: list[int] = []

    async def routine() -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise KeyError("a bug in a pass")

    caplog.set_level(logging.ERROR, logger=cluster_view.__name__)
    asyncio.run(asyncio.wait_for(cluster_view._supervised("directory", routine), 5))
    assert runs == [0, 1, 2]
    failures = [r for r in caplog.records if "directory routine failed" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info for r in failures)


def test_a_cancelled_cluster_routine_stops() -> None:
    async def main() -> None:
        task = asyncio.create_task(cluster_view._supervised("leader_record", asyncio.Event().wait))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
