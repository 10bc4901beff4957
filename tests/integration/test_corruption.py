"""A flipped byte on disk surfaces as DATA_LOSS from the broker, never as wrong data."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc

from .conftest import Node
from .rpc_helpers import rich_error

CANARY = b"FLUXMQ-CANARY-RECORD-" * 4


def test_flipped_byte_in_a_record_is_reported_as_data_loss(tmp_path: Path) -> None:
    node = Node(tmp_path / "c")
    node.start()
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)
        stub.CreateQueue(pb.CreateQueueRequest(config=pb.QueueConfig(name="c")))
        values = [b"before", CANARY, b"after"]
        stub.Publish(
            pb.PublishRequest(queue="c", messages=[pb.PublishMessage(value=v) for v in values])
        )
    assert node.stop() == 0

    data = node.data_dir / "data.mdb"
    raw = bytearray(data.read_bytes())
    at = raw.find(CANARY)
    assert at >= 0 and raw.find(CANARY, at + 1) < 0
    raw[at + 10] ^= 0x01
    data.write_bytes(bytes(raw))

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
