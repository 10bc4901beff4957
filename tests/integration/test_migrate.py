"""``fluxmq migrate --data-dir DIR`` as an operator runs it on a stopped node's data directory
of record format 1 (its store, a replication group's store, Raft snapshots), and ``fluxmq
serve`` meeting such a directory."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from raft import snapshot_file
from storage import LmdbStore, OldFormatError
from storage.migrate import copy_format
from tests import format1_store as f1

from .conftest import Node, free_port

RUN_TIMEOUT_S = 60.0
LAST = (b"last-command", 4242, 7)
PREV = (b"prev-command", 4241, 7)
MEMBERS = ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]


def fluxmq(*args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLUXMQ")}
    return subprocess.run(
        [sys.executable, "-m", "fluxmq", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=clean,
        stdin=subprocess.DEVNULL,
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A cluster node's data directory of format 1: its store, a replication group's store,
    and the Raft snapshot of its home shard (whose state copy is format 1)."""
    root = tmp_path / "node"
    f1.write_env(str(root), f1.sample_content())
    f1.write_env(str(root / "groups" / "g1"), f1.sample_content())
    state = tmp_path / "state.copy"
    f1.write_copy(str(root), str(state))
    raft_dir = root / "raft" / "home"
    raft_dir.mkdir(parents=True)
    snapshot_file.write(str(raft_dir / "snapshot"), LAST, PREV, MEMBERS, str(state))
    return root


def test_fluxmq_migrate_rewrites_stores_and_snapshots_in_place(
    data_dir: Path, tmp_path: Path
) -> None:
    content = f1.sample_content()
    with pytest.raises(OldFormatError, match="fluxmq migrate"):
        LmdbStore(str(data_dir))

    proc = fluxmq("migrate", "--data-dir", str(data_dir))

    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3, proc.stdout
    assert f"{data_dir}: migrated to format 2: 3 logs, 290 records" in lines[0]
    assert f"{data_dir / 'groups' / 'g1'}: migrated to format 2" in lines[1]
    assert f"{data_dir / 'raft' / 'home' / 'snapshot'}: snapshot at log index 4242" in lines[2]
    for store_dir in (data_dir, data_dir / "groups" / "g1"):
        store = LmdbStore(str(store_dir))
        try:
            f1.assert_store_holds(store, content)
        finally:
            store.close()
    snapshot = data_dir / "raft" / "home" / "snapshot"
    info = snapshot_file.read_info(str(snapshot))
    assert (info.last, info.prev, list(info.members)) == (LAST, PREV, MEMBERS)
    state = tmp_path / "extracted.copy"
    snapshot_file.extract_state(str(snapshot), info, str(state))
    assert copy_format(str(state)) == 2
    replica = LmdbStore(str(tmp_path / "replica"))
    try:
        replica.replace_from(str(state))
        f1.assert_store_holds(replica, content)
    finally:
        replica.close()
    leftovers = [p for p, _d, _f in os.walk(data_dir) if ".fluxmq-migrate-" in p]
    assert leftovers == []


def test_fluxmq_migrate_a_second_time_says_nothing_to_do(data_dir: Path) -> None:
    assert fluxmq("migrate", "--data-dir", str(data_dir)).returncode == 0
    files = [data_dir / "data.mdb", data_dir / "raft" / "home" / "snapshot"]
    before = [sha256(path) for path in files]

    proc = fluxmq("migrate", "--data-dir", str(data_dir))

    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and all("already format 2, nothing to do" in ln for ln in lines), lines
    assert [sha256(path) for path in files] == before


def test_fluxmq_migrate_refuses_a_damaged_row_and_exits_non_zero(data_dir: Path) -> None:
    log_id = next(iter(f1.sample_content().logs))
    row = bytearray(f1.row_at(str(data_dir), log_id, 42))
    row[10] ^= 0x01
    f1.put_row(str(data_dir), log_id, 42, bytes(row))
    before = sha256(data_dir / "data.mdb")

    proc = fluxmq("migrate", "--data-dir", str(data_dir))

    assert proc.returncode == 1, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"corrupt record in log {log_id} at offset 42" in proc.stderr
    assert "nothing was changed" in proc.stderr
    assert sha256(data_dir / "data.mdb") == before
    with pytest.raises(OldFormatError):
        LmdbStore(str(data_dir))


def test_fluxmq_migrate_refuses_while_a_process_holds_a_store(data_dir: Path) -> None:
    group = data_dir / "groups" / "g1"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import lmdb, sys; env = lmdb.open(sys.argv[1], max_dbs=8); "
            "print('open', flush=True); sys.stdin.read()",
            str(group),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        before = [sha256(data_dir / "data.mdb"), sha256(group / "data.mdb")]

        proc = fluxmq("migrate", "--data-dir", str(data_dir))

        assert proc.returncode == 1, proc.stdout
        assert str(group) in proc.stderr and "stop the node first" in proc.stderr
        # Refused before anything changed, the store nobody held included.
        assert [sha256(data_dir / "data.mdb"), sha256(group / "data.mdb")] == before
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(RUN_TIMEOUT_S)


def test_fluxmq_migrate_of_a_missing_directory_is_one_line_and_non_zero(tmp_path: Path) -> None:
    proc = fluxmq("migrate", "--data-dir", str(tmp_path / "nope"))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"fluxmq migrate: {str(tmp_path / 'nope')!r} is not a directory"
    ]


def test_serve_on_a_format_1_data_dir_fails_at_start_naming_fluxmq_migrate(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "old"
    f1.write_env(str(data_dir), f1.sample_content())
    before = sha256(data_dir / "data.mdb")

    proc = fluxmq(
        "serve",
        "--data-dir", str(data_dir),
        "--listen", f"127.0.0.1:{free_port()}",
        "--metrics-listen", "",
    )  # fmt: skip

    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "record format 1" in lines[0]
    assert "fluxmq migrate --data-dir" in lines[0]
    # Pointing at another directory would strand the data: the way forward is the migration.
    assert "choose a directory" not in lines[0]
    assert sha256(data_dir / "data.mdb") == before


# The last commit whose broker stored record format 1 (its child made the store write batches).
FORMAT_1_COMMIT = "8aa79dbb4d572d599e09280dc7558bf1a8ece911"
REPO = Path(__file__).resolve().parents[2]

RecordView = tuple[int, int, bytes, bytes | None, dict[str, bytes], str]


def format_1_broker_source(into: Path) -> Path:
    """The packages of the format-1 broker, from this repository's history."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", FORMAT_1_COMMIT, "fluxmq", "storage", "raft"],
            capture_output=True,
            timeout=RUN_TIMEOUT_S,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"the format-1 broker's source is not in this checkout's history: {err}")
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=RUN_TIMEOUT_S)
    return into


class Format1Node(Node):
    """A node of the format-1 broker: its packages first on the path, and run from their
    directory (``python -m`` puts the working directory before PYTHONPATH)."""

    def __init__(self, data_dir: Path, source: Path) -> None:
        super().__init__(data_dir)
        self.source = source
        self.env = {**os.environ, "PYTHONPATH": str(source)}

    def spawn(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child process owns it
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.source
        )


def fetch_all(
    stub: queue_pb2_grpc.QueueServiceStub, queue: str, partition: int
) -> list[RecordView]:
    out: list[RecordView] = []
    offset = 0
    while True:
        got = stub.Fetch(pb.FetchRequest(queue=queue, partition=partition, offset=offset))
        out.extend(
            (
                r.offset,
                r.timestamp_ms,
                r.value,
                r.key if r.HasField("key") else None,
                dict(r.headers),
                r.idempotency_key,
            )
            for r in got.records
        )
        if got.next_offset >= got.high_watermark:
            return out
        offset = got.next_offset


def test_data_written_by_the_format_1_broker_is_served_after_fluxmq_migrate(
    tmp_path: Path,
) -> None:
    old_source = format_1_broker_source(tmp_path / "format-1-broker")
    data_dir = tmp_path / "node"
    old = Format1Node(data_dir, old_source)
    old.start()
    try:
        with old.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            stub.CreateQueue(
                pb.CreateQueueRequest(config=pb.QueueConfig(name="orders", partitions=3))
            )
            for round_ in range(5):
                messages = [
                    pb.PublishMessage(
                        key=b"customer-%d" % (i % 4) if i % 5 else None,
                        value=b"order %d.%d" % (round_, i),
                        headers={"round": b"%d" % round_} if i % 2 else {},
                        idempotency_key=f"order-{round_}-{i}" if i % 3 == 0 else "",
                    )
                    for i in range(40)
                ]
                stub.Publish(pb.PublishRequest(queue="orders", messages=messages))
            before = {p: fetch_all(stub, "orders", p) for p in range(3)}
    finally:
        assert old.stop() == 0
    assert sum(len(records) for records in before.values()) == 200
    assert b"log" in f1.db_names(str(data_dir))

    proc = fluxmq("migrate", "--data-dir", str(data_dir))
    assert proc.returncode == 0, proc.stderr
    assert "migrated to format 2" in proc.stdout

    new = Node(data_dir)
    new.start()
    try:
        with new.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            assert {p: fetch_all(stub, "orders", p) for p in range(3)} == before
            # The dedup rows came along: a retry of an old message is answered, not written.
            again = stub.Publish(
                pb.PublishRequest(
                    queue="orders",
                    messages=[pb.PublishMessage(value=b"x", idempotency_key="order-2-3")],
                )
            ).results[0]
            original = next(r for p in before.values() for r in p if r[5] == "order-2-3")
            assert again.duplicate and (again.offset, again.timestamp_ms) == original[:2]
            fresh = stub.Publish(
                pb.PublishRequest(queue="orders", messages=[pb.PublishMessage(value=b"new")])
            ).results[0]
            assert fresh.offset == len(before[fresh.partition])
        held = fluxmq("migrate", "--data-dir", str(data_dir))
        assert held.returncode == 1 and "stop the node first" in held.stderr, held.stderr
    finally:
        assert new.stop() == 0
