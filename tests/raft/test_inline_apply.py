"""A committed batch is applied on the driver thread when it is small and applies are cheap
(a state without fsync), saving a hand-off to the apply thread and back; slow applies stay on
the apply thread, so the driver never stalls its heartbeats on a disk. Either way every
replica applies the same history, in order."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from raft.api import Entry
from tests.raft.helpers import LocalCluster
from tests.raft.test_replication import (
    assert_same_history,
    payloads,
    propose_each,
    running,
    sole_leader,
)

PROPOSALS = 120  # enough for the moving average of apply cost to settle (weight 1/8)


def _record_threads(
    c: LocalCluster, monkeypatch: pytest.MonkeyPatch, extra_s: float, fsync: bool
) -> list[str]:
    names: list[str] = []
    for sm in c.sms.values():
        original: Callable[[Sequence[Entry]], list[object]] = sm.apply_batch

        def apply_batch(
            entries: Sequence[Entry], _orig: Callable[..., list[object]] = original
        ) -> list[object]:
            names.append(threading.current_thread().name)
            if extra_s:
                time.sleep(extra_s)
            return _orig(entries)

        monkeypatch.setattr(sm, "apply_batch", apply_batch)
    if not fsync:
        monkeypatch.setattr("tests.raft.helpers.os.fsync", lambda fd: None)
    return names


async def test_small_cheap_batches_are_applied_on_the_driver_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        names = _record_threads(c, monkeypatch, extra_s=0.0, fsync=False)
        sent = payloads("i", PROPOSALS)
        await propose_each(leader, sent)
        await c.converged(15.0)
        assert_same_history(c, sent)
        inline = sum(s.batches_applied_inline for s in c.shards.values())
        assert inline > 0, "no batch was applied without the hand-off"
        assert any(not n.startswith("apply-") for n in names), set(names)
        monkeypatch.undo()


async def test_slow_applies_stay_on_the_apply_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        _record_threads(c, monkeypatch, extra_s=0.003, fsync=True)
        before = sum(s.batches_applied_inline for s in c.shards.values())
        sent = payloads("s", PROPOSALS // 4)
        await propose_each(leader, sent)
        await c.converged(15.0)
        assert_same_history(c, sent)
        assert sum(s.batches_applied_inline for s in c.shards.values()) == before
        monkeypatch.undo()


async def test_a_batch_the_state_refuses_inline_is_applied_by_the_apply_thread_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(tmp_path) as c:
        leader = await sole_leader(c)
        _record_threads(c, monkeypatch, extra_s=0.0, fsync=False)
        await propose_each(leader, payloads("w", PROPOSALS))  # applies are cheap by now
        refused: list[str] = []
        for sm in c.sms.values():
            cheap = sm.apply_batch

            def apply_batch(
                entries: Sequence[Entry], _cheap: Callable[..., list[object]] = cheap
            ) -> list[object]:
                if not refused and not threading.current_thread().name.startswith("apply-"):
                    refused.append(threading.current_thread().name)
                    raise OSError("disk full, once")  # rolled back: nothing applied
                return _cheap(entries)

            monkeypatch.setattr(sm, "apply_batch", apply_batch)
        sent = payloads("r", 20)
        await propose_each(leader, sent)
        await c.converged(15.0)
        assert refused, "no batch was tried inline"
        assert_same_history(c, payloads("w", PROPOSALS) + sent)  # once each, in order
        monkeypatch.undo()
