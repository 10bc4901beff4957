"""A node's shard processes as one another see them, and how the front end picks one per call.

A single node with ``shard_processes`` = N > 1 runs N local shards, one per shard process, each
with its own store. A queue lives in one of them: the one its name hashes to when it was
created (``home_process``), or wherever its shard process reports it. Each shard process
reports the queues of its shards to the front end whenever they change, before it answers the
call that changed them; the front end keeps the table (``QueueTable``), routes each call by the
queue it names, and passes every report on to the other shard processes (``Siblings``), so a
call that still reaches the wrong one (a stream's later requests, a name in another
environment's words) is forwarded once, through the front end's internal socket, to the one
that has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
from collections.abc import AsyncIterator, Iterable, Mapping

from fluxmq.config import SHARD_PROCESSES_MAX
from fluxmq.server.shard_process.frames import FrameError

# Metadata of a call the front end takes on its internal socket: the shard process to serve it.
TARGET_PROCESS_KEY = "x-fluxmq-shard-process"
# A forwarding address names its process after this mark: "unix:/run/x/front.sock#2".
_PROCESS_MARK = "#"
QUEUE_NAMES_MAX = 1_000_000  # in one report: far beyond any catalog, short of a runaway frame

Report = dict[str, list[str]]  # shard id -> the queue names of its catalog


def home_process(queue: str, count: int) -> int:
    """The shard process a new queue named ``queue`` is created in: a stable hash of its name
    (the same in the front end and in every shard process, and across restarts).

    >>> [home_process(name, 2) for name in ("orders", "payments", "audit", "events")]
    [0, 0, 1, 0]
    """
    return zlib.crc32(queue.encode("utf-8")) % count if count > 1 else 0


def group_process(group_id: str, count: int, home_group: str = "") -> int:
    """The shard process of a cluster node that runs replication group ``group_id``: the home
    group's is the first; groups numbered by provisioning (g1, g2, ...) take the processes in
    turn, others go by a hash of their id (the same answer in every process, every restart).

    >>> [group_process(g, 2, "g1") for g in ("g1", "g2", "g3", "g4")]
    [0, 1, 0, 1]
    """
    if count < 2 or group_id == home_group:
        return 0
    if group_id[:1] == "g" and group_id[1:].isdigit():
        return (int(group_id[1:]) - 1) % count
    return zlib.crc32(group_id.encode("utf-8")) % count


def local_shard_id(index: int) -> str:
    """The id of shard process ``index``'s local shard ("local" for the first, as a node in
    one process calls its shard)."""
    return "local" if index == 0 else f"local-{index}"


def local_shard_index(shard_id: str) -> int | None:
    """The shard process of local shard ``shard_id`` (None: not a local shard's id).

    >>> local_shard_index("local"), local_shard_index("local-3"), local_shard_index("g1")
    (0, 3, None)
    """
    if shard_id == "local":
        return 0
    prefix, _, number = shard_id.partition("-")
    return int(number) if prefix == "local" and number.isdigit() and number[0] != "0" else None


def sibling_address(socket_path: str, index: int) -> str:
    return f"unix:{socket_path}{_PROCESS_MARK}{index}"


def split_address(address: str) -> tuple[str, int | None]:
    """-> (the gRPC target, the shard process named after it or None)."""
    target, mark, index = address.rpartition(_PROCESS_MARK)
    if not mark or not address.startswith("unix:") or not index.isdigit():
        return address, None
    return target, int(index)


def encode_report(report: Mapping[str, Iterable[str]], index: int | None = None) -> bytes:
    body: dict[str, object] = {"shards": {k: sorted(v) for k, v in report.items()}}
    if index is not None:
        body["process"] = index
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def decode_report(payload: bytes | memoryview) -> tuple[int | None, Report]:
    """-> (the process it is about, when the front end passes it on; its shards' queues)."""
    try:
        body = json.loads(bytes(payload))
        shards = body["shards"]
        index = body.get("process")
        if not isinstance(shards, dict) or not (index is None or isinstance(index, int)):
            raise TypeError("bad report")
        report = {str(k): [str(n) for n in v] for k, v in shards.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise FrameError(f"bad queue report: {err}") from None
    if sum(len(v) for v in report.values()) > QUEUE_NAMES_MAX:
        raise FrameError("queue report beyond its limit")
    return index, report


class QueueTable:
    """Which shard process holds which queue, from their reports (the front end's table)."""

    def __init__(self, count: int) -> None:
        assert 1 <= count <= SHARD_PROCESSES_MAX, count
        self.count = count
        self._owner: dict[str, int] = {}
        self.reports: list[Report] = [{} for _ in range(count)]

    def update(self, index: int, report: Report) -> None:
        for names in self.reports[index].values():
            for name in names:
                if self._owner.get(name) == index:
                    del self._owner[name]
        self.reports[index] = report
        for names in report.values():
            for name in names:
                self._owner[name] = index

    def process_of(self, queue: str) -> int:
        """Where a call about ``queue`` goes: where it is, else where it would be created."""
        found = self._owner.get(queue)
        return home_process(queue, self.count) if found is None else found


class Siblings:
    """A shard process's view of the others: which holds which queue, and how to reach each
    (the front end's internal socket, naming the process)."""

    def __init__(self, index: int, count: int, socket_path: str, home_group: str = "") -> None:
        assert 0 <= index < count <= SHARD_PROCESSES_MAX, (index, count)
        self.index = index
        self.count = count
        self.home_group = home_group  # a cluster node's home group ("": a single node)
        self._socket_path = socket_path
        self._owner: dict[str, tuple[int, str]] = {}
        self._reports: dict[int, Report] = {}

    def others(self) -> list[int]:
        return [i for i in range(self.count) if i != self.index]

    def address_of(self, index: int) -> str:
        return sibling_address(self._socket_path, index)

    def update(self, index: int, report: Report) -> None:
        if index == self.index or not 0 <= index < self.count:
            return
        for names in self._reports.get(index, {}).values():
            for name in names:
                if self._owner.get(name, (None, ""))[0] == index:
                    del self._owner[name]
        self._reports[index] = report
        for shard_id, names in report.items():
            for name in names:
                self._owner[name] = (index, shard_id)

    def process_of_group(self, group_id: str) -> int:
        return group_process(group_id, self.count, self.home_group)

    def owns_group(self, group_id: str) -> bool:
        return self.process_of_group(group_id) == self.index

    def owner(self, queue: str) -> tuple[int, str] | None:
        """(shard process, shard id) of another shard process's queue (None: none has it)."""
        return self._owner.get(queue)


class NameLocks:
    """One holder at a time per name (the first shard process placing a new queue); a name's
    lock is dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(name, (asyncio.Lock(), 0))
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)
