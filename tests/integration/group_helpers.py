"""Member processes and the event-log checker shared by the consumer-group integration tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc

REPO = Path(__file__).resolve().parents[2]


class MemberProcess:
    def __init__(
        self,
        addresses: Sequence[str],
        queue: str,
        group: str,
        consumer: str,
        events: Path,
        session_ms: int = 3000,
        seconds: float = 120,
        api_key: str = "",
    ) -> None:
        self.consumer = consumer
        self.killed_at: float | None = None
        cmd = [
            sys.executable, "-m", "tests.integration.group_member",
            "--addresses", ",".join(addresses), "--queue", queue, "--group", group,
            "--consumer", consumer, "--events", str(events),
            "--session-ms", str(session_ms), "--seconds", str(seconds),
        ]  # fmt: skip
        self.log_path = events.parent / f"{consumer}.log"
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child process owns it
        env = {**os.environ, "FLUXMQ_API_KEY": api_key}
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        # Taken once the process is reaped, not before the signal: a member still running
        # between the two may log a lease after a timestamp taken too early. Nobody else may
        # take its partitions before its session lapses, so this later bound is still strict.
        self.killed_at = time.monotonic()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def wait_for(
    what: str,
    check: Callable[[], bool],
    timeout_s: float = 30.0,
    every_s: float = 0.05,
    show: Callable[[], object] | None = None,
) -> float:
    """Poll ``check`` until true (bounded); -> seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if check():
            return time.monotonic() - start
        time.sleep(every_s)
    state = f"; last state: {show()}" if show is not None else ""
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}{state}")


def describe(stub: queue_pb2_grpc.QueueServiceStub, queue: str, group: str) -> pb.GroupDescription:
    return stub.DescribeGroup(pb.DescribeGroupRequest(queue=queue, group=group), timeout=10)


def settled(desc: pb.GroupDescription, members: int, partitions: int) -> bool:
    """``members`` members, every partition owned, nothing being revoked or waited for."""
    if len(desc.members) != members:
        return False
    owned = sorted(p for m in desc.members for p in m.assigned)
    moving = any(m.revoking or m.pending for m in desc.members)
    return owned == list(range(partitions)) and not moving


def owners(desc: pb.GroupDescription) -> dict[int, str]:
    return {p: m.consumer_id for m in desc.members for p in m.assigned}


def read_events(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _expired_without_touching(
    timeline: list[dict[str, object]], after: int, c: str, p: int
) -> bool:
    """Whether member ``c`` learns later that the broker removed it (``should_rejoin``: its
    session lapsed, say a process starved under load) and got no work from ``p`` meanwhile.
    Its session, and so its ownership, had then ended before another member acquired ``p``
    (the broker refuses an expired member's leases): no partition had two owners."""
    for e in timeline[after + 1 :]:
        if e["c"] != c:
            continue
        if e["ev"] == "should_rejoin":
            return True
        if e["ev"] in ("lease", "release", "acquire") and e.get("p") == p:
            return False
    return False


def check_single_owner(events: list[dict[str, object]], killed: dict[str, float]) -> int:
    """No partition is held by two members at once, and every lease was of a held partition.
    A killed member holds nothing from its kill time on; a member whose session lapsed holds
    nothing from the moment the broker gave its partitions away, and must get no work from
    them until it has rejoined. -> number of ownership changes seen."""
    timeline = sorted(events, key=lambda e: float(e["t"]))  # type: ignore[arg-type]
    for consumer, t in killed.items():
        timeline.append({"t": t, "c": consumer, "ev": "killed"})
    timeline.sort(key=lambda e: float(e["t"]))  # type: ignore[arg-type]
    holder: dict[int, str] = {}
    held_by: dict[str, set[int]] = {}
    lapsed: set[tuple[str, int]] = set()  # (member, partition) it drops on its should_rejoin
    changes = 0
    for i, e in enumerate(timeline):
        c, ev = str(e["c"]), e["ev"]
        if ev == "killed":
            for p in held_by.pop(c, set()):
                holder.pop(p, None)
            continue
        if ev == "acquire":
            p = int(e["p"])  # type: ignore[call-overload]
            old = holder.get(p)
            if old is not None and _expired_without_touching(timeline, i, old, p):
                held_by[old].discard(p)
                lapsed.add((old, p))
                del holder[p]
            assert p not in holder, f"partition {p} acquired by {c} while {holder.get(p)} holds it"
            holder[p] = c
            held_by.setdefault(c, set()).add(p)
            changes += 1
        elif ev == "release":
            p = int(e["p"])  # type: ignore[call-overload]
            if (c, p) in lapsed:
                lapsed.discard((c, p))
                continue
            assert holder.get(p) == c, f"{c} released partition {p} held by {holder.get(p)}"
            del holder[p]
            held_by[c].discard(p)
        elif ev == "lease":
            p = int(e["p"])  # type: ignore[call-overload]
            assert holder.get(p) == c, f"{c} leased from partition {p} held by {holder.get(p)}"
    return changes
