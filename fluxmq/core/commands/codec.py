"""Binary commands of the queue state machine.

Wire form: one op-code byte, then the serialized protobuf message of that op code
(proto/fluxmq/internal/commands.proto). An op code never changes meaning; a new operation is a
new op code. Decoding an unknown op code fails loudly rather than skipping an entry, because a
replica that skipped a command would diverge from the others.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from fluxmq._pb.internal import commands_pb2 as cpb

Command = Any  # one of the *Cmd protobuf messages of commands_pb2


class Op(IntEnum):
    CREATE_QUEUE = 1
    UPDATE_QUEUE = 2
    DELETE_QUEUE = 3
    APPEND = 4
    PURGE = 5
    APPLY_RETENTION = 6
    CREATE_GROUP = 7
    DELETE_GROUP = 8
    LEASE = 9
    ACK = 10
    NACK = 11
    EXTEND_LEASE = 12
    EXPIRE_LEASES = 13
    COMMIT_OFFSETS = 14
    RESET_OFFSETS = 15
    REPLAY_DEAD_LETTERS = 16
    PURGE_DEAD_LETTERS = 17
    TRANSACT = 18
    JOIN_GROUP = 19
    LEAVE_GROUP = 20
    RELEASE_PARTITIONS = 21
    EXPIRE_MEMBERS = 22
    RECORD_NODE_ADDRESS = 23
    INIT_PRODUCER = 24
    CHECKOUT = 25
    CHECKIN = 26


_TYPES: dict[Op, type[Any]] = {
    Op.CREATE_QUEUE: cpb.CreateQueueCmd,
    Op.UPDATE_QUEUE: cpb.UpdateQueueCmd,
    Op.DELETE_QUEUE: cpb.DeleteQueueCmd,
    Op.APPEND: cpb.AppendCmd,
    Op.PURGE: cpb.PurgeCmd,
    Op.APPLY_RETENTION: cpb.ApplyRetentionCmd,
    Op.CREATE_GROUP: cpb.CreateGroupCmd,
    Op.DELETE_GROUP: cpb.DeleteGroupCmd,
    Op.LEASE: cpb.LeaseCmd,
    Op.ACK: cpb.AckCmd,
    Op.NACK: cpb.NackCmd,
    Op.EXTEND_LEASE: cpb.ExtendLeaseCmd,
    Op.EXPIRE_LEASES: cpb.ExpireLeasesCmd,
    Op.COMMIT_OFFSETS: cpb.CommitOffsetsCmd,
    Op.RESET_OFFSETS: cpb.ResetOffsetsCmd,
    Op.REPLAY_DEAD_LETTERS: cpb.ReplayDeadLettersCmd,
    Op.PURGE_DEAD_LETTERS: cpb.PurgeDeadLettersCmd,
    Op.TRANSACT: cpb.TransactCmd,
    Op.JOIN_GROUP: cpb.JoinGroupCmd,
    Op.LEAVE_GROUP: cpb.LeaveGroupCmd,
    Op.RELEASE_PARTITIONS: cpb.ReleasePartitionsCmd,
    Op.EXPIRE_MEMBERS: cpb.ExpireMembersCmd,
    Op.RECORD_NODE_ADDRESS: cpb.RecordNodeAddressCmd,
    Op.INIT_PRODUCER: cpb.InitProducerCmd,
    Op.CHECKOUT: cpb.CheckoutCmd,
    Op.CHECKIN: cpb.CheckinCmd,
}
_OPS: dict[type[Any], Op] = {t: op for op, t in _TYPES.items()}


class UnknownCommandError(ValueError):
    pass


def encode(cmd: Command) -> bytes:
    op = _OPS.get(type(cmd))
    if op is None:
        raise TypeError(f"not a command: {type(cmd).__name__}")
    body: bytes = cmd.SerializeToString()
    return bytes((op,)) + body


def decode(payload: bytes) -> tuple[Op, Command]:
    if not payload:
        raise UnknownCommandError("empty command")
    try:
        op = Op(payload[0])
    except ValueError:
        raise UnknownCommandError(f"unknown op code {payload[0]}") from None
    cmd = _TYPES[op]()
    cmd.ParseFromString(payload[1:])
    return op, cmd
