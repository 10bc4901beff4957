"""Every limit of the core in one place. Anything unbounded is a bug."""

from __future__ import annotations

import re

# \Z, not $: "$" also matches before a final newline, which would let "x\n" pass as a name.
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}\Z")
PARTITIONS_MAX = 1024
QUEUES_MAX = 100_000
LABELS_MAX = 64
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}\Z")
LABEL_VALUE_CHARS_MAX = 256

PUBLISH_MESSAGES_MAX = 1000
MESSAGE_BYTES_DEFAULT = 1024 * 1024
MESSAGE_BYTES_MAX = 16 * 1024 * 1024
MESSAGE_KEY_BYTES_MAX = 16 * 1024
MESSAGE_HEADERS_MAX = 64
HEADER_NAME_CHARS_MAX = 256
IDEMPOTENCY_KEY_BYTES_MAX = 256

DEDUP_WINDOW_DEFAULT = "2m"
DEDUP_WINDOW_MS_MAX = 7 * 86_400_000

REQUEST_TIMEOUT_MS_DEFAULT = 30_000
REQUEST_TIMEOUT_MS_MIN = 10
REQUEST_TIMEOUT_MS_MAX = 900_000

FETCH_MESSAGES_DEFAULT = 1000
FETCH_MESSAGES_MAX = 10_000
FETCH_BYTES_DEFAULT = 4 * 1024 * 1024
FETCH_BYTES_MAX = 16 * 1024 * 1024
WAIT_MS_MAX = 60_000

LIST_LIMIT_DEFAULT = 100
LIST_LIMIT_MAX = 1000

# Work done by one ApplyRetention command, so that a command never holds the writer for long;
# the next pass continues where this one stopped.
RETENTION_RECORDS_PER_PASS_MAX = 50_000
DEDUP_EXPIRIES_PER_PASS_MAX = 50_000
DROP_RECORDS_PER_PASS_MAX = 50_000
RETENTION_BATCHES_PER_PASS_MAX = 10_000  # batch headers one retention-by-bytes cut reads per log

# Delivery (consumer groups).
GROUPS_PER_QUEUE_MAX = 64
CHECKOUTS_PER_GROUP_MAX = 1000  # consumers checked out (Consume streams) at once, per group
CONSUMER_ID_CHARS_MAX = 200
LEASE_MESSAGES_MAX = 1000
RECEIPTS_MAX = 1000
LEASE_MS_MIN = 100
LEASE_MS_MAX = 12 * 3_600_000
LEASE_TIMEOUT_DEFAULT = "30s"
MAX_ATTEMPTS_MAX = 1000
RETRY_BACKOFF_BASE_DEFAULT = "1s"
RETRY_BACKOFF_MAX_DEFAULT = "5m"
DELAY_MS_MAX = 7 * 86_400_000  # delivery_delay, delay_ms, deliver_at_ms ahead, retry delays
MESSAGE_TTL_MS_MAX = 365 * 86_400_000
IN_FLIGHT_MAX = 10_000  # Consume: max_in_flight
# Offsets of one group partition between its committed offset and its delivery frontier that
# are leased, scheduled or done-out-of-order. At the limit the partition hands out only retries
# until the committed offset moves: one stuck message cannot grow the state without bound.
PENDING_PER_PARTITION_MAX = 100_000
# Records one Lease command may examine (filtered, delayed, expired ones included).
LEASE_SCAN_RECORDS_MAX = 10_000
EXPIRIES_PER_PASS_MAX = 10_000  # leases expired + TTL dead letters per ExpireLeases command
REPLAY_PER_COMMAND_MAX = 1000
# PurgeDeadLetters all=true: letters one command deletes (each is a row: a shared DLQ is never
# truncated wholesale); the server repeats the command until fewer remain.
PURGE_DEAD_LETTERS_PER_COMMAND_MAX = 10_000
FILTER_TERMS_MAX = 16

ACK_TIMEOUT_DEFAULT = "10s"
ACK_TIMEOUT_MS_MIN = 100
ACK_TIMEOUT_MS_MAX = 600_000
REPLICATION_FACTOR_MAX = 7
