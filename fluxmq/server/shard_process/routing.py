"""Which shard process the front end gives a call: the one that holds the queue the call names.

The front end does not decode requests: it reads the one string field that names the queue
straight from the request's bytes (``queue``, or ``name``, or ``config.name``: the field
``router.queue_of`` reads, found once per method from the descriptors). A Transact is decoded
(its queues are spread over nested messages; it is not the hot path), a PublishStream goes
where its first request's queue is. A call that names no queue (a listing, the cluster status,
API keys) goes to the first shard process, which asks the others itself where it must; so does
every CreateQueue (the first shard process places new queues).
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor

from fluxmq._pb.v1 import queue_pb2
from fluxmq.server.router import queue_of
from fluxmq.server.shard_process.siblings import QueueTable

FieldPath = tuple[int, ...]
_TRANSACT = queue_pb2.TransactRequest.DESCRIPTOR.full_name
_PUBLISH_STREAM = queue_pb2.PublishStreamRequest.DESCRIPTOR
NESTING_MAX = 4


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("varint cut short")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def length_delimited_field(data: bytes, number: int) -> bytes | None:
    """The first field ``number`` of wire type 2 in the serialized message ``data`` (None:
    absent, or ``data`` does not parse; the shard process then answers what is wrong).

    >>> length_delimited_field(b"\\x0a\\x06orders\\x10\\x01", 1)
    b'orders'
    """
    at = 0
    try:
        while at < len(data):
            key, at = _varint(data, at)
            field, wire = key >> 3, key & 7
            if wire == 2:
                length, at = _varint(data, at)
                if field == number:
                    return data[at : at + length] if at + length <= len(data) else None
                at += length
            elif wire == 0:
                _, at = _varint(data, at)
            elif wire == 1:
                at += 8
            elif wire == 5:
                at += 4
            else:
                return None
    except ValueError:
        return None
    return None


def string_at(data: bytes, path: FieldPath) -> str | None:
    for number in path:
        found = length_delimited_field(data, number)
        if found is None:
            return None
        data = found
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def queue_field_path(message: Descriptor) -> FieldPath | None:
    """The field numbers to the string that names the queue, as ``router.queue_of`` picks it."""
    fields = message.fields_by_name
    for name in ("queue", "name"):
        field = fields.get(name)
        if field is not None and field.type == FieldDescriptor.TYPE_STRING:
            return (field.number,)
    config = fields.get("config")
    if config is not None and config.message_type is not None:
        inner = config.message_type.fields_by_name.get("name")
        if inner is not None and inner.type == FieldDescriptor.TYPE_STRING:
            return (config.number, inner.number)
    return None


class CallRouting:
    """Per method, how to find its queue; then the table says which shard process has it."""

    def __init__(self, table: QueueTable, services: Iterable[ServiceDescriptor]) -> None:
        self.table = table
        self._paths: dict[str, FieldPath | None] = {}
        self._transact: set[str] = set()
        self.by_first_request: set[str] = set()
        publish = _PUBLISH_STREAM.fields_by_name["publish"]
        publish_path = queue_field_path(publish.message_type)  # type: ignore[arg-type]
        assert publish_path is not None
        self._publish_path: FieldPath = (publish.number, *publish_path)
        queue_service = queue_pb2.DESCRIPTOR.services_by_name["QueueService"].full_name
        self._create = f"/{queue_service}/CreateQueue"
        for service in services:
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                if method.input_type.full_name == _TRANSACT:
                    self._transact.add(path)
                elif method.input_type is _PUBLISH_STREAM:
                    self.by_first_request.add(path)
                elif not method.client_streaming and service.name == "QueueService":
                    self._paths[path] = queue_field_path(method.input_type)

    def process_for(self, method: str, body: bytes) -> int:
        """The shard process for a call of ``method`` whose request (or first request) is
        ``body``."""
        if self.table.count == 1:
            return 0
        if method == self._create:
            # The first shard process places every new queue (QueueService.CreateQueue): one
            # at a time per name, so two creates of one name never land in two processes.
            return 0
        if method in self._transact:
            try:
                queue = queue_of(queue_pb2.TransactRequest.FromString(body))
            except Exception:  # the shard process answers what is wrong with it
                queue = None
        elif method in self.by_first_request:
            queue = string_at(body, self._publish_path)
        else:
            path = self._paths.get(method)
            queue = None if path is None else string_at(body, path)
        return 0 if not queue else self.table.process_of(queue)
