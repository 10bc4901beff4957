"""A command larger than the coalescing frame (frame_bytes_max) but within entry_bytes_max is
replicated alone in its frame (issue 20, item 12: a cluster takes the publishes a single node
takes), while small commands still coalesce into frames of at most frame_bytes_max; beyond
entry_bytes_max a command is refused before anything is written."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from raft.api import ShardRequestDeniedError
from raft.pysyncobj_shard import ShardConfig
from tests.raft.helpers import encoded_frame_sizes
from tests.raft.test_replication import assert_same_history, propose_all, running, sole_leader

FRAME_BYTES_MAX = 4096
ENTRY_BYTES_MAX = 64 * 1024
WAIT_S = 15.0


async def test_a_command_over_the_frame_size_within_the_entry_limit_is_replicated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = encoded_frame_sizes(monkeypatch)
    overrides = {"frame_bytes_max": FRAME_BYTES_MAX, "entry_bytes_max": ENTRY_BYTES_MAX}
    async with running(tmp_path, **overrides) as c:
        leader = await sole_leader(c)
        big = b"B" * (ENTRY_BYTES_MAX - 1024)
        small = [b"%04d" % i + b"s" * 996 for i in range(40)]
        await propose_all([leader], [big, *small])
        await c.converged(WAIT_S)
        assert_same_history(c, [big, *small])
        assert max(sizes) > FRAME_BYTES_MAX  # the big one, alone
        assert sorted(sizes)[-2] <= FRAME_BYTES_MAX  # the small ones coalesced as before
        with pytest.raises(ShardRequestDeniedError, match=str(ENTRY_BYTES_MAX)):
            await leader.propose(b"x" * ENTRY_BYTES_MAX)


def test_the_largest_entry_stays_below_pysyncobjs_chunking_threshold() -> None:
    default = ShardConfig("g1", "127.0.0.1:7100", ("127.0.0.1:7101",), "/d", "s" * 16)
    assert default.entry_limit == default.frame_bytes_max
    assert default.append_batch_bytes == 4 * default.frame_bytes_max  # unchanged by default
    big = replace(default, entry_bytes_max=65 * 1024 * 1024)
    # pysyncobj takes its chunked path for an entry of append_batch_bytes or more.
    assert big.append_batch_bytes > big.entry_limit == 65 * 1024 * 1024
    assert big.wire_limits.frame_bytes_max > big.append_batch_bytes
