"""When is a peer broker really ready? Pure judgments over what the brokers report.

Each function takes the parsed output of a broker's own status endpoint or CLI and answers
``(ready, reason)``: ``reason`` says what is still missing (or ``"ready"``), so a start-up that
gives up can say why. No I/O and no third-party imports here, so the unit tests run without the
``bench`` extra (tests/unit/test_bench_readiness.py feeds them output captured from real
nats-server 2.15 and RabbitMQ 3.10 clusters).

NATS JetStream (``/jsz`` of every node): a 3-node cluster takes stream creates once a meta
leader is elected and knows every peer as current. That is necessary, not sufficient: the meta
leader places a stream only on peers whose first STATSZ it received (until then
``add_stream`` answers "no suitable peers for placement, peer offline", err_code 10005), and
nothing in ``/jsz`` shows that, so the start-up also probes placement
(``is_placement_not_ready`` tells that answer apart from real errors).

RabbitMQ: ``rabbitmqctl cluster_status --formatter json`` of every node lists every node as
running, and after a quorum queue is declared ``rabbitmqctl list_queues name members online
--formatter json`` lists every node as a member and every member as online.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

# JSClusterNoPeersErrF: the meta leader could not pick enough peers for a stream or consumer.
NATS_NO_PEERS_ERR_CODE = 10005
_NO_PEERS_TEXT = "no suitable peers for placement"

Verdict = tuple[bool, str]
READY: Verdict = (True, "ready")


def _names(names: Collection[str]) -> str:
    return ", ".join(sorted(names)) or "none"


# --- NATS JetStream ---------------------------------------------------------------------------


def nats_cluster_ready(
    jsz_by_node: Mapping[str, Mapping[str, Any] | None], expected: Sequence[str]
) -> Verdict:
    """Ready when every node in ``expected`` (server names) answered ``/jsz`` with JetStream
    on, and (more than one node) all of them name the same meta leader, count ``len(expected)``
    meta peers, and the leader reports every other node as a current, online replica with no
    lag. Only the leader's replica list counts: a follower lists its peers too, but marks
    those it has no Raft traffic with as not current (seen on 2.15)."""
    for name in expected:
        jsz = jsz_by_node.get(name)
        if jsz is None:
            return False, f"{name}: /jsz did not answer"
        if jsz.get("disabled") or "config" not in jsz:
            return False, f"{name}: JetStream not enabled yet"
    if len(expected) == 1:
        return READY
    leaders: dict[str, str] = {}
    for name in expected:
        meta = jsz_by_node[name].get("meta_cluster") or {}  # type: ignore[union-attr]
        leader = str(meta.get("leader") or "")
        if not leader:
            return False, f"{name}: no JetStream meta leader yet"
        size = meta.get("cluster_size")
        if size != len(expected):
            return False, f"{name}: meta group has {size} peers, {len(expected)} expected"
        leaders[name] = leader
    if len(set(leaders.values())) != 1:
        seen = ", ".join(f"{n} -> {leader}" for n, leader in sorted(leaders.items()))
        return False, f"nodes disagree on the meta leader ({seen})"
    leader = next(iter(leaders.values()))
    if leader not in expected:
        return False, f"meta leader {leader} is not one of {_names(expected)}"
    return _leader_sees_all_current(leader, jsz_by_node[leader], expected)


def _leader_sees_all_current(
    leader: str, jsz: Mapping[str, Any] | None, expected: Sequence[str]
) -> Verdict:
    meta = (jsz or {}).get("meta_cluster") or {}
    replicas = {str(r.get("name", "")): r for r in meta.get("replicas") or []}
    peers = [n for n in expected if n != leader]
    missing = [n for n in peers if n not in replicas]
    if missing:
        unknown = [n for n in replicas if n not in expected]
        extra = f" (it lists {_names(unknown)})" if unknown else ""
        return False, f"meta leader {leader} does not list peer(s) {_names(missing)}{extra}"
    for name in peers:
        replica = replicas[name]
        if replica.get("offline"):
            return False, f"meta leader {leader} sees peer {name} offline"
        if not replica.get("current"):
            return False, f"meta leader {leader} sees peer {name} not current"
        lag = int(replica.get("lag") or 0)  # omitted when 0
        if lag:
            return False, f"meta leader {leader} sees peer {name} {lag} entries behind"
    return READY


def is_placement_not_ready(err_code: int | None, description: str | None) -> bool:
    """True for the JetStream API error a stream or consumer create gets while the meta leader
    cannot place it yet ("no suitable peers for placement, peer offline"): worth retrying
    shortly. Any other error (bad config, name in use, ...) is not."""
    if err_code == NATS_NO_PEERS_ERR_CODE:
        return True
    return _NO_PEERS_TEXT in (description or "").lower()


# --- RabbitMQ ---------------------------------------------------------------------------------


def parse_ctl_json(output: str) -> Any:
    """The JSON document in a ``rabbitmqctl ... --formatter json`` output. rabbitmqctl may
    print lines before it (e.g. "Timeout: 60.0 seconds ...", "Listing queues ..."), so parsing
    starts at the first line that opens an object or array. Raises ValueError if there is
    none."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("{", "[")):
            return json.loads("\n".join(lines[i:]))
    raise ValueError(f"no JSON in rabbitmqctl output: {output.strip()[:200]!r}")


def rabbit_cluster_ready(status: Mapping[str, Any], expected: Collection[str]) -> Verdict:
    """One node's ``cluster_status`` (parsed JSON): ready when it lists every node of
    ``expected`` (``rabbitN@localhost``) as a disk node, as running, and reports no network
    partition and no alarm."""
    want = set(expected)
    disk = set(status.get("disk_nodes") or [])
    if not want <= disk:
        return False, f"not cluster members yet: {_names(want - disk)}"
    running = set(status.get("running_nodes") or [])
    if not want <= running:
        return False, f"not running yet: {_names(want - running)}"
    partitions = status.get("partitions") or {}
    if partitions:
        return False, f"network partitions: {partitions}"
    alarms = status.get("alarms") or []
    if alarms:
        return False, f"alarms: {alarms}"
    return READY


def rabbit_quorum_queues_ready(
    rows: Sequence[Mapping[str, Any]], queues: Collection[str], expected: Collection[str]
) -> Verdict:
    """``list_queues name members online`` (parsed JSON rows): ready when each of ``queues``
    is listed with every node of ``expected`` as a member and every member online."""
    by_name = {str(r.get("name")): r for r in rows}
    want = set(expected)
    for queue in sorted(queues):
        row = by_name.get(queue)
        if row is None:
            return False, f"queue {queue} not listed yet"
        members = set(row.get("members") or [])
        online = set(row.get("online") or [])
        if not want <= members:
            return False, f"queue {queue}: {_names(want - members)} not member(s) yet"
        offline = members - online
        if offline:
            return False, f"queue {queue}: member(s) {_names(offline)} not online yet"
    return READY
