"""Publishing's pieces: a PublishMessage filled from a caller's arguments, one Publish sent, the
results of an answer.

A retry never stores a message twice: ``publish()``, ``publish_batch()`` and ``producer()`` send
in a producer session (fluxmq/client/sessions.py), whose resends the broker answers with their
first outcome (``duplicate=True``); a message with your own ``idempotency_key`` travels without a
session, deduplicated by that key within the queue's ``dedup_window`` (default 2 minutes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client._transport import Transport
from fluxmq.client.arguments import integer_argument
from fluxmq.client.codecs import Codec, to_bytes
from fluxmq.client.errors import FluxMQError

log = logging.getLogger("fluxmq.client")

MAX_BATCH = 1000  # messages per Publish request (the broker's limit)
Headers = Mapping[str, str | bytes]
Key = str | bytes


class PublishResult(NamedTuple):
    """Where a message was stored. ``duplicate``: its idempotency key was seen within the
    dedup window, so this is the first write's position and nothing new was stored.
    ``pending``: asynchronous replication, no offset yet."""

    partition: int
    offset: int
    timestamp_ms: int
    duplicate: bool = False
    pending: bool = False


@dataclass(slots=True)
class OutgoingMessage:
    """One message of :func:`publish_batch`, when it needs more than a value."""

    value: Any
    key: Key | None = None
    headers: Headers | None = None
    partition: int | None = None
    delay_ms: int | None = None
    deliver_at_ms: int | None = None
    idempotency_key: str | None = None


def fill(
    m: pb.PublishMessage,
    codec: Codec,
    value: Any,
    key: Key | None = None,
    headers: Headers | None = None,
    partition: int | None = None,
    delay_ms: int | None = None,
    deliver_at_ms: int | None = None,
    idempotency_key: str | None = None,
) -> int:
    """Fills a PublishMessage; returns its size in bytes (key + value + headers)."""
    raw = codec.encode(value)
    m.value = raw
    size = len(raw)
    if key is not None:
        k = to_bytes(key, "key")
        m.key = k
        size += len(k)
    if headers:
        for name, v in headers.items():
            hv = to_bytes(v, "header", name)
            m.headers[name] = hv
            size += len(name) + len(hv)
    if partition is not None:
        m.partition = integer_argument(pb.PublishMessage, "partition", partition)
    if delay_ms:
        m.delay_ms = integer_argument(pb.PublishMessage, "delay_ms", delay_ms)
    if deliver_at_ms:
        m.deliver_at_ms = integer_argument(pb.PublishMessage, "deliver_at_ms", deliver_at_ms)
    if idempotency_key:
        m.idempotency_key = idempotency_key
    return size


def results_of(resp: pb.PublishResponse | pb.PublishStreamResponse) -> list[PublishResult]:
    if resp.HasField("batch"):  # the answer to encoded records: one range
        b = resp.batch
        if b.pending:
            return [PublishResult(b.partition, 0, 0, False, True)] * b.count
        # Made without a Python-level call per message (tuple.__new__ over zip): a request
        # of 1000 records answers 1000 results, and this is the client's busiest line.
        fields = zip(
            repeat(b.partition), range(b.base_offset, b.base_offset + b.count),
            repeat(b.timestamp_ms), repeat(b.duplicate), repeat(False),
        )  # fmt: skip
        return list(map(tuple.__new__, repeat(PublishResult), fields))
    return [
        PublishResult(r.partition, r.offset, r.timestamp_ms, r.duplicate, r.pending)
        for r in resp.results
    ]


async def send_request(
    transport: Transport,
    request: pb.PublishRequest,
    timeout_s: float | None = None,
    *,
    safe: bool = True,
    give_up: Callable[[FluxMQError], bool] | None = None,
) -> list[PublishResult]:
    """One Publish. ``safe``: every message has an idempotency key (or the request a producer
    session), so a retry after a lost answer stores nothing twice (otherwise only failures
    where nothing was written are retried). ``give_up``: errors not to retry after all."""
    resp = await transport.unary(
        "queue", "Publish", request, safe=safe, queue=request.queue, timeout_s=timeout_s,
        give_up=give_up,
    )  # fmt: skip
    return results_of(resp)
