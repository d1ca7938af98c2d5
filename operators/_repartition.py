"""``relstate repartition``: rewrite a stopped query's state for a new
partition count.

The runner puts a key's rows in partition ``pmod(F.hash(key columns), n)``
(:mod:`operators._spark_hash`). Every table of an operator is partitioned by its
*leading primary-key columns*, as many as the query has key columns: that is
the convention the runner's operators keep (a row lives in the task of its key,
and its primary key starts with that key), and this command checks it on every
row it moves. The timer table's keys are the operator's own strings, so a query
with pending timers cannot be repartitioned (the command says so).

The new state is written beside the old one, complete, with the runner's
records of the last committed batch naming the new commits; then the old
state moves aside (kept as ``<state>.before-repartition-<batch>``) and the new
one takes its place. Run it again after a crash: it finishes the move.
"""

from __future__ import annotations

import json
import posixpath
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from operators._spark_hash import spark_partition, supported
from operators._state_location import RUNNER, StateLocation, table_schema
from operators._state_read import read_rows
from operators._task import TIMERS
from operators.errors import InputError
from statestore import StateStore, StoreConfig
from statestore._metadata import TableMeta

__all__ = ["RepartitionResult", "repartition"]

_DONE = "_REPARTITION_DONE"


@dataclass(frozen=True)
class RepartitionResult:
    """What a repartition did."""

    operator: str
    batch_id: int
    old_partitions: int
    new_partitions: int
    rows: dict[str, int]
    backup: str


def _spark_type(dtype: pa.DataType) -> str:
    from pyspark.sql.pandas.types import from_arrow_type

    return str(from_arrow_type(dtype).simpleString())


def _partition_keys(metas: list[TableMeta], key_types: list[str]) -> dict[str, list[int]]:
    """Per table, the positions of its partition-key columns; an error when a
    table's leading key columns do not have the query's key types."""
    out: dict[str, list[int]] = {}
    k = len(key_types)
    for meta in metas:
        if meta.name == TIMERS.name:
            continue
        names = [n for n, _, _ in meta.key_columns[:k]]
        types = [meta.columns.field(n).type for n in names]
        if len(names) < k or [_spark_type(t) for t in types] != key_types:
            raise InputError(
                f"table {meta.name!r} cannot be repartitioned: its leading primary-key "
                f"columns {names} ({[str(t) for t in types]}) are not the query's "
                f"{k} key column(s) of Spark types {key_types}; relstate partitions every "
                "table by the leading primary-key columns that hold the query's key"
            )
        unsupported = [str(t) for t in types if not supported(t)]
        if unsupported:
            raise InputError(
                f"table {meta.name!r}: relstate cannot compute Spark's hash of key "
                f"type(s) {unsupported}, so it cannot repartition this state"
            )
        out[meta.name] = [meta.columns.get_field_index(n) for n in names]
    return out


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    columns = [c.to_pylist() for c in table.columns]
    return list(zip(*columns, strict=True)) if columns else []


def _move(fs: pafs.FileSystem, src: str, dst: str) -> None:
    """Move a directory tree: a rename where the filesystem has one, else a
    copy and a delete (object stores)."""
    if fs.get_file_info(dst).type != pafs.FileType.NotFound:
        fs.delete_dir(dst)
    if isinstance(fs, pafs.LocalFileSystem):
        fs.move(src, dst)
        return
    pafs.copy_files(src, dst, source_filesystem=fs, destination_filesystem=fs)
    fs.delete_dir(src)


def _write_json(fs: pafs.FileSystem, path: str, obj: Any) -> None:
    fs.create_dir(posixpath.dirname(path), recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(obj, sort_keys=True).encode())


def _read_json(fs: pafs.FileSystem, path: str) -> Any:
    with fs.open_input_stream(path) as src:
        return json.loads(src.read())


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    found: bool = fs.get_file_info(path).type != pafs.FileType.NotFound
    return found


def repartition(
    path: str,
    partitions: int,
    options: dict[str, str] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> RepartitionResult:
    """Rewrite the state of the stopped query at ``path`` (its checkpoint or
    state location) for ``partitions`` partitions. The query must not run."""
    if not isinstance(partitions, int) or partitions < 1:
        raise InputError(f"--partitions must be a positive integer, got {partitions!r}")
    fs, root = StateLocation.resolve_root(path, options)
    staging = f"{root}.repartition"
    if not _exists(fs, root) and _exists(fs, posixpath.join(staging, _DONE)):
        progress("finishing an interrupted repartition")
        return _swap(fs, root, staging, _read_json(fs, posixpath.join(staging, _DONE)))
    location = StateLocation(path, options)
    root = location.root
    staging = f"{root}.repartition"
    query = location.query()
    batch = location.latest_batch()
    if query is None or batch is None:
        raise InputError(
            f"the state at {path} has no committed batch recorded by the runner; there is "
            "nothing to repartition"
        )
    operator = location.operator(query["operator"])
    old = int(query["partitions"])
    if old == partitions:
        raise InputError(f"the state at {path} has {old} partitions already")
    metas = location.tables(operator, batch)
    keys = _partition_keys(metas, list(query["key_types"][0]))
    if _exists(fs, staging):
        fs.delete_dir(staging)
    local = tempfile.mkdtemp(prefix="relstate-repartition-")
    rows = dict.fromkeys(keys, 0)
    try:
        stores = [
            StateStore(
                staging,
                operator,
                q,
                [table_schema(m) for m in metas],
                StoreConfig(local_dir=local, partition_count=partitions),
                filesystem=fs,
            )
            for q in range(partitions)
        ]
        try:
            for store in stores:
                store.load(None)
            for p in location.partitions(operator):
                progress(f"reading partition {p}")
                _move_partition(location, operator, metas, keys, p, old, batch, stores, rows)
            winners = {}
            for q, store in enumerate(stores):
                info = store.commit(batch)
                store.record_winner(batch, info.commit_id)
                winners[str(q)] = info.commit_id
        finally:
            for store in stores:
                store.close()
    finally:
        shutil.rmtree(local, ignore_errors=True)
    record = _read_json(fs, posixpath.join(root, RUNNER, "batches", f"{batch:020d}.json"))
    record["winners"] = winners
    runner = posixpath.join(staging, RUNNER)
    _write_json(fs, posixpath.join(runner, "batches", f"{batch:020d}.json"), record)
    _write_json(fs, posixpath.join(runner, "query.json"), {**query, "partitions": partitions})
    summary = {
        "operator": operator,
        "batch_id": batch,
        "old_partitions": old,
        "new_partitions": partitions,
        "rows": rows,
        "backup": f"{root}.before-repartition-{batch}",
    }
    _write_json(fs, posixpath.join(staging, _DONE), summary)
    return _swap(fs, root, staging, summary)


def _move_partition(
    location: StateLocation,
    operator: str,
    metas: list[TableMeta],
    keys: dict[str, list[int]],
    partition: int,
    old: int,
    batch: int,
    stores: list[StateStore],
    rows: dict[str, int],
) -> None:
    """Insert one old partition's rows into the new stores of their keys."""
    for meta in metas:
        table = read_rows(location, operator, meta, partition, batch)
        if meta.name == TIMERS.name:
            if table.num_rows:
                raise InputError(
                    f"partition {partition} has {table.num_rows} pending timer(s); a "
                    "timer's key is the operator's own string, so relstate cannot tell "
                    "which partition it belongs to. Let the timers fire (advance the "
                    "watermark) before repartitioning"
                )
            continue
        index = keys[meta.name]
        types = [meta.columns.field(i).type for i in index]
        for row in _rows(table):
            key = [row[i] for i in index]
            if spark_partition(key, types, old) != partition:
                raise InputError(
                    f"a row of table {meta.name!r} with key {key} is in partition "
                    f"{partition}, but the runner puts that key in partition "
                    f"{spark_partition(key, types, old)}: the table is not partitioned "
                    "by its leading primary-key columns, so it cannot be repartitioned"
                )
            q = spark_partition(key, types, len(stores))
            stores[q].table(meta.name).insert(row)
            rows[meta.name] += 1


def _swap(
    fs: pafs.FileSystem, root: str, staging: str, summary: dict[str, Any]
) -> RepartitionResult:
    """Move the old state aside and the new state into its place."""
    backup = str(summary["backup"])
    if _exists(fs, root):
        _move(fs, root, backup)
    _move(fs, staging, root)
    fs.delete_file(posixpath.join(root, _DONE))
    return RepartitionResult(
        operator=str(summary["operator"]),
        batch_id=int(summary["batch_id"]),
        old_partitions=int(summary["old_partitions"]),
        new_partitions=int(summary["new_partitions"]),
        rows={str(k): int(v) for k, v in summary["rows"].items()},
        backup=backup,
    )
