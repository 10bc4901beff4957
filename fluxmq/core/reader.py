"""Read-only queries over the committed state (any thread; each call is one read transaction)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys
from fluxmq.core.errors import (
    invalid_argument,
    offset_out_of_range,
    partition_out_of_range,
    queue_not_found,
)
from fluxmq.core.queue_config import labels_match, parse_label_selector, validate_name
from fluxmq.core.state_machine import QueueEntry, QueueStateMachine
from storage.api import Record, Watermarks

_TOKEN_TAG = b"queues:"  # page tokens are base64url("queues:" + last name of the page)


@dataclass(frozen=True, slots=True)
class FetchResult:
    records: list[Record]
    next_offset: int
    watermarks: Watermarks


class QueueReader:
    def __init__(self, state: QueueStateMachine) -> None:
        self._state = state
        self._store = state.store

    def entry(self, name: str, field_path: str = "queue") -> QueueEntry:
        entry = self._state.catalog.get(name)
        if entry is None:
            validate_name(name, field_path)
            raise queue_not_found(name)
        return entry

    def _log_id(self, entry: QueueEntry, partition: int) -> int:
        if partition >= entry.policy.partitions:
            raise partition_out_of_range(
                entry.name, partition, entry.policy.partitions, "partition"
            )
        return keys.log_id(entry.queue_id, partition)

    def list_queues(
        self, prefix: str, label_selector: str, page_token: str, limit: int
    ) -> tuple[list[pb.Queue], str]:
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
                if len(out) == limit:
                    more = True
                    break
                out.append(queue)
        token = ""
        if more and out:
            token = base64.urlsafe_b64encode(_TOKEN_TAG + out[-1].config.name.encode()).decode()
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
        self, entry: QueueEntry, partition: int, offset: int, max_messages: int, max_bytes: int
    ) -> FetchResult:
        """Records from ``offset``. Below the low watermark or above the high one is an error
        that says where the log starts and ends; exactly at the high watermark is empty."""
        if offset < 0:
            raise invalid_argument("offset", f"must be >= 0 (got {offset})")
        log_id = self._log_id(entry, partition)
        with self._store.read() as txn:
            log = txn.log(log_id)
            wm = log.watermarks()
            if offset < wm.low or offset > wm.high:
                raise offset_out_of_range(entry.name, partition, offset, wm.low, wm.high)
            records = log.read(offset, max_messages, max_bytes) if offset < wm.high else []
        if records:
            assert records[0].offset == offset, "a log never skips an offset between watermarks"
        next_offset = records[-1].offset + 1 if records else offset
        return FetchResult(records, next_offset, wm)

    def offset_for_timestamp(self, entry: QueueEntry, partition: int, timestamp_ms: int) -> int:
        with self._store.read() as txn:
            return txn.log(self._log_id(entry, partition)).offset_for_timestamp(timestamp_ms)
