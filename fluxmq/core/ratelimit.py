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
