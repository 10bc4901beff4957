"""Delivery scenarios as text files (etcd-raft's ``testdata/`` style): commands in, what the
applies assigned and the group's state out, reviewed as a diff.

Each file in ``testdata/delivery/`` is a list of blocks::

    <command> <args...>
    ----
    <what it printed>

separated by blank lines. The runner applies each command to a fresh state machine (memory
and LMDB stores alike) and compares what it prints. ``FLUXMQ_REWRITE=1 pytest ...`` writes the
actual output into the files instead (then review ``git diff``).

Commands (the clock starts at 1000 ms and moves only with ``tick``):

- ``queue <name> [partitions=N] [max_attempts=N] [lease_ms=N]`` (a work queue)
- ``group <queue> <group> [ordered]``
- ``publish <queue> <n> [partition=P]``: n messages ``m1``, ``m2``, ... (numbered per queue)
- ``checkout <queue> <group> <consumer> window=N [lease_ms=N] [session=N]``
- ``checkin <queue> <group> <consumer> session=N``
- ``lease <queue> <group> <consumer> <n>``: a Lease poll
- ``ack <queue> <group> <consumer> [<n>|all]`` / ``nack ... [retry_ms=N]``: the consumer's oldest
  leases
- ``tick <ms>``, ``expire``: the leader's expiry pass at the current time
- ``restart``: a new state machine on the same store (what a replica rebuilds from disk)
- ``dump <queue> <group>``: checkouts, and per partition the committed offset, the frontier
  and every slot

Every command prints what it returned (refusals as ``error REASON``) and every push
(``push <consumer>#<session>: <partition>/<offset>=<value> a<attempt> d<deadline>``,
``revoked <consumer>#<session>: REASON``, or ``end <consumer>#<session>``: checked in, the
stream ends after what it was sent).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.commands.results import ExpireResult, LeaseResult, SettleResult
from fluxmq.core.delivery import Delivery, Push
from fluxmq.core.errors import FluxError
from fluxmq.core.queue_config import normalize_new
from fluxmq.core.state_machine import QueueStateMachine
from storage import LmdbStore, MemoryStore, Store
from tests.unit.test_state_machine import Driver, append_cmd

TESTDATA = Path(__file__).parent / "testdata" / "delivery"
SEPARATOR = "----"
START_MS = 1000  # the clock at the start (a command without a time assigns nothing)


def parse(text: str) -> list[tuple[str, str, str]]:
    """-> [(comment lines, command line, expected output)]"""
    blocks: list[tuple[str, str, str]] = []
    for chunk in text.strip("\n").split("\n\n"):
        if not chunk.strip():
            continue
        lines = chunk.split("\n")
        comments = []
        while lines and lines[0].startswith("#"):
            comments.append(lines.pop(0))  # a comment before the command
        assert len(lines) >= 2 and lines[1] == SEPARATOR, f"malformed block:\n{chunk}"
        blocks.append(("\n".join(comments), lines[0], "\n".join(lines[2:])))
    return blocks


class Scenario:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.d = Driver(store)
        self.now = START_MS
        self.pushes: list[Push] = []
        self.queues: dict[str, pb.Queue] = {}
        self.published: dict[str, int] = {}
        # (queue, group, consumer) -> receipts the consumer holds, oldest first
        self.held: dict[tuple[str, str, str], list[pb.Receipt]] = {}
        self.group_ids: dict[int, tuple[str, str]] = {}
        self.listen()

    def listen(self) -> None:
        self.d.sm.commit_listener = lambda _l, _g, pushes: self.pushes.extend(pushes)

    def run(self, line: str) -> str:
        words = line.split()
        op, args = words[0], words[1:]
        pos = [a for a in args if "=" not in a]
        kw = {k: int(v) for k, v in (a.split("=", 1) for a in args if "=" in a)}
        out = getattr(self, "do_" + op)(pos, kw)
        lines = [out] if out else []
        lines += self.take_pushes()
        return "\n".join(lines)

    def cmd(self, command: object) -> object:
        return self.d.one(command)

    # -- printing ---------------------------------------------------------------------------

    def fmt(self, x: Delivery) -> str:
        return (
            f"{x.partition}/{x.record.offset}={x.record.value.decode()} a{x.attempt} "
            f"d{x.deadline_ms}"
        )

    def take_pushes(self) -> list[str]:
        pushes, self.pushes = self.pushes, []
        out = []
        for push in pushes:
            queue, group = self.group_ids[push.group_id]
            who = f"{push.consumer_id}#{push.session_id}"
            if push.error is not None:
                out.append(f"revoked {who}: {push.error.reason}")
                continue
            if push.end:
                out.append(f"end {who}")
                continue
            self.hold(queue, group, push.consumer_id, push.group_id, push.deliveries)
            out.append(f"push {who}: " + ", ".join(self.fmt(x) for x in push.deliveries))
        return out

    def hold(
        self, queue: str, group: str, consumer: str, group_id: int, got: tuple[Delivery, ...]
    ) -> None:
        held = self.held.setdefault((queue, group, consumer), [])
        for x in got:
            held.append(
                pb.Receipt(
                    partition=x.partition,
                    offset=x.record.offset,
                    attempt=x.attempt,
                    lease_deadline_ms=x.deadline_ms,
                    lease_id=x.lease_id,
                    group_id=group_id,
                )
            )

    @staticmethod
    def result(res: object) -> str:
        if isinstance(res, FluxError):
            return f"error {res.reason}"
        return ""

    # -- commands ---------------------------------------------------------------------------

    def do_queue(self, pos: list[str], kw: dict[str, int]) -> str:
        name = pos[0]
        cfg = pb.QueueConfig(
            name=name,
            type=pb.QUEUE_TYPE_WORK,
            partitions=kw.get("partitions", 1),
            max_attempts=kw.get("max_attempts", 0),
        )
        if "lease_ms" in kw:
            cfg.lease_timeout = f"{kw['lease_ms']}ms"
        res = self.cmd(cpb.CreateQueueCmd(config=normalize_new(cfg), now_ms=self.now))
        assert isinstance(res, pb.Queue), res
        self.queues[name] = res
        return ""

    def do_group(self, pos: list[str], kw: dict[str, int]) -> str:
        q = self.queues[pos[0]]
        mode = pb.DELIVERY_MODE_ORDERED if "ordered" in pos[2:] else pb.DELIVERY_MODE_SHARED
        res = self.cmd(
            cpb.CreateGroupCmd(
                queue=pos[0], queue_id=q.queue_id, group=pos[1], mode=mode, now_ms=self.now
            )
        )
        assert isinstance(res, pb.Group), res
        self.group_ids[res.group_id] = (pos[0], pos[1])
        return ""

    def do_publish(self, pos: list[str], kw: dict[str, int]) -> str:
        q = self.queues[pos[0]]
        msgs = []
        for _ in range(int(pos[1])):
            n = self.published[pos[0]] = self.published.get(pos[0], 0) + 1
            msgs.append(pb.PublishMessage(value=b"m%d" % n, partition=kw.get("partition", 0)))
        return self.result(self.cmd(append_cmd(q, msgs, self.now)))

    def do_checkout(self, pos: list[str], kw: dict[str, int]) -> str:
        q = self.queues[pos[0]]
        res = self.cmd(
            cpb.CheckoutCmd(
                queue=pos[0],
                queue_id=q.queue_id,
                group=pos[1],
                consumer_id=pos[2],
                max_in_flight=kw["window"],
                lease_ms=kw.get("lease_ms", 1000),
                session_id=kw.get("session", 1),
                now_ms=self.now,
            )
        )
        return self.result(res)

    def do_checkin(self, pos: list[str], kw: dict[str, int]) -> str:
        q = self.queues[pos[0]]
        cmd = cpb.CheckinCmd(queue=pos[0], queue_id=q.queue_id)
        cmd.consumers.add(group=pos[1], consumer_id=pos[2], session_id=kw["session"])
        return f"ended {self.cmd(cmd)}"

    def do_lease(self, pos: list[str], kw: dict[str, int]) -> str:
        q = self.queues[pos[0]]
        res = self.cmd(
            cpb.LeaseCmd(
                queue=pos[0],
                queue_id=q.queue_id,
                group=pos[1],
                consumer_id=pos[2],
                max_messages=int(pos[3]),
                lease_ms=kw.get("lease_ms", 1000),
                now_ms=self.now,
            )
        )
        if not isinstance(res, LeaseResult):
            return self.result(res)
        self.hold(pos[0], pos[1], pos[2], res.group_id, tuple(res.deliveries))
        return "leased " + (", ".join(self.fmt(x) for x in res.deliveries) or "nothing")

    def _settle(self, pos: list[str]) -> tuple[pb.Queue, list[pb.Receipt]]:
        held = self.held.get((pos[0], pos[1], pos[2]), [])
        n = len(held) if len(pos) < 4 or pos[3] == "all" else int(pos[3])
        taken, held[:] = held[:n], held[n:]
        return self.queues[pos[0]], taken

    def do_ack(self, pos: list[str], kw: dict[str, int]) -> str:
        q, receipts = self._settle(pos)
        res = self.cmd(
            cpb.AckCmd(
                queue=pos[0], queue_id=q.queue_id, group=pos[1], receipts=receipts, now_ms=self.now
            )
        )
        return self.settled("acked", receipts, res)

    def do_nack(self, pos: list[str], kw: dict[str, int]) -> str:
        q, receipts = self._settle(pos)
        res = self.cmd(
            cpb.NackCmd(
                queue=pos[0],
                queue_id=q.queue_id,
                group=pos[1],
                receipts=receipts,
                now_ms=self.now,
                retry_at_ms=self.now + kw.get("retry_ms", 0) if "retry_ms" in kw else 0,
            )
        )
        return self.settled("nacked", receipts, res)

    def settled(self, what: str, receipts: list[pb.Receipt], res: object) -> str:
        if not isinstance(res, SettleResult):
            return self.result(res)
        names = {v: k for k, v in pb.ReceiptStatus.items()}
        return f"{what} " + " ".join(
            f"{r.partition}/{r.offset}:{names[s].removeprefix('RECEIPT_STATUS_')}"
            for r, s in zip(receipts, res.statuses, strict=True)
        )

    def do_tick(self, pos: list[str], kw: dict[str, int]) -> str:
        self.now += int(pos[0])
        return f"now {self.now}"

    def do_expire(self, pos: list[str], kw: dict[str, int]) -> str:
        res = self.cmd(cpb.ExpireLeasesCmd(now_ms=self.now))
        assert isinstance(res, ExpireResult), res
        return f"expired {res.expired_leases}"

    def do_restart(self, pos: list[str], kw: dict[str, int]) -> str:
        self.d.sm = QueueStateMachine(self.store)
        self.listen()
        return ""

    def do_dump(self, pos: list[str], kw: dict[str, int]) -> str:
        q = self.queues[pos[0]]
        g = self.d.sm.delivery.get(q.queue_id, pos[0], pos[1])
        out = []
        for consumer_id, co in sorted(g.checkouts.items()):
            held = g.in_flight_by_member.get(consumer_id, 0)
            out.append(
                f"checkout {consumer_id}#{co.session_id} window={co.max_in_flight} "
                f"held={held} lease_ms={co.lease_ms}"
            )
        for p in range(q.config.partitions):
            v = self.d.sm.delivery.view(g, p)
            slots = [
                f"{o}:leased({m},a{a},d{d})" for o, (m, _lid, a, d) in sorted(v.leased.items())
            ] + [f"{o}:scheduled(a{a},due{d})" for o, (d, a) in sorted(v.scheduled.items())]
            out.append(
                f"p{p} committed={v.committed} next={v.next} acked={v.acked} "
                + (" ".join(slots) or "no slots")
            )
        return "\n".join(out)


def scenarios() -> list[Path]:
    return sorted(TESTDATA.glob("*.txt"))


@pytest.fixture(params=["memory", "lmdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else LmdbStore(str(tmp_path / "db"))
    yield s
    s.close()


@pytest.mark.parametrize("path", scenarios(), ids=lambda p: p.stem)
def test_delivery_scenario(path: Path, store: Store) -> None:
    blocks = parse(path.read_text())
    scenario = Scenario(store)
    actual = [(comments, line, scenario.run(line)) for comments, line, _ in blocks]
    if os.environ.get("FLUXMQ_REWRITE"):
        text = "\n\n".join(
            (f"{comments}\n" if comments else "") + f"{line}\n{SEPARATOR}\n{out}".rstrip("\n")
            for comments, line, out in actual
        )
        path.write_text(text + "\n")
        return
    for (_, line, want), (_, _, got) in zip(blocks, actual, strict=True):
        assert got == want, f"{path.name}: {line}\n--- want\n{want}\n--- got\n{got}"


def test_there_are_scenarios() -> None:
    assert len(scenarios()) >= 4
