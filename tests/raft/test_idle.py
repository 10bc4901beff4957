"""An idle shard sleeps until its next timer: the driver wakes for heartbeats and their answers,
not on a fixed short period (issue 22: an idle cluster uses under 1% of a core per node)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from raft.pysyncobj_shard import RaftTimings
from tests.raft.helpers import LocalCluster

TIMINGS = RaftTimings(heartbeat_ms=100)  # production timings, heartbeats every 100 ms


async def test_an_idle_shard_wakes_for_its_timers_and_messages_only(tmp_path: Path) -> None:
    c = LocalCluster(str(tmp_path), timings=TIMINGS)
    c.idle_wait_ms = 200  # the production default
    try:
        await c.start_all()
        leader = await c.leader(timeout_s=15)
        await leader.propose(b"settle")
        await c.converged()
        await asyncio.sleep(0.5)
        before = {a: d.rounds for a, d in c.drivers.items()}
        await asyncio.sleep(2.0)
        per_s = {a: (c.drivers[a].rounds - before[a]) / 2.0 for a in c.drivers}
        # A leader: 10 heartbeats a second and their 20 answers; a follower: 10 heartbeats.
        # A fixed 5 ms poll (what this replaced) is 200+ rounds a second on every replica.
        assert 20 <= per_s[leader.address] <= 60, per_s  # heartbeats on time, nothing more
        assert all(r <= 40 for a, r in per_s.items() if a != leader.address), per_s
        assert leader.is_leader, "heartbeats still flow: the leader kept its followers"
    finally:
        await c.stop_all()


async def test_the_next_timer_is_the_heartbeat_on_a_leader_and_the_election_on_a_follower(
    tmp_path: Path,
) -> None:
    c = LocalCluster(str(tmp_path), timings=TIMINGS)
    try:
        await c.start_all()
        leader = await c.leader(timeout_s=15)
        follower = next(s for s in c.shards.values() if s is not leader)

        def timers() -> tuple[float, float]:
            assert leader.syncobj is not None and follower.syncobj is not None
            return leader.syncobj.fx_next_timer_s(), follower.syncobj.fx_next_timer_s()

        lead_s, follow_s = await asyncio.wrap_future(leader.driver.call(lambda: timers()))
        assert 0 <= lead_s <= TIMINGS.heartbeat_ms / 1000
        assert 0 <= follow_s <= TIMINGS.election_max_ms / 1000
    finally:
        await c.stop_all()


async def test_a_message_handled_after_the_tick_decided_asks_for_another_round_at_once(
    tmp_path: Path,
) -> None:
    """pysyncobj's tick ends by polling the sockets itself; an acknowledgement handled there
    arrived after the tick computed the commit index, so the driver must not sleep until the
    next heartbeat before ticking again (the stage table showed commits held ~100 ms)."""
    c = LocalCluster(str(tmp_path), timings=TIMINGS)
    c.idle_wait_ms = 200
    try:
        await c.start_all()
        leader = await c.leader(timeout_s=15)
        assert leader.syncobj is not None
        transport = leader.syncobj.transport

        def late_message() -> float:
            leader.step()
            transport.messages_received += 1  # as if the tick's own poll handled one
            return leader.next_wake_s()

        assert await asyncio.wrap_future(leader.driver.call(late_message)) == 0.0
    finally:
        await c.stop_all()
