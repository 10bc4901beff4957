"""The embedded metadata store's file shared by a node's shard processes: a watch in one process
hears of another process's write (as a re-read of everything), of none of its own, and of no
API-key usage time (every process writes those)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from fluxmq.metadata import EmbeddedMetadataStore, NodeInfo
from tests.contract.test_api_key_store_contract import make_key

WRITER = """
import asyncio, sys
from fluxmq.metadata import EmbeddedMetadataStore, NodeInfo
from tests.contract.test_api_key_store_contract import make_key

async def main() -> None:
    store = EmbeddedMetadataStore(sys.argv[1])
    await store.register_node(NodeInfo("other", "127.0.0.1:1", "127.0.0.1", 1, 0), 60_000)
    await store.close()

asyncio.run(main())
"""


TOUCHER = """
import asyncio, sys
from fluxmq.metadata import EmbeddedMetadataStore

async def main() -> None:
    store = EmbeddedMetadataStore(sys.argv[1])
    await store.touch_api_keys({sys.argv[2]: 1_000})
    assert await store.list_api_key_usage() == {sys.argv[2]: 1_000}
    await store.close()

asyncio.run(main())
"""


async def pending_kinds(watch: object, wait_s: float) -> set[tuple[str, str]]:
    seen: set[tuple[str, str]] = set()
    while True:
        try:
            event = await asyncio.wait_for(anext(watch), wait_s)  # type: ignore[call-overload]
        except TimeoutError:
            return seen
        seen.add((event.kind, event.key))


async def test_a_watch_hears_of_another_processs_write_and_not_of_its_own(tmp_path: Path) -> None:
    store = EmbeddedMetadataStore(tmp_path / "meta", watch_poll_ms=20)
    watch = store.watch()
    await pending_kinds(watch, 0.2)  # the first re-read every watch starts with
    await store.register_node(NodeInfo("mine", "127.0.0.1:2", "127.0.0.1", 2, 0), 60_000)
    assert await pending_kinds(watch, 0.3) == {("node", "mine")}  # its own: the key, no re-read
    await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", WRITER, str(tmp_path / "meta")], check=True
    )
    seen = await pending_kinds(watch, 0.5)
    assert ("node", "") in seen and ("api_key", "") in seen  # everything, re-read
    assert {n.node_id for n in await store.list_nodes()} == {"mine", "other"}
    # Usage times are written by every process that serves a key, and watched by nobody.
    _, key = make_key()
    await store.create_api_key(key, 2)
    await pending_kinds(watch, 0.3)  # its own write
    await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", TOUCHER, str(tmp_path / "meta"), key.key_id],
        check=True,
    )
    assert await pending_kinds(watch, 0.3) == set()
    await watch.aclose()
    await store.close()
