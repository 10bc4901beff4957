"""What delivery costs the state machine, without the network: a queue of one partition, one
checked-out consumer (credit 500), and rounds of "append 100 messages (the apply leases them to
the consumer), then ack them": in one Ack of 100, or one Ack per message. Per 100 messages it
prints the apply time (LMDB, each command its own transaction; without fsync unless ``--sync``:
the fsync is shared by a whole round and swamps the difference on this machine) and the delivery
rows written and deleted (``keys.SLOT_RUN`` and ``keys.SLOT``).

    python -m bench.delivery_rows [--rounds 60] [--sync]

Run from another checkout (``PYTHONPATH=<worktree> python <this file>``) it measures that
checkout's state machine: the before/after of a change to how delivery state is stored.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import commands
from fluxmq.core.delivery import Push
from fluxmq.core.partitioner import prepare_append
from fluxmq.core.queue_config import normalize_new, policy_of
from fluxmq.core.state_machine import QueueStateMachine
from storage import LmdbStore

T0_MS = 1_700_000_000_000
# keys.SLOT_RUN, and keys.SLOT (the per-offset rows of older versions), spelled out so that
# the file also runs against a checkout that has no SLOT_RUN
ROW_PREFIXES = (b"U/", b"S/")


@dataclass(frozen=True)
class _Entry:
    index: int
    payload: bytes


class _CountingTxn:
    def __init__(self, txn: Any, counts: dict[str, int]) -> None:
        self._txn = txn
        self._counts = counts

    def put(self, key: bytes, value: bytes) -> None:
        if key.startswith(ROW_PREFIXES):
            self._counts["rows_put"] += 1
        self._txn.put(key, value)

    def delete(self, key: bytes) -> bool:
        if key.startswith(ROW_PREFIXES):
            self._counts["rows_deleted"] += 1
        return bool(self._txn.delete(key))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


class _CountingStore(LmdbStore):
    def __init__(self, path: str, sync: bool) -> None:
        super().__init__(path, sync=sync)
        self.counts = {"rows_put": 0, "rows_deleted": 0}

    @contextlib.contextmanager
    def write(self) -> Iterator[Any]:  # type: ignore[override]
        with super().write() as txn:
            yield _CountingTxn(txn, self.counts)


def measure(per_message_ack: bool, rounds: int, sync: bool = False) -> dict[str, float]:
    path = tempfile.mkdtemp(prefix="fluxmq-delivery-rows-")
    store = _CountingStore(path, sync)
    sm = QueueStateMachine(store)
    index = 0
    pushes: list[Push] = []
    sm.commit_listener = lambda _logs, _groups, p: pushes.extend(p)

    def one(cmd: object) -> object:
        nonlocal index
        index += 1
        return sm.apply_batch([_Entry(index, commands.encode(cmd))])[0]

    config = normalize_new(pb.QueueConfig(name="q", partitions=1, type=pb.QUEUE_TYPE_WORK))
    queue = one(cpb.CreateQueueCmd(config=config, now_ms=T0_MS))
    assert isinstance(queue, pb.Queue), queue
    group = one(cpb.CreateGroupCmd(queue="q", queue_id=queue.queue_id, group="g", now_ms=T0_MS))
    assert isinstance(group, pb.Group), group
    one(
        cpb.CheckoutCmd(
            queue="q", queue_id=queue.queue_id, group="g", consumer_id="c", max_in_flight=500,
            lease_ms=30_000, session_id=1, member=cpb.MemberRef(), now_ms=T0_MS,
        )
    )  # fmt: skip
    policy = policy_of(queue.config)
    messages = [pb.PublishMessage(value=b"x" * 256) for _ in range(100)]
    store.counts.update(rows_put=0, rows_deleted=0)
    start = time.perf_counter()
    for k in range(rounds):
        now_ms = T0_MS + 1 + k
        pushes.clear()
        one(prepare_append("q", queue.queue_id, policy, messages, 0, now_ms).command)
        deliveries = [d for p in pushes for d in p.deliveries]
        assert len(deliveries) == 100, len(deliveries)
        receipts = [
            pb.Receipt(
                partition=d.partition, offset=d.record.offset, attempt=d.attempt,
                lease_deadline_ms=d.deadline_ms, lease_id=d.lease_id, group_id=group.group_id,
            )
            for d in deliveries
        ]  # fmt: skip
        batches = [[r] for r in receipts] if per_message_ack else [receipts]
        for batch in batches:
            one(cpb.AckCmd(queue="q", queue_id=queue.queue_id, group="g", receipts=batch,
                           now_ms=now_ms))  # fmt: skip
    elapsed_ms = (time.perf_counter() - start) * 1000
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    return {
        "apply_ms_per_100": elapsed_ms / rounds,
        "rows_put_per_100": store.counts["rows_put"] / rounds,
        "rows_deleted_per_100": store.counts["rows_deleted"] / rounds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=60, help="rounds of 100 messages (ack of 100)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each; the fastest is shown")
    p.add_argument("--sync", action="store_true", help="fsync every commit (as a node does)")
    args = p.parse_args()
    for per_message, rounds in ((False, args.rounds), (True, max(1, args.rounds // 4))):
        runs = [measure(per_message, rounds, args.sync) for _ in range(args.repeats)]
        best = min(runs, key=lambda r: r["apply_ms_per_100"])
        what = "one Ack per message" if per_message else "one Ack of 100"
        print(
            f"{what}: apply {best['apply_ms_per_100']:.2f} ms per 100 messages, delivery rows "
            f"{best['rows_put_per_100']:.0f} written and {best['rows_deleted_per_100']:.0f} "
            "deleted per 100"
        )


if __name__ == "__main__":
    main()
