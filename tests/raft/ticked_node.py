"""One HardenedSyncObj whose peers never run, ticked by hand, and pysyncobj's wire format: for
tests that speak to a node's Raft port as a peer or an attacker would."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any

from pysyncobj.encryptor import getEncryptor

from raft import _pysyncobj
from raft._pysyncobj import HardenedSyncObj, SyncObjConf
from raft.journal import LmdbJournal
from raft.wire_guard import WireLimits
from tests.raft.helpers import free_ports

SECRET = "the-cluster-secret"
WAIT_S = 10.0


class TickedNode:
    """Its transport accepts the connections a test opens; without ``address`` and ``peers``
    it takes three free loopback ports (its own and two peers')."""

    def __init__(
        self,
        root: str,
        address: str | None = None,
        peers: list[str] | None = None,
        limits: WireLimits | None = None,
    ) -> None:
        self.journal = LmdbJournal(os.path.join(root, "journal"))
        if address is None or peers is None:
            address, *peers = (f"127.0.0.1:{p}" for p in free_ports(3))
        self.address = address
        self.peers = peers
        conf = SyncObjConf(
            password=SECRET,
            autoTick=False,
            fullDumpFile=os.path.join(root, "snapshot"),
            useFork=False,
            bindAddress=self.address,
            maxBindRetries=1,
        )
        self.so = HardenedSyncObj(
            self.address,
            self.peers,
            conf,
            self.journal,
            _pysyncobj.create_poller(),
            lambda index, frame: index,
            lambda path, info: None,
            limits,
        )

    def tick_until(self, what: str, done: Callable[[], bool], wait_s: float = WAIT_S) -> None:
        deadline = time.monotonic() + wait_s
        while not done():
            assert time.monotonic() < deadline, f"not reached within {wait_s}s: {what}"
            self.so.doTick(0.01)

    def tick_until_bound(self) -> None:
        self.tick_until("the raft port is bound", lambda: bool(self.so.transport.ready))

    def dial(self) -> socket.socket:
        """A connection to the node's Raft port (not yet accepted: the node accepts on a tick)."""
        host, port = self.address.rsplit(":", 1)
        return socket.create_connection((host, int(port)), timeout=WAIT_S)

    def connect(self) -> socket.socket:
        """A connection the node has accepted (it is in the handshake)."""
        sock = self.dial()
        self.tick_until("the connection is accepted", lambda: bool(self.unknown()))
        return sock

    def unknown(self) -> set[Any]:
        """The node's connections still in the handshake."""
        return set(self.so.transport._unknownConnections)


def frame(message: Any, secret: str = SECRET) -> bytes:
    """One message as pysyncobj's TcpConnection sends it, encrypted with ``secret``."""
    token = getEncryptor(secret).encrypt_at_time(zlib.compress(pickle.dumps(message), 3), 1)
    return struct.pack("i", len(token)) + token


def read_frame(sock: socket.socket, secret: str = SECRET) -> Any:
    """One message off ``sock``, decrypted with ``secret`` (blocking for WAIT_S at most, even
    on a socket a test made non-blocking)."""
    sock.settimeout(WAIT_S)

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "closed"
            data += chunk
        return data

    (length,) = struct.unpack("i", exactly(4))
    return pickle.loads(zlib.decompress(getEncryptor(secret).decrypt(exactly(length))))
