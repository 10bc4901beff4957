"""``fluxmqctl publish QUEUE [VALUE ...] | --file F.jsonl | --file -``: messages from the command
line, or JSON lines (``{"value": ..., "key": ..., "headers": {...}}``) from a file or stdin, sent
in batches of up to 1000 with a progress line on stderr for bulk input. With no VALUE and stdin
not a terminal, every line of stdin is one plain-text message (``printf 'a\\nb\\n' | fluxmqctl
publish Q``, as ``kcat -P``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.cli.conn import CliError, Context, UsageError
from fluxmq.cli.output import message_dict, show_time
from fluxmq.cli.values import key_value, non_negative, positive

BATCH_MAX = 1000  # the broker's limit per Publish
BATCH_BYTES_MAX = 4 * 1024 * 1024  # keeps requests far below request_bytes_max
PROGRESS_EVERY_S = 0.1
LINE_KEYS = ("value", "key", "headers", "partition", "delay_ms", "deliver_at_ms", "idempotency_key")


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "publish",
        parents=[common],
        help="publish messages (arguments, a JSON lines file, or stdin)",
        description="Publishes each VALUE (UTF-8 text) as one message, or every line of --file "
        '(JSON lines: {"value": ..., "key": ..., "headers": {...}}, optionally "partition", '
        '"delay_ms", "deliver_at_ms", "idempotency_key"; a value that is not a string is sent as '
        "compact JSON). With no VALUE and stdin not a terminal, each line of stdin is one "
        "plain-text message. --key/--header/--partition/--delay-ms apply to every message (a "
        "line's own fields win). Batches of up to --batch messages; a progress line on stderr "
        "for file input when stderr is a terminal, or with --progress.",
    )
    p.add_argument("queue")
    p.add_argument(
        "values",
        nargs="*",
        default=[],
        metavar="VALUE",
        help='message values; "-" = --file -; none, with stdin not a terminal: one message per '
        "line of stdin (as kcat -P)",
    )
    p.add_argument("--key", help="message key (UTF-8)")
    p.add_argument(
        "--header", metavar="K=V", type=key_value, action="append", default=[], help="repeatable"
    )
    p.add_argument("--partition", type=non_negative, help="explicit partition")
    p.add_argument("--delay-ms", type=non_negative, default=0, help="invisible to groups this long")
    p.add_argument("--idempotency-key", default="", help="for a single message")
    p.add_argument(
        "--idempotency-prefix",
        default="",
        metavar="PREFIX",
        help="message n (from 0) gets the idempotency key PREFIXn: re-running the same input "
        "within the queue's dedup window publishes nothing twice",
    )
    p.add_argument("--file", "-f", metavar="F.jsonl", help='JSON lines to publish; "-" = stdin')
    p.add_argument(
        "--lines", action="store_true", help="the input holds one plain-text value per line"
    )
    p.add_argument("--batch", type=positive, default=BATCH_MAX, help="messages per request")
    p.add_argument("--progress", action="store_true", help="show progress even off a terminal")
    p.set_defaults(handler=publish)


@dataclass
class Defaults:
    key: bytes | None
    headers: dict[str, bytes]
    partition: int | None
    delay_ms: int
    idempotency_prefix: str


@dataclass
class Tally:
    published: int = 0
    duplicates: int = 0
    results: list[pb.PublishResult] = field(default_factory=list)


def publish(args: argparse.Namespace, ctx: Context) -> int:
    if args.batch > BATCH_MAX:
        raise UsageError(f"--batch: at most {BATCH_MAX}")
    source = args.file
    if args.values == ["-"]:
        if source is not None:
            raise UsageError('give either "-" or --file, not both')
        source, args.values = "-", []
    if source is not None and args.values:
        raise UsageError("give either VALUE arguments or --file, not both")
    if source is None and not args.values:
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError(
                "nothing to publish: give VALUE arguments, --file F.jsonl, --file -, or pipe "
                "lines to stdin"
            )
        # Piped input with no VALUE: one message per line, as `kcat -P` reads it.
        source, args.lines = "-", True
    if args.idempotency_key and (source is not None or len(args.values) != 1):
        raise UsageError("--idempotency-key is for one VALUE; use --idempotency-prefix for more")
    defaults = Defaults(
        key=args.key.encode() if args.key is not None else None,
        headers={k: v.encode() for k, v in args.header},
        partition=args.partition,
        delay_ms=args.delay_ms,
        idempotency_prefix=args.idempotency_prefix,
    )
    tally = Tally()
    started = time.monotonic()
    if source is None:
        msgs: Iterator[pb.PublishMessage] = (
            _message(defaults, v.encode(), n, args.idempotency_key)
            for n, v in enumerate(args.values)
        )
        _publish_all(ctx, args, msgs, tally, keep=True, progress=None)
    else:
        stream, total = _open(source)
        show = args.progress or sys.stderr.isatty()
        progress = Progress(total, sys.stderr) if show else None
        try:
            msgs = _parse(stream, defaults, args.lines, progress)
            _publish_all(ctx, args, msgs, tally, keep=False, progress=progress)
        finally:
            if progress is not None:
                progress.finish(tally.published)
            if stream is not sys.stdin.buffer:
                stream.close()
    seconds = time.monotonic() - started
    _report(ctx, args.queue, tally, seconds, per_message=source is None)
    return 0


def _publish_all(
    ctx: Context,
    args: argparse.Namespace,
    msgs: Iterator[pb.PublishMessage],
    tally: Tally,
    *,
    keep: bool,
    progress: Progress | None,
) -> None:
    batch: list[pb.PublishMessage] = []
    size = 0
    try:
        for msg in msgs:
            batch.append(msg)
            size += msg.ByteSize()
            if len(batch) >= args.batch or size >= BATCH_BYTES_MAX:
                _send(ctx, args.queue, batch, tally, keep)
                batch, size = [], 0
                if progress is not None:
                    progress.update(tally.published)
        if batch:
            _send(ctx, args.queue, batch, tally, keep)
    except CliError as err:
        if tally.published:
            hint = "" if args.idempotency_prefix else "; --idempotency-prefix makes a re-run safe"
            err.args = (f"{err} ({tally.published} messages were published before this{hint})",)
        raise


def _send(
    ctx: Context, queue: str, batch: list[pb.PublishMessage], tally: Tally, keep: bool
) -> None:
    resp = ctx.conn.call(ctx.conn.queues.Publish, pb.PublishRequest(queue=queue, messages=batch))
    tally.published += len(resp.results)
    tally.duplicates += sum(1 for r in resp.results if r.duplicate)
    if keep:
        tally.results.extend(resp.results)


def _message(
    d: Defaults,
    value: bytes,
    n: int,
    idempotency_key: str = "",
    *,
    key: bytes | None = None,
    headers: dict[str, bytes] | None = None,
    partition: int | None = None,
    delay_ms: int | None = None,
    deliver_at_ms: int = 0,
) -> pb.PublishMessage:
    msg = pb.PublishMessage(
        value=value,
        headers={**d.headers, **(headers or {})},
        idempotency_key=idempotency_key
        or (f"{d.idempotency_prefix}{n}" if d.idempotency_prefix else ""),
        deliver_at_ms=deliver_at_ms,
    )
    key = key if key is not None else d.key
    if key is not None:
        msg.key = key
    partition = partition if partition is not None else d.partition
    if partition is not None:
        msg.partition = partition
    delay = delay_ms if delay_ms is not None else d.delay_ms
    if delay and not deliver_at_ms:
        msg.delay_ms = delay
    return msg


def _open(source: str) -> tuple[IO[bytes], int | None]:
    if source == "-":
        return sys.stdin.buffer, None
    try:
        f = open(source, "rb")  # noqa: SIM115 - closed by the caller
    except OSError as err:
        raise UsageError(f"--file {source}: {err.strerror or err}") from None
    try:
        total = f.seek(0, 2)
        f.seek(0)
    except OSError:
        total = None  # a pipe or a device
    return f, total or None


def _parse(
    stream: IO[bytes], d: Defaults, plain: bool, progress: Progress | None
) -> Iterator[pb.PublishMessage]:
    n = 0
    for lineno, raw in enumerate(stream, 1):
        if progress is not None:
            progress.consumed += len(raw)
        line = raw.rstrip(b"\r\n")
        if plain:
            yield _message(d, line, n)
            n += 1
            continue
        if not line.strip():
            continue
        yield _from_json(line, lineno, d, n)
        n += 1


def _from_json(line: bytes, lineno: int, d: Defaults, n: int) -> pb.PublishMessage:
    where = f"input line {lineno}"
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{where}: not JSON ({err}); --lines publishes plain text") from None
    if not isinstance(obj, dict):
        raise UsageError(f'{where}: expected an object like {{"value": "..."}}')
    unknown = sorted(set(obj) - set(LINE_KEYS))
    if unknown:
        raise UsageError(
            f"{where}: unknown field(s) {', '.join(unknown)}; known: " + ", ".join(LINE_KEYS)
        )
    headers = obj.get("headers") or {}
    if not isinstance(headers, dict):
        raise UsageError(f"{where}: headers must be an object")
    idem = obj.get("idempotency_key") or ""
    if not isinstance(idem, str):
        raise UsageError(f"{where}: idempotency_key must be a string")
    key = obj.get("key")
    return _message(
        d,
        _to_bytes(obj.get("value", "")),
        n,
        idem,
        key=None if key is None else _to_bytes(key),
        headers={str(k): _to_bytes(v) for k, v in headers.items()},
        partition=_int_field(obj, "partition", where),
        delay_ms=_int_field(obj, "delay_ms", where),
        deliver_at_ms=_int_field(obj, "deliver_at_ms", where) or 0,
    )


def _to_bytes(value: object) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":")).encode()


def _int_field(obj: dict[str, Any], name: str, where: str) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"{where}: {name} must be a non-negative integer")
    return value


def _report(ctx: Context, queue: str, tally: Tally, seconds: float, *, per_message: bool) -> None:
    if ctx.out.json:
        doc: dict[str, Any] = {
            "queue": queue,
            "published": tally.published,
            "duplicates": tally.duplicates,
            "seconds": round(seconds, 3),
        }
        if per_message:
            doc["results"] = [message_dict(r) for r in tally.results]
        ctx.out.doc(doc)
        return
    if per_message:
        ctx.out.table(
            ["PARTITION", "OFFSET", "TIMESTAMP", "DUPLICATE"],
            [
                [
                    r.partition,
                    r.offset if not r.pending else "pending",
                    show_time(r.timestamp_ms),
                    "yes" if r.duplicate else "no",
                ]
                for r in tally.results
            ],
        )
        return
    rate = tally.published / seconds if seconds > 0 else 0.0
    dups = f" ({tally.duplicates} duplicates)" if tally.duplicates else ""
    ctx.out.line(
        f"published {tally.published} messages to {queue}{dups} in {seconds:.2f} s "
        f"({rate:,.0f} msg/s)"
    )


class Progress:
    """``[#####.....]  45%  12,000 msgs  8,000 msg/s`` redrawn on stderr (a count and a rate
    when the input's size is unknown)."""

    WIDTH = 30

    def __init__(self, total_bytes: int | None, stream: IO[str]) -> None:
        self.total = total_bytes
        self.consumed = 0
        self._stream = stream
        self._started = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def update(self, published: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        elapsed = max(now - self._started, 1e-9)
        text = f"{published:,} msgs  {published / elapsed:,.0f} msg/s"
        if self.total:
            frac = min(self.consumed / self.total, 1.0)
            filled = int(frac * self.WIDTH)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            text = f"[{bar}] {frac * 100:3.0f}%  {text}"
        self._stream.write("\r" + text)
        self._stream.flush()
        self._drawn = True

    def finish(self, published: int) -> None:
        self.update(published, force=True)
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()
