"""An append-entries answer delayed across terms on one TCP connection (tests/sim/
stale_answer.py has the schedule): without its term (raft/_pysyncobj.py hook 12) the leader
counts it for the entries now at those indexes and commits an entry only it holds."""

from __future__ import annotations

import pytest

from raft import _pysyncobj
from tests.sim.stale_answer import run_stale_answer


def test_an_answer_delayed_from_an_earlier_term_does_not_count_toward_a_commit() -> None:
    result = run_stale_answer()
    assert result.stale_answers_held == 2  # the schedule did hold them on the stalled link
    assert not result.committed_on_a_alone
    assert result.converged


def test_without_the_term_on_answers_the_leader_commits_an_entry_only_it_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The negative control: the same schedule, the leader taking every answer as stock
    # pysyncobj does.
    monkeypatch.setattr(_pysyncobj, "_is_stale_answer", lambda message, term: False)
    with pytest.raises(AssertionError, match="committed means durable on a majority") as caught:
        run_stale_answer()
    assert "(index 7, term 5)" in str(caught.value)
    assert "only ['10.0.0.1:7100'] of 3 have it on disk" in str(caught.value)
