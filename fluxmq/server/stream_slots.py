"""The bound on concurrent streams of a node (Tail, Consume, PublishStream, served here or
relayed to another node). Each stream holds buffers, a task and wake-ups for as long as it
runs, and each of its reads takes an LMDB reader slot for a moment; without a bound, a client
opening thousands of streams exhausts the node for every other client. A stream beyond the
bound is refused at once with RESOURCE_EXHAUSTED / TOO_MANY_STREAMS, retriable with RetryInfo:
slots free up as other streams end."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fluxmq.core.errors import FluxError

# Below LMDB's 256 reader slots (storage.lmdb_store.MAX_READERS), with room for the apply
# thread, the Raft driver, unary reads and scrapes, should a stream ever hold a read open.
STREAMS_MAX_DEFAULT = 200
RETRY_AFTER_MS = 1000


def too_many_streams(limit: int) -> FluxError:
    return FluxError(
        "TOO_MANY_STREAMS",
        f"this node already runs {limit} streams (Tail, Consume, PublishStream), its limit "
        "(streams_max); retry later, on another node, or close streams you do not use",
        retriable=True,
        retry_after_ms=RETRY_AFTER_MS,
        metadata={"limit": str(limit)},
    )


class StreamSlots:
    """A counter of open streams with a ceiling (event-loop confined: no lock)."""

    def __init__(self, limit: int = STREAMS_MAX_DEFAULT) -> None:
        if limit < 1:
            raise ValueError(f"streams limit must be >= 1, got {limit}")
        self.limit = limit
        self.open = 0

    @contextmanager
    def hold(self) -> Iterator[None]:
        """One slot for the ``with`` block; TOO_MANY_STREAMS when none is free."""
        if self.open >= self.limit:
            raise too_many_streams(self.limit)
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1
