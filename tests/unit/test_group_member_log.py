"""The consumer-group test harness itself: the member process logs a release before the
heartbeat that hands the partition over, and the single-owner checker tells a real double
owner from a member whose session had already lapsed."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from tests.integration.group_helpers import check_single_owner
from tests.integration.group_member import Member


class _Aborted(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.ABORTED

    def details(self) -> str:
        return "STALE_GENERATION"


class _Broker:
    """Answers a member as the broker does when a revocation lands between a Lease and its Ack:
    the Ack is stale, a heartbeat tells generation 2 (partition 2 revoked), and a heartbeat that
    carries generation 2 acknowledges the revocation (partition 2 goes to another member)."""

    def __init__(self, events: Path) -> None:
        self.events = events
        self.acks = 0
        self.handed_over_at: float | None = None  # log size when partition 2 changed hands

    def JoinGroup(self, req: Any, **_: Any) -> pb.MemberAssignment:
        return pb.MemberAssignment(member_id="m", generation_id=1, assigned=[0, 2])

    def Lease(self, req: Any, **_: Any) -> pb.LeaseResponse:
        receipt = pb.Receipt(partition=2, offset=0, lease_id=1)
        return pb.LeaseResponse(messages=[pb.LeasedMessage(receipt=receipt)])

    def Ack(self, req: Any, **_: Any) -> pb.AckResponse:
        self.acks += 1
        if self.acks == 1:
            raise _Aborted()
        return pb.AckResponse()

    def Heartbeat(self, req: Any, **_: Any) -> pb.MemberAssignment:
        if req.generation_id < 2:
            return pb.MemberAssignment(member_id="m", generation_id=2, assigned=[0], revoking=[2])
        self.handed_over_at = len(self.events.read_text().splitlines())
        return pb.MemberAssignment(member_id="m", generation_id=3, assigned=[0])


def _member(tmp_path: Path) -> tuple[Member, _Broker]:
    events = tmp_path / "events.jsonl"
    args = argparse.Namespace(
        addresses="127.0.0.1:1", queue="q", group="g", consumer="c1", events=str(events),
        session_ms=3000, strategy="sticky", seconds=1.0,
    )  # fmt: skip
    member = Member(args)
    broker = _Broker(events)
    member.stub = broker  # type: ignore[assignment]
    return member, broker


def test_member_logs_a_release_before_the_heartbeat_that_hands_the_partition_over(
    tmp_path: Path,
) -> None:
    member, broker = _member(tmp_path)
    member.join()
    member.work_once()  # the stale Ack teaches generation 2, which revokes partition 2
    member.heartbeat()  # carries generation 2: partition 2 changes hands
    member.out.flush()
    lines = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert broker.handed_over_at is not None
    released = [i for i, e in enumerate(lines) if e["ev"] == "release" and e["p"] == 2]
    assert released and released[0] < broker.handed_over_at, lines
    assert member.held == {0}


def _ev(t: float, c: str, ev: str, **fields: object) -> dict[str, object]:
    return {"t": t, "c": c, "ev": ev, **fields}


def test_partition_acquired_from_a_live_holder_is_two_owners() -> None:
    events = [_ev(1, "a", "acquire", p=0), _ev(2, "b", "acquire", p=0), _ev(3, "a", "release", p=0)]
    with pytest.raises(AssertionError, match="partition 0 acquired by b while a holds it"):
        check_single_owner(events, {})


def test_partition_acquired_after_its_holder_lapsed_is_one_owner() -> None:
    events = [
        _ev(1, "a", "acquire", p=0),
        _ev(2, "b", "acquire", p=0),  # the broker expired a (it starved), gave 0 to b
        _ev(3, "b", "lease", p=0),
        _ev(4, "a", "should_rejoin", reason="session expired"),
        _ev(4.1, "a", "release", p=0),
    ]
    assert check_single_owner(events, {}) == 2


def test_lapsed_holder_that_still_gets_work_from_the_partition_is_two_owners() -> None:
    events = [
        _ev(1, "a", "acquire", p=0),
        _ev(2, "b", "acquire", p=0),
        _ev(3, "a", "lease", p=0),  # an expired member must not lease: this is a real bug
        _ev(4, "a", "should_rejoin", reason="session expired"),
    ]
    with pytest.raises(AssertionError, match="acquired by b while a holds it"):
        check_single_owner(events, {})
