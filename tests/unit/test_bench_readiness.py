"""The comparison bench waits until its peer brokers are really ready (issue 19, item 7).

The judgments in bench/peers/readiness.py are fed output captured from real brokers on the bench
machine (tests/unit/bench_readiness_samples/, each file says how it was made); a few cases no
healthy start-up shows (a lagging or offline peer, a split view of the leader) are derived from
those samples by changing one field. The NATS create retry runs against nats-py's own error
type (skipped when the ``bench`` extra is not installed).
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bench.peers.readiness import (
    NATS_NO_PEERS_ERR_CODE,
    is_placement_not_ready,
    nats_cluster_ready,
    parse_ctl_json,
    rabbit_cluster_ready,
    rabbit_quorum_queues_ready,
)

SAMPLES = Path(__file__).parent / "bench_readiness_samples"
NATS3 = ["n0", "n1", "n2"]
RABBIT3 = ["rabbit1@localhost", "rabbit2@localhost", "rabbit3@localhost"]


def _sample(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SAMPLES / name).read_text())
    return doc


def _nodes(doc: dict[str, Any]) -> dict[str, Any]:
    """The per-node /jsz documents of one capture (keys starting with _ are notes)."""
    return {k: v for k, v in doc.items() if not k.startswith("_")}


def _ready_cluster() -> dict[str, Any]:
    return copy.deepcopy(_nodes(_sample("nats3_jsz_startup.json")["leader_elected"]))


def _leader_replica(jsz: dict[str, Any], peer: str) -> dict[str, Any]:
    leader = jsz["n0"]["meta_cluster"]["leader"]
    replicas = jsz[leader]["meta_cluster"]["replicas"]
    found: dict[str, Any] = next(r for r in replicas if r["name"] == peer)
    return found


def _a_follower(jsz: dict[str, Any]) -> str:
    leader = jsz["n0"]["meta_cluster"]["leader"]
    return next(n for n in NATS3 if n != leader)


def _not_ready(answer: tuple[bool, str]) -> str:
    """The reason of a readiness check's answer, which must be "not ready"."""
    ready, reason = answer
    assert not ready, reason
    return reason


# --- NATS JetStream ---------------------------------------------------------------------------


def test_nats_cluster_is_not_ready_before_its_nodes_answer() -> None:
    jsz = _nodes(_sample("nats3_jsz_startup.json")["not_listening"])
    assert all(v is None for k, v in jsz.items() if k in NATS3)
    reason = _not_ready(nats_cluster_ready(jsz, NATS3))
    assert reason == "n0: /jsz did not answer"


def test_nats_cluster_is_not_ready_while_the_meta_group_has_no_leader() -> None:
    # JetStream is on and /jsz answers, but the meta group is still forming (/healthz: 503)
    jsz = _nodes(_sample("nats3_jsz_startup.json")["meta_forming"])
    reason = _not_ready(nats_cluster_ready(jsz, NATS3))
    assert "no JetStream meta leader yet" in reason


def test_nats_cluster_is_ready_once_the_leader_sees_every_peer_current() -> None:
    jsz = _ready_cluster()
    # the sample's followers list a peer as not current: only the leader's view may count
    follower = _a_follower(jsz)
    follower_view = jsz[follower]["meta_cluster"]["replicas"]
    assert any(not r["current"] for r in follower_view)
    assert nats_cluster_ready(jsz, NATS3) == (True, "ready")


def test_nats_cluster_is_not_ready_when_a_node_stops_answering() -> None:
    sample = _sample("nats3_jsz_peer_stopped.json")
    jsz = {**sample["after_stop"], sample["victim"]: None}
    reason = _not_ready(nats_cluster_ready(jsz, NATS3))
    assert reason == f"{sample['victim']}: /jsz did not answer"


def test_nats_cluster_is_not_ready_when_the_leader_sees_a_peer_not_current() -> None:
    # the stopped node's last /jsz still looks fine; the leader's view is what tells
    sample = _sample("nats3_jsz_peer_stopped.json")
    victim = sample["victim"]
    assert nats_cluster_ready(sample["before_stop"], NATS3) == (True, "ready")
    jsz = {**sample["after_stop"], victim: sample["before_stop"][victim]}
    reason = _not_ready(nats_cluster_ready(jsz, NATS3))
    assert reason.endswith(f"sees peer {victim} not current")


def test_nats_cluster_is_not_ready_when_a_peer_lags() -> None:
    jsz = _ready_cluster()
    peer = _a_follower(jsz)
    _leader_replica(jsz, peer)["lag"] = 3
    reason = _not_ready(nats_cluster_ready(jsz, NATS3))
    assert reason.endswith(f"sees peer {peer} 3 entries behind")


def test_nats_cluster_is_not_ready_when_a_peer_is_offline() -> None:
    jsz = _ready_cluster()
    peer = _a_follower(jsz)
    _leader_replica(jsz, peer)["offline"] = True
    reason = _not_ready(nats_cluster_ready(jsz, NATS3))
    assert reason.endswith(f"sees peer {peer} offline")


def test_nats_cluster_is_not_ready_when_the_leader_does_not_know_a_peer_by_name() -> None:
    jsz = _ready_cluster()
    peer = _a_follower(jsz)
    replica = _leader_replica(jsz, peer)
    replica["name"] = f"Server name unknown at this time (peerID: {replica['peer']})"
    reason = _not_ready(nats_cluster_ready(jsz, NATS3))
    assert f"does not list peer(s) {peer}" in reason
    assert "Server name unknown" in reason


def test_nats_cluster_is_not_ready_while_nodes_disagree_on_the_leader() -> None:
    jsz = _ready_cluster()
    leader = jsz["n0"]["meta_cluster"]["leader"]
    follower = _a_follower(jsz)
    jsz[follower]["meta_cluster"]["leader"] = follower
    reason = _not_ready(nats_cluster_ready(jsz, NATS3))
    assert reason.startswith("nodes disagree on the meta leader")
    assert f"{follower} -> {follower}" in reason and f"-> {leader}" in reason


def test_nats_cluster_is_not_ready_while_the_meta_group_is_smaller_than_the_cluster() -> None:
    jsz = _ready_cluster()
    jsz["n2"]["meta_cluster"]["cluster_size"] = 2
    reason = _not_ready(nats_cluster_ready(jsz, NATS3))
    assert reason == "n2: meta group has 2 peers, 3 expected"


def test_nats_single_node_is_ready_once_jetstream_answers() -> None:
    jsz = _nodes(_sample("nats1_jsz.json"))
    assert "meta_cluster" not in jsz["n0"]
    assert nats_cluster_ready(jsz, ["n0"]) == (True, "ready")
    assert nats_cluster_ready({"n0": None}, ["n0"])[0] is False


def test_only_the_no_suitable_peers_answer_counts_as_placement_not_ready() -> None:
    # the text nats-server 2.15 sends (selectPeerError.Error, JSClusterNoPeersErrF)
    offline = "no suitable peers for placement, peer offline"
    assert is_placement_not_ready(NATS_NO_PEERS_ERR_CODE, offline)
    assert is_placement_not_ready(None, offline)
    assert not is_placement_not_ready(10058, "stream name already in use with a different config")
    assert not is_placement_not_ready(10059, "stream not found")
    assert not is_placement_not_ready(None, None)


# --- the NATS create retry (needs nats-py) ----------------------------------------------------


def _no_peers_error() -> Exception:
    from nats.js.errors import APIError

    return APIError(
        code=400,
        err_code=NATS_NO_PEERS_ERR_CODE,
        description="no suitable peers for placement, peer offline",
    )


def test_nats_stream_create_is_retried_while_placement_is_not_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench.peers import nats as peer

    monkeypatch.setattr(peer, "PLACEMENT_RETRY_FIRST_S", 0.01)
    calls: list[int] = []

    async def create() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise _no_peers_error()

    asyncio.run(peer.NatsAdapter._create("stream s", create))
    assert len(calls) == 3


def test_nats_create_gives_up_on_placement_with_a_clear_message_after_its_budget() -> None:
    from bench.peers import nats as peer

    calls: list[int] = []

    async def create() -> None:
        calls.append(1)
        raise _no_peers_error()

    with pytest.raises(RuntimeError, match=r"could not place stream s within 1 s .*peer offline"):
        asyncio.run(peer.create_placed("stream s", create, 1.0))
    assert 2 <= len(calls) <= 4  # delays of 0.1 + 0.2 + 0.4 s fit in the budget, 0.8 more not


def test_nats_create_does_not_retry_other_api_errors() -> None:
    from nats.js.errors import APIError

    from bench.peers import nats as peer

    calls: list[int] = []

    async def create() -> None:
        calls.append(1)
        raise APIError(code=400, err_code=10058, description="stream name already in use")

    with pytest.raises(APIError):
        asyncio.run(peer.NatsAdapter._create("stream s", create))
    assert len(calls) == 1


# --- RabbitMQ ---------------------------------------------------------------------------------


def _ctl(name: str) -> Any:
    return parse_ctl_json(_sample("rabbit3_ctl.json")[name])


def test_rabbit_cluster_is_ready_when_every_node_sees_every_node_running() -> None:
    for i in (1, 2, 3):
        status = _ctl(f"cluster_status_{i}")
        assert rabbit_cluster_ready(status, RABBIT3) == (True, "ready"), i


def test_rabbit_cluster_is_not_ready_while_a_node_is_stopped() -> None:
    status = _ctl("cluster_status_node3_stopped")
    reason = _not_ready(rabbit_cluster_ready(status, RABBIT3))
    assert reason == "not running yet: rabbit3@localhost"


def test_rabbit_cluster_is_not_ready_before_a_node_joined() -> None:
    status = _ctl("cluster_status_1")
    status["disk_nodes"].remove("rabbit2@localhost")
    status["running_nodes"].remove("rabbit2@localhost")
    reason = _not_ready(rabbit_cluster_ready(status, RABBIT3))
    assert reason == "not cluster members yet: rabbit2@localhost"


def test_rabbit_cluster_is_not_ready_under_an_alarm() -> None:
    status = _ctl("cluster_status_1")
    status["alarms"] = [{"node": "rabbit1@localhost", "resource": "disk"}]
    reason = _not_ready(rabbit_cluster_ready(status, RABBIT3))
    assert reason.startswith("alarms:")


def test_rabbit_quorum_queue_is_ready_when_every_member_is_online() -> None:
    for name in ("list_queues_after_declare", "list_queues_node3_restarted", "list_queues_silent"):
        rows = _ctl(name)
        assert rabbit_quorum_queues_ready(rows, ["cap.g"], RABBIT3) == (True, "ready"), name


def test_rabbit_quorum_queue_is_not_ready_while_a_member_is_offline() -> None:
    rows = _ctl("list_queues_node3_stopped")
    reason = _not_ready(rabbit_quorum_queues_ready(rows, ["cap.g"], RABBIT3))
    assert reason == "queue cap.g: member(s) rabbit3@localhost not online yet"


def test_rabbit_quorum_queue_is_not_ready_before_it_is_listed_or_has_every_member() -> None:
    rows = _ctl("list_queues_after_declare")
    ready, reason = rabbit_quorum_queues_ready(rows, ["cap.g", "cap.h"], RABBIT3)
    assert (ready, reason) == (False, "queue cap.h not listed yet")
    rows[0]["members"] = rows[0]["members"][:2]
    rows[0]["online"] = rows[0]["online"][:2]
    ready, reason = rabbit_quorum_queues_ready(rows, ["cap.g"], RABBIT3)
    assert (ready, reason) == (False, "queue cap.g: rabbit3@localhost not member(s) yet")
    # a classic queue of the same listing has no members at all
    _not_ready(rabbit_quorum_queues_ready(rows, ["cap.classic"], RABBIT3))


def test_rabbitmqctl_json_is_found_after_banner_lines() -> None:
    raw = _sample("rabbit3_ctl.json")["list_queues_after_declare"]
    banner = "Timeout: 60.0 seconds ...\nListing queues for vhost / ...\n"
    assert parse_ctl_json(banner + raw) == parse_ctl_json(raw)
    with pytest.raises(ValueError, match="no JSON in rabbitmqctl output"):
        parse_ctl_json("Error: unable to perform an operation on node 'rabbit1@localhost'\n")
