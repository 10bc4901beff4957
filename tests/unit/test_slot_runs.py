"""Pending deliveries stored as runs (keys.SLOT_RUN): a lease of in-order records is one row, the
rows are a function of the state alone (however commands were batched, on every replica), a
reopened store has the state that wrote it, and a store from before runs is rewritten on open."""

from __future__ import annotations

import dataclasses
import random

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import commands, keys
from fluxmq.core.commands.results import LeaseResult, SettleResult
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.core.views import DeliveryView, GroupView
from storage import LmdbStore, Store
from tests.unit.test_delivery import LEASE_MS, Q, make, msg
from tests.unit.test_state_machine import T0, Driver, E, append_cmd
from tests.unit.test_state_machine import store as store  # the fixture: memory and LMDB

SEEDS = range(12)


def run_rows(sm: QueueStateMachine) -> list[tuple[int, int, int, int]]:
    """(partition, first, last, kind) of every stored run."""
    with sm.store.read() as txn:
        out = []
        for key, value in txn.scan(keys.SLOT_RUN):
            _g, p, last = keys.split_slot_key(key)
            kind, _attempt, _due, _lease_id, first = keys.SLOT_RUN_VALUE.unpack_from(value)
            out.append((p, first, last, kind))
        return out


def all_rows(sm: QueueStateMachine) -> list[tuple[bytes, bytes]]:
    with sm.store.read() as txn:
        return [(k, v) for k, v in txn.scan(b"") if k != keys.APPLIED]


def test_leasing_and_acking_in_order_records_costs_one_row(store: Store) -> None:
    q = make(store)
    q.group()
    q.publish(*[msg(b"m%d" % i) for i in range(100)])
    got = q.lease(n=100)
    assert len(got.deliveries) == 100
    assert run_rows(q.sm) == [(0, 0, 99, 1)]
    receipts = q.receipts(got)
    for i in range(10):  # acked one at a time, in order: the run shrinks from its front
        assert q.ack([receipts[i]]) == [pb.RECEIPT_STATUS_ACKED]
        assert run_rows(q.sm) == [(0, i + 1, 99, 1)]
    assert q.ack(receipts[10:]) == [pb.RECEIPT_STATUS_ACKED] * 90
    assert run_rows(q.sm) == []


def test_a_nack_splits_its_run_and_an_ack_of_the_rest_removes_it(store: Store) -> None:
    q = make(store)
    q.group()
    q.publish(*[msg(b"m%d" % i) for i in range(10)])
    receipts = q.receipts(q.lease(n=10))
    assert q.nack([receipts[5]], retry_at=T0 + 50) == [pb.RECEIPT_STATUS_NACKED]
    assert run_rows(q.sm) == [(0, 0, 4, 1), (0, 5, 5, 2), (0, 6, 9, 1)]
    q.extend(receipts[6:], now=T0 + 10)  # a later deadline: still one run, rewritten
    assert run_rows(q.sm) == [(0, 0, 4, 1), (0, 5, 5, 2), (0, 6, 9, 1)]
    q.ack(receipts[:5] + receipts[6:])
    assert run_rows(q.sm) == [(0, 5, 5, 2)]
    assert q.view().scheduled == {5: (T0 + 50, 1)}


def random_commands(q: Q, rng: random.Random, steps: int) -> list[object]:
    """Apply a random mix of publishes, leases, acks, nacks, extends and expiry passes one by
    one, and return the commands (they depend on earlier results, so they are made here)."""
    made: list[object] = []
    held: list[pb.Receipt] = []
    now = T0

    def run(cmd: object) -> object:
        made.append(cmd)
        return q.d.one(cmd)

    for _ in range(steps):
        now += rng.choice((0, 1, 5, 400))
        roll = rng.random()
        base = {"queue": q.name, "queue_id": q.q.queue_id, "group": "g", "now_ms": now}
        if roll < 0.2:
            run(append_cmd(q.q, [msg(b"x", partition=rng.randrange(2))] * rng.randint(1, 30), now))
        elif roll < 0.45:
            res = run(
                cpb.LeaseCmd(
                    consumer_id=rng.choice(("c1", "c2")),
                    max_messages=rng.randint(1, 40),
                    lease_ms=LEASE_MS,
                    **base,  # type: ignore[arg-type]
                )
            )
            assert isinstance(res, LeaseResult)
            held.extend(q.receipts(res))
        elif roll < 0.85 and held:
            rng.shuffle(held) if rng.random() < 0.3 else held.sort(key=lambda r: r.offset)
            k = rng.randint(1, len(held))
            picked, held[:] = held[:k], held[k:]
            kind = rng.random()
            if kind < 0.6:
                res = run(cpb.AckCmd(receipts=picked, **base))  # type: ignore[arg-type]
            elif kind < 0.85:
                res = run(cpb.NackCmd(receipts=picked, **base))  # type: ignore[arg-type]
            else:
                res = run(
                    cpb.ExtendLeaseCmd(receipts=picked, lease_ms=LEASE_MS, **base)  # type: ignore[arg-type]
                )
                held.extend(picked)
            assert isinstance(res, SettleResult)
        else:
            run(cpb.ExpireLeasesCmd(now_ms=now))
    return made


@pytest.mark.parametrize("seed", SEEDS)
def test_runs_do_not_depend_on_how_commands_were_batched(
    seed: int, tmp_path: object, store: Store
) -> None:
    """One replica applies each command in its own batch, another in random batches: they
    store the same rows (the runs are a function of the slots, not of the flushes)."""
    rng = random.Random(seed)
    q = make(store, partitions=2)
    q.group(mode=pb.DELIVERY_MODE_SHARED)
    made = random_commands(q, rng, 120)
    other = Driver(LmdbStore(str(tmp_path) + f"/other-{seed}"))
    other.run(*q_prefix(q))
    at = 0
    while at < len(made):
        k = rng.randint(1, 25)
        other.run(*made[at : at + k])
        at += k
    assert all_rows(other.sm) == all_rows(q.sm), f"seed={seed}"
    assert other.sm.digest() == q.sm.digest(), f"seed={seed}"
    other.sm.store.close()


def q_prefix(q: Q) -> list[object]:
    """The commands that made ``q``'s queue and group (as ``make`` and ``group`` did)."""
    return [
        cpb.CreateQueueCmd(config=q.q.config, now_ms=T0),
        cpb.CreateGroupCmd(
            queue=q.name,
            queue_id=q.q.queue_id,
            group="g",
            mode=pb.DELIVERY_MODE_SHARED,
            now_ms=T0,
        ),
    ]


def comparable(view: DeliveryView) -> dict[int, GroupView]:
    """The groups of ``view`` without their expiry hint: the live heap keeps entries made stale
    by acks and extends until they come up, a reloaded one has none."""
    return {gid: dataclasses.replace(g, expiry_head_ms=None) for gid, g in view.by_id.items()}


@pytest.mark.parametrize("seed", SEEDS)
def test_a_reopened_store_has_the_delivery_state_that_wrote_it(seed: int, tmp_path: object) -> None:
    path = str(tmp_path)
    q = make(LmdbStore(path), partitions=2)
    q.group(mode=pb.DELIVERY_MODE_SHARED)
    random_commands(q, random.Random(seed), 120)
    before = comparable(DeliveryView.of(q.sm.delivery))
    views = {p: q.view(partition=p) for p in (0, 1)}
    q.sm.store.close()
    again = QueueStateMachine(LmdbStore(path))
    assert comparable(DeliveryView.of(again.delivery)) == before, f"seed={seed}"
    g = again.delivery.get(q.q.queue_id, q.name, "g")
    assert {p: again.delivery.view(g, p) for p in (0, 1)} == views, f"seed={seed}"
    again.store.close()


def test_a_store_with_per_offset_slot_rows_is_rewritten_as_runs_on_open(tmp_path: object) -> None:
    path = str(tmp_path)
    q = make(LmdbStore(path), partitions=2)
    q.group(mode=pb.DELIVERY_MODE_SHARED)
    random_commands(q, random.Random(7), 150)
    assert run_rows(q.sm), "the sequence leaves deliveries pending"
    rows, digest = all_rows(q.sm), q.sm.digest()
    views = {p: q.view(partition=p) for p in (0, 1)}
    # Write the pending slots the way stores did before runs: one S/ row per offset.
    with q.sm.store.write() as txn:
        for key, value in list(txn.scan(keys.SLOT_RUN)):
            g, p, last = keys.split_slot_key(key)
            kind, attempt, due, lease_id, first = keys.SLOT_RUN_VALUE.unpack_from(value)
            member = value[keys.SLOT_RUN_VALUE.size :]
            step = 1 if kind == 1 else 0
            for i in range(last - first + 1):
                txn.put(
                    keys.slot_key(g, p, first + i),
                    keys.SLOT_VALUE.pack(kind, attempt, due, lease_id + step * i) + member,
                )
            txn.delete(key)
    q.sm.store.close()
    again = QueueStateMachine(LmdbStore(path))
    with again.store.read() as txn:
        assert list(txn.scan(keys.SLOT)) == []
    assert all_rows(again) == rows
    assert again.digest() == digest
    g = again.delivery.get(q.q.queue_id, q.name, "g")
    assert {p: again.delivery.view(g, p) for p in (0, 1)} == views
    # And it goes on from there: a later command's apply finds the runs where it left them.
    index = again.last_applied_index() + 1
    again.apply_batch([E(index, commands.encode(cpb.ExpireLeasesCmd(now_ms=T0 + 10**9)))])
    assert all(kind == 2 for _p, _f, _l, kind in run_rows(again))
    again.store.close()


def test_the_delivery_rows_bench_counts_one_row_per_in_order_lease_of_100() -> None:
    from bench.delivery_rows import measure

    batched = measure(per_message_ack=False, rounds=2)
    assert (batched["rows_put_per_100"], batched["rows_deleted_per_100"]) == (1, 1)
    one_by_one = measure(per_message_ack=True, rounds=1)  # each ack rewrites the run's row
    assert (one_by_one["rows_put_per_100"], one_by_one["rows_deleted_per_100"]) == (100, 1)
