"""Administration: queues, consumer groups, offsets, dead letters, cluster status, API keys.

``client.admin`` is an :class:`Admin`. Results are the API's protobuf messages
(``fluxmq._pb.v1.queue_pb2`` / ``admin_pb2``: ``Queue``, ``QueueStats``, ``GroupDescription``,
``DeadLetter``...); listings are async iterators that page on their own.

Calls that change something (create, update, delete, purge, reset, replay) are retried only
when the broker says nothing was done (or the node could not be reached), never after an
answer was lost, since repeating them could act twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from google.protobuf import field_mask_pb2

from fluxmq._pb.v1 import admin_pb2
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client._security import KEY_ID_CHARS, KEY_PREFIXES
from fluxmq.client._transport import Transport
from fluxmq.client.arguments import check_integers, integer_argument
from fluxmq.client.errors import AlreadyExists, NotFound

QUEUE_TYPES = {"stream": pb.QUEUE_TYPE_STREAM, "work": pb.QUEUE_TYPE_WORK}
DELIVERY_MODES = {"shared": pb.DELIVERY_MODE_SHARED, "ordered": pb.DELIVERY_MODE_ORDERED}
PURGE_SCOPES = {
    "ready": pb.PURGE_SCOPE_READY,
    "scheduled": pb.PURGE_SCOPE_SCHEDULED,
    "all": pb.PURGE_SCOPE_ALL,
}


def start_position(
    start: str | None = None, *, offset: int | None = None, timestamp_ms: int | None = None
) -> pb.StartPosition:
    """``"earliest"`` / ``"latest"``, or an ``offset``, or a ``timestamp_ms``."""
    given = sum(x is not None for x in (start, offset, timestamp_ms))
    if given != 1:
        raise ValueError("give one of: 'earliest' / 'latest', offset=, timestamp_ms=")
    if offset is not None:
        return pb.StartPosition(offset=integer_argument(pb.StartPosition, "offset", offset))
    if timestamp_ms is not None:
        return pb.StartPosition(
            timestamp_ms=integer_argument(pb.StartPosition, "timestamp_ms", timestamp_ms)
        )
    if start == "earliest":
        return pb.StartPosition(earliest=True)
    if start == "latest":
        return pb.StartPosition(latest=True)
    raise ValueError(f"start must be 'earliest' or 'latest', not {start!r}")


def queue_config(name: str, fields: Mapping[str, Any]) -> pb.QueueConfig:
    """QueueConfig from keyword fields (``partitions=3, type="work", retention={"max_age":
    "7d"}, labels={...}``); nested messages as dicts."""
    values = dict(fields)
    kind = values.get("type")
    if isinstance(kind, str):
        try:
            values["type"] = QUEUE_TYPES[kind]
        except KeyError:
            raise ValueError(f"type must be one of {sorted(QUEUE_TYPES)}") from None
    check_integers(pb.QueueConfig, values)
    return pb.QueueConfig(name=name, **values)


class Admin:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    async def _q(self, method: str, request: Any, *, safe: bool, queue: str | None) -> Any:
        return await self._t.unary("queue", method, request, safe=safe, queue=queue)

    # -- queues ----------------------------------------------------------------------------------

    async def create_queue(self, name: str, *, exist_ok: bool = False, **config: Any) -> pb.Queue:
        """Creates a queue: ``create_queue("jobs", type="work", partitions=4,
        max_attempts=5, retention={"max_age": "7d"})`` (fields of QueueConfig). With
        ``exist_ok`` an existing queue is returned as it is (its config unchanged)."""
        request = pb.CreateQueueRequest(config=queue_config(name, config))
        try:
            queue: pb.Queue = await self._q("CreateQueue", request, safe=False, queue=name)
        except AlreadyExists:
            if not exist_ok:
                raise
            return await self.get_queue(name)
        return queue

    async def get_queue(self, name: str) -> pb.Queue:
        queue: pb.Queue = await self._q(
            "GetQueue", pb.GetQueueRequest(name=name), safe=True, queue=name
        )
        return queue

    async def list_queues(
        self, *, prefix: str = "", label_selector: str = "", page_size: int = 100
    ) -> AsyncIterator[pb.Queue]:
        """Every queue (name prefix, ``label_selector`` like ``"team=pay,env=prod"``), paging
        as it goes."""
        integer_argument(pb.ListQueuesRequest, "limit", page_size, "page_size")
        token = ""
        while True:
            resp = await self._q(
                "ListQueues",
                pb.ListQueuesRequest(
                    prefix=prefix,
                    label_selector=label_selector,
                    page_token=token,
                    limit=page_size,
                ),
                safe=True,
                queue=None,
            )
            for q in resp.queues:
                yield q
            token = resp.next_page_token
            if not token:
                return

    async def update_queue(self, name: str, **fields: Any) -> pb.Queue:
        """Changes the given fields only (``update_queue("jobs", max_attempts=3,
        retention={"max_age": "1d"})``): the update mask is their names."""
        if not fields:
            raise ValueError("name at least one field to change")
        request = pb.UpdateQueueRequest(
            config=queue_config(name, fields),
            update_mask=field_mask_pb2.FieldMask(paths=sorted(fields)),
        )
        queue: pb.Queue = await self._q("UpdateQueue", request, safe=False, queue=name)
        return queue

    async def delete_queue(self, name: str, *, missing_ok: bool = False) -> None:
        try:
            await self._q("DeleteQueue", pb.DeleteQueueRequest(name=name), safe=False, queue=name)
        except NotFound:
            if not missing_ok:
                raise

    async def purge_queue(
        self, name: str, *, scope: str = "all", destructive: bool = False
    ) -> pb.PurgeQueueResponse:
        """Drops waiting messages: ``scope`` ``ready`` / ``scheduled`` / ``all``; leased ones
        stay with their consumers unless ``destructive``."""
        if scope not in PURGE_SCOPES:
            raise ValueError(f"scope must be one of {sorted(PURGE_SCOPES)}, not {scope!r}")
        request = pb.PurgeQueueRequest(
            name=name, scope=PURGE_SCOPES[scope], destructive=destructive
        )
        resp: pb.PurgeQueueResponse = await self._q("PurgeQueue", request, safe=False, queue=name)
        return resp

    async def queue_stats(self, name: str) -> pb.QueueStats:
        stats: pb.QueueStats = await self._q(
            "GetQueueStats", pb.GetQueueStatsRequest(name=name), safe=True, queue=name
        )
        return stats

    # -- groups ----------------------------------------------------------------------------------

    async def create_group(
        self,
        queue: str,
        group: str,
        *,
        start: str | None = None,
        offset: int | None = None,
        timestamp_ms: int | None = None,
        mode: str = "shared",
        header_equals: Mapping[str, bytes] | None = None,
        key_prefix: bytes | None = None,
        exist_ok: bool = False,
    ) -> pb.Group:
        """A consumer group starting at ``"earliest"`` (default) / ``"latest"`` / ``offset=``
        / ``timestamp_ms=``, mode ``"shared"`` (competing consumers) or ``"ordered"`` (one
        consumer per partition), optionally filtered."""
        request = pb.CreateGroupRequest(queue=queue, group=group, mode=DELIVERY_MODES[mode])
        if start is not None or offset is not None or timestamp_ms is not None:
            request.start.CopyFrom(start_position(start, offset=offset, timestamp_ms=timestamp_ms))
        if header_equals:
            request.filter.header_equals.update(header_equals)
        if key_prefix is not None:
            request.filter.key_prefix = key_prefix
        try:
            created: pb.Group = await self._q("CreateGroup", request, safe=False, queue=queue)
        except AlreadyExists:
            if not exist_ok:
                raise
            return (await self.describe_group(queue, group)).group
        return created

    async def list_groups(self, queue: str) -> list[pb.Group]:
        resp = await self._q(
            "ListGroups", pb.ListGroupsRequest(queue=queue), safe=True, queue=queue
        )
        return list(resp.groups)

    async def describe_group(self, queue: str, group: str) -> pb.GroupDescription:
        desc: pb.GroupDescription = await self._q(
            "DescribeGroup",
            pb.DescribeGroupRequest(queue=queue, group=group),
            safe=True,
            queue=queue,
        )
        return desc

    async def delete_group(self, queue: str, group: str, *, missing_ok: bool = False) -> None:
        try:
            await self._q(
                "DeleteGroup", pb.DeleteGroupRequest(queue=queue, group=group), safe=False,
                queue=queue,
            )  # fmt: skip
        except NotFound:
            if not missing_ok:
                raise

    # -- offsets ---------------------------------------------------------------------------------

    async def get_offsets(self, queue: str, group: str) -> list[pb.PartitionOffsets]:
        """Committed offset, latest offset and lag of every partition."""
        resp = await self._q(
            "GetOffsets", pb.GetOffsetsRequest(queue=queue, group=group), safe=True, queue=queue
        )
        return list(resp.partitions)

    async def commit_offsets(
        self, queue: str, group: str, offsets: Mapping[int, int]
    ) -> list[pb.PartitionOffsets]:
        """Stream queues: partition -> the next offset to read."""
        check_integers(pb.CommitOffsetsRequest, {"offsets": offsets})
        resp = await self._q(
            "CommitOffsets",
            pb.CommitOffsetsRequest(queue=queue, group=group, offsets=dict(offsets)),
            safe=True,
            queue=queue,
        )
        return list(resp.partitions)

    async def reset_offsets(
        self,
        queue: str,
        group: str,
        to: str | None = None,
        *,
        offset: int | None = None,
        timestamp_ms: int | None = None,
        partitions: Iterable[int] = (),
    ) -> list[pb.PartitionOffsets]:
        """Replays or skips: delivery of ``partitions`` (default all) starts again at
        ``to="earliest"`` / ``"latest"``, an ``offset`` or a ``timestamp_ms``; their leases and
        retries are dropped."""
        chosen = list(partitions)
        check_integers(pb.ResetOffsetsRequest, {"partitions": chosen})
        request = pb.ResetOffsetsRequest(
            queue=queue,
            group=group,
            partitions=chosen,
            to=start_position(to, offset=offset, timestamp_ms=timestamp_ms),
        )
        resp = await self._q("ResetOffsets", request, safe=False, queue=queue)
        return list(resp.partitions)

    async def seek(
        self,
        queue: str,
        group: str,
        *,
        offset: int | None = None,
        timestamp_ms: int | None = None,
        partitions: Iterable[int] = (),
    ) -> list[pb.PartitionOffsets]:
        """Moves the group to an offset or to the first message at or after a time."""
        return await self.reset_offsets(
            queue, group, offset=offset, timestamp_ms=timestamp_ms, partitions=partitions
        )

    async def offset_for_timestamp(self, queue: str, partition: int, timestamp_ms: int) -> int:
        """The first offset of ``partition`` stored at or after ``timestamp_ms`` (or the high
        watermark)."""
        check_integers(
            pb.SeekToTimestampRequest, {"partition": partition, "timestamp_ms": timestamp_ms}
        )
        resp = await self._q(
            "SeekToTimestamp",
            pb.SeekToTimestampRequest(queue=queue, partition=partition, timestamp_ms=timestamp_ms),
            safe=True,
            queue=queue,
        )
        return int(resp.offset)

    # -- dead letters ----------------------------------------------------------------------------

    async def list_dead_letters(
        self,
        queue: str,
        *,
        group: str = "",
        from_ms: int = 0,
        to_ms: int = 0,
        page_size: int = 100,
    ) -> AsyncIterator[pb.DeadLetter]:
        """The dead letters of ``queue`` (optionally one group's, or a time range): its own only,
        also when other queues share its dead-letter queue."""
        check_integers(pb.ListDeadLettersRequest, {"from_ms": from_ms, "to_ms": to_ms})
        integer_argument(pb.ListDeadLettersRequest, "limit", page_size, "page_size")
        token = ""
        while True:
            resp = await self._q(
                "ListDeadLetters",
                pb.ListDeadLettersRequest(
                    queue=queue,
                    group=group,
                    from_ms=from_ms,
                    to_ms=to_ms,
                    page_token=token,
                    limit=page_size,
                ),
                safe=True,
                queue=queue,
            )
            for d in resp.dead_letters:
                yield d
            token = resp.next_page_token
            if not token:
                return

    async def replay_dead_letters(
        self, queue: str, *, ids: Iterable[int] = (), all: bool = False, group: str = ""
    ) -> int:
        """Back to ``queue`` as new messages for the group that dead-lettered them (``ids``, or
        ``all`` — optionally only ``group``'s); returns how many."""
        chosen = list(ids)
        check_integers(pb.ReplayDeadLettersRequest, {"ids": chosen})
        resp = await self._q(
            "ReplayDeadLetters",
            pb.ReplayDeadLettersRequest(queue=queue, ids=chosen, all=all, group=group),
            safe=False,
            queue=queue,
        )
        return int(resp.replayed)

    async def purge_dead_letters(
        self, queue: str, *, ids: Iterable[int] = (), all: bool = False
    ) -> int:
        """Delete dead letters of ``queue`` (``ids``, or ``all`` of its own: other queues sharing
        its dead-letter queue keep theirs); returns how many."""
        chosen = list(ids)
        check_integers(pb.PurgeDeadLettersRequest, {"ids": chosen})
        resp = await self._q(
            "PurgeDeadLetters",
            pb.PurgeDeadLettersRequest(queue=queue, ids=chosen, all=all),
            safe=False,
            queue=queue,
        )
        return int(resp.purged)

    # -- cluster ---------------------------------------------------------------------------------

    async def cluster_status(self, *, address: str | None = None) -> admin_pb2.ClusterStatus:
        """The view of one node (``address``, default the current one): its shards (role,
        term, commit / applied index, members, leader, digest, queues) and the live nodes."""
        status: admin_pb2.ClusterStatus = await self._t.unary(
            "admin",
            "GetClusterStatus",
            admin_pb2.GetClusterStatusRequest(),
            safe=True,
            address=address,
        )
        return status

    # -- API keys --------------------------------------------------------------------------------

    async def create_api_key(
        self, name: str, role: str, *, tier: str = "", environment: str = ""
    ) -> admin_pb2.CreateApiKeyResponse:
        """A new API key (admin keys only): ``role`` admin / producer / consumer / read-only,
        ``tier`` its rate-limit tier (default "default"), ``environment`` development /
        staging / production (default the caller's). The answer's ``key`` is the whole key,
        shown this once; ``info`` describes it. Not retried after a lost answer (it would make a
        second key)."""
        resp: admin_pb2.CreateApiKeyResponse = await self._t.unary(
            "admin",
            "CreateApiKey",
            admin_pb2.CreateApiKeyRequest(name=name, role=role, tier=tier, environment=environment),
            safe=False,
        )
        return resp

    async def list_api_keys(self, *, include_revoked: bool = False) -> list[admin_pb2.ApiKeyInfo]:
        """The keys of the caller's environment (prefix, name, role, tier, times; never a
        secret), oldest first."""
        resp: admin_pb2.ListApiKeysResponse = await self._t.unary(
            "admin",
            "ListApiKeys",
            admin_pb2.ListApiKeysRequest(include_revoked=include_revoked),
            safe=True,
        )
        return list(resp.keys)

    async def revoke_api_key(self, key_id: str) -> admin_pb2.ApiKeyInfo:
        """Revokes a key by its id (the 8 characters after ``fmq_live_sk_`` / ``fmq_test_sk_``;
        a whole prefix or key is accepted too). Revoking a revoked key is not an error."""
        info: admin_pb2.ApiKeyInfo = await self._t.unary(
            "admin",
            "RevokeApiKey",
            admin_pb2.RevokeApiKeyRequest(key_id=key_id_of(key_id)),
            safe=True,
        )
        return info


def key_id_of(text: str) -> str:
    """``fmq_live_sk_AbCd1234…`` (a prefix, or a whole key) -> ``AbCd1234``; anything else as
    it is."""
    text = text.strip().rstrip("…")
    for prefix in KEY_PREFIXES:
        if text.startswith(prefix):
            return text[len(prefix) : len(prefix) + KEY_ID_CHARS]
    return text
