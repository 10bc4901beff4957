"""A node forwarding a call for a group it does not host follows one NOT_LEADER redirect: the
directory named a member that no longer leads (a leadership change it has not seen yet), and
that member names the leader's gRPC address; NOT_LEADER means nothing was done, so the call goes
there once more. Any other failure, or a NOT_LEADER naming nobody new, is the caller's answer."""

from __future__ import annotations

from typing import Any

import pytest

from fluxmq.core.errors import FluxError
from fluxmq.server.router import Router, RoutingInterceptor, call_leader
from fluxmq.server.shard.proposer import not_leader


class ScriptedForwarder:
    """Answers each forward with the next scripted outcome; records the addresses called."""

    def __init__(self, *outcomes: object) -> None:
        self.outcomes = list(outcomes)
        self.called: list[str] = []

    async def forward(self, address: str, method: str, request: Any, context: Any) -> Any:
        self.called.append(address)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, FluxError):
            raise outcome
        return outcome

    async def close(self) -> None:
        pass


def interceptor(forwarder: ScriptedForwarder) -> RoutingInterceptor:
    router = Router("g1", forwarder)  # type: ignore[arg-type]
    return RoutingInterceptor(router)


async def test_forwarding_follows_one_not_leader_redirect_to_the_named_leader() -> None:
    fwd = ScriptedForwarder(not_leader("stale", "10.0.0.3:7070"), "answer")
    assert await interceptor(fwd)._forward("10.0.0.2:7070", "Heartbeat", None, None) == "answer"
    assert fwd.called == ["10.0.0.2:7070", "10.0.0.3:7070"]
    assert call_leader.get() == "10.0.0.3:7070"  # the trailer names who answered


@pytest.mark.parametrize(
    "refusal",
    [
        not_leader("electing", None),
        not_leader("names itself", "10.0.0.2:7070"),
        FluxError("QUEUE_NOT_FOUND", "no such queue"),
    ],
)
async def test_forwarding_gives_up_without_a_new_leader_to_go_to(refusal: FluxError) -> None:
    fwd = ScriptedForwarder(refusal, "never")
    with pytest.raises(FluxError) as err:
        await interceptor(fwd)._forward("10.0.0.2:7070", "Heartbeat", None, None)
    assert err.value.reason == refusal.reason
    assert fwd.called == ["10.0.0.2:7070"]
