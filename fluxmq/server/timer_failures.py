"""How a leader timer (retention, lease and TTL expiry, member expiry, dead-letter alerts) logs
a pass that failed.

Losing leadership or the majority is part of a failover: the pass's proposal then ends
NOT_LEADER, OUTCOME_UNKNOWN, REQUEST_TIMEOUT, SHARD_BUSY or SHUTTING_DOWN, and the next tick
retries it (or a new leader takes over). Those are one WARNING line per streak, repeated at
most every ``interval_s`` with the count, and an INFO line when a pass works again: alerting on
ERROR stays quiet through a failover. Anything else is a bug or a real fault (a full disk,
corrupted data) and is logged as ERROR with its traceback, on every occurrence.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from fluxmq.core.errors import FluxError
from fluxmq.server.errors import domain_error

REPEAT_INTERVAL_S = 60.0


def expected(exc: BaseException) -> FluxError | None:
    """The retriable FluxError ``exc`` stands for (lost leadership, no majority, a timeout), or
    None when it is not one of those."""
    err = domain_error(exc)
    return err if err is not None and err.retriable else None


class TimerFailures:
    """The failure log of one leader timer (``what``: "lease expiry pass")."""

    def __init__(
        self,
        what: str,
        logger: logging.Logger,
        interval_s: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._what = what
        self._log = logger
        self._interval_s = interval_s
        self._clock = clock
        self._streak = 0  # expected failures since the last pass that worked
        self._unlogged = 0  # of those, not logged yet
        self._logged_at: float | None = None

    def failed(self, exc: BaseException) -> None:
        """Call from the timer's ``except Exception`` block."""
        err = expected(exc)
        if err is None:
            self._log.error("%s failed; retrying on the next tick", self._what, exc_info=exc)
            return
        self._streak += 1
        self._unlogged += 1
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < self._interval_s:
            return
        repeats = "" if self._unlogged == 1 else f" ({self._unlogged} times since the last line)"
        self._log.warning(
            "%s failed with %s%s: %s; retrying on the next tick",
            self._what,
            err.reason,
            repeats,
            err.message,
        )
        self._logged_at = now
        self._unlogged = 0

    def stand_down(self) -> None:
        """This node no longer leads: the timer idles, and a streak ends without a line."""
        self._streak = self._unlogged = 0
        self._logged_at = None

    def succeeded(self) -> None:
        """Call after a pass that worked: ends a streak of expected failures."""
        if self._streak:
            self._log.info("%s works again after %d failed passes", self._what, self._streak)
        self._streak = self._unlogged = 0
        self._logged_at = None
