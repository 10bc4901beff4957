"""Queue names at the edge: checked, then put in the caller's namespace on the way in, and
shown as the caller names them on the way out (``core.namespaces`` has the rules).

Every QueueService request is rewritten in place before routing, so every layer below (the
router, the state machine, etcd placements, a node a call is forwarded to) sees stored names
only. Responses and errors of a scoped caller are rewritten back; a caller of the operators'
environment (or any caller with authentication off) sees stored names as they are, and pays
nothing for namespaces but the name check it always had.
"""

from __future__ import annotations

from typing import Any

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.dead_letters import ORIGIN_HEADER
from fluxmq.core.errors import FieldViolation, FluxError
from fluxmq.core.namespaces import (
    SCOPE_SEPARATOR,
    caller_name,
    caller_text,
    check_caller_name,
    scoped_prefix,
)

# Scope None: authentication is off (stored names are accepted as they are); "": the
# operators' environment (names as they are); else the environment that scopes the names.
Scope = str | None


def scope_request(request: Any, scope: Scope) -> None:
    """Check every queue name ``request`` carries (INVALID_ARGUMENT naming the field) and
    replace it with its stored name. An empty name is left to the method, which says what it
    needs (some fields are optional). Requests of other services name no queues."""
    if getattr(request, "DESCRIPTOR", None) is None or request.DESCRIPTOR.file is not pb.DESCRIPTOR:
        return
    if isinstance(request, pb.TransactRequest):
        for i, ack in enumerate(request.acks):
            ack.queue = _stored(ack.queue, f"acks[{i}].queue", scope)
        for i, publish in enumerate(request.publishes):
            publish.queue = _stored(publish.queue, f"publishes[{i}].queue", scope)
    elif isinstance(request, pb.CreateQueueRequest | pb.UpdateQueueRequest):
        config = request.config
        config.name = _stored(config.name, "config.name", scope)
        config.dead_letter_queue = _stored(
            config.dead_letter_queue, "config.dead_letter_queue", scope
        )
    elif isinstance(request, pb.PublishStreamRequest):
        # A stream answers a bad name in that request's error response and goes on, so the
        # name is not refused here: the stream's handler refuses what cannot be a stored name.
        request.publish.queue = _stored_or_unusable(request.publish.queue, scope)
    elif isinstance(request, pb.ListQueuesRequest):
        if scope:
            request.prefix = scoped_prefix(scope, request.prefix)
    else:
        field_name = queue_field(type(request))
        if field_name:
            name = getattr(request, field_name)
            if name:
                setattr(request, field_name, check_caller_name(name, field_name, scope))


def _stored(name: str, field_path: str, scope: Scope) -> str:
    return check_caller_name(name, field_path, scope) if name else name


def _stored_or_unusable(name: str, scope: Scope) -> str:
    """The stored name of ``name``, or, when it is not a name the caller can give, a name no
    stored name can be, which the method refuses as it refuses any bad name. Without ``:`` a
    bad name is bad as stored too; with one, it must not become another namespace's name, so
    it is put under the caller's scope (where a second ``:`` is never valid) or, for the
    operators' namespace, after a bare ``:``."""
    try:
        return _stored(name, "publish.queue", scope)
    except FluxError:
        if SCOPE_SEPARATOR not in name or scope is None:
            return name
        return f"{scope}{SCOPE_SEPARATOR}{name}"


_NAME_FIELDS: dict[type, str] = {}  # message type -> its field naming a queue ("" for none)


def queue_field(kind: type) -> str:
    """The field of a QueueService request type that names its queue ("" for none)."""
    field_name = _NAME_FIELDS.get(kind)
    if field_name is None:
        fields = kind.DESCRIPTOR.fields_by_name  # type: ignore[attr-defined]
        strings = [f for f in ("queue", "name") if f in fields]
        strings = [f for f in strings if fields[f].type == fields[f].TYPE_STRING]
        field_name = _NAME_FIELDS[kind] = strings[0] if strings else ""
    return field_name


# String fields of responses that hold queue names (or text quoting them). Other names that
# share a field name (a group's, a key's) cannot hold the separator, so they pass unchanged.
_NAME_FIELD_NAMES = frozenset({"queue", "name", "dead_letter_queue", "queues", "dead_letter_of"})
_TEXT_FIELD_NAMES = frozenset({"message"})


def caller_response(response: Any, scope: Scope) -> Any:
    """``response`` with the caller's stored names as the caller gives them: a copy when
    anything changes, since a servicer may answer with the state's own objects (a catalog
    entry's Queue), which must never change."""
    if not scope or not _unscope(response, scope, dry_run=True):
        return response
    copy = type(response)()
    copy.CopyFrom(response)
    _unscope(copy, scope, dry_run=False)
    return copy


def _unscope(message: Any, scope: str, *, dry_run: bool) -> bool:
    """-> whether ``message`` holds a name of ``scope`` (rewritten unless ``dry_run``)."""
    if isinstance(message, pb.Record):
        return _unscope_record(message, scope, dry_run=dry_run)
    found = False
    for fd, value in message.ListFields():
        repeated = fd.is_repeated
        if fd.type == fd.TYPE_MESSAGE:
            if repeated and fd.message_type.GetOptions().map_entry:
                continue  # maps of scalars: counts by code, labels
            for item in value if repeated else (value,):
                found = _unscope(item, scope, dry_run=dry_run) or found
        elif fd.type == fd.TYPE_STRING and (
            fd.name in _NAME_FIELD_NAMES or (fd.name in _TEXT_FIELD_NAMES and not repeated)
        ):
            texts = list(value) if repeated else [value]
            shown = [
                caller_name(scope, v) if fd.name in _NAME_FIELD_NAMES else caller_text(scope, v)
                for v in texts
            ]
            if shown == texts:
                continue
            found = True
            if dry_run:
                return True
            if repeated:
                value[:] = shown
            else:
                setattr(message, fd.name, shown[0])
    return found


def _unscope_record(record: pb.Record, scope: str, *, dry_run: bool) -> bool:
    """A dead letter's origin header names its source queue by its stored name."""
    origin = record.headers.get(ORIGIN_HEADER)
    prefix = (scope + SCOPE_SEPARATOR).encode()
    if origin is None or not origin.startswith(prefix):
        return False
    if not dry_run:
        record.headers[ORIGIN_HEADER] = origin[len(prefix) :]
    return True


def stored_names(message: Any, scope: Scope) -> None:
    """Every queue name in ``message`` (an answer another shard process gave in the caller's
    words) back under its stored name (in place), to be merged with this process's answer,
    which the edge then shows in the caller's words once."""
    if not scope:
        return
    prefix = scope + SCOPE_SEPARATOR
    for fd, value in message.ListFields():
        if fd.type == fd.TYPE_MESSAGE:
            if fd.is_repeated and fd.message_type.GetOptions().map_entry:
                continue
            for item in value if fd.is_repeated else (value,):
                stored_names(item, scope)
        elif fd.type == fd.TYPE_STRING and fd.name in _NAME_FIELD_NAMES:
            if fd.is_repeated:
                value[:] = [v if not v or v.startswith(prefix) else prefix + v for v in value]
            elif value and not value.startswith(prefix):
                setattr(message, fd.name, prefix + value)


def stored_queue(queue: pb.Queue, scope: Scope) -> pb.Queue:
    """A Queue another node answered in the caller's words, back under stored names (in place),
    to be merged and paged with this node's (a listing merges and cuts by stored name)."""
    if scope:
        for owner, field_name in (
            (queue.config, "name"),
            (queue.config, "dead_letter_queue"),
            (queue, "dead_letter_of"),
        ):
            name = getattr(owner, field_name)
            if name and not name.startswith(scope + SCOPE_SEPARATOR):
                setattr(owner, field_name, f"{scope}{SCOPE_SEPARATOR}{name}")
    return queue


def caller_error(err: FluxError, scope: Scope) -> None:
    """``err`` (in place) with the caller's stored names as the caller gives them."""
    if not scope:
        return
    err.message = caller_text(scope, err.message)
    err.metadata = {k: caller_text(scope, v) for k, v in err.metadata.items()}
    err.violations = tuple(
        FieldViolation(v.field, caller_text(scope, v.description)) for v in err.violations
    )
    err.args = (f"{err.reason}: {err.message}",)
