"""A consumer-group member as its own process (so tests can kill -9 it), writing an event log.

    python -m tests.integration.group_member --addresses A,B --queue q --group g \
        --consumer c1 --events out.jsonl [--session-ms 3000] [--seconds 60]

It joins, heartbeats at the interval the broker asks for, leases from the partitions it owns and
acks each batch before the next heartbeat. Every line of the event log is JSON with a
system-wide monotonic time ``t`` (comparable across processes):

- ``{"ev": "acquire", "p": P}``  P appeared in its assignment;
- ``{"ev": "release", "p": P}``  P was being revoked and it stopped working on it (logged before
  the heartbeat that acknowledges the revocation);
- ``{"ev": "lease", "p": P, "offsets": [...]}``  a batch it got (then acked).
Ownership as the member sees it = assigned + revoking: a test checks from the log that no
partition is ever held by two members at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import grpc

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc


class Member:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.addresses = args.addresses.split(",")
        self.target = 0
        self.channel = grpc.insecure_channel(self.addresses[0])
        self.stub = queue_pb2_grpc.QueueServiceStub(self.channel)
        self.out = open(args.events, "a", buffering=1)  # noqa: SIM115 - lives as long as we do
        self.member_id = ""
        self.generation = 0
        self.held: set[int] = set()
        # Held partitions our generation revokes: the next heartbeat that carries this
        # generation acknowledges the revocation, so we stop work on them (and log it) first.
        self.revoked: set[int] = set()
        key = os.environ.get("FLUXMQ_API_KEY", "")  # a cluster authenticates its clients
        self.metadata = (("authorization", f"Bearer {key}"),) if key else None

    def log(self, ev: str, **fields: Any) -> None:
        rec = {"t": time.monotonic(), "c": self.args.consumer, "ev": ev, **fields}
        self.out.write(json.dumps(rec) + "\n")

    def call(self, name: str, req: Any) -> Any:
        """Retry on UNAVAILABLE, moving to the next address (a node died or is not leader)."""
        deadline = time.monotonic() + 30
        while True:
            try:
                return getattr(self.stub, name)(req, timeout=10, metadata=self.metadata)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                self.target = (self.target + 1) % len(self.addresses)
                self.channel.close()
                self.channel = grpc.insecure_channel(self.addresses[self.target])
                self.stub = queue_pb2_grpc.QueueServiceStub(self.channel)
                time.sleep(0.1)

    def adopt(self, a: pb.MemberAssignment) -> None:
        # A revoked partition stays ours until we let it go (below), never comes back by it.
        now = set(a.assigned) | (set(a.revoking) & self.held)
        for p in sorted(now - self.held):
            self.log("acquire", p=p, gen=a.generation_id)
        for p in sorted(self.held - now):  # taken away without a revoke (we were expired)
            self.log("release", p=p, gen=a.generation_id)
        self.held = now
        self.revoked = set(a.revoking) & now
        self.generation = a.generation_id

    def let_go(self, keep: set[int] | frozenset[int] = frozenset()) -> None:
        """Stop work on the revoked partitions (but those in ``keep``: a batch of them is still
        out, and the broker hands nothing over while a lease is) and say so, before a heartbeat
        acknowledges the revocation: after it, the new owner may get them at any moment."""
        for p in sorted(self.revoked - keep):
            self.log("release", p=p, gen=self.generation)
        self.held -= self.revoked - keep
        self.revoked &= keep

    def join(self) -> pb.MemberAssignment:
        a = self.call(
            "JoinGroup",
            pb.JoinGroupRequest(
                queue=self.args.queue,
                group=self.args.group,
                consumer_id=self.args.consumer,
                session_timeout_ms=self.args.session_ms,
                strategy=self.args.strategy,
            ),
        )
        self.member_id = a.member_id
        self.log("joined", member_id=a.member_id, gen=a.generation_id)
        self.adopt(a)
        return a

    def heartbeat(self) -> pb.MemberAssignment:
        self.let_go()
        a = self.call(
            "Heartbeat",
            pb.HeartbeatRequest(
                queue=self.args.queue,
                group=self.args.group,
                member_id=self.member_id,
                generation_id=self.generation,
            ),
        )
        if a.should_rejoin:
            self.log("should_rejoin", reason=a.reason)
            for p in sorted(self.held):
                self.log("release", p=p, gen=self.generation)
            self.held = set()
            return self.join()
        self.adopt(a)
        if self.revoked:
            # Nothing is in flight between batches: stop working on them and say so at once.
            self.let_go()
            a = self.call(
                "Heartbeat",
                pb.HeartbeatRequest(
                    queue=self.args.queue,
                    group=self.args.group,
                    member_id=self.member_id,
                    generation_id=self.generation,
                ),
            )
            self.adopt(a)
        return a

    def work_once(self) -> None:
        if not self.held:
            return
        resp = self.call(
            "Lease",
            pb.LeaseRequest(
                queue=self.args.queue,
                group=self.args.group,
                consumer_id=self.args.consumer,
                max_messages=20,
                wait_ms=100,
                member_id=self.member_id,
                generation_id=self.generation,
            ),
        )
        if not resp.messages:
            return
        by_p: dict[int, list[int]] = {}
        for m in resp.messages:
            by_p.setdefault(m.receipt.partition, []).append(m.receipt.offset)
        for p, offsets in sorted(by_p.items()):
            self.log("lease", p=p, offsets=offsets, gen=self.generation)
        for attempt in range(5):
            try:
                self.call(
                    "Ack",
                    pb.AckRequest(
                        queue=self.args.queue,
                        group=self.args.group,
                        receipts=[m.receipt for m in resp.messages],
                        member_id=self.member_id,
                        generation_id=self.generation,
                    ),
                )
                return
            except grpc.RpcError as err:
                self.log("ack_failed", code=str(err.code()), details=err.details())
                if err.code() != grpc.StatusCode.ABORTED or attempt == 4:
                    return
                # STALE_GENERATION: our assignment changed meanwhile. Learn the new generation
                # and ack again. This heartbeat acknowledges what our generation revokes
                # (the broker keeps the partitions of this batch, which is still out).
                self.let_go(keep=set(by_p))
                a = self.call(
                    "Heartbeat",
                    pb.HeartbeatRequest(
                        queue=self.args.queue,
                        group=self.args.group,
                        member_id=self.member_id,
                        generation_id=self.generation,
                    ),
                )
                if a.should_rejoin:
                    return
                self.adopt(a)

    def run(self) -> None:
        a = self.join()
        interval_s = a.heartbeat_interval_ms / 1000
        next_beat = time.monotonic() + interval_s
        end = time.monotonic() + self.args.seconds
        while time.monotonic() < end:
            if time.monotonic() >= next_beat:
                a = self.heartbeat()
                interval_s = a.heartbeat_interval_ms / 1000
                next_beat = time.monotonic() + interval_s
            try:
                self.work_once()
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.ABORTED:  # STALE_GENERATION: heartbeat first
                    raise
                self.log("stale", details=err.details())
                next_beat = 0.0
            if not self.held:
                time.sleep(min(0.05, interval_s))
        self.call(
            "LeaveGroup",
            pb.LeaveGroupRequest(
                queue=self.args.queue, group=self.args.group, member_id=self.member_id
            ),
        )
        self.log("left")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--addresses", required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--consumer", required=True)
    ap.add_argument("--events", required=True)
    ap.add_argument("--session-ms", type=int, default=3000)
    ap.add_argument("--strategy", default="sticky")
    ap.add_argument("--seconds", type=float, default=120)
    Member(ap.parse_args(argv)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
