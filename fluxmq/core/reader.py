"""Read-only queries over the committed state (any thread; each call is one read transaction)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import dead_letters, keys
from fluxmq.core.catalog import QueueEntry, dead_letter_entry, find_entry
from fluxmq.core.commands.leases import start_offset
from fluxmq.core.commands.letters import dead_letter_depth
from fluxmq.core.commands.results import member_view
from fluxmq.core.commands.rules import group_view
from fluxmq.core.delivery import header
from fluxmq.core.errors import invalid_argument, offset_out_of_range, partition_out_of_range
from fluxmq.core.membership import Membership, releasable
from fluxmq.core.queue_config import labels_match, parse_label_selector
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.core.validation import group_name as validate_group_name
from fluxmq.core.views import GroupView, StateView
from storage.api import Record, StoredBatch, Watermarks

_TOKEN_TAG = b"queues:"  # page tokens are base64url("queues:" + last name of the page)


def page_token_after(name: str) -> str:
    """The ListQueues page token of the page after ``name`` (the same on every node, so pages
    of several replication groups merge)."""
    return base64.urlsafe_b64encode(_TOKEN_TAG + name.encode()).decode()


@dataclass(frozen=True, slots=True)
class FetchResult:
    records: list[Record]
    next_offset: int
    watermarks: Watermarks
    batches: list[StoredBatch] = field(default_factory=list)  # instead of records, when asked
    log_id: int = 0  # the salt of the batches' checksums
    _start: int = 0  # the offset asked for (batches may begin below it)

    @property
    def empty(self) -> bool:
        return not self.records and not self.batches

    @property
    def start_offset(self) -> int:
        """The offset asked for: records below it in the first batch are not to be read."""
        return self._start

    @property
    def messages(self) -> int:
        """Records this result hands on (of the batches: those from the start offset on)."""
        return len(self.records) if self.records else self.next_offset - self._start


class QueueReader:
    def __init__(self, state: QueueStateMachine) -> None:
        self._state = state
        self._store = state.store

    @property
    def view(self) -> StateView:
        """The state as of the last commit (what a leader prepares its commands against)."""
        return self._state.view

    @property
    def catalog(self) -> Mapping[str, QueueEntry]:
        """The catalog as of the last commit."""
        return self._state.catalog

    def entry(self, name: str, field_path: str = "queue") -> QueueEntry:
        return find_entry(self._state.catalog, name, field_path)

    def _log_id(self, entry: QueueEntry, partition: int) -> int:
        if partition >= entry.policy.partitions:
            raise partition_out_of_range(
                entry.name, partition, entry.policy.partitions, "partition"
            )
        return keys.log_id(entry.queue_id, partition)

    def list_queues(
        self,
        prefix: str,
        label_selector: str,
        page_token: str,
        limit: int,
        visible: Callable[[pb.Queue], bool] | None = None,
    ) -> tuple[list[pb.Queue], str]:
        """A page of queues, by name. ``visible`` (the caller's environment) filters before the
        page is cut, so neither the page nor its token reveals a queue the caller may not see."""
        selector = parse_label_selector(label_selector)
        start = keys.queue_key(prefix)
        if page_token:
            try:
                raw = base64.b64decode(page_token.encode(), altchars=b"-_", validate=True)
                if not raw.startswith(_TOKEN_TAG):
                    raise ValueError("untagged")
                after = raw[len(_TOKEN_TAG) :].decode()
            except (binascii.Error, UnicodeDecodeError, ValueError):
                raise invalid_argument("page_token", "not a token this server issued") from None
            if not after.startswith(prefix):
                raise invalid_argument("page_token", "does not belong to this prefix")
            start = keys.queue_key(after) + b"\x00"
        out: list[pb.Queue] = []
        more = False
        with self._store.read() as txn:
            for _key, value in txn.scan(keys.queue_key(prefix), start):
                queue = pb.Queue.FromString(value)
                if selector and not labels_match(queue.config.labels, selector):
                    continue
                if visible is not None and not visible(queue):
                    continue
                if len(out) == limit:
                    more = True
                    break
                out.append(queue)
        token = page_token_after(out[-1].config.name) if more and out else ""
        return out, token

    def watermarks(self, entry: QueueEntry, partition: int) -> Watermarks:
        with self._store.read() as txn:
            return txn.log(self._log_id(entry, partition)).watermarks()

    def stats(self, entry: QueueEntry) -> list[tuple[int, Watermarks, int]]:
        """-> per partition (partition, watermarks, bytes)."""
        out = []
        with self._store.read() as txn:
            for partition in range(entry.policy.partitions):
                log = txn.log(keys.log_id(entry.queue_id, partition))
                out.append((partition, log.watermarks(), log.size_bytes()))
        return out

    def fetch(
        self,
        entry: QueueEntry,
        partition: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        batches: bool = False,
    ) -> FetchResult:
        """Records from ``offset`` (or, with ``batches``, the stored batches that hold them, not
        opened). Below the low watermark or above the high one is an error that says where the
        log starts and ends; exactly at the high watermark is empty."""
        if offset < 0:
            raise invalid_argument("offset", f"must be >= 0 (got {offset})")
        log_id = self._log_id(entry, partition)
        with self._store.read() as txn:
            log = txn.log(log_id)
            wm = log.watermarks()
            if offset < wm.low or offset > wm.high:
                raise offset_out_of_range(entry.name, partition, offset, wm.low, wm.high)
            if batches:
                stored = (
                    log.read_batches(offset, max_messages, max_bytes) if offset < wm.high else []
                )
                if not stored:
                    return FetchResult([], offset, wm, [], log_id, offset)
                assert stored[0].base_offset <= offset, "the first batch holds the start offset"
                last = stored[-1]
                return FetchResult([], last.base_offset + last.count, wm, stored, log_id, offset)
            records = log.read(offset, max_messages, max_bytes) if offset < wm.high else []
        if records:
            assert records[0].offset == offset, "a log never skips an offset between watermarks"
        next_offset = records[-1].offset + 1 if records else offset
        return FetchResult(records, next_offset, wm)

    def offset_for_timestamp(self, entry: QueueEntry, partition: int, timestamp_ms: int) -> int:
        with self._store.read() as txn:
            return txn.log(self._log_id(entry, partition)).offset_for_timestamp(timestamp_ms)

    # -- consumer groups --------------------------------------------------------------------

    def group(self, entry: QueueEntry, name: str) -> GroupView:
        return group_view(self._state.view, entry, name)

    def groups(self, entry: QueueEntry) -> list[pb.Group]:
        return [g.meta for g in self._state.view.delivery.of_queue(entry.queue_id)]

    def group_partitions(
        self, entry: QueueEntry, name: str, now_ms: int
    ) -> list[pb.GroupPartition]:
        """Each partition's counts. ``scheduled`` counts what is not due at ``now_ms``: a
        pending slot that is due (a retry or delay whose time came, or a ready record that a
        purge of delayed messages walked past) is ready, waiting for a lease."""
        g = self.group(entry, name)
        out = []
        with self._store.read() as txn:
            for p in range(entry.policy.partitions):
                v = g.part(p)
                high = txn.log(keys.log_id(entry.queue_id, p)).watermarks().high
                out.append(
                    pb.GroupPartition(
                        partition=p,
                        committed=v.committed,
                        high_watermark=high,
                        lag=max(high - v.committed, 0),
                        in_flight=v.leased,
                        scheduled=v.scheduled_after(now_ms),
                        dead=v.dead,
                        filtered=v.filtered,
                        skipped_by_retention=v.skipped,
                        acked=v.acked,
                        delivered_up_to=v.next,
                    )
                )
        return out

    def describe_group(self, entry: QueueEntry, name: str, now_ms: int) -> pb.GroupDescription:
        g = self.group(entry, name)
        desc = pb.GroupDescription(group=g.meta)
        desc.partitions.extend(self.group_partitions(entry, name, now_ms))
        desc.in_flight_by_consumer.update(g.in_flight_by_member)
        for consumer_id, co in sorted(g.checkouts.items()):
            desc.streaming.add(
                consumer_id=consumer_id,
                max_in_flight=co.max_in_flight,
                lease_ms=co.lease_ms,
                member_id=co.member.member_id,
            )
        ms = g.membership
        if ms is not None:
            desc.group_generation = ms.group_generation
            desc.strategy = ms.strategy if ms.members else ""
            desc.members.extend(member_view(m) for _, m in sorted(ms.members.items()))
        return desc

    def in_flight(self, entry: QueueEntry, group: str, consumer_id: str) -> int:
        g = self._state.view.delivery.get(entry.queue_id, entry.name, group)
        return g.in_flight_by_member.get(consumer_id, 0)

    def maybe_ready(
        self, entry: QueueEntry, group: str, now_ms: int, member_id: str = ""
    ) -> tuple[bool, int | None]:
        """-> (a lease could make progress now, earliest due time of a scheduled message).
        ``member_id`` of an ordered group with members: only the partitions it owns count."""
        g = self._state.view.delivery.get(entry.queue_id, entry.name, group)
        only = _owned_partitions(g, member_id)
        with self._store.read() as txn:
            highs = {
                p: txn.log(keys.log_id(entry.queue_id, p)).watermarks().high
                for p in range(entry.policy.partitions)
                if only is None or p in only
            }
        return g.maybe_ready(highs, now_ms), g.next_ready_ms()

    def checkouts_ready(self, now_ms: int) -> bool:
        """Whether some checked-out consumer with credit could be assigned a message now that
        no apply assigned it (a retry or a delay came due, offsets were reset, ...)."""
        catalog = {e.queue_id: e for e in self._state.view.catalog.values()}
        for g in self._state.view.delivery.all_groups():
            entry = catalog.get(g.queue_id)
            if entry is None:
                continue
            for consumer_id, co in g.checkouts.items():
                if co.max_in_flight <= g.in_flight_by_member.get(consumer_id, 0):
                    continue
                if self.maybe_ready(entry, g.name, now_ms, co.member.member_id)[0]:
                    return True
        return False

    def owned_partitions(self, entry: QueueEntry, group: str, member_id: str) -> set[int] | None:
        """The partitions a member may lease from (None: no restriction)."""
        return _owned_partitions(
            self._state.view.delivery.get(entry.queue_id, entry.name, group), member_id
        )

    def releasable(
        self, entry: QueueEntry, group: str, member_id: str, generation_id: int
    ) -> list[int]:
        g = self._state.view.delivery.get(entry.queue_id, entry.name, group)
        if g.membership is None:
            return []
        return releasable(g.membership, member_id, generation_id, g.busy)

    def memberships(self) -> list[tuple[int, Membership]]:
        """(group id, membership) of every group with members, for the session tracker."""
        return [
            (g.group_id, g.membership)
            for g in self._state.view.delivery.all_groups()
            if g.membership is not None and g.membership.members
        ]

    def offsets(self, entry: QueueEntry, group: str) -> pb.OffsetsResponse:
        resp = pb.OffsetsResponse()
        # Offsets do not depend on the time (``scheduled`` is not part of the answer).
        for gp in self.group_partitions(entry, group, now_ms=0):
            resp.partitions.add(
                partition=gp.partition,
                committed=gp.committed,
                latest=gp.high_watermark,
                lag=gp.lag,
            )
        return resp

    def reset_preview(
        self, entry: QueueEntry, group: str, partitions: Sequence[int], to: pb.StartPosition
    ) -> pb.OffsetsResponse:
        """ResetOffsets with dry_run: each chosen partition as it is now, where the reset
        would restart it and the leases and retries it would drop (the same ``start_offset``
        the command applies, on this replica's state)."""
        g = self.group(entry, group)
        resp = pb.OffsetsResponse()
        with self._store.read() as txn:
            for p in sorted(set(partitions)) if partitions else range(entry.policy.partitions):
                v = g.part(p)
                log = txn.log(keys.log_id(entry.queue_id, p))
                high = log.watermarks().high
                resp.partitions.add(
                    partition=p,
                    committed=v.committed,
                    latest=high,
                    lag=max(high - v.committed, 0),
                    reset_to=start_offset(log, to),
                    in_flight=v.leased,
                    scheduled=v.scheduled_after(0),
                )
        return resp

    def group_lags(self, entry: QueueEntry, now_ms: int) -> list[pb.GroupLag]:
        out = []
        for meta in self.groups(entry):
            parts = self.group_partitions(entry, meta.name, now_ms)
            out.append(
                pb.GroupLag(
                    name=meta.name,
                    lag=sum(p.lag for p in parts),
                    in_flight=sum(p.in_flight for p in parts),
                    scheduled=sum(p.scheduled for p in parts),
                )
            )
        return out

    # -- dead letters -----------------------------------------------------------------------

    def dead_letter_depth(self, entry: QueueEntry) -> int:
        with self._store.read() as txn:
            return dead_letter_depth(txn, self._state.catalog, entry)

    def dead_letters(
        self, entry: QueueEntry, group: str, from_ms: int, to_ms: int, page_token: str, limit: int
    ) -> tuple[list[pb.DeadLetter], str]:
        """Dead letters of ``entry`` in DLQ order (= time order), ``limit`` per page: only its
        own, also when other queues share its DLQ."""
        if group:
            validate_group_name(group)
        start = 0
        if page_token:
            try:
                raw = base64.b64decode(page_token.encode(), altchars=b"-_", validate=True)
                if not raw.startswith(_DEAD_TOKEN_TAG):
                    raise ValueError("untagged")
                start = int(raw[len(_DEAD_TOKEN_TAG) :].decode())
            except (binascii.Error, UnicodeDecodeError, ValueError):
                raise invalid_argument("page_token", "not a token this server issued") from None
        dlq = dead_letter_entry(self._state.catalog, entry)
        if dlq is None:
            return [], ""
        out: list[pb.DeadLetter] = []
        next_token = ""
        with self._store.read() as txn:
            log = txn.log(keys.log_id(dlq.queue_id, 0))
            offset = max(start, log.offset_for_timestamp(from_ms) if from_ms else 0)
            scanned = 0
            more = False
            for record in dead_letters.letters(txn, dlq.queue_id, entry.name, offset):
                if len(out) >= limit or scanned >= _DEAD_SCAN_MAX:
                    more = True
                    break
                offset = record.offset + 1
                scanned += 1
                if to_ms and record.timestamp_ms >= to_ms:
                    return out, ""
                dl = _dead_letter(record)
                if group and dl.group != group:
                    continue
                out.append(dl)
            if more:
                next_token = base64.urlsafe_b64encode(
                    _DEAD_TOKEN_TAG + str(offset).encode()
                ).decode()
        return out, next_token


def _owned_partitions(g: GroupView, member_id: str) -> set[int] | None:
    ms = g.membership
    if not g.ordered or ms is None or not ms.members:
        return None
    m = ms.members.get(member_id)
    return set(m.owned) if m is not None else set()


_DEAD_TOKEN_TAG = b"dead:"
_DEAD_SCAN_MAX = 100_000  # dead letters one ListDeadLetters page may pass over (group filter)


def _dead_letter(record: Record) -> pb.DeadLetter:
    def h(name: str) -> str:
        value = header(record, name)
        return value.decode() if value is not None else ""

    dl = pb.DeadLetter(
        id=record.offset,
        group=h("fluxmq-group"),
        reason=h("fluxmq-dead-reason"),
        attempts=int(h("fluxmq-attempts") or 0),
        dead_at_ms=int(h("fluxmq-dead-at") or 0),
        original_partition=int(h("fluxmq-original-partition") or 0),
        original_offset=int(h("fluxmq-original-offset") or 0),
    )
    rec = dl.record
    rec.offset = record.offset
    rec.timestamp_ms = record.timestamp_ms
    rec.value = record.value
    if record.key is not None:
        rec.key = record.key
    rec.headers.update(record.headers)
    return dl
