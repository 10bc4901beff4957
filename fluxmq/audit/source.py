"""``spark.read.format("fluxmq")``: FluxMQ node data directories as Spark tables.

Options:

``paths``
    The node data directories, as a JSON list of ``PATH`` or ``NAME=PATH`` (see
    ``layout.discover``). Every Spark worker must see them at the same paths.
``table``
    ``records`` (default), ``logs`` or ``groups`` (schemas in ``fluxmq.audit.tables``).
``exclude``
    Store directories to leave out, as a JSON list of paths (what ``discover`` names them:
    absolute): the audit passes the stores its check found unreadable.
``split_records``
    Offsets per Spark partition of the records table (default 1,000,000). A split holds the
    stored batches whose base offset falls in its range, so it cuts at batch boundaries.

The schema may be narrowed with ``.schema("node string, offset bigint, ...")`` (any subset of the
table's columns, same types); only those columns are kept and shipped to the JVM, which is how
the audit leaves the payloads behind (each record batch is still decoded whole, since its crc
covers all of it).

One Spark partition is one (node, store, queue, partition, offset range) of the records table,
or one store of the small tables. Each reads in its own LMDB read transaction; the log metadata
that cut the splits was read in one transaction per store, and everything below a log's high
watermark is immutable but for retention, so the view is consistent for stopped nodes and
copies. A live node may drop records to retention while the audit reads them: audit a copy, or
an ``export`` archive, to be exact.

>>> # spark.dataSource.register(FluxDataSource)
>>> # spark.read.format("fluxmq").option("paths", '["n1", "n2"]').load().count()
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from fluxmq.audit import tables
from fluxmq.audit.layout import AuditUsageError, StoreRef, discover
from storage.lmdb_inspect import LmdbInspector

SPLIT_RECORDS_DEFAULT = 1_000_000
SPLIT_RECORDS_MAX = 100_000_000


class _Part(InputPartition):  # type: ignore[misc]
    def __init__(self, store: StoreRef, split: tables.Split | None) -> None:
        super().__init__(None)
        self.store = store
        self.split = split  # None: the whole store (logs, groups)


def parse_exclude(options: dict[str, str]) -> set[str]:
    try:
        exclude = json.loads(options.get("exclude", "[]"))
    except json.JSONDecodeError as err:
        raise AuditUsageError(f"option exclude: not a JSON list ({err})") from None
    if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
        raise AuditUsageError("option exclude: a JSON list of store directories")
    return {os.path.abspath(p) for p in exclude}


def parse_options(options: dict[str, str]) -> tuple[list[str], str, int]:
    """-> (data dirs, table, split_records); AuditUsageError naming the bad option."""
    try:
        paths = json.loads(options.get("paths", "[]"))
    except json.JSONDecodeError as err:
        raise AuditUsageError(f"option paths: not a JSON list ({err})") from None
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths) or not paths:
        raise AuditUsageError('option paths: a JSON list of data directories, e.g. ["n1", "n2"]')
    table = options.get("table", "records")
    if table not in tables.TABLES:
        raise AuditUsageError(f"option table: {table!r} is not one of {sorted(tables.TABLES)}")
    raw = options.get("split_records", str(SPLIT_RECORDS_DEFAULT))
    if not raw.isdigit() or not 1 <= int(raw) <= SPLIT_RECORDS_MAX:
        raise AuditUsageError(f"option split_records: an integer in 1..{SPLIT_RECORDS_MAX}")
    return paths, table, int(raw)


class FluxDataSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return "fluxmq"

    def schema(self) -> str:
        _paths, table, _n = parse_options(dict(self.options))
        return tables.spark_ddl(tables.TABLES[table])

    def reader(self, schema: StructType) -> DataSourceReader:
        paths, table, split_records = parse_options(dict(self.options))
        columns = dict(tables.TABLES[table])
        names = [f.name for f in schema.fields]
        unknown = [n for n in names if n not in columns]
        if unknown:
            raise AuditUsageError(f"table {table} has no column(s) {unknown}")
        return _Reader(paths, table, split_records, names, parse_exclude(dict(self.options)))


class _Reader(DataSourceReader):  # type: ignore[misc]
    def __init__(
        self, paths: list[str], table: str, split_records: int, names: list[str], exclude: set[str]
    ) -> None:
        self.paths = paths
        self.exclude = exclude
        self.table = table
        self.split_records = split_records
        self.names = names

    def partitions(self) -> Sequence[InputPartition]:
        stores = [s for s in discover(self.paths) if s.path not in self.exclude]
        if self.table != "records":
            return [_Part(s, None) for s in stores]
        parts: list[InputPartition] = []
        for store in stores:
            with LmdbInspector(store.path) as inspector, inspector.view() as view:
                parts.extend(
                    _Part(store, sp) for sp in tables.splits(store, view, self.split_records)
                )
        return parts

    def read(self, partition: Any) -> Iterator[Any]:
        part: _Part = partition
        with LmdbInspector(part.store.path) as inspector, inspector.view() as view:
            if part.split is not None:
                yield from tables.read_split(part.split, view, self.names)
            elif self.table == "logs":
                yield from tables.read_logs(part.store, view, self.names)
            else:
                yield from tables.read_groups(part.store, view, self.names)
