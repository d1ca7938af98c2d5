"""Reading state without Spark: a table's rows at a committed batch, the
changes between two batches, and the metadata of a state location.

Every read loads the partition into a private temporary RocksDB (removed
afterwards) from the checkpoint alone, so it never touches a running query's
local directory nor writes to the checkpoint. ``relstate inspect`` prints what
these functions return; the ``relstate-state`` and ``relstate-metadata`` data
sources wrap them, one Spark partition per state partition.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from operators._checkpoint.location import StateLocation, table_schema
from operators.errors import InputError, RelstateError, RepartitionedError
from statestore import Manifest, StateStore, StoreConfig, TableMeta, read_changelogs

__all__ = [
    "CHANGE_COLUMNS",
    "CHANGE_TYPES",
    "METADATA_SCHEMA",
    "READ",
    "change_schema",
    "metadata",
    "read_changes",
    "read_rows",
    "scan_chunks",
]

#: The kinds of change in a change feed, in the order they are given per key.
CHANGE_TYPES = ("insert", "update_preimage", "update_postimage", "delete")

METADATA_SCHEMA = pa.schema(
    [
        pa.field("operator", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("table", pa.string()),
        pa.field("table_id", pa.int64()),
        pa.field("layout", pa.string()),
        pa.field("columns", pa.string()),
        pa.field("key_columns", pa.string()),
        pa.field("partition_count", pa.int32()),
        pa.field("batch_id", pa.int64()),
        pa.field("commit_id", pa.string()),
        pa.field("kept_versions", pa.list_(pa.int64())),
        pa.field("snapshot_version", pa.int64()),
        pa.field("changelogs", pa.int32()),
        pa.field("state_bytes", pa.int64()),
        pa.field("partition_rows", pa.int64()),
        pa.field("table_rows", pa.int64()),
        pa.field("status", pa.string()),
    ]
)

#: ``status`` of a partition whose commit was read.
READ = "ok"


#: The change feed's own columns, before the table's.
CHANGE_COLUMNS = (
    pa.field("batch_id", pa.int64(), nullable=False),
    pa.field("change_type", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
)


def change_schema(meta: TableMeta) -> pa.Schema:
    """A change feed's columns: the batch, the kind of change, the partition,
    then the table's own columns. A table with a column of one of those
    names is refused: the feed would have two columns of one name."""
    taken = [f.name for f in CHANGE_COLUMNS if f.name in meta.columns.names]
    if taken:
        raise InputError(
            f"table {meta.name!r} has column(s) {taken}, which the change feed's own "
            f"columns {[f.name for f in CHANGE_COLUMNS]} are named too, so its feed "
            "cannot be given without two columns of one name; read the state after each "
            "batch (option batchId) and compare, or rename the table's column"
        )
    return pa.schema([*CHANGE_COLUMNS, *(f.with_nullable(True) for f in meta.columns)])


@contextlib.contextmanager
def _reader(
    location: StateLocation, operator: str, partition: int, metas: Sequence[TableMeta]
) -> Iterator[StateStore]:
    """A store on a private temporary directory, configured with the tables
    ``metas`` (a manifest's: a store must configure every table it loads)."""
    local = tempfile.mkdtemp(prefix="relstate-read-")
    try:
        store = StateStore(
            location.root,
            operator,
            partition,
            [table_schema(m) for m in metas],
            StoreConfig(local_dir=local, spill_rows=None),
            filesystem=location.fs,
        )
        with store:
            yield store
    finally:
        shutil.rmtree(local, ignore_errors=True)


def read_rows(
    location: StateLocation,
    operator: str,
    meta: TableMeta,
    partition: int,
    batch_id: int | None = None,
    limit: int | None = None,
) -> pa.Table:
    """The rows of table ``meta`` in ``partition`` after ``batch_id`` (default:
    the latest committed batch), in key order, with the table's column types."""
    manifest = location.commit(operator, partition, batch_id)
    if manifest is None:
        return meta.columns.empty_table()
    with _reader(location, operator, partition, manifest.tables) as store:
        store.load(manifest.version, manifest.commit_id)
        table = store.table(meta.name)
        if limit is None:
            return pa.Table.from_batches([table.scan_batch()], schema=meta.columns)
        rows: list[tuple[Any, ...]] = []
        for row in table.scan():
            if len(rows) >= limit:
                break
            rows.append(tuple(row))
    return _table(rows, meta.columns)


def scan_chunks(
    location: StateLocation,
    operator: str,
    partition: int,
    batch_id: int,
    chunk_rows: int,
) -> Iterator[tuple[TableMeta, list[tuple[Any, ...]]]]:
    """Every table's rows in ``partition`` after ``batch_id``, table by
    table in key order, in lists of at most ``chunk_rows`` rows: the whole
    state of a partition without holding it in memory."""
    manifest = location.commit(operator, partition, batch_id)
    if manifest is None:
        return
    with _reader(location, operator, partition, manifest.tables) as store:
        store.load(manifest.version, manifest.commit_id)
        for meta in manifest.tables:
            rows = (tuple(row) for row in store.table(meta.name).scan())
            while chunk := list(itertools.islice(rows, chunk_rows)):
                yield meta, chunk


def _table(rows: list[tuple[Any, ...]], schema: pa.Schema) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    arrays = [pa.array(list(c), type=f.type) for c, f in zip(columns, schema, strict=True)]
    return pa.Table.from_arrays(arrays, schema=schema)


def read_changes(
    location: StateLocation,
    operator: str,
    meta: TableMeta,
    partition: int,
    start: int,
    end: int | None = None,
) -> pa.Table:
    """What batches ``start``..``end`` (inclusive; default: the latest
    committed) changed in table ``meta`` of ``partition``: per batch, per key,
    ``insert`` (the new row), ``update_preimage`` and ``update_postimage`` (the
    row before and after) or ``delete`` (the row before).

    Each batch is compared with the batch before it, so that one must be kept
    (or the partition's state must begin at its first kept version). A batch
    whose commit wrote a changelog on the one before is compared on the keys
    that changelog touched; a batch that took a snapshot instead (every
    ``snapshot_interval``-th), or follows a gap, on the whole table."""
    schema = change_schema(meta)
    if end is None:
        end = location.latest_batch()
    kept = location.kept_batches(operator, partition)
    if end is None:
        end = kept[-1] if kept else start
    if start > end:
        raise InputError(
            f"the change feed needs changeStartBatchId <= changeEndBatchId; got {start}..{end}"
        )
    if not kept:
        return schema.empty_table()
    earlier = [v for v in kept if v < start]
    if not earlier:
        _check_beginning(location, operator, partition, kept, start)
    versions = [v for v in kept if start <= v <= end]
    if not versions:
        return schema.empty_table()
    out: list[tuple[Any, ...]] = []
    newest = location.commit(operator, partition, versions[-1])
    with _reader(location, operator, partition, () if newest is None else newest.tables) as store:
        before = None
        if earlier:
            before = location.commit(operator, partition, earlier[-1])
            if before is not None:
                store.load(before.version, before.commit_id)
        for version in versions:
            after = location.commit(operator, partition, version)
            if after is None:
                continue
            out.extend(_batch_changes(store, meta, partition, before, after))
            before = after
    return _table(out, schema)


def _check_beginning(
    location: StateLocation, operator: str, partition: int, kept: list[int], start: int
) -> None:
    """Refuse a feed from ``start`` when no kept version before it gives the
    state it changed: the first kept version builds on a removed one, or is
    the new partition a repartition wrote (the state before it is another
    partitioning's, kept only in the backup)."""
    first = location.commit(operator, partition, kept[0])
    if first is None:
        return
    if first.parent is not None:
        raise InputError(
            f"the change feed from batch {start} needs the state of the batch before it, "
            f"which is no longer kept (partition {partition} keeps {kept[0]}..{kept[-1]}); "
            f"start at {kept[0] + 1} or later"
        )
    record = location.record(first.version)
    if record is not None and record.repartitioned is not None:
        raise RepartitionedError(
            f"batch {first.version} of operator {operator!r} was rewritten by `relstate "
            f"repartition` (from {record.repartitioned[0]} to {record.repartitioned[1]} "
            f"partitions): partition {partition} has no state of "
            f"the batches before it to compare with, so a change feed from batch {start} "
            f"would report the whole state as inserted at {first.version}. Start at "
            f"{first.version + 1} or later (earlier batches are in the repartition's backup)",
            first.version + 1,
        )


def _batch_changes(
    store: StateStore,
    meta: TableMeta,
    partition: int,
    before: Manifest | None,
    after: Manifest,
) -> list[tuple[Any, ...]]:
    """The changes ``after`` made to ``store``, which holds ``before`` (the
    empty state: ``None``) and holds ``after`` on return."""
    own = [c for c in after.changelogs if c.commit == after.ref]
    if before is None or after.parent != before.ref or not own:
        old = _keyed(store, meta) if before is not None else {}
        store.load(after.version, after.commit_id)
        return _diff(after.version, partition, old, _keyed(store, meta))
    table = store.table(meta.name)
    prefix = table.keys.prefix
    touched: set[tuple[Any, ...]] = set()
    for log in read_changelogs(store.checkpoint.fs, own, after.version, store.config.io_threads):
        for lower, upper in log.range_deletes:
            for key, _ in table.backend.items(max(lower, prefix), upper, False):
                if not key.startswith(prefix):
                    break
                touched.add(table.keys.decode_prefix(key)[0])
        touched.update(
            table.keys.decode_prefix(key)[0]
            for key in log.writes.keys.to_pylist()
            if key.startswith(prefix)
        )
    keys = sorted(touched, key=table.keys.encode)
    old_rows = table.get_rows(keys)
    store.load(after.version, after.commit_id)
    new_rows = store.table(meta.name).get_rows(keys)
    return _diff(
        after.version,
        partition,
        {k: r for k, r in zip(keys, old_rows, strict=True) if r is not None},
        {k: r for k, r in zip(keys, new_rows, strict=True) if r is not None},
    )


def _keyed(store: StateStore, meta: TableMeta) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """The table's whole state in ``store``, by primary key."""
    index = [meta.columns.get_field_index(n) for n, _, _ in meta.key_columns]
    return {tuple(row[i] for i in index): tuple(row) for row in store.table(meta.name).scan()}


def _diff(
    version: int,
    partition: int,
    before: dict[tuple[Any, ...], tuple[Any, ...]],
    after: dict[tuple[Any, ...], tuple[Any, ...]],
) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for key, row in after.items():
        old = before.get(key)
        if old is None:
            out.append((version, "insert", partition, *row))
        elif old != row:
            out.append((version, "update_preimage", partition, *old))
            out.append((version, "update_postimage", partition, *row))
    out.extend((version, "delete", partition, *old) for k, old in before.items() if k not in after)
    return out


def metadata(location: StateLocation, batch_id: int | None = None) -> pa.Table:
    """One row per operator, partition and table at ``batch_id`` (default: the
    latest committed): schema, partition count, the commit read, the kept
    versions, the snapshot and changelog chain, the bytes and rows of the
    partition's state, and the table's rows (``None`` for a manifest older
    than that record). A partition whose commit cannot be read (the batch is
    not kept there, a damaged manifest) is one row with its kept versions and
    why in ``status``; every other row's ``status`` is ``ok``. A batch after
    the runner's latest record raises, as :func:`read_rows` does."""
    if batch_id is not None:
        location.check_committed(batch_id)
    rows: list[tuple[Any, ...]] = []
    for operator in location.operators():
        for partition in location.partitions(operator):
            kept = location.kept_batches(operator, partition)
            try:
                manifest = location.commit(operator, partition, batch_id)
            except RelstateError as exc:
                rows.append(_unread(operator, partition, batch_id, kept, str(exc)))
                continue
            if manifest is None:
                continue
            size = sum(f.size for f in manifest.files())
            snapshot = None if manifest.snapshot is None else manifest.snapshot.commit.version
            for meta in manifest.tables:
                rows.append(
                    (
                        operator,
                        partition,
                        meta.name,
                        meta.table_id,
                        meta.layout,
                        ", ".join(f"{f.name} {f.type}" for f in meta.columns),
                        ", ".join(f"{n} {d}" for n, d, _ in meta.key_columns),
                        manifest.partition_count,
                        manifest.version,
                        manifest.commit_id,
                        kept,
                        snapshot,
                        len(manifest.changelogs),
                        size,
                        manifest.metrics.get("numTotalStateRows"),
                        manifest.table_rows.get(meta.name),
                        READ,
                    )
                )
    return _table(rows, METADATA_SCHEMA)


def _unread(
    operator: str, partition: int, batch_id: int | None, kept: list[int], why: str
) -> tuple[Any, ...]:
    """The metadata row of a partition whose commit could not be read."""
    row: list[Any] = [None] * len(METADATA_SCHEMA)
    names = METADATA_SCHEMA.names
    for name, value in (
        ("operator", operator),
        ("partition", partition),
        ("batch_id", batch_id),
        ("kept_versions", kept),
        ("status", why),
    ):
        row[names.index(name)] = value
    return tuple(row)
