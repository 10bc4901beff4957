"""What the parts of a replicated publish cost on this machine, each alone: ``python -m
bench.floor``.

A one-message publish at c=1 on a 3-node cluster is, at the least: a gRPC unary call (client to
leader and back), a hand-off from the event loop to the Raft driver thread and one back, a
round trip to a follower over TCP, the follower's journal append and fdatasync, and the apply of
the message. Each is timed here on its own, in the language and libraries FluxMQ runs (Python,
grpc.aio on uvloop, sockets, os.fdatasync, LMDB), sequentially, nothing else running. Their sum
is a floor under the cluster's c=1 latency that no scheduling in ``raft/`` can go below; the
cluster runs them on 4 processes (3 nodes and the client) sharing the machine's cores, so it
pays wake-ups on top.

Bounded: each part runs ``--calls`` times (default 2,000).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import queue
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import lmdb
import uvloop

PAYLOAD = os.urandom(600)  # a 256 B message in its publish request and Raft frame, roughly
SERVICE = "bench.Floor"


def _quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "p50_ms": xs[len(xs) // 2] * 1e3,
        "p99_ms": xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e3,
        "mean_ms": statistics.fmean(xs) * 1e3,
    }


def _timed(calls: int, one: Callable[[], None]) -> list[float]:
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        one()
        out.append(time.perf_counter() - started)
    return out


# -- gRPC unary round trip (grpc.aio on uvloop, both ends) ------------------------------------


def _echo_server(port: int, ready: Any) -> None:
    async def serve() -> None:
        async def echo(request: bytes, _context: Any) -> bytes:
            return request

        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    uvloop.run(serve())


def grpc_unary(calls: int) -> list[float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_echo_server, args=(port, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(20):
            raise RuntimeError("the echo server did not start")

        async def run() -> list[float]:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                echo = channel.unary_unary(f"/{SERVICE}/Echo")
                for _ in range(50):
                    await echo(PAYLOAD)
                out = []
                for _ in range(calls):
                    started = time.perf_counter()
                    await echo(PAYLOAD)
                    out.append(time.perf_counter() - started)
                return out

        return uvloop.run(run())
    finally:
        server.terminate()
        server.join(5)


# -- event loop -> worker thread -> event loop -------------------------------------------------


def thread_handoff(calls: int) -> list[float]:
    """A proposal handed from the event loop to a thread (queue + wake-up) and its result
    handed back (call_soon_threadsafe), as the broker hands one to the Raft driver."""
    inbox: queue.Queue[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None] = (
        queue.Queue()
    )

    def worker() -> None:
        while (item := inbox.get()) is not None:
            loop, fut = item
            loop.call_soon_threadsafe(fut.set_result, None)

    t = threading.Thread(target=worker, daemon=True)
    t.start()

    async def run() -> list[float]:
        loop = asyncio.get_running_loop()
        out = []
        for _ in range(calls):
            started = time.perf_counter()
            fut: asyncio.Future[None] = loop.create_future()
            inbox.put((loop, fut))
            await fut
            out.append(time.perf_counter() - started)
        return out

    try:
        return uvloop.run(run())
    finally:
        inbox.put(None)
        t.join(5)


# -- TCP round trip between two processes -------------------------------------------------------


def _tcp_echo(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := conn.recv(1 << 16):
        conn.sendall(data[:16])


def tcp_round_trip(calls: int) -> list[float]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    peer = multiprocessing.Process(target=_tcp_echo, args=(listener,), daemon=True)
    peer.start()
    c = socket.create_connection(listener.getsockname())
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:

        def one() -> None:
            c.sendall(PAYLOAD)
            c.recv(64)

        return _timed(calls, one)
    finally:
        c.close()
        peer.join(5)
        listener.close()


# -- disk -----------------------------------------------------------------------------------------


def journal_append(calls: int, directory: str) -> list[float]:
    """One pwrite + fdatasync into a preallocated file: a follower's journal flush."""
    fd = os.open(os.path.join(directory, "segment"), os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, calls * len(PAYLOAD) + 4096)
    os.fsync(fd)
    position = [0]

    def one() -> None:
        os.pwrite(fd, PAYLOAD, position[0])
        os.fdatasync(fd)
        position[0] += len(PAYLOAD)

    try:
        return _timed(calls, one)
    finally:
        os.close(fd)


def lmdb_commit_synced(calls: int, directory: str) -> list[float]:
    """One fsync'd LMDB commit of one entry: what the journal cost before segment files."""
    env = lmdb.open(os.path.join(directory, "lmdb"), map_size=1 << 30, sync=True, metasync=True)
    keys = iter(range(calls))

    def one() -> None:
        with env.begin(write=True) as txn:
            txn.put(next(keys).to_bytes(8, "big"), PAYLOAD)

    try:
        return _timed(calls, one)
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    calls = max(10, min(args.calls, 100_000))
    home = os.path.expanduser("~")  # the disk the nodes' data directories are on, not a tmpfs
    with tempfile.TemporaryDirectory(dir=home) as d:
        rows = [
            ("gRPC unary round trip (grpc.aio + uvloop, 600 B)", grpc_unary(calls)),
            ("event loop -> thread -> event loop", thread_handoff(calls)),
            ("TCP round trip between two processes (600 B)", tcp_round_trip(calls)),
            ("journal append: pwrite + fdatasync, preallocated (600 B)", journal_append(calls, d)),
            ("for comparison: fsync'd LMDB commit (600 B)", lmdb_commit_synced(calls, d)),
        ]
    print(f"| part ({calls} calls each, sequential) | p50 ms | p99 ms | mean ms |")
    print("|---|---:|---:|---:|")
    for name, xs in rows:
        q = _quantiles(xs)
        print(f"| {name} | {q['p50_ms']:.3f} | {q['p99_ms']:.3f} | {q['mean_ms']:.3f} |")


if __name__ == "__main__":
    main()
