"""Token buckets per (key, rate class): pure, time is an input.

A bucket holds at most ``burst`` tokens and gains ``rate_per_s`` per second; a call takes one
token per message (publish) or one per call (consume, admin). When the bucket is short, the call
is refused with the time until enough tokens are back, which the edge turns into
RESOURCE_EXHAUSTED / RATE_LIMITED with RetryInfo.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Limit:
    rate_per_s: float
    burst: int

    def __post_init__(self) -> None:
        assert self.rate_per_s > 0 and self.burst >= 1, self


@dataclass(slots=True)
class Bucket:
    limit: Limit
    tokens: float
    updated_ms: int

    def take(self, n: int, now_ms: int) -> int:
        """Take ``n`` tokens; -> 0 when taken, else the milliseconds until they would be there.

        A batch larger than the burst waits for a full bucket, then takes all ``n``: the bucket
        goes into debt, and later calls wait until it is paid back, so the rate holds for any
        batch size.

        >>> b = Bucket(Limit(rate_per_s=10, burst=5), tokens=5, updated_ms=0)
        >>> [b.take(1, 0) for _ in range(6)]
        [0, 0, 0, 0, 0, 100]
        >>> b.take(1, 100)
        0
        >>> b = Bucket(Limit(rate_per_s=10, burst=5), tokens=5, updated_ms=0)
        >>> b.take(25, 0), b.take(1, 0), b.take(1, 2000), b.take(1, 2100)
        (0, 2100, 100, 0)
        """
        elapsed_ms = max(0, now_ms - self.updated_ms)
        self.tokens = min(
            float(self.limit.burst), self.tokens + elapsed_ms * self.limit.rate_per_s / 1000
        )
        self.updated_ms = max(self.updated_ms, now_ms)
        admit_at = min(n, self.limit.burst)  # what must be there before the call may go
        if self.tokens >= admit_at:
            self.tokens -= n
            return 0
        return max(1, int((admit_at - self.tokens) * 1000 / self.limit.rate_per_s + 0.999))


@dataclass(slots=True)
class RateLimiter:
    """Buckets by (key id, class), created full on first use; the least recently used are
    dropped beyond ``buckets_max`` (a dropped bucket comes back full: generous, never stuck)."""

    buckets_max: int = 100_000
    _buckets: OrderedDict[tuple[str, str], Bucket] = field(default_factory=OrderedDict)

    def take(self, key_id: str, rate_class: str, limit: Limit, n: int, now_ms: int) -> int:
        slot = (key_id, rate_class)
        bucket = self._buckets.get(slot)
        # `is not` first: the limits of a tier are built once, so equality is rarely needed.
        if bucket is None or (bucket.limit is not limit and bucket.limit != limit):
            bucket = Bucket(limit, float(limit.burst), now_ms)
            self._buckets[slot] = bucket
            while len(self._buckets) > self.buckets_max:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(slot)
        return bucket.take(n, now_ms)


INFLIGHT_BYTES_MAX_DEFAULT = 256 * 1024 * 1024  # config.NodeConfig.inflight_bytes_max


@dataclass(slots=True)
class InflightBudget:
    """Bytes of requests (and of the responses reserved for them) a node is working on, with a
    ceiling per node and a smaller one per key, so that a few large calls of one tenant cannot
    hold the node's memory while every other tenant waits. Event-loop confined: no lock.

    A call that would go beyond either ceiling is refused (the edge answers RESOURCE_EXHAUSTED /
    NODE_BUSY, retriable), except on an idle node: a single call larger than the share of a key
    (or than the node's budget) still runs when nothing else does, so that a big but legal
    message always gets through.

    >>> b = InflightBudget(node_bytes_max=100, key_bytes_max=50)
    >>> b.reserve("a", 40), b.reserve("a", 20), b.reserve("b", 50), b.reserve("c", 20)
    (True, False, True, False)
    >>> b.release("a", 40); b.release("b", 50); b.in_use
    0
    >>> b.reserve("a", 500), b.reserve("b", 1)
    (True, False)
    """

    node_bytes_max: int
    key_bytes_max: int
    in_use: int = 0
    _by_key: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.node_bytes_max >= 1 and 1 <= self.key_bytes_max <= self.node_bytes_max, self

    def reserve(self, key: str | None, n: int) -> bool:
        """Reserve ``n`` bytes for ``key`` (None: a caller without a key, auth off, bound by
        the node's ceiling only); -> whether it fits. True must be paired with ``release``."""
        held = self._by_key.get(key, 0) if key is not None else 0
        fits = self.in_use + n <= self.node_bytes_max and (
            key is None or held + n <= self.key_bytes_max
        )
        if not fits and self.in_use > 0:
            return False
        self.in_use += n
        if key is not None:
            self._by_key[key] = held + n
        return True

    def release(self, key: str | None, n: int) -> None:
        self.in_use = max(0, self.in_use - n)
        if key is None:
            return
        held = self._by_key.get(key, 0) - n
        if held > 0:
            self._by_key[key] = held
        else:
            self._by_key.pop(key, None)  # idle keys cost no memory

    def held_by(self, key: str) -> int:
        return self._by_key.get(key, 0)

    def free_for(self, key: str | None) -> int:
        """The bytes ``key`` could still reserve (0 when either ceiling is reached).

        >>> b = InflightBudget(node_bytes_max=100, key_bytes_max=50)
        >>> b.reserve("a", 30), b.free_for("a"), b.free_for("b"), b.free_for(None)
        (True, 20, 50, 70)
        """
        node_free = self.node_bytes_max - self.in_use
        if key is None:
            return max(0, node_free)
        return max(0, min(node_free, self.key_bytes_max - self._by_key.get(key, 0)))
