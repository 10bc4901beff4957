"""The commands of the queue state machine. ``codec`` is their wire form (op code + protobuf);
``from fluxmq.core.commands import Op, decode, encode`` keeps working through this re-export."""

from __future__ import annotations

from fluxmq.core.commands.codec import Command, Op, UnknownCommandError, decode, encode

__all__ = ["Command", "Op", "UnknownCommandError", "decode", "encode"]
