"""How a shard process takes its calls: the FramedServer on its end of the socket pair the front
end made, its serving status sent to the front end's health service, and its life tied to the
front end's (it dies with it)."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import os
import signal
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fluxmq.server.router import names_held
from fluxmq.server.shard_process.shard_server import FramedServer
from fluxmq.server.shard_process.siblings import encode_report

if TYPE_CHECKING:
    from fluxmq.server.shard.runtime import ShardRuntime

QUEUE_REPORT_INTERVAL_S = 1.0  # catalog changes no call made (none today) reach the front end

# Set by the front end in the shard process's environment (never by an operator).
SHARD_FD_ENV = "FLUXMQ_INTERNAL_SHARD_FD"
FRONT_PORT_ENV = "FLUXMQ_INTERNAL_FRONT_PORT"
FRONT_PID_ENV = "FLUXMQ_INTERNAL_FRONT_PID"
NODE_CONFIG_ENV = "FLUXMQ_INTERNAL_NODE_CONFIG"
SHARD_INDEX_ENV = "FLUXMQ_INTERNAL_SHARD_INDEX"  # this shard process's number, from 0
SHARD_COUNT_ENV = "FLUXMQ_INTERNAL_SHARD_COUNT"  # the node's shard processes
FRONT_SOCKET_ENV = "FLUXMQ_INTERNAL_FRONT_SOCKET"  # the front end's internal socket ("": none)
_PR_SET_PDEATHSIG = 1


def is_shard_process(environ: Mapping[str, str] | None = None) -> bool:
    return SHARD_FD_ENV in (os.environ if environ is None else environ)


def shard_index(environ: Mapping[str, str] | None = None) -> int:
    """This shard process's number (0 outside a shard process)."""
    return int((os.environ if environ is None else environ).get(SHARD_INDEX_ENV, "0"))


def shard_count(environ: Mapping[str, str] | None = None) -> int:
    """The node's shard processes (1 outside a shard process)."""
    return int((os.environ if environ is None else environ).get(SHARD_COUNT_ENV, "1"))


def front_socket(environ: Mapping[str, str] | None = None) -> str:
    return (os.environ if environ is None else environ).get(FRONT_SOCKET_ENV, "")


def node_config_settings(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The front end's settings, as it passed them (already validated there)."""
    settings: dict[str, Any] = json.loads(
        (os.environ if environ is None else environ)[NODE_CONFIG_ENV]
    )
    return settings


def die_with_front_end() -> None:
    """The kernel kills this process when the front end dies (kill -9 of a node stops all of
    it, as it did when it was one process); if the front end is already gone, exit now."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is not None:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(os.environ[FRONT_PID_ENV]):
        os._exit(1)


class HealthRelay:
    """The shard process's serving statuses, sent to the front end on every change."""

    def __init__(self, server: FramedServer) -> None:
        self._server = server
        self._statuses: dict[str, int] = {}

    async def set(self, service: str, status: int) -> None:
        self._statuses[service] = int(status)
        self._server.send_health(tuple((k, str(v)) for k, v in self._statuses.items()))


class FramedEdge:
    def __init__(self, server: FramedServer, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.server = server
        self.health = HealthRelay(server)
        self.port = int(env[FRONT_PORT_ENV])
        self._sock = socket.socket(fileno=int(env[SHARD_FD_ENV]))
        self.front_end_gone = asyncio.Event()

    async def start(self) -> None:
        channel = await self.server.serve(self._sock)
        closed = channel.closed

        async def watch() -> None:
            await closed.wait()
            self.front_end_gone.set()

        self._watch = asyncio.create_task(watch(), name="front-end-watch")

    async def stop(self, grace_s: float) -> None:
        await self.server.stop(grace_s)


class QueueReporter:
    """Tells the front end this shard process's queues, and the DLQs they name, whenever a
    catalog changed (each is replaced, never changed in place, so a changed one is a
    different object)."""

    def __init__(
        self, server: FramedServer, runtimes: Callable[[], Mapping[str, ShardRuntime]]
    ) -> None:
        self._server = server
        self._runtimes = runtimes
        self._last: Mapping[str, object] = {}

    def maybe_report(self) -> None:
        current = {shard_id: r.state.catalog for shard_id, r in self._runtimes().items()}
        if current.keys() == self._last.keys() and all(
            current[k] is self._last[k] for k in current
        ):
            return
        self._last = current
        report = {shard_id: names_held(catalog) for shard_id, catalog in current.items()}
        self._server.send_queues(encode_report(report))

    async def report_routine(self) -> None:
        while True:
            await asyncio.sleep(QUEUE_REPORT_INTERVAL_S)
            self.maybe_report()
