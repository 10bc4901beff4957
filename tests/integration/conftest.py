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

STARTUP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """One `fluxmq serve` process with its data dir; can be killed and restarted."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.metrics_port = free_port()
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.env: dict[str, str] | None = None  # None: inherit this process's environment

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [
            sys.executable, "-m", "fluxmq", "serve",
            "--data-dir", str(self.data_dir),
            "--listen", self.address,
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
            *self.extra,
        ]  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child process owns it
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
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
        return grpc.insecure_channel(self.address)


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
