"""bench.auth_profile's sample counting: what it calls the security edge's share."""

from __future__ import annotations

import doctest

from bench import auth_profile


def test_guard_share_worked_example() -> None:
    assert doctest.testmod(auth_profile).failed == 0


def test_guard_share_counts_every_guard_frame_and_nothing_else() -> None:
    raw = "\n".join(
        [
            "run (a.py:1);Guard.admit (fluxmq/server/guard.py:10) 2",
            "run (a.py:1);parse_key (fluxmq/core/auth.py:5) 1",
            "run (a.py:1);RateLimiter.take (fluxmq/core/ratelimit.py:7) 1",
            "run (a.py:1);_authenticate (fluxmq/server/interceptors.py:9) 1",
            "run (a.py:1);QueueService.Publish (fluxmq/server/queue_service.py:176) 3",
            "run (a.py:1);StateMachine._append_checked (fluxmq/core/state_machine.py:5) 1",
            "run (a.py:1);_checked (fluxmq/server/elsewhere.py:5) 1",
            "",
            "garbage line",
        ]
    )
    assert auth_profile.guard_share(raw) == (10, 0.5)
    assert auth_profile.guard_share("") == (0, 0.0)
