"""The quorum rule hook 7 and the shard's self-check share: an index counts as committed-safe
once more than half the members have it on disk (pysyncobj's "count > members / 2")."""

from __future__ import annotations

import doctest

import pytest

from raft import _pysyncobj
from raft._pysyncobj import majority_index


@pytest.mark.parametrize(
    ("durable", "expected"),
    [
        ([4], 4),  # one member: its own disk
        ([7, 5, 3], 5),
        ([3, 7, 5], 5),  # order does not matter
        ([9, 9, 2, 1], 2),  # four members need three
        ([5, 5, 5, 5, 1], 5),
        ([9, 1, 1, 1, 1], 1),  # a leader far ahead alone commits nothing new
    ],
)
def test_an_index_is_on_a_majority_once_more_than_half_the_members_hold_it(
    durable: list[int], expected: int
) -> None:
    assert majority_index(durable) == expected
    assert sum(d >= expected for d in durable) > len(durable) / 2


def test_the_worked_examples_hold() -> None:
    failed, _ = doctest.testmod(_pysyncobj)
    assert failed == 0
