"""The channel between a node's front end and its shard processes (issue 35): ``python -m
bench.local_channel``.

Two processes, each on a uvloop event loop, as the front end and a shard process would be. The
front end sends requests of ``--request-bytes`` (a small publish) and the shard answers each
with ``--answer-bytes``, over:

- ``unix``: a Unix stream socket, each message ``u32 length | body``, read with asyncio's
  protocol callbacks;
- ``grpc-unix``: a grpc.aio call over a Unix socket (identity serializers: no protobuf), which
  is what routing through FluxMQ's existing forwarding path (fluxmq/server/forwarding.py) to a
  shard process would cost.

One caller (round trip p50 / p99 in microseconds), then ``--concurrency`` callers (messages per
second and CPU microseconds per message of each process). Bounded: each run stops after
``--calls`` calls or ``--duration`` seconds.

Why framed messages on a Unix socket and not a second gRPC hop: measured here, a grpc.aio call
costs about ten times the CPU of a framed message on each side and about eight times its round
trip (bench/RESULTS.md, issue 35).

Why a Unix socket and not a shared-memory ring: a ring saves the kernel's copy of a few hundred
bytes, not the system call. A reader asleep must be woken (an eventfd or a socket byte: one
call), and waking it only when it said it is about to sleep is a store-then-load handshake
between processes that x86 may reorder without a memory fence, which Python cannot issue (a
lost wake-up). Rung on every write, a ring measured here no better than the socket at one
caller (round trip 68-93 us against 61-76 us, 30-40 us of CPU per message on each side
against 20-34; see bench/RESULTS.md), while the socket gives bounded buffers, ordering and
the other process's death (end of file) for free.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import struct
import time
from multiprocessing import get_context
from typing import Any

import uvloop

_LEN = struct.Struct("<I")


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


# -- unix socket ---------------------------------------------------------------------------


class _Frames(asyncio.Protocol):
    def __init__(self, on_frame: Any) -> None:
        self._buf = bytearray()
        self._on_frame = on_frame
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # uvloop's transports are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        while len(buf) - pos >= 4:
            (n,) = _LEN.unpack_from(buf, pos)
            if len(buf) - pos - 4 < n:
                break
            self._on_frame(bytes(buf[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        del buf[:pos]

    def send(self, body: bytes) -> None:
        assert self.transport is not None
        self.transport.write(_LEN.pack(len(body)) + body)


def _unix_shard(sock: socket.socket, answer_bytes: int) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        answer = b"a" * answer_bytes
        proto: _Frames

        def on_frame(body: bytes) -> None:
            if body in (b"cpu", b"stop"):
                proto.send(_LEN.pack(0) + struct.pack("<d", cpu_s()))
                if body == b"stop":
                    done.set_result(None)
                return
            proto.send(body[:8] + answer)

        proto = _Frames(on_frame)
        await loop.connect_accepted_socket(lambda: proto, sock)
        await done

    uvloop.run(main())


# -- the front end ---------------------------------------------------------------------------


async def _drive(call: Any, args: argparse.Namespace, c: int) -> dict[str, float]:
    request_tail = b"r" * max(0, args.request_bytes - 8)
    ids = iter(range(1, 1 << 62))
    latencies: list[float] = []
    sent = [0]
    stop_at = time.monotonic() + args.duration

    async def caller() -> None:
        while sent[0] < args.calls and time.monotonic() < stop_at:
            sent[0] += 1
            t0 = time.perf_counter()
            await call(struct.pack("<Q", next(ids)) + request_tail)
            latencies.append(time.perf_counter() - t0)

    cpu0, t0 = cpu_s(), time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(c)))
    elapsed, cpu = time.perf_counter() - t0, cpu_s() - cpu0
    latencies.sort()
    return {
        "calls": len(latencies),
        "rate": len(latencies) / elapsed,
        "p50_us": 1e6 * statistics.median(latencies),
        "p99_us": 1e6 * latencies[int(0.99 * (len(latencies) - 1))],
        "front_cpu_us": 1e6 * cpu / len(latencies),
    }


async def _measure(call: Any, shard_cpu_s: Any, args: argparse.Namespace) -> list[dict[str, float]]:
    rows = []
    for c in (1, args.concurrency):
        before = await shard_cpu_s()
        row = await _drive(call, args, c)
        row["shard_cpu_us"] = 1e6 * (await shard_cpu_s() - before) / row["calls"]
        row["concurrency"] = c
        rows.append(row)
    return rows


async def _front(args: argparse.Namespace) -> list[dict[str, float]]:
    loop = asyncio.get_running_loop()
    ctx = get_context("spawn")
    answers: dict[int, asyncio.Future[bytes]] = {}
    cpu_answers: list[asyncio.Future[float]] = []

    def on_answer(body: bytes) -> None:
        if body[:4] == _LEN.pack(0):
            cpu_answers.pop(0).set_result(struct.unpack_from("<d", body, 4)[0])
            return
        (k,) = struct.unpack_from("<Q", body)
        answers.pop(k).set_result(body)

    front_sock, shard_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = ctx.Process(target=_unix_shard, args=(shard_sock, args.answer_bytes))
    proc.start()
    shard_sock.close()
    proto = _Frames(on_answer)
    await loop.connect_accepted_socket(lambda: proto, front_sock)
    send = proto.send

    async def shard_cpu_s(what: bytes = b"cpu") -> float:
        fut: asyncio.Future[float] = loop.create_future()
        cpu_answers.append(fut)
        send(what)
        return await fut

    async def call(body: bytes) -> bytes:
        fut: asyncio.Future[bytes] = loop.create_future()
        answers[struct.unpack_from("<Q", body)[0]] = fut
        send(body)
        return await fut

    await shard_cpu_s()  # the shard process is up
    rows = await _measure(call, shard_cpu_s, args)
    await shard_cpu_s(b"stop")
    proc.join(10)
    return rows


# -- gRPC over a Unix socket (what forwarding to a shard process through the existing
# forwarding path would cost) ---------------------------------------------------------------


def _identity(b: bytes) -> bytes:
    return b


def _grpc_shard(path: str, answer_bytes: int) -> None:
    import grpc

    async def main() -> None:
        stop = asyncio.Event()
        answer = b"a" * answer_bytes

        async def echo(request: bytes, _context: Any) -> bytes:
            return request[:8] + answer

        async def cpu(request: bytes, _context: Any) -> bytes:
            if request == b"stop":
                stop.set()
            return struct.pack("<d", cpu_s())

        handlers = {
            "Echo": grpc.unary_unary_rpc_method_handler(echo, _identity, _identity),
            "Cpu": grpc.unary_unary_rpc_method_handler(cpu, _identity, _identity),
        }
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("b", handlers),))
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        await stop.wait()
        await server.stop(0.5)

    uvloop.run(main())


async def _grpc_front(args: argparse.Namespace) -> list[dict[str, float]]:
    import tempfile

    import grpc

    path = os.path.join(tempfile.mkdtemp(prefix="fluxmq-channel-"), "shard.sock")
    proc = get_context("spawn").Process(target=_grpc_shard, args=(path, args.answer_bytes))
    proc.start()
    async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
        echo = channel.unary_unary("/b/Echo", _identity, _identity)
        cpu = channel.unary_unary("/b/Cpu", _identity, _identity)

        async def shard_cpu_s(what: bytes = b"cpu") -> float:
            return float(struct.unpack("<d", await cpu(what, wait_for_ready=True))[0])

        await shard_cpu_s()
        rows = await _measure(echo, shard_cpu_s, args)
        await shard_cpu_s(b"stop")
    proc.join(10)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.local_channel", description=__doc__)
    parser.add_argument("--request-bytes", type=int, default=300)
    parser.add_argument("--answer-bytes", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print(
        "| channel | callers | calls | msg/s | p50 us | p99 us | front CPU us/msg "
        "| shard CPU us/msg |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for _ in range(args.repeat):
        for kind, front in (("unix", _front), ("grpc-unix", _grpc_front)):
            for r in uvloop.run(front(args)):
                print(
                    f"| {kind} | {r['concurrency']:.0f} | {r['calls']:.0f} | {r['rate']:.0f} | "
                    f"{r['p50_us']:.0f} | {r['p99_us']:.0f} | {r['front_cpu_us']:.1f} | "
                    f"{r['shard_cpu_us']:.1f} |"
                )


if __name__ == "__main__":
    main()
