"""The edge reads what a client is still writing before ending its stream with an error, and
that read is bounded in messages and time (a client that never half-closes cannot hold it)."""

from __future__ import annotations

import asyncio

import grpc

from fluxmq.server.client_streams import let_client_finish_writing


class Writer:
    """A client stream as the servicer context reads it."""

    def __init__(self, messages: int | None, stall: bool = False) -> None:
        self.messages = messages  # None: never half-closes
        self.stall = stall
        self.read_count = 0

    async def read(self) -> object:
        if self.stall:
            await asyncio.sleep(3600)
        if self.messages is not None and self.read_count >= self.messages:
            return grpc.aio.EOF
        self.read_count += 1
        return b"request"


def test_the_edge_reads_until_the_client_half_closes() -> None:
    writer = Writer(messages=3)
    assert asyncio.run(let_client_finish_writing(writer)) == 3  # type: ignore[arg-type]


def test_a_client_that_never_half_closes_costs_at_most_messages_max() -> None:
    writer = Writer(messages=None)
    read = asyncio.run(let_client_finish_writing(writer, messages_max=5))  # type: ignore[arg-type]
    assert read == 5 == writer.read_count


def test_a_silent_client_costs_at_most_settle_ms() -> None:
    async def run() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        read = await let_client_finish_writing(Writer(None, stall=True), settle_ms=50)  # type: ignore[arg-type]
        return read, loop.time() - started

    read, elapsed_s = asyncio.run(run())
    assert read == 0
    assert elapsed_s < 5  # bounded by settle_ms, not by the client


def test_a_failing_read_ends_the_wait_without_raising() -> None:
    class Gone:
        async def read(self) -> object:
            raise RuntimeError("the client went away")

    assert asyncio.run(let_client_finish_writing(Gone())) == 0  # type: ignore[arg-type]
