"""Real broker processes on loopback for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fluxmq._pb.v1 import queue_pb2_grpc
from fluxmq.server.shard_process.supervisor import child_pids

STARTUP_TIMEOUT_S = 30.0


_ISSUED: set[int] = set()


def free_port() -> int:
    """A port nothing listens on, and never one this process handed out before: the kernel
    may offer a just-released port again, and one cluster asks for several at once."""
    for _ in range(1_000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _ISSUED:
            _ISSUED.add(port)
            return port
    raise RuntimeError("no fresh free port in 1000 tries")


class _Authorize(  # type: ignore[misc]
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <key>`` to every call that does not carry its own."""

    def __init__(self, api_key: str) -> None:
        self._header = ("authorization", f"Bearer {api_key}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = list(details.metadata or ())
        if any(k == "authorization" for k, _ in metadata):
            return details
        return details._replace(metadata=[*metadata, self._header])  # type: ignore[attr-defined,no-any-return]

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), requests)


class Node:
    """One `fluxmq serve` process with its data dir; can be killed and restarted. With
    ``api_key`` set, every call on ``channel()`` presents it (unless the call brings its own)."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.metrics_port = free_port()
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.env: dict[str, str] | None = None  # None: inherit this process's environment
        self.api_key = ""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "fluxmq", "serve",
            "--data-dir", str(self.data_dir),
            "--listen", self.address,
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
            *self.extra,
        ]  # fmt: skip

    def spawn(self) -> None:
        """Start the process without waiting for it to serve."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child process owns it
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.env
        )

    def start(self) -> None:
        self.spawn()
        self.wait_serving()

    def wait_serving(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        with self.channel() as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(f"node exited early:\n{self.log_path.read_text()}")
                try:
                    resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if resp.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.05)
        raise RuntimeError(f"node did not become ready:\n{self.log_path.read_text()}")

    def shard_pids(self) -> list[int]:
        """The node's shard process (``shard_processes = 1``): none otherwise."""
        return [] if self.proc is None else child_pids(self.proc.pid)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise

    def channel(self) -> grpc.Channel:
        return authorized_channel(self.address, self.api_key)


def authorized_channel(address: str, api_key: str) -> grpc.Channel:
    """A plaintext channel to ``address`` whose calls present ``api_key`` ('' for none)."""
    channel = grpc.insecure_channel(address)
    if not api_key:
        return channel
    return _AuthorizedChannel(channel, api_key)


class _AuthorizedChannel(grpc.Channel):  # type: ignore[misc]
    """An intercepted channel that still closes (and works as a context manager) like the
    channel under it: tests write ``with node.channel() as ch``."""

    def __init__(self, channel: grpc.Channel, api_key: str) -> None:
        self._raw = channel
        self._channel = grpc.intercept_channel(channel, _Authorize(api_key))

    def subscribe(self, callback, try_to_connect=False):  # type: ignore[no-untyped-def]
        self._raw.subscribe(callback, try_to_connect)

    def unsubscribe(self, callback):  # type: ignore[no-untyped-def]
        self._raw.unsubscribe(callback)

    def unary_unary(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._channel.unary_unary(*args, **kwargs)

    def unary_stream(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._channel.unary_stream(*args, **kwargs)

    def stream_unary(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._channel.stream_unary(*args, **kwargs)

    def stream_stream(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._channel.stream_stream(*args, **kwargs)

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> _AuthorizedChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node1")
    n.start()
    yield n
    n.stop()


@pytest.fixture
def stub(node: Node) -> Iterator[queue_pb2_grpc.QueueServiceStub]:
    with node.channel() as ch:
        yield queue_pb2_grpc.QueueServiceStub(ch)


os.environ.setdefault("PYTHONUNBUFFERED", "1")
