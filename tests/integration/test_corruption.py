"""A flipped byte on disk surfaces as DATA_LOSS from the broker, never as wrong data."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.client import record_batches

from .conftest import Node
from .rpc_helpers import rich_error

CANARY = b"FLUXMQ-CANARY-RECORD-" * 4


def flip_every_copy_of_the_canary(data: Path) -> None:
    """One bit of the canary, in the live page and in any stale copy LMDB left in the file (a
    page rewritten by a later commit), so the read surely meets the damage."""
    raw = bytearray(data.read_bytes())
    at = raw.find(CANARY)
    assert at >= 0
    while at >= 0:
        raw[at + 10] ^= 0x01
        at = raw.find(CANARY, at + 1)
    data.write_bytes(bytes(raw))


def test_flipped_byte_in_a_record_is_reported_as_data_loss(tmp_path: Path) -> None:
    node = Node(tmp_path / "c")
    node.start()
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="c")))
        for v in (b"before", CANARY, b"after"):  # three publishes: three batches
            stub.Publish(pb.PublishRequest(queue="c", messages=[pb.PublishMessage(value=v)]))
    assert node.stop() == 0

    flip_every_copy_of_the_canary(node.data_dir / "data.mdb")

    node.start()
    try:
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            assert (
                stub.Fetch(pb.FetchRequest(queue="c", offset=0, max_messages=1)).records[0].value
                == b"before"
            )
            with pytest.raises(grpc.RpcError) as info:
                stub.Fetch(pb.FetchRequest(queue="c", offset=1))
            e = rich_error(info.value)
            assert (e.code, e.reason, e.metadata["offset"]) == (
                grpc.StatusCode.DATA_LOSS,
                "DATA_CORRUPTED",
                "1",
            )
            assert stub.Fetch(pb.FetchRequest(queue="c", offset=2)).records[0].value == b"after"
    finally:
        node.stop()


def test_flipped_byte_in_a_batch_is_data_loss_for_every_offset_it_holds(tmp_path: Path) -> None:
    node = Node(tmp_path / "c")
    node.start()
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="c")))
        stub.Publish(pb.PublishRequest(queue="c", messages=[pb.PublishMessage(value=b"first")]))
        values = [b"before", CANARY, b"after"]  # one publish: one batch at offsets 1..3
        stub.Publish(
            pb.PublishRequest(queue="c", messages=[pb.PublishMessage(value=v) for v in values])
        )
    assert node.stop() == 0

    flip_every_copy_of_the_canary(node.data_dir / "data.mdb")

    node.start()
    try:
        with node.channel() as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            assert (
                stub.Fetch(pb.FetchRequest(queue="c", offset=0, max_messages=1)).records[0].value
                == b"first"
            )
            for offset in (1, 2, 3):
                with pytest.raises(grpc.RpcError) as info:
                    stub.Fetch(pb.FetchRequest(queue="c", offset=offset))
                e = rich_error(info.value)
                assert (e.code, e.reason) == (grpc.StatusCode.DATA_LOSS, "DATA_CORRUPTED")
                assert (e.metadata["first_offset"], e.metadata["last_offset"]) == ("1", "3")
            # Batches go to the client as stored; the SDK's decoder refuses the damaged one.
            resp = stub.Fetch(pb.FetchRequest(queue="c", offset=1, record_batches=True))
            (batch,) = resp.record_batches
            with pytest.raises(record_batches.CorruptBatchError):
                record_batches.decode(resp.log_id, batch.base_offset, batch.data, 0, 1)
    finally:
        node.stop()
