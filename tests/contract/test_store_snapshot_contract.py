"""Copies, replacement and digests of a whole store (storage/api.py), on every implementation.

A copy written by ``copy_to`` and read back by ``replace_from`` must reproduce the store exactly;
``replace_from`` must be all or nothing; ``digest`` must see every change and be the same for
LmdbStore and MemoryStore holding the same content.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator
from hashlib import sha256
from pathlib import Path

import pytest

from storage import LmdbStore, MemoryStore, NewRecord, StorageError, Store, record_batch
from storage.codec import position

MiB = 1024 * 1024
StoreFactory = Callable[[], Store]
LOG_IDS = (0, 1, 5, 2**64 - 1)


@pytest.fixture(params=["lmdb", "memory"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Builds empty stores of one implementation; closes them afterwards."""
    made: list[Store] = []

    def make() -> Store:
        store: Store
        if request.param == "lmdb":
            path = tmp_path / f"store{len(made)}"
            store = LmdbStore(str(path), map_size_bytes=256 * MiB, sync=False)
        else:
            store = MemoryStore()
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def rec(value: bytes, timestamp_ms: int = 1_000, **kw: object) -> NewRecord:
    return NewRecord(timestamp_ms, value, **kw)  # type: ignore[arg-type]


def fill(store: Store) -> None:
    """Logs in every state a log can be in, and a key/value table."""
    with store.write() as txn:
        txn.log(0).append([rec(b"a"), rec(b"b", key=b"k"), rec(b"c", headers=(("h", b"v"),))])
        txn.log(1).append([rec(bytes([i]) * i, timestamp_ms=i) for i in range(50)])
        txn.log(5).append([rec(b"emptied")])
        txn.log(2**64 - 1).append([rec(b"last", idempotency_key="idem")])
        txn.put(b"a", b"1")
        txn.put(b"a/b", b"")
        txn.put(b"z" * 511, b"x" * 1000)
    with store.write() as txn:
        txn.log(1).append([rec(b"more", timestamp_ms=60)] * 5)  # a second batch: [50, 54]
        txn.log(1).truncate_before(20)  # low above 0, inside the first batch [0, 49]
        txn.log(5).truncate_before(1)  # empty, but high remembered
        txn.log(9).append([rec(b"gone")])
    with store.write() as txn:
        assert txn.log(9).drop()


def content(store: Store) -> object:
    """Everything a reader can see of the logs in LOG_IDS (+ a dropped one) and the table."""
    with store.read() as txn:
        logs = [
            (
                txn.log(i).watermarks(),
                txn.log(i).size_bytes(),
                txn.log(i).read(0, 10**6, 2**62),
                txn.log(i).batch_headers(0, 10**6),
            )
            for i in (*LOG_IDS, 9)
        ]
        return logs, list(txn.scan(b""))


def copy(store: Store, path: Path) -> str:
    store.copy_to(str(path))
    return str(path)


def test_copy_replaced_into_another_store_reproduces_it(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    source, target = make_store(), make_store()
    fill(source)
    target.replace_from(copy(source, tmp_path / "copy"))
    assert content(target) == content(source)
    assert target.digest() == source.digest()
    with target.read() as txn:
        # The batch that holds low came over whole, its records below low still unreadable.
        assert txn.log(1).watermarks().low == 20
        assert [(h.base_offset, h.count) for h in txn.log(1).batch_headers(0, 10)] == [
            (0, 50),
            (50, 5),
        ]
        assert txn.log(1).read(0, 1, 2**20)[0].offset == 20
    # The copy goes on like the original: same offsets for the next appends.
    for store in (source, target):
        with store.write() as txn:
            assert txn.log(1).append([rec(b"next", timestamp_ms=99)]) == 55
            assert txn.log(5).append([rec(b"next")]) == 1
            assert txn.log(9).append([rec(b"next")]) == 0
    assert content(target) == content(source)
    assert target.digest() == source.digest()


def test_replace_from_discards_everything_the_store_held_before(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    source, target = make_store(), make_store()
    with source.write() as txn:
        txn.log(1).append([rec(b"new")])
        txn.put(b"kept", b"new")
    with target.write() as txn:
        txn.log(1).append([rec(b"old"), rec(b"old")])
        txn.log(3).append([rec(b"old")])
        txn.put(b"kept", b"old")
        txn.put(b"stale", b"old")
    target.replace_from(copy(source, tmp_path / "copy"))
    assert content(target) == content(source)
    with target.read() as txn:
        assert txn.log(3).watermarks().high == 0
        assert txn.get(b"stale") is None
        assert txn.get(b"kept") == b"new"
    assert target.digest() == source.digest()


def test_copy_of_an_empty_store_empties_the_target(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    source, target = make_store(), make_store()
    fill(target)
    target.replace_from(copy(source, tmp_path / "copy"))
    assert content(target) == content(source)
    assert target.digest() == source.digest()


def test_copy_shows_the_view_of_the_read_transaction_it_is_given(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    source, target = make_store(), make_store()
    with source.write() as txn:
        txn.log(1).append([rec(b"before")])
    before = content(source)
    with source.read() as view:
        with source.write() as txn:
            txn.log(1).append([rec(b"after")])
            txn.put(b"k", b"after")
        try:
            source.copy_to(str(tmp_path / "copy"), view)
        except StorageError:
            # The memory twin keeps no snapshots: it refuses rather than copy the wrong state.
            assert isinstance(source, MemoryStore)
            assert not (tmp_path / "copy").exists()
            return
    target.replace_from(str(tmp_path / "copy"))
    assert content(target) == before


def test_copy_refuses_to_overwrite_an_existing_file(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    store = make_store()
    (tmp_path / "copy").write_bytes(b"precious")
    with pytest.raises(StorageError):
        store.copy_to(str(tmp_path / "copy"))
    assert (tmp_path / "copy").read_bytes() == b"precious"


def test_reader_that_began_before_replace_never_sees_the_new_content(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    source, target = make_store(), make_store()
    with source.write() as txn:
        txn.log(1).append([rec(b"new")])
        txn.put(b"k", b"new")
    with target.write() as txn:
        txn.log(1).append([rec(b"old"), rec(b"old")])
        txn.put(b"k", b"old")
    path = copy(source, tmp_path / "copy")
    with target.read() as reader:
        target.replace_from(path)
        # LMDB keeps the reader's snapshot; the memory twin keeps none and must refuse instead.
        try:
            seen = ([r.value for r in reader.log(1).read(0, 10, 10_000)], reader.get(b"k"))
        except StorageError:
            assert isinstance(target, MemoryStore)
        else:
            assert seen == ([b"old", b"old"], b"old")
    assert content(target) == content(source)


def test_concurrent_readers_see_all_old_or_all_new_content(tmp_path: Path) -> None:
    """Readers in other threads while replace_from runs: each read transaction shows one whole
    version (LMDB only: the memory twin is single-threaded)."""
    versions: list[str] = []
    for name, count in (("small", 3), ("large", 400)):
        store = LmdbStore(str(tmp_path / name), map_size_bytes=256 * MiB, sync=False)
        with store.write() as txn:
            for log_id in range(4):
                txn.log(log_id).append([rec(name.encode())] * count)
            txn.put(b"version", name.encode())
        versions.append(copy(store, tmp_path / f"{name}.copy"))
        store.close()
    live = LmdbStore(str(tmp_path / "live"), map_size_bytes=256 * MiB, sync=False)
    live.replace_from(versions[0])
    expected = {b"small": 3, b"large": 400}
    seen: list[tuple[bytes | None, tuple[int, ...]]] = []
    stop = threading.Event()

    def read_until_stopped() -> None:
        while not stop.is_set():
            with live.read() as txn:
                highs = tuple(txn.log(log_id).watermarks().high for log_id in range(4))
                seen.append((txn.get(b"version"), highs))

    readers = [threading.Thread(target=read_until_stopped) for _ in range(3)]
    for thread in readers:
        thread.start()
    try:
        for n in range(10):
            live.replace_from(versions[(n + 1) % 2])
    finally:
        stop.set()
        for thread in readers:
            thread.join()
        live.close()
    assert seen
    for version, highs in seen:
        assert version is not None
        assert highs == (expected[version],) * 4, (version, highs)


def test_digest_changes_whenever_the_content_does(make_store: StoreFactory) -> None:
    store = make_store()
    digests = [store.digest()]

    def changed() -> None:
        digests.append(store.digest())
        assert digests[-1] != digests[-2], f"change {len(digests) - 1} left the digest as it was"

    with store.write() as txn:
        txn.log(1).append([rec(b"a"), rec(b"b")])
    changed()
    with store.write() as txn:
        txn.log(2).append([rec(b"a")])  # same record, other log
    changed()
    with store.write() as txn:
        txn.log(1).truncate_before(1)  # log meta: low moves
    changed()
    with store.write() as txn:
        txn.log(1).truncate_before(2)  # emptied: only the watermarks remain
    changed()
    with store.write() as txn:
        assert txn.log(1).drop()  # forgotten
    changed()
    with store.write() as txn:
        txn.put(b"k", b"v")
    changed()
    with store.write() as txn:
        txn.put(b"k", b"w")  # same key, other value
    changed()
    with store.write() as txn:
        txn.put(b"kw", b"")  # key and value bytes regrouped: b"k"+b"w" vs b"kw"+b""
    changed()
    with store.write() as txn:
        txn.delete(b"k")
    changed()
    assert len(set(digests)) == len(digests)
    # Nothing changed: the same digest again.
    assert store.digest() == digests[-1]


def test_digest_leaves_out_the_excluded_keys(make_store: StoreFactory) -> None:
    store = make_store()
    with store.write() as txn:
        txn.put(b"M/applied", b"1")
        txn.put(b"k", b"v")
    first = store.digest(exclude_kv_keys=(b"M/applied",))
    with store.write() as txn:
        txn.put(b"M/applied", b"2")
    assert store.digest(exclude_kv_keys=(b"M/applied",)) == first
    assert store.digest() != first
    with store.write() as txn:
        txn.put(b"k", b"w")
    assert store.digest(exclude_kv_keys=(b"M/applied",)) != first


@pytest.mark.parametrize(
    "damage",
    ["garbage", "empty", "truncated", "flipped", "other_implementation", "directory", "missing"],
)
def test_replace_from_a_bad_copy_is_refused_and_changes_nothing(
    make_store: StoreFactory, tmp_path: Path, damage: str
) -> None:
    source, target = make_store(), make_store()
    fill(source)
    with source.write() as txn:
        txn.log(7).append([rec(b"only in the copy")])
    with target.write() as txn:
        txn.log(1).append([rec(b"mine")])
        txn.put(b"k", b"mine")
    bad = tmp_path / "bad"
    good = Path(copy(source, tmp_path / "good")).read_bytes()
    if damage == "garbage":
        bad.write_bytes(b"\xde\xad\xbe\xef" * 10_000)
    elif damage == "empty":
        bad.write_bytes(b"")
    elif damage == "truncated":
        bad.write_bytes(good[: len(good) // 2])
    elif damage == "flipped":
        bad.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    elif damage == "other_implementation":
        other: Store = (
            MemoryStore()
            if isinstance(source, LmdbStore)
            else LmdbStore(str(tmp_path / "other"), map_size_bytes=64 * MiB, sync=False)
        )
        fill(other)
        other.copy_to(str(bad))
        other.close()
    elif damage == "directory":
        bad.mkdir()
    before = (content(target), target.digest())
    with pytest.raises(StorageError):
        target.replace_from(str(bad))
    assert (content(target), target.digest()) == before
    # Still a working store.
    with target.write() as txn:
        assert txn.log(1).append([rec(b"more")]) == 1


def test_lmdb_and_memory_digests_agree_for_the_same_writes(tmp_path: Path) -> None:
    lmdb_store = LmdbStore(str(tmp_path / "lmdb"), map_size_bytes=64 * MiB, sync=False)
    memory_store = MemoryStore()
    try:
        assert lmdb_store.digest() == memory_store.digest()
        for store in (lmdb_store, memory_store):
            fill(store)
        assert lmdb_store.digest() == memory_store.digest()
        assert lmdb_store.digest(exclude_kv_keys=(b"a",)) == memory_store.digest(
            exclude_kv_keys=(b"a",)
        )
        with lmdb_store.write() as txn:
            txn.put(b"a", b"2")
        assert lmdb_store.digest() != memory_store.digest()
    finally:
        lmdb_store.close()
        memory_store.close()


def test_digest_pins_the_documented_encoding() -> None:
    """The digest is compared across nodes and versions: it must not drift by accident."""
    store = MemoryStore()
    with store.write() as txn:
        txn.log(3).append([rec(b"x"), rec(b"y")])
        txn.log(3).append([rec(b"z")])
        txn.log(3).truncate_before(1)
        txn.put(b"k", b"v")
    first = record_batch.encode(3, 0, [rec(b"x"), rec(b"y")])
    second = record_batch.encode(3, 2, [rec(b"z")])
    expected = sha256(
        b"fluxmq-store-digest-1"
        + b"L"
        + (3).to_bytes(8, "big")
        + (1).to_bytes(8, "big")
        + (3).to_bytes(8, "big")
        + (len(first) + len(second)).to_bytes(8, "big")
        + b"B"
        + (0).to_bytes(8, "big")
        + len(first).to_bytes(4, "big")
        + first
        + b"B"
        + (2).to_bytes(8, "big")
        + len(second).to_bytes(4, "big")
        + second
        + b"K"
        + (1).to_bytes(2, "big")
        + (1).to_bytes(4, "big")
        + b"kv"
    ).hexdigest()
    assert store.digest() == expected


def remove_batch(store: Store, log_id: int, base_offset: int) -> None:
    """Delete one stored batch behind the store's back (a raw LMDB delete, or the twin's lists),
    leaving its metadata as it was."""
    if isinstance(store, LmdbStore):
        env = store._env
        with env.begin(write=True) as txn:
            db = env.open_db(b"batches", txn=txn, create=False)
            assert txn.delete(position(log_id, base_offset), db=db)
        return
    assert isinstance(store, MemoryStore)
    state = store._logs[log_id]
    index = state.bases.index(base_offset)
    del state.bases[index]
    del state.batches[index]


def test_replace_from_refuses_a_copy_with_a_gap_between_batches(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    source, target = make_store(), make_store()
    with source.write() as txn:
        for base in range(0, 9, 3):
            txn.log(1).append([rec(bytes([base + i])) for i in range(3)])
    remove_batch(source, 1, 3)
    with target.write() as txn:
        txn.log(1).append([rec(b"mine")])
    before = (content(target), target.digest())
    try:
        source.copy_to(str(tmp_path / "copy"))
    except StorageError:
        return  # refusing to copy a log with a hole is as good as refusing the copy
    with pytest.raises(StorageError, match=r"missing|where the one before ends"):
        target.replace_from(str(tmp_path / "copy"))
    assert (content(target), target.digest()) == before


# The twin's copy format, built by hand: each check of replace_from, alone, refuses a copy that
# is otherwise sound (right magic, sizes and sha256).

_COPY_MAGIC = b"FLUXMQ-MEMORY-STORE-2\n"


def _memory_copy(
    path: Path, log_id: int, low: int, high: int, batches: list[tuple[int, bytes]], size: int
) -> str:
    body = _COPY_MAGIC + b"L" + struct.pack(">QQQQ", log_id, low, high, size)
    for base, batch in batches:
        body += struct.pack(">QI", base, len(batch)) + batch
    body += b"E"
    path.write_bytes(body + sha256(body).digest())
    return str(path)


def _batch(log_id: int, base: int, count: int) -> bytes:
    return record_batch.encode(log_id, base, [rec(bytes([base + i])) for i in range(count)])


@pytest.mark.parametrize(
    ("low", "high", "layout", "problem"),
    [
        pytest.param(0, 6, [(0, 2, 0), (3, 3, 3)], "where the one before ends at 2", id="gap"),
        pytest.param(0, 5, [(0, 3, 0), (2, 3, 2)], "where the one before ends at 3", id="overlap"),
        pytest.param(1, 5, [(2, 3, 2)], "above low", id="first-above-low"),
        pytest.param(3, 5, [(0, 2, 0), (2, 3, 2)], r"\[0, 1\] lies outside", id="below-low"),
        pytest.param(0, 4, [(0, 2, 0), (2, 3, 2)], r"\[2, 4\] lies outside", id="past-high"),
        pytest.param(0, 5, [(0, 2, 0), (2, 3, 1)], "crc32c", id="sealed-elsewhere"),
    ],
)
def test_memory_replace_from_refuses_batches_that_do_not_tile_the_log(
    tmp_path: Path,
    low: int,
    high: int,
    layout: list[tuple[int, int, int]],
    problem: str,
) -> None:
    """layout: (stored base, count, base the batch was sealed for)."""
    batches = [(base, _batch(1, sealed_for, count)) for base, count, sealed_for in layout]
    path = _memory_copy(tmp_path / "copy", 1, low, high, batches, sum(len(b) for _, b in batches))
    store = MemoryStore()
    with pytest.raises(StorageError, match=problem):
        store.replace_from(path)
    assert store.digest() == MemoryStore().digest()


def test_memory_replace_from_refuses_sizes_that_do_not_add_up(tmp_path: Path) -> None:
    batches = [(0, _batch(1, 0, 2)), (2, _batch(1, 2, 3))]
    size = sum(len(b) for _, b in batches)
    store = MemoryStore()
    with pytest.raises(StorageError, match="its metadata says"):
        store.replace_from(_memory_copy(tmp_path / "bad", 1, 0, 5, batches, size + 1))
    # The same copy with the right size is accepted: only the size was wrong.
    store.replace_from(_memory_copy(tmp_path / "good", 1, 1, 5, batches, size))
    with store.read() as txn:
        assert [r.value for r in txn.log(1).read(0, 10, 2**20)] == [
            bytes([i]) for i in (1, 2, 3, 4)
        ]
