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
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from operators._state_location import StateLocation, table_schema
from operators.errors import InputError
from statestore import StateStore, StoreConfig
from statestore._manifest import Manifest
from statestore._metadata import TableMeta

__all__ = [
    "CHANGE_COLUMNS",
    "CHANGE_TYPES",
    "METADATA_SCHEMA",
    "change_schema",
    "metadata",
    "read_changes",
    "read_rows",
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
    ]
)


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


def _load(store: StateStore, manifest: Manifest | None, name: str) -> list[tuple[Any, ...]]:
    if manifest is None:
        return []
    store.load(manifest.version, manifest.commit_id)
    return [tuple(row) for row in store.table(name).scan()]


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
    row before and after) or ``delete`` (the row before). Found by comparing
    each batch's state with the one before, so it needs ``start - 1`` kept
    (or ``start`` to be the partition's first version)."""
    if end is None:
        end = location.latest_batch()
    kept = location.kept_batches(operator, partition)
    if end is None:
        end = kept[-1] if kept else start
    if start > end:
        raise InputError(f"the change feed needs startBatchId <= endBatchId; got {start}..{end}")
    versions = [v for v in kept if start <= v <= end]
    earlier = [v for v in kept if v < start]
    out: list[tuple[Any, ...]] = []
    if not versions:
        return _table(out, change_schema(meta))
    newest = location.commit(operator, partition, versions[-1])
    with _reader(location, operator, partition, () if newest is None else newest.tables) as store:
        before_manifest = None
        if earlier:
            before_manifest = location.commit(operator, partition, earlier[-1])
        else:
            first = location.commit(operator, partition, versions[0])
            if first is not None and first.parent is not None:
                raise InputError(
                    f"the change feed from batch {start} needs the state of the batch "
                    f"before it, which is no longer kept (partition {partition} keeps "
                    f"{kept[0]}..{kept[-1]}); start at {kept[0] + 1} or later"
                )
        before = _keyed(_load(store, before_manifest, meta.name), meta)
        for version in versions:
            manifest = location.commit(operator, partition, version)
            after = _keyed(_load(store, manifest, meta.name), meta)
            out.extend(_diff(version, partition, before, after))
            before = after
    return _table(out, change_schema(meta))


def _keyed(rows: list[tuple[Any, ...]], meta: TableMeta) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    index = [meta.columns.get_field_index(n) for n, _, _ in meta.key_columns]
    return {tuple(row[i] for i in index): row for row in rows}


def _diff(
    version: int,
    partition: int,
    before: dict[tuple[Any, ...], tuple[Any, ...]],
    after: dict[tuple[Any, ...], tuple[Any, ...]],
) -> Iterator[tuple[Any, ...]]:
    for key, row in after.items():
        old = before.get(key)
        if old is None:
            yield (version, "insert", partition, *row)
        elif old != row:
            yield (version, "update_preimage", partition, *old)
            yield (version, "update_postimage", partition, *row)
    for key, old in before.items():
        if key not in after:
            yield (version, "delete", partition, *old)


def metadata(location: StateLocation, batch_id: int | None = None) -> pa.Table:
    """One row per operator, partition and table at ``batch_id`` (default: the
    latest committed): schema, partition count, the commit read, the kept
    versions, the snapshot and changelog chain, bytes and rows of the
    partition's state."""
    rows: list[tuple[Any, ...]] = []
    for operator in location.operators():
        for partition in location.partitions(operator):
            manifest = location.commit(operator, partition, batch_id)
            if manifest is None:
                continue
            kept = location.kept_batches(operator, partition)
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
                    )
                )
    return _table(rows, METADATA_SCHEMA)
