"""The front end runs its shard process, and runs it again when it dies.

A shard process is ``python -m fluxmq serve`` with the front end's settings and one end of a
socket pair (the other end is the front end's ``ShardProcessLink``). It serves once it says so
(its first health frame). If it dies (a crash, kill -9, the OOM killer) the link fails the
calls in flight, the port reports QueueService and AdminService not serving, and a new one
starts after a back-off; it opens the same data directory and catches up as a restarted replica
does. One that exits before it ever served stopped on something a restart does not fix (its
settings, its data directory): the node stops with its exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

from fluxmq.config import NodeConfig
from fluxmq.server.shard_process import shard_edge
from fluxmq.server.shard_process.front import ShardProcessLink

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
STABLE_AFTER_S = 30.0  # a shard process that ran this long starts the back-off over
STOP_EXTRA_S = 5.0  # beyond the shutdown grace, before a shard process that hangs is killed
PID_FILE = "shard-process.pid"
PREVIOUS_GONE_WAIT_S = 10.0
CHANNEL_SOCKET_BYTES = 2 * 1024 * 1024  # each end's send buffer on the channel


class ShardProcessExited(Exception):
    """The shard process stopped before it served (it printed why): the node stops too."""

    def __init__(self, code: int) -> None:
        super().__init__(f"shard process exited with {code}")
        self.code = code


def wait_previous_gone(
    data_dir: str, timeout_s: float = PREVIOUS_GONE_WAIT_S, index: int = 0
) -> bool:
    """The shard process of this data directory's last front end, if it still runs, is dying
    (the kernel kills it when its front end dies, a moment after): wait until it is gone, so
    that a node restarted at once after a kill -9 does not find its ports and store taken.
    -> False: still there after ``timeout_s``."""
    try:
        with open(pid_file(data_dir, index)) as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return True  # none, or none readable: the data directory's own check says why
    deadline = time.monotonic() + timeout_s
    while pid > 0 and _is_shard_process(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a front end's shard process), from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if ppid == pid:
            out.append(int(entry))
    return out


def _is_shard_process(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return shard_edge.SHARD_FD_ENV.encode() in f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False


def _write_pid(data_dir: str, index: int, pid: int) -> None:
    os.makedirs(data_dir, exist_ok=True)
    path = pid_file(data_dir, index)
    with open(path + ".tmp", "w") as f:
        f.write(f"{pid}\n")
    os.replace(path + ".tmp", path)


LOCAL_SHARDS_DIR = "local-shards"


def process_config(cfg: NodeConfig, index: int) -> NodeConfig:
    """The settings shard process ``index`` runs with: the node's own, but with several the
    front end serves the metrics port (asking each for its metrics), and on a single node each
    after the first keeps its local shard's store in ``<data_dir>/local-shards/<index>`` (the
    first's is the node's data directory, as in one process)."""
    if cfg.shard_processes < 2:
        return cfg
    data_dir = cfg.data_dir
    if index > 0 and not cfg.cluster_mode:  # a cluster node's share the groups/ directory
        data_dir = os.path.join(cfg.data_dir, LOCAL_SHARDS_DIR, str(index))
    return dataclasses.replace(cfg, data_dir=data_dir, metrics_listen="")


def pid_file(data_dir: str, index: int) -> str:
    """Where shard process ``index`` of the node on ``data_dir`` writes its pid."""
    return os.path.join(data_dir, PID_FILE if index == 0 else f"shard-process-{index}.pid")


def node_data_dir(process_data_dir: str, index: int) -> str:
    """The node's data directory, from shard process ``index``'s (``process_config``'s inverse):
    what the node's shard processes share (its API keys)."""
    if index == 0:
        return process_data_dir
    parent = os.path.dirname(os.path.normpath(process_data_dir))
    assert os.path.basename(parent) == LOCAL_SHARDS_DIR, process_data_dir
    return os.path.dirname(parent)


class ShardProcessSupervisor:
    def __init__(
        self,
        cfg: NodeConfig,
        front_port: int,
        link: ShardProcessLink,
        on_down: Callable[[], None],
        *,
        index: int = 0,
        front_socket: str = "",
    ) -> None:
        self._cfg = process_config(cfg, index)
        self._index = index
        self._count = max(cfg.shard_processes, 1)
        self._front_socket = front_socket
        self._front_port = front_port
        self._link = link
        self._on_down = on_down
        self._process: asyncio.subprocess.Process | None = None
        self._serving = asyncio.Event()
        self._stopping = False
        self.restarts = 0
        self._routine: asyncio.Task[None] | None = None
        link.on_health = self._on_health
        self.on_health: Callable[[dict[str, int]], None] = lambda statuses: None
        # Each new shard process's channel, once attached (the front end tells it where the
        # other shard processes' queues are).
        self.on_attached: Callable[[], None] = lambda: None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _on_health(self, statuses: tuple[tuple[str, str | bytes], ...]) -> None:
        self._serving.set()
        self.on_health({k: int(v) for k, v in statuses})

    async def _spawn(self) -> asyncio.subprocess.Process:
        front_end, shard_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for end in (front_end, shard_end):
            # A Fetch answer of a few hundred KB goes into the socket in one write, not in
            # pieces with an event-loop turn each (the kernel caps it at net.core.wmem_max).
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CHANNEL_SOCKET_BYTES)
        env = dict(os.environ)
        env[shard_edge.SHARD_FD_ENV] = str(shard_end.fileno())
        env[shard_edge.FRONT_PORT_ENV] = str(self._front_port)
        env[shard_edge.FRONT_PID_ENV] = str(os.getpid())
        env[shard_edge.NODE_CONFIG_ENV] = json.dumps(dataclasses.asdict(self._cfg))
        env[shard_edge.SHARD_INDEX_ENV] = str(self._index)
        env[shard_edge.SHARD_COUNT_ENV] = str(self._count)
        env[shard_edge.FRONT_SOCKET_ENV] = self._front_socket
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "fluxmq",
                "serve",
                env=env,
                pass_fds=(shard_end.fileno(),),
            )
        finally:
            shard_end.close()
        _write_pid(self._cfg.data_dir, self._index, process.pid)
        self._serving.clear()
        await self._link.attach(front_end)
        self.on_attached()
        # The first start says nothing of its own (the node's "serving" line, or the shard
        # process's one-line reason it cannot, is what an operator reads); a restart says it.
        log.log(
            logging.INFO if self._process is not None else logging.DEBUG,
            "shard process %d (%d of %d) started",
            process.pid,
            self._index,
            self._count,
        )
        return process

    async def start(self) -> None:
        """Start the shard process; return once it serves (ShardProcessExited: it stopped
        first)."""
        self._process = await self._spawn()
        await self._until_serving(self._process)
        self._routine = asyncio.create_task(self.supervise_routine(), name="shard-process")

    async def _until_serving(self, process: asyncio.subprocess.Process) -> None:
        exited = asyncio.ensure_future(process.wait())
        serving = asyncio.ensure_future(self._serving.wait())
        await asyncio.wait((exited, serving), return_when=asyncio.FIRST_COMPLETED)
        serving.cancel()
        if not self._serving.is_set():
            self._link.detach()
            raise ShardProcessExited(exited.result() or 1)
        exited.cancel()

    async def supervise_routine(self) -> None:
        attempt = 0
        while not self._stopping:
            process = self._process
            assert process is not None
            started = time.monotonic()
            code = await process.wait()
            self._link.detach()
            if self._stopping:
                return
            self._on_down()
            if time.monotonic() - started >= STABLE_AFTER_S:
                attempt = 0
            delay = RESTART_BACKOFF_S[min(attempt, len(RESTART_BACKOFF_S) - 1)]
            attempt += 1
            log.error(
                "shard process %d (%d of %d) exited with %s; starting another in %.1f s",
                process.pid,
                self._index,
                self._count,
                code,
                delay,
            )
            await asyncio.sleep(delay)
            while not self._stopping:
                try:
                    self._process = await self._spawn()
                    break
                except OSError:  # no memory, no pids, an executable gone: try again
                    log.exception("cannot start a shard process; trying again in %.1f s", delay)
                    await asyncio.sleep(delay)
            self.restarts += 1

    async def stop(self, grace_s: float) -> None:
        """SIGTERM: the shard process drains and stops as a node does; killed if it has not
        after ``grace_s`` and a margin."""
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), grace_s + STOP_EXTRA_S)
            except TimeoutError:
                log.error("shard process %d did not stop in time: killed", process.pid)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        self._link.detach()
        if self._routine is not None:
            self._routine.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._routine
