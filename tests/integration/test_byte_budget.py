"""Byte budgets on a live node (issue 20, item 8): a key sending large publishes is held to its
tier's byte rate (RATE_LIMITED) and to its share of the node's in-flight bytes (NODE_BUSY),
while another key's small publishes keep being served; the in-flight bytes of a call are given
back when it ends, answered, failed or cancelled."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from tests.integration.rpc_helpers import rich_error
from tests.integration.test_security import Api, md, serving_secured

MIB = 1024 * 1024
# "fat" keys: 2 MiB/s of request bytes, burst 4 MiB; the node: 8 MiB in flight, 4 MiB a key.
TIERS = (
    "default:publish=100000/100000,consume=100000/100000,admin=1000/1000;"
    "fat:publish=100000/100000,consume=100000/100000,admin=1000/1000,bytes=2097152/4194304"
)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[str, Api]]:
    with serving_secured(
        tmp_path,
        "--rate-limit-tiers", TIERS,
        "--inflight-bytes-max", "8MiB",
        "--request-bytes-max", "16MiB",
    ) as (_node, admin, api):  # fmt: skip
        config = pb.QueueConfig(name="big", max_message_bytes=8 * MIB)
        api.q.CreateQueue(pb.CreateQueueRequest(config=config), metadata=md(admin), timeout=10)
        api.q.CreateQueue(
            pb.CreateQueueRequest(config=pb.QueueConfig(name="empty")),
            metadata=md(admin),
            timeout=10,
        )
        yield admin, api


def publish(api: Api, key: str, size: int, queue: str = "big") -> str:
    """-> the outcome: OK, or the status code name and the reason."""
    request = pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(value=b"x" * size)])
    try:
        api.q.Publish(request, metadata=md(key), timeout=20)
    except grpc.RpcError as err:
        return f"{err.code().name}/{rich_error(err).reason}"
    return "OK"


def test_large_publishes_of_one_key_are_limited_while_another_keys_small_ones_are_served(
    live: tuple[str, Api],
) -> None:
    admin, api = live
    fat = api.key(admin, "producer", tier="fat")
    small = api.key(admin, "producer")
    outcomes: list[str] = []

    def flood() -> None:
        for _ in range(5):
            outcomes.append(publish(api, fat, 3 * MIB))

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for thread in threads:
        thread.start()
    served = [publish(api, small, 100, "empty") for _ in range(30)]
    for thread in threads:
        thread.join(60)
    assert served == ["OK"] * 30
    assert len(outcomes) == 20
    refused = [o for o in outcomes if o != "OK"]
    assert refused, outcomes
    assert set(refused) <= {"RESOURCE_EXHAUSTED/RATE_LIMITED", "RESOURCE_EXHAUSTED/NODE_BUSY"}
    # 20 x 3 MiB at 2 MiB/s, burst 4 MiB: far fewer than all of them pass in a minute.
    assert outcomes.count("OK") < 20


def _until(outcome: str, attempt: Callable[[], str], bound_s: float = 10.0) -> str:
    """``attempt()`` until it gives ``outcome`` (bounded) -> its last outcome."""
    deadline = time.monotonic() + bound_s
    got = ""
    while time.monotonic() < deadline:
        got = attempt()
        if got == outcome:
            return got
        time.sleep(0.05)
    return got


def test_a_keys_share_of_in_flight_bytes_refuses_it_node_busy_and_frees_when_calls_end(
    live: tuple[str, Api],
) -> None:
    admin, api = live
    holder = api.key(admin, "consumer")
    producer = api.key(admin, "producer")
    other = api.key(admin, "producer")
    # A long poll on an empty queue holds its response bytes (max_bytes 16 MiB, cut to the
    # key's 4 MiB share) for as long as it waits.
    fetch = pb.FetchRequest(queue="empty", max_bytes=16 * MIB, wait_ms=30_000)
    waiting = api.q.Fetch.future(fetch, metadata=md(holder), timeout=40)
    try:
        # The same key cannot take more while it waits; a read by it is refused NODE_BUSY.
        def second_fetch() -> str:
            try:
                api.q.Fetch(
                    pb.FetchRequest(queue="empty", max_bytes=MIB), metadata=md(holder), timeout=10
                )
            except grpc.RpcError as err:
                return f"{err.code().name}/{rich_error(err).reason}"
            return "OK"

        busy = "RESOURCE_EXHAUSTED/NODE_BUSY"
        assert _until(busy, second_fetch) == busy
        # Another key is served meanwhile.
        assert publish(api, other, 100, "empty") == "OK"
    finally:
        waiting.cancel()
    # The cancelled long poll gave its bytes back.
    assert _until("OK", second_fetch) == "OK"

    # Failed calls give their bytes back too: had the first 3 MiB publish to a missing queue
    # kept its bytes, the second would exceed the key's 4 MiB share and be NODE_BUSY.
    for _ in range(4):
        assert publish(api, producer, 3 * MIB, "missing").startswith("NOT_FOUND")
    assert publish(api, producer, 3 * MIB) == "OK"
    assert publish(api, other, 3 * MIB) == "OK"
