"""An attacker without the cluster secret floods a leader's Raft port of a real 3-replica shard:
one connection declares a frame of 0x7fffffff bytes and keeps sending (at most 64 MiB), and
300 more connect and stay idle. The leader must keep committing through it all, and every one
of the attacker's connections must be closed: the flood at its length prefix, the idle ones at
once beyond the handshake cap or at connect_timeout. (Before the hardening the flood was
buffered on the driver thread and the idle connections stayed open forever.)"""

from __future__ import annotations

import itertools
import os
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.raft.helpers import LocalCluster

FLOOD_BYTES_MAX = 64 << 20
IDLE_CONNECTIONS = 300
ATTACK_S_MAX = 20.0
COMMIT_GAP_S_MAX = 2.0  # the unhardened leader stalled for ~20 s


@dataclass
class Flood:
    sent_bytes: int = 0
    closed_after_s: float | None = None  # when the node closed it, from the first byte


@dataclass
class Idle:
    opened: int = 0
    failed: int = 0
    closed: int = 0
    close_after_s: list[float] = field(default_factory=list)


def flood(address: tuple[str, int], out: Flood, deadline: float) -> None:
    chunk = os.urandom(1 << 20)
    start = time.monotonic()
    with socket.create_connection(address, timeout=5.0) as sock:
        try:
            sock.sendall(struct.pack("<i", 0x7FFFFFFF))
            while out.sent_bytes < FLOOD_BYTES_MAX and time.monotonic() < deadline:
                out.sent_bytes += sock.send(chunk)
            # Everything sent: does the node still hold the connection?
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            if sock.recv(1) == b"":
                out.closed_after_s = time.monotonic() - start
        except (ConnectionError, TimeoutError):
            out.closed_after_s = time.monotonic() - start


def idle(address: tuple[str, int], out: Idle, deadline: float) -> None:
    socks: dict[int, socket.socket] = {}
    opened_at: dict[int, float] = {}
    try:
        for _ in range(IDLE_CONNECTIONS):
            try:
                s = socket.create_connection(address, timeout=5.0)
            except OSError:
                out.failed += 1
                continue
            s.setblocking(False)
            socks[s.fileno()] = s
            opened_at[s.fileno()] = time.monotonic()
            out.opened += 1
        poller = select.poll()
        for fd in socks:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        open_fds = set(socks)
        while open_fds and time.monotonic() < deadline:
            for fd, _event in poller.poll(100):
                try:
                    data = socks[fd].recv(4096)
                except BlockingIOError:
                    continue
                except ConnectionError:
                    data = b""
                if not data:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    out.closed += 1
                    out.close_after_s.append(time.monotonic() - opened_at[fd])
    finally:
        for s in socks.values():
            s.close()


async def test_a_flooded_leader_keeps_committing_and_closes_every_attacker_connection(
    tmp_path: Any,
) -> None:
    cluster = LocalCluster(str(tmp_path), 3)
    await cluster.start_all()
    try:
        leader = await cluster.leader()
        host, port = leader._cfg.self_address.rsplit(":", 1)
        address = (host, int(port))
        for i in range(20):  # warm up: the cluster commits before the attack
            await leader.propose(b"warm-%d" % i)
        term_before = leader.status().term

        deadline = time.monotonic() + ATTACK_S_MAX
        flooded, idled = Flood(), Idle()
        attackers = [
            threading.Thread(target=flood, args=(address, flooded, deadline), daemon=True),
            threading.Thread(target=idle, args=(address, idled, deadline), daemon=True),
        ]
        commits: list[float] = []
        attack_start = time.monotonic()
        for t in attackers:
            t.start()
        i = 0
        while any(t.is_alive() for t in attackers):
            await leader.propose(b"during-%d" % i)
            commits.append(time.monotonic())
            i += 1
        attack_end = time.monotonic()
        for t in attackers:
            t.join()

        # The leader kept committing, with no stall, for the whole attack.
        assert len(commits) >= 20, commits
        marks = [attack_start, *commits, attack_end]
        gaps = [b - a for a, b in itertools.pairwise(marks)]
        assert max(gaps) < COMMIT_GAP_S_MAX, f"commits stalled {max(gaps):.2f} s"
        assert leader.is_leader
        assert leader.status().term == term_before  # no election: the driver never stalled

        # The flood was cut at its length prefix, long before 64 MiB.
        assert flooded.closed_after_s is not None, flooded
        assert flooded.sent_bytes < FLOOD_BYTES_MAX, flooded
        # Every idle connection was closed: beyond the cap at once, the rest at connect_timeout.
        assert idled.opened + idled.failed == IDLE_CONNECTIONS
        assert idled.opened >= IDLE_CONNECTIONS - 10, idled
        assert idled.closed == idled.opened, idled
        timeout_s = leader._cfg.timings.connect_timeout_ms / 1000
        assert max(idled.close_after_s) < timeout_s + 5.0
        assert leader._so is not None and leader._so.transport.handshakes_pending == 0
        assert leader._so.transport.peers_open == 2  # the replicas were never cut off

        await leader.propose(b"after")
        await cluster.converged()
    finally:
        await cluster.stop_all()
