"""One end of the Unix socket between a front end and its shard process, as an asyncio
protocol: frames in through ``on_frame``, out through ``send``; ``writable`` waits while the
kernel's buffer and the transport's are full (a slow reader slows the writer, nothing grows
without bound); ``closed`` is set when the other end is gone (end of file: the process died
or closed it)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence

from fluxmq.server.shard_process.frames import FrameError, FrameReader, Kind

log = logging.getLogger(__name__)

# What the transport buffers before the writer waits (the socket's own buffer comes first).
WRITE_BUFFER_HIGH_BYTES = 4 * 1024 * 1024
WRITE_BUFFER_LOW_BYTES = 1024 * 1024

OnFrame = Callable[[Kind, int, memoryview], None]


class Channel(asyncio.Protocol):
    def __init__(self, on_frame: OnFrame, frame_bytes_max: int) -> None:
        self._on_frame = on_frame
        self._reader = FrameReader(frame_bytes_max)
        self._transport: asyncio.Transport | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.closed = asyncio.Event()
        self.on_closed: Callable[[], None] = lambda: None

    @classmethod
    async def over(cls, sock: socket.socket, on_frame: OnFrame, frame_bytes_max: int) -> Channel:
        """The channel over a connected Unix stream socket (one end of a socket pair)."""
        loop = asyncio.get_running_loop()
        _, channel = await loop.create_unix_connection(
            lambda: cls(on_frame, frame_bytes_max), sock=sock
        )
        return channel

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they have its methods.
        transport.set_write_buffer_limits(  # type: ignore[attr-defined]
            WRITE_BUFFER_HIGH_BYTES, WRITE_BUFFER_LOW_BYTES
        )
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except FrameError as err:
            log.error("closing the shard process channel: %s", err)
            self.close()
            return
        for kind, call_id, payload in frames:
            try:
                self._on_frame(kind, call_id, payload)
            except FrameError as err:  # a frame whose header read well but whose body did not
                log.error("closing the shard process channel: %s", err)
                self.close()
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._can_write.set()  # writers wake and find the channel closed
        self.closed.set()
        self.on_closed()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    @property
    def buffered_bytes(self) -> int:
        """Bytes written here that the other end has not taken yet (beyond the socket's)."""
        return 0 if self._transport is None else int(self._transport.get_write_buffer_size())

    def send(self, data: bytes) -> bool:
        """-> False when the channel is closed (nothing was sent)."""
        if self._transport is None or self._transport.is_closing():
            return False
        self._transport.write(data)
        return True

    def send_parts(self, parts: Sequence[bytes]) -> bool:
        """``send`` of the parts joined, written without joining them (-> False: closed)."""
        if self._transport is None or self._transport.is_closing():
            return False
        self._transport.writelines(parts)
        return True

    async def writable(self) -> None:
        await self._can_write.wait()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
