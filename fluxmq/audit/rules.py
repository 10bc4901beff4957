"""The audit rules: each a named check over the three tables that returns its violations.

A violation is one row of ``VIOLATION_COLUMNS``: the rule, where (node, replication group,
queue, partition, offset; null where it does not apply) and a readable detail. Each rule looks
at one kind of damage, so that one injected fault is reported by one rule:

==================  =====================================================================
crc_valid           a stored record fails its crc32c (bit rot, a torn write): per replica
offset_contiguity   a log's stored offsets are not exactly [low, high) (a lost batch, a
                    record outside the watermarks, an offset stored twice by overlapping
                    batches, damaged log metadata)
replica_agreement   replicas of one group hold different records (by their stored crc32c)
                    at the same offset; only offsets stored on two or more replicas count
replica_shape       replicas of one group at the same applied index hold different
                    [low, high) for a partition (the shape most share is taken as right),
                    or a replica behind another holds offsets the one ahead lacks
                    (``fluxmq.audit.shape``)
dedup_window        two records of a queue carry the same idempotency key less than the
                    queue's dedup window apart (the window in force now)
producer_sequence   a producer session's (id, epoch, sequence) is stored twice in a
                    partition, or its sequences do not rise by one from 0 within an epoch
                    (gaps are judged only in logs that are whole and readable, and from 0
                    only where retention removed nothing), or its epoch goes back
key_order           within a partition, a key's records do not have non-decreasing
                    timestamps in offset order
group_consistency   a group partition's row contradicts its log: committed > next,
                    next > high watermark, a pending slot outside [committed, next), a
                    group partition the queue does not have
dlq_conservation    a dead letter's origin does not exist: unknown queue or partition,
                    offset at or past the origin's high watermark, or never handed out to
                    the group it names (an origin below the low watermark was removed by
                    retention, which is fine). Letters are found by the store's own index
                    of dead letters as well as by their fluxmq-original-* headers, so a
                    letter whose headers are gone or name another origin is reported.
                    Each letter is joined to its own origin, so a DLQ shared by several
                    queues is audited per source, and messages published to a DLQ directly
                    are not letters. Per source queue and group, the letters stored must
                    equal the dead counted (fewer only once the DLQ's front was removed)
totals              a group partition's counts do not add up: next - base must equal
                    acked + dead + filtered + skipped + purged + leased + scheduled
==================  =====================================================================

Records that fail their crc are reported by ``crc_valid`` only: their fields are null, so the
other record rules do not see them (``replica_agreement`` compares stored checksums, which a
flipped payload byte does not change).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from fluxmq.audit.shape import LogShape, shape_violations

VIOLATION_COLUMNS = (
    "rule",
    "node",
    "replication_group",
    "queue",
    "partition",
    "offset",
    "detail",
)
_LOG = ["node", "replication_group", "queue_id", "partition"]


LogKey = tuple[str, str, int, int]  # node, replication_group, queue_id, partition


@dataclass(frozen=True)
class Tables:
    records: DataFrame  # at least tables.AUDIT_RECORD_COLUMNS
    logs: DataFrame
    groups: DataFrame

    @cached_property
    def whole_logs(self) -> dict[LogKey, int]:
        """_whole_logs, computed once for the rules that ask (cached_property writes the
        instance's __dict__ directly, so a frozen dataclass may hold it)."""
        return _whole_logs(self)


@dataclass(frozen=True)
class Rule:
    name: str
    title: str
    check: Callable[[Tables], DataFrame]


def _violations(df: DataFrame, rule: str, offset: Column, detail: Column) -> DataFrame:
    return df.select(
        F.lit(rule).alias("rule"),
        F.col("node"),
        F.col("replication_group"),
        F.col("queue"),
        F.col("partition").cast("int").alias("partition"),
        offset.cast("bigint").alias("offset"),
        detail.alias("detail"),
    )


def crc_valid(t: Tables) -> DataFrame:
    bad = t.records.where(~F.col("crc_ok"))
    return _violations(bad, "crc_valid", F.col("offset"), F.col("error"))


def offset_contiguity(t: Tables) -> DataFrame:
    logs = t.logs.select(*_LOG, "queue", "low", "high", "meta_error")
    damaged = _violations(
        logs.where(F.col("meta_error").isNotNull()),
        "offset_contiguity",
        F.lit(None),
        F.concat(F.lit("log metadata is damaged: "), F.col("meta_error")),
    )
    good = logs.where(F.col("meta_error").isNull())
    recs = t.records.select(*_LOG, "offset").join(F.broadcast(good.drop("queue")), _LOG)
    inside = (F.col("offset") >= F.col("low")) & (F.col("offset") < F.col("high"))
    outside = _violations(
        recs.where(~inside).join(F.broadcast(good.select(*_LOG, "queue")), _LOG),
        "offset_contiguity",
        F.col("offset"),
        F.format_string("record stored outside the watermarks [%d, %d)", "low", "high"),
    )
    # One pass counts every log's stored offsets inside its watermarks; only logs that come out
    # short are walked offset by offset, to name the missing ranges.
    counts = recs.where(inside).groupBy(*_LOG).agg(F.count(F.lit(1)).alias("n"))
    short = (
        good.join(counts, _LOG, "left")
        .fillna(0, ["n"])
        .where(F.col("n") != F.col("high") - F.col("low"))
    )
    short_logs = short.select(*_LOG).collect()
    if not short_logs:
        return damaged.unionByName(outside)
    short = short.join(
        F.broadcast(t.records.sparkSession.createDataFrame(short_logs)), _LOG, "left_semi"
    )
    walk = (
        recs.where(inside)
        .join(F.broadcast(short.select(*_LOG)), _LOG, "left_semi")
        .select(*_LOG, "offset", "low", "high")
    )
    w = Window.partitionBy(*_LOG).orderBy("offset")
    lagged = walk.withColumn("prev", F.lag("offset").over(w))
    # Overlapping batches store an offset twice: a log can come out long, or short and long.
    twice = _violations(
        lagged.where(F.col("prev") == F.col("offset"))
        .select(*_LOG, "offset")
        .distinct()
        .join(F.broadcast(good.select(*_LOG, "queue")), _LOG),
        "offset_contiguity",
        F.col("offset"),
        F.format_string("offset %d is stored more than once (overlapping batches)", "offset"),
    )
    inner = (
        lagged.withColumn("from", F.coalesce(F.col("prev") + 1, F.col("low")))
        .where(F.col("offset") > F.col("from"))
        .select(*_LOG, "from", (F.col("offset") - 1).alias("to"))
    )
    tail = (
        short.join(
            walk.groupBy(*_LOG).agg(F.max("offset").alias("last")),
            _LOG,
            "left",
        )
        .withColumn("from", F.coalesce(F.col("last") + 1, F.col("low")))
        .where(F.col("from") < F.col("high"))
        .select(*_LOG, "from", (F.col("high") - 1).alias("to"))
    )
    gaps = inner.unionByName(tail).join(F.broadcast(good.select(*_LOG, "queue")), _LOG)
    missing = _violations(
        gaps,
        "offset_contiguity",
        F.col("from"),
        F.when(
            F.col("from") == F.col("to"),
            F.format_string("offset %d is missing", "from"),
        ).otherwise(
            F.format_string(
                "offsets %d..%d are missing (%d records)",
                "from",
                "to",
                F.col("to") - F.col("from") + 1,
            )
        ),
    )
    return damaged.unionByName(outside).unionByName(missing).unionByName(twice)


AGREEMENT_BLOCK_OFFSETS = 4096


def replica_agreement(t: Tables) -> DataFrame:
    key = ["replication_group", "queue_id", "partition", "offset"]
    block = ["replication_group", "queue_id", "partition", "block"]
    recs = (
        t.records.where(F.col("crc_ok"))
        .select(*key, "node", "queue", "crc")
        .withColumn("block", F.floor(F.col("offset") / AGREEMENT_BLOCK_OFFSETS))
    )
    # Replicas are compared by block digests first (an xor of per-record hashes: the shuffle
    # moves one row per block and node, not one per record); only blocks whose digests differ
    # are compared offset by offset. A block that differs only because a replica lacks a
    # record has no disagreeing offset (offset_contiguity reports the loss).
    digests = recs.groupBy(*block, "node").agg(
        F.bit_xor(F.xxhash64("offset", "crc")).alias("digest")
    )
    differing = (
        digests.groupBy(*block)
        .agg(F.min("digest").alias("lo"), F.max("digest").alias("hi"))
        .where(F.col("lo") != F.col("hi"))
        .select(*block)
        .collect()
    )
    if not differing:
        return _violations(recs.limit(0), "replica_agreement", F.col("offset"), F.lit(""))
    blocks = t.records.sparkSession.createDataFrame(differing)
    suspects = recs.join(F.broadcast(blocks), block, "left_semi")
    split = (
        suspects.groupBy(*key)
        .agg(F.min("crc").alias("lo"), F.max("crc").alias("hi"))
        .where(F.col("lo") != F.col("hi"))
        .select(*key)
    )
    rows = suspects.join(split, key, "left_semi")
    by_crc = rows.groupBy(*key, "crc").agg(
        F.count(F.lit(1)).alias("copies"), F.sort_array(F.collect_list("node")).alias("nodes")
    )
    # The majority (ties: the lowest crc) is taken as right; every other copy is a violation.
    rank = Window.partitionBy(*key).orderBy(F.desc("copies"), F.asc("crc"))
    ranked = by_crc.withColumn("rank", F.row_number().over(rank))
    majority = ranked.where(F.col("rank") == 1).select(
        *key, F.col("crc").alias("majority_crc"), F.col("nodes").alias("majority_nodes")
    )
    odd = rows.join(majority, key).where(F.col("crc") != F.col("majority_crc"))
    return _violations(
        odd,
        "replica_agreement",
        F.col("offset"),
        F.format_string(
            "crc32c %08x here, %08x on %s",
            F.col("crc"),
            F.col("majority_crc"),
            F.array_join(F.col("majority_nodes"), ","),
        ),
    )


def _whole_logs(t: Tables) -> dict[LogKey, int]:
    """The logs whose every offset in [low, high) is stored once and passed its check, with
    their low watermark: only there can a gap in something else (sequences, letters) be told
    from a loss that offset_contiguity or crc_valid reports already. One aggregation,
    collected: there is one row per log (``Tables.whole_logs`` keeps the answer).

    "Once" is judged by the count, sum and range of the stored offsets against [low, high)'s
    (a duplicate and a gap that cancel in all three at once is damage offset_contiguity reports
    anyway); no per-offset distinct count, which would move every offset through a shuffle."""
    good = t.logs.where(F.col("meta_error").isNull()).select(*_LOG, "low", "high")
    offset = F.col("offset").cast("decimal(38,0)")
    stats = (
        t.records.join(F.broadcast(good), _LOG)
        .groupBy(*_LOG, "low", "high")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(offset).alias("total"),
            F.min("offset").alias("lo"),
            F.max("offset").alias("hi"),
            F.min(F.col("crc_ok").cast("int")).alias("all_ok"),
        )
        .collect()
    )
    whole: dict[LogKey, int] = {}
    for r in stats:
        low, high = r["low"], r["high"]
        if (
            r["all_ok"] == 1
            and r["n"] == high - low
            and r["lo"] == low
            and r["hi"] == high - 1
            and int(r["total"]) == (low + high - 1) * (high - low) // 2
        ):
            whole[(r["node"], r["replication_group"], r["queue_id"], r["partition"])] = low
    counted = {(r["node"], r["replication_group"], r["queue_id"], r["partition"]) for r in stats}
    for r in good.where(F.col("low") == F.col("high")).collect():  # empty logs are whole
        key = (r["node"], r["replication_group"], r["queue_id"], r["partition"])
        if key not in counted:
            whole[key] = r["low"]
    return whole


def _whole_frame(t: Tables) -> DataFrame:
    """_whole_logs as a small frame: _LOG columns and low."""
    schema = "node string, replication_group string, queue_id bigint, partition int, low bigint"
    rows = [(*key, low) for key, low in t.whole_logs.items()]
    return t.records.sparkSession.createDataFrame(rows, schema)


def producer_sequence(t: Tables) -> DataFrame:
    who = [*_LOG, "producer_id"]
    recs = t.records.where(F.col("producer_id").isNotNull() & F.col("crc_ok"))
    if recs.isEmpty():
        return _violations(t.records.limit(0), "producer_sequence", F.col("offset"), F.lit(""))
    # A producer's records of one request share sequence - offset, and so do its requests
    # stored back to back: one hash aggregate turns records into runs (one row per request or
    # fewer), and the ordering is judged on runs, not on every record.
    runs = (
        recs.groupBy(
            *who, "queue", "producer_epoch", (F.col("sequence") - F.col("offset")).alias("shift")
        )
        .agg(
            F.min("offset").alias("first"),
            F.max("offset").alias("last"),
            F.min("sequence").alias("s0"),
            F.max("sequence").alias("s1"),
            F.count(F.lit(1)).alias("n"),
        )
        .join(F.broadcast(_whole_frame(t)), _LOG, "left")
    )
    by_seq = Window.partitionBy(*who, "producer_epoch").orderBy("s0", "first")
    before = by_seq.rowsBetween(Window.unboundedPreceding, -1)
    by_offset = Window.partitionBy(*who).orderBy("first")
    marked = (
        runs.withColumn("seen_s1", F.max("s1").over(before))
        .withColumn("seen_first", F.last("first").over(before))
        .withColumn("prev_epoch", F.lag("producer_epoch").over(by_offset))
        .withColumn("prev_s1", F.lag("s1").over(by_offset))
        .withColumn("prev_last", F.lag("last").over(by_offset))
    )
    whole = F.col("low").isNotNull()
    twice = F.col("seen_s1").isNotNull() & (F.col("s0") <= F.col("seen_s1"))
    span = F.format_string("producer %d epoch %d", "producer_id", "producer_epoch")
    stored_twice = F.when(
        twice,
        F.format_string(
            "%s sequences %d..%d are stored twice: at offsets %d..%d, and from offset %d",
            span,
            "s0",
            F.least("s1", "seen_s1"),
            "first",
            "last",
            "seen_first",
        ),
    )
    first_in_epoch = F.col("prev_epoch").isNull() | (F.col("producer_epoch") > F.col("prev_epoch"))
    order = (
        F.when(
            F.col("prev_epoch").isNotNull() & (F.col("producer_epoch") < F.col("prev_epoch")),
            F.format_string(
                "%s at offset %d follows epoch %d (offset %d): epochs never go back",
                span,
                "first",
                "prev_epoch",
                "prev_last",
            ),
        )
        .when(
            first_in_epoch
            & (F.col("s0") != 0)
            & whole
            & (F.col("prev_epoch").isNotNull() | (F.col("low") == 0)),
            F.format_string(
                "%s begins at sequence %d (offset %d), not 0: sequences 0..%d are missing",
                span,
                "s0",
                "first",
                F.col("s0") - 1,
            ),
        )
        .when(
            ~first_in_epoch & (F.col("s0") > F.col("prev_s1") + 1) & whole,
            F.format_string(
                "%s: sequence %d (offset %d) follows %d (offset %d): %d..%d are missing",
                span,
                "s0",
                "first",
                "prev_s1",
                "prev_last",
                F.col("prev_s1") + 1,
                F.col("s0") - 1,
            ),
        )
        .when(
            ~first_in_epoch & (F.col("s0") <= F.col("prev_s1")) & ~twice,
            F.format_string(
                "%s: sequence %d (offset %d) follows %d (offset %d): sequences only rise",
                span,
                "s0",
                "first",
                "prev_s1",
                "prev_last",
            ),
        )
        .when(
            (F.col("n") != F.col("last") - F.col("first") + 1) & whole,
            F.format_string(
                "%s: sequences %d..%d lie at offsets %d..%d with others between, some missing",
                span,
                "s0",
                "s1",
                "first",
                "last",
            ),
        )
    )
    problems = F.concat_ws("; ", stored_twice, order)
    bad = marked.withColumn("problems", problems).where(F.col("problems") != "")
    return _violations(bad, "producer_sequence", F.col("first"), F.col("problems"))


def replica_shape(t: Tables) -> DataFrame:
    rows = [
        LogShape(
            r["node"],
            r["replication_group"],
            r["queue"],
            r["queue_id"],
            r["partition"],
            r["low"],
            r["high"],
            r["applied_index"],
            r["meta_error"] is not None,
        )
        for r in t.logs.select(
            *_LOG, "queue", "low", "high", "applied_index", "meta_error"
        ).collect()
    ]
    found = shape_violations(rows)
    schema = (
        "rule string, node string, replication_group string, queue string, partition int, "
        "offset bigint, detail string"
    )
    return t.logs.sparkSession.createDataFrame(
        [
            ("replica_shape", v.node, v.replication_group, v.queue, v.partition, v.offset, v.detail)
            for v in found
        ],
        schema,
    )


def dedup_window(t: Tables) -> DataFrame:
    who = ["node", "replication_group", "queue_id", "idempotency_key"]
    recs = t.records.where(F.col("idempotency_key").isNotNull()).select(
        *who, "queue", "partition", "offset", "timestamp_ms"
    )
    repeated = recs.groupBy(*who).count().where(F.col("count") > 1).select(*who)
    windows = t.logs.select("node", "replication_group", "queue_id", "dedup_window_ms").distinct()
    w = Window.partitionBy(*who).orderBy("timestamp_ms", "partition", "offset")
    dup = (
        recs.join(repeated, who, "left_semi")
        .join(F.broadcast(windows), ["node", "replication_group", "queue_id"])
        .withColumn("prev_ts", F.lag("timestamp_ms").over(w))
        .withColumn("prev_partition", F.lag("partition").over(w))
        .withColumn("prev_offset", F.lag("offset").over(w))
        .where(F.col("timestamp_ms") - F.col("prev_ts") < F.col("dedup_window_ms"))
    )
    return _violations(
        dup,
        "dedup_window",
        F.col("offset"),
        F.format_string(
            "idempotency key %s was already stored at partition %d offset %d, %d ms earlier "
            "(window %d ms)",
            "idempotency_key",
            "prev_partition",
            "prev_offset",
            F.col("timestamp_ms") - F.col("prev_ts"),
            "dedup_window_ms",
        ),
    )


def key_order(t: Tables) -> DataFrame:
    who = [*_LOG, "key"]
    # A log whose timestamps never go down (ts >= ts_prev, the previous good record's) has every
    # key in order: only logs where they do go down are sorted per key.
    unordered = (
        t.records.where(F.col("timestamp_ms") < F.col("ts_prev")).select(*_LOG).distinct()
    ).collect()
    recs = t.records.where(F.col("key").isNotNull() & F.col("crc_ok")).select(
        *who, "queue", "offset", "timestamp_ms"
    )
    if not unordered:
        return _violations(recs.limit(0), "key_order", F.col("offset"), F.lit(""))
    logs = t.records.sparkSession.createDataFrame(unordered)
    w = Window.partitionBy(*who).orderBy("offset")
    back = (
        recs.join(F.broadcast(logs), _LOG, "left_semi")
        .withColumn("prev_ts", F.lag("timestamp_ms").over(w))
        .withColumn("prev_offset", F.lag("offset").over(w))
        .where(F.col("timestamp_ms") < F.col("prev_ts"))
    )
    return _violations(
        back,
        "key_order",
        F.col("offset"),
        F.format_string(
            "key %s: timestamp %d is before %d of offset %d",
            F.hex("key"),
            "timestamp_ms",
            "prev_ts",
            "prev_offset",
        ),
    )


def group_consistency(t: Tables) -> DataFrame:
    g = t.groups.join(F.broadcast(t.logs.select(*_LOG, "partitions")), _LOG, "left")
    problems = F.concat_ws(
        "; ",
        F.when(
            F.col("committed") > F.col("next"),
            F.format_string("committed %d is past the delivery frontier %d", "committed", "next"),
        ),
        F.when(
            F.col("high").isNotNull() & (F.col("committed") > F.col("high")),
            F.format_string("committed %d is past the high watermark %d", "committed", "high"),
        ),
        F.when(
            F.col("high").isNotNull() & (F.col("next") > F.col("high")),
            F.format_string("delivery frontier %d is past the high watermark %d", "next", "high"),
        ),
        F.when(
            F.col("slots_outside") > 0,
            F.format_string("%d pending offsets outside [committed, next)", "slots_outside"),
        ),
        F.when(
            F.col("queue").isNull() | F.col("group").isNull(),
            F.lit("the row belongs to no known queue and group"),
        ),
        F.when(
            F.col("partitions").isNotNull() & (F.col("partition") >= F.col("partitions")),
            F.format_string("partition %d of a queue with %d", "partition", "partitions"),
        ),
    )
    bad = g.withColumn("problems", problems).where(F.col("problems") != "")
    return _violations(
        bad,
        "group_consistency",
        F.col("committed"),
        F.concat(F.lit("group "), F.coalesce(F.col("group"), F.lit("?")), F.lit(": "), "problems"),
    )


def _letters(t: Tables) -> DataFrame:
    """The dead letters stored: records that the store's index of dead letters names, or whose
    fluxmq-original-* headers do (letters replayed or purged left the index; letters written
    before it existed were never in it)."""
    return t.records.where(
        (F.col("origin_queue").isNotNull() | F.col("indexed_origin").isNotNull()) & F.col("crc_ok")
    ).select(
        "node",
        "replication_group",
        "queue",
        "partition",
        "offset",
        "origin_queue",
        "origin_partition",
        "origin_offset",
        "dead_group",
        "indexed_origin",
    )


def dlq_conservation(t: Tables) -> DataFrame:
    dead = _letters(t)
    logs = t.logs.select(
        "node",
        "replication_group",
        F.col("queue").alias("origin_queue"),
        F.col("partition").alias("origin_partition"),
        F.col("low").alias("origin_low"),
        F.col("high").alias("origin_high"),
    )
    groups = t.groups.select(
        "node",
        "replication_group",
        F.col("queue").alias("origin_queue"),
        F.col("group").alias("dead_group"),
        F.col("partition").alias("origin_partition"),
        F.col("next").alias("group_next"),
    )
    where = ["node", "replication_group", "origin_queue", "origin_partition"]
    joined = dead.join(F.broadcast(logs), where, "left").join(
        F.broadcast(groups), [*where, "dead_group"], "left"
    )
    origin = F.format_string(
        "%s partition %s offset %s",
        "origin_queue",
        F.coalesce(F.col("origin_partition").cast("string"), F.lit("?")),
        F.coalesce(F.col("origin_offset").cast("string"), F.lit("?")),
    )
    detail = (
        F.when(
            F.col("origin_queue").isNull(),
            F.format_string(
                "dead letter of %s (by the store's index of dead letters) has no "
                "fluxmq-original-* headers naming its origin",
                "indexed_origin",
            ),
        )
        .when(
            F.col("indexed_origin").isNotNull()
            & (F.col("indexed_origin") != F.col("origin_queue")),
            F.format_string(
                "dead letter's headers name origin %s, the store's index of dead letters %s",
                "origin_queue",
                "indexed_origin",
            ),
        )
        .when(
            F.col("origin_partition").isNull() | F.col("origin_offset").isNull(),
            F.concat(F.lit("dead letter without a readable origin: "), origin),
        )
        .when(
            F.col("origin_high").isNull(),
            F.concat(F.lit("origin queue or partition does not exist: "), origin),
        )
        .when(
            F.col("origin_offset") >= F.col("origin_high"),
            F.concat(
                F.lit("origin was never written: "),
                origin,
                F.format_string(" is at or past the high watermark %d", "origin_high"),
            ),
        )
        .when(
            F.col("group_next").isNotNull() & (F.col("origin_offset") >= F.col("group_next")),
            F.concat(
                F.lit("origin was never handed out to group "),
                F.col("dead_group"),
                F.lit(": "),
                origin,
            ),
        )
    )
    bad = joined.withColumn("problem", detail).where(F.col("problem").isNotNull())
    letters = _violations(bad, "dlq_conservation", F.col("offset"), F.col("problem"))
    return letters.unionByName(_dead_counts(t, dead))


def _dead_counts(t: Tables, letters: DataFrame) -> DataFrame:
    """Per source queue (one with a DLQ) and its groups: the letters its DLQ stores against the
    dead its group partitions counted. Letters only leave a DLQ's log from its front (retention,
    purge, or the compaction of replayed and purged letters), so while the DLQ's log is whole
    and starts at 0 the two are equal; once its low watermark moved, or a letter is unreadable
    (crc_valid reports it), the DLQ may hold fewer, never more. A group's own letters are
    counted by their fluxmq-group header; the source's total also counts letters whose header
    is gone (dlq_conservation reports those one by one). The inputs are small once aggregated
    (a row per queue, group or log), so the comparison runs on the driver."""
    schema = (
        "rule string, node string, replication_group string, queue string, partition int, "
        "offset bigint, detail string"
    )
    spark = t.records.sparkSession
    log_rows = t.logs.select(*_LOG, "queue", "low", "dead_letter_queue").collect()
    dlq_logs = {
        (r["node"], r["replication_group"], r["queue"]): r for r in log_rows if r["partition"] == 0
    }
    sources = {
        (r["node"], r["replication_group"], r["queue"]): r["dead_letter_queue"]
        for r in log_rows
        if r["dead_letter_queue"] is not None
        and (r["node"], r["replication_group"], r["dead_letter_queue"]) in dlq_logs
    }
    if not sources:
        return spark.createDataFrame([], schema)
    dead: dict[tuple[str, str, str], dict[str, int]] = {}
    for r in (
        t.groups.where(F.col("queue").isNotNull() & F.col("group").isNotNull())
        .groupBy("node", "replication_group", "queue", "group")
        .agg(F.sum("dead").alias("dead"))
        .collect()
    ):
        dead.setdefault((r["node"], r["replication_group"], r["queue"]), {})[r["group"]] = int(
            r["dead"]
        )
    stored: dict[tuple[str, str, str, str], dict[str | None, int]] = {}
    for r in (
        letters.groupBy(
            "node",
            "replication_group",
            F.col("queue").alias("dlq"),
            F.coalesce("indexed_origin", "origin_queue").alias("source"),
            F.col("dead_group").alias("group"),
        )
        .count()
        .collect()
    ):
        key = (r["node"], r["replication_group"], r["dlq"], r["source"])
        stored.setdefault(key, {})[r["group"]] = int(r["count"])
    whole = t.whole_logs
    out = []
    for (node, group_of_store, queue), dlq in sorted(sources.items()):
        counted = dead.get((node, group_of_store, queue), {})
        held = stored.get((node, group_of_store, dlq, queue), {})
        for name, n_dead in sorted(counted.items()):
            n_stored = held.get(name, 0)
            if n_stored > n_dead:
                detail = (
                    f"group {name} of {queue} counted {n_dead} dead, but {dlq} holds "
                    f"{n_stored} of its letters"
                )
                out.append(("dlq_conservation", node, group_of_store, queue, None, None, detail))
        # Letters of existing groups, and letters whose group header is gone; a letter naming
        # a group deleted since is left out, as its dead count is.
        n_stored = sum(n for name, n in held.items() if name is None or name in counted)
        n_dead = sum(counted.values())
        dlq_log = dlq_logs[(node, group_of_store, dlq)]
        key = (node, group_of_store, dlq_log["queue_id"], 0)
        exact = dlq_log["low"] == 0 and key in whole
        if n_stored > n_dead or (exact and n_stored < n_dead):
            why = (
                "more letters than dead messages"
                if n_stored > n_dead
                else "letters lost, or dropped while the queue had no dead-letter queue"
            )
            detail = (
                f"the groups of {queue} counted {n_dead} dead, and {dlq} holds {n_stored} of "
                f"their letters ({why})"
            )
            out.append(("dlq_conservation", node, group_of_store, queue, None, None, detail))
    return spark.createDataFrame(out, schema)


def totals(t: Tables) -> DataFrame:
    accounted = (
        F.col("acked")
        + F.col("dead")
        + F.col("filtered")
        + F.col("skipped")
        + F.col("purged")
        + F.col("leased")
        + F.col("scheduled")
    )
    bad = t.groups.where(F.col("next") - F.col("base") != accounted)
    return _violations(
        bad,
        "totals",
        F.lit(None),
        F.format_string(
            "group %s: %d offsets in [base %d, next %d) but acked %d + dead %d + filtered %d "
            "+ skipped %d + purged %d + leased %d + scheduled %d = %d",
            F.coalesce(F.col("group"), F.lit("?")),
            F.col("next") - F.col("base"),
            "base",
            "next",
            "acked",
            "dead",
            "filtered",
            "skipped",
            "purged",
            "leased",
            "scheduled",
            accounted,
        ),
    )


RULES: tuple[Rule, ...] = (
    Rule("crc_valid", "every stored record passes its crc32c", crc_valid),
    Rule(
        "offset_contiguity",
        "every log stores exactly the offsets [low, high)",
        offset_contiguity,
    ),
    Rule(
        "replica_agreement",
        "replicas hold the same record at the same offset",
        replica_agreement,
    ),
    Rule(
        "replica_shape",
        "replicas at one applied index hold the same offsets; one behind holds no more",
        replica_shape,
    ),
    Rule(
        "dedup_window",
        "no idempotency key is stored twice within the dedup window",
        dedup_window,
    ),
    Rule(
        "producer_sequence",
        "a producer's sequences are stored once each, without gaps within an epoch",
        producer_sequence,
    ),
    Rule("key_order", "a key's records have non-decreasing timestamps", key_order),
    Rule(
        "group_consistency",
        "group offsets lie within their logs (committed <= next <= high)",
        group_consistency,
    ),
    Rule(
        "dlq_conservation",
        "every dead letter has an origin that was handed out to its group, and the letters "
        "stored match the dead counted",
        dlq_conservation,
    ),
    Rule(
        "totals",
        "per group: published = acked + ready + leased + scheduled + dead + removed",
        totals,
    ),
)


def group_totals(t: Tables) -> DataFrame:
    """Per (node, replication group, queue, group): the totals the report shows.

    ``published`` counts the offsets in the group's scope, [base, high); it splits into
    ``acked + ready + leased + scheduled + dead + removed`` where ``ready`` = high - next (never
    handed out) and ``removed`` = skipped by retention + purged + filtered out.
    """
    g = t.groups.where(F.col("high").isNotNull())
    return (
        g.groupBy("node", "replication_group", "queue", "group")
        .agg(
            F.sum(F.col("high") - F.col("base")).alias("published"),
            F.sum("acked").alias("acked"),
            F.sum(F.col("high") - F.col("next")).alias("ready"),
            F.sum("leased").alias("leased"),
            F.sum("scheduled").alias("scheduled"),
            F.sum("dead").alias("dead"),
            F.sum(F.col("skipped") + F.col("purged") + F.col("filtered")).alias("removed"),
            F.sum(F.col("high") - F.col("committed")).alias("lag"),
        )
        .orderBy("queue", "group", "node")
    )
