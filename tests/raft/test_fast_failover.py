"""A follower whose leader's connection closes campaigns at once (raft/_pysyncobj.py hook 5)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from raft.pysyncobj_shard import RaftTimings
from tests.raft.helpers import LocalCluster

# An election timeout far above the fast window (50-250 ms): without the hook the survivors
# wait at least SLOW_ELECTION_MS after the leader's last heartbeat.
SLOW_ELECTION_MS = 8000
TIMINGS = RaftTimings(
    heartbeat_ms=50,
    election_min_ms=SLOW_ELECTION_MS,
    election_max_ms=SLOW_ELECTION_MS + 1000,
    leader_fallback_ms=30_000,
    connect_timeout_ms=SLOW_ELECTION_MS + 1000,  # pysyncobj wants it above the election timeout
)


async def test_followers_elect_a_new_leader_at_once_when_the_leaders_connection_closes(
    tmp_path: Path,
) -> None:
    c = LocalCluster(str(tmp_path), timings=TIMINGS)
    try:
        await c.start_all()
        old = await c.leader(timeout_s=3 * SLOW_ELECTION_MS / 1000)
        await old.propose(b"before")
        loop = asyncio.get_running_loop()
        await c.stop(old.address)  # its sockets close, as a killed process's do
        closed_at = loop.time()
        new = await c.leader(timeout_s=SLOW_ELECTION_MS / 1000 / 2)
        elected_s = loop.time() - closed_at
        assert new.address != old.address
        assert elected_s < SLOW_ELECTION_MS / 1000 / 2, elected_s
        await new.propose(b"after")
        await c.converged()
        assert all(sm.payloads() == [b"before", b"after"] for sm in c.sms.values())
    finally:
        await c.stop_all()
