"""A small durable state machine and an in-process cluster for raft/ tests.

``FileStateMachine`` records every applied payload in an append-only file (fsync'd per batch),
so restarts, replays and snapshots can be checked exactly: the applied sequence must be the same
on every replica and contain every acknowledged payload once.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import socket
import struct
from collections.abc import Sequence

import pytest

from raft import frames
from raft.api import Entry
from raft.driver import RaftDriver
from raft.pysyncobj_shard import PySyncObjShard, RaftTimings, ShardConfig

_REC = struct.Struct(">QI")
SECRET = "test-secret"
FAST = RaftTimings(
    heartbeat_ms=30, election_min_ms=300, election_max_ms=600, leader_fallback_ms=1500
)


class FileStateMachine:
    def __init__(self, path: str) -> None:
        self.path = path
        self.applied: list[tuple[int, bytes]] = []
        self._load()

    def _load(self) -> None:
        self.applied = []
        if not os.path.exists(self.path):
            return
        with open(self.path, "rb") as f:
            data = f.read()
        pos = 0
        while pos + _REC.size <= len(data):
            index, n = _REC.unpack_from(data, pos)
            if pos + _REC.size + n > len(data):
                break  # torn tail of a crash: never acknowledged
            self.applied.append((index, data[pos + _REC.size : pos + _REC.size + n]))
            pos += _REC.size + n

    def last_applied_index(self) -> int:
        return self.applied[-1][0] if self.applied else 0

    def apply_batch(self, entries: Sequence[Entry]) -> list[object]:
        last = self.last_applied_index()
        out: list[object] = []
        buf = bytearray()
        for e in entries:
            if e.index <= last:
                out.append(None)
                continue
            last = e.index
            self.applied.append((e.index, e.payload))
            buf += _REC.pack(e.index, len(e.payload)) + e.payload
            out.append(len(self.applied))
        if buf:
            with open(self.path, "ab") as f:
                f.write(buf)
                f.flush()
                os.fsync(f.fileno())
        return out

    def write_snapshot(self, path: str) -> int:
        shutil.copyfile(self.path, path) if os.path.exists(self.path) else open(path, "wb").close()
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        return self.last_applied_index()

    def install_snapshot(self, path: str) -> None:
        tmp = self.path + ".tmp"
        shutil.copyfile(path, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._load()

    def payloads(self) -> list[bytes]:
        return [p for _, p in self.applied]

    def digest(self) -> str:
        return hashlib.sha256(b"".join(self.payloads())).hexdigest()


def encoded_frame_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every frame encoded from now on (for the rest of the test), in order."""
    sizes: list[int] = []
    real_encode = frames.encode

    def encode(payloads: Sequence[bytes]) -> bytes:
        frame = real_encode(payloads)
        sizes.append(len(frame))
        return frame

    monkeypatch.setattr(frames, "encode", encode)
    return sizes


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def free_port_dialling(peer_address: str, attempts: int = 64) -> int:
    """A free loopback port for a node that dials ``peer_address`` itself.

    pysyncobj opens a connection only towards peers whose address sorts below its own (the
    other side dials the rest), so a node given a random port dials a given peer about one time
    in two. Ports are drawn (each held open, so none repeats) until one sorts above."""
    socks: list[socket.socket] = []
    try:
        for _ in range(attempts):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
            if f"127.0.0.1:{port}" > peer_address:
                return port
    finally:
        for s in socks:
            s.close()
    raise RuntimeError(f"no free port sorting above {peer_address} in {attempts} draws")


class LocalCluster:
    """N replicas of one shard in this process, each with its own directory and driver."""

    idle_wait_ms = 2  # the drivers' longest sleep: short, so tests react fast

    def __init__(self, root: str, n: int = 3, **overrides: object) -> None:
        self.root = root
        self.addresses = [f"127.0.0.1:{p}" for p in free_ports(n)]
        self.overrides = overrides
        self.shards: dict[str, PySyncObjShard] = {}
        self.sms: dict[str, FileStateMachine] = {}
        self.drivers: dict[str, RaftDriver] = {}

    def add_address(self) -> str:
        """A new address (not started): its config lists every address as a peer."""
        address = f"127.0.0.1:{free_ports(1)[0]}"
        self.addresses.append(address)
        return address

    def config(self, address: str, **extra: object) -> ShardConfig:
        i = self.addresses.index(address)
        kwargs: dict[str, object] = {
            "timings": FAST,
            "secret": SECRET,
            **self.overrides,
            **extra,
        }
        return ShardConfig(
            shard_id="s1",
            self_address=address,
            peers=tuple(a for a in self.addresses if a != address),
            data_dir=os.path.join(self.root, f"n{i}"),
            **kwargs,  # type: ignore[arg-type]
        )

    def data_dir(self, address: str) -> str:
        return os.path.join(self.root, f"n{self.addresses.index(address)}")

    async def start(self, address: str, **extra: object) -> PySyncObjShard:
        """Start the replica at ``address``; ``extra`` overrides its config fields."""
        cfg = self.config(address, **extra)
        os.makedirs(cfg.data_dir, exist_ok=True)
        sm = FileStateMachine(os.path.join(cfg.data_dir, "applied.bin"))
        driver = RaftDriver(idle_wait_ms=self.idle_wait_ms, name=f"driver-{address}")
        shard = PySyncObjShard(sm, cfg, driver)
        try:
            await shard.start()
        except BaseException:
            driver.stop()
            raise
        self.shards[address], self.sms[address], self.drivers[address] = shard, sm, driver
        return shard

    async def start_all(self) -> None:
        for a in self.addresses:
            await self.start(a)

    async def stop(self, address: str) -> None:
        shard = self.shards.pop(address)
        await shard.close()
        self.drivers.pop(address).stop()
        self.sms.pop(address)

    async def stop_all(self) -> None:
        for a in list(self.shards):
            await self.stop(a)

    async def leader(self, timeout_s: float = 10.0) -> PySyncObjShard:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            leaders = [s for s in self.shards.values() if s.is_leader]
            if len(leaders) == 1:
                return leaders[0]
            await asyncio.sleep(0.02)
        raise AssertionError(f"no single leader within {timeout_s} s")

    async def converged(self, timeout_s: float = 10.0) -> None:
        """Wait until every running replica applied the same sequence."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            seqs = {tuple(sm.payloads()) for sm in self.sms.values()}
            if len(seqs) == 1:
                return
            await asyncio.sleep(0.05)
        sizes = {a: len(sm.applied) for a, sm in self.sms.items()}
        raise AssertionError(f"replicas did not converge: {sizes}")
