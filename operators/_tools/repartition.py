"""``relstate repartition``: rewrite a stopped query's state for a new
partition count.

The runner puts a key's rows in partition ``pmod(F.hash(key columns), n)``
(:mod:`operators._engine.spark_hash`). Each table declares, and its manifest records,
how its rows map to the query's key (:data:`encoding.PartitionBy`): by its
leading primary-key columns (the default), by other named columns (an index
keyed by time first), or not at all (:class:`encoding.PartitionLocal`: a
partition's own bookkeeping, which every new partition gets the least of, or
which must be empty). Every keyed row moves to the partition of its key, and
is checked on the way to be in the partition of that key now. A pipeline
moves each stage's state by that stage's own key; a keyless stage
(``keys=()``) runs as one partition whatever the query's count, so its state
is carried over as it is. This covers queries whose manifests record the
placement (written by this relstate or later), and no pending timers.

The new state is written beside the old one, complete, with the runner's
records of the last committed batch naming the new commits; then a journal
beside the state (``<state>.repartition.json``) records each step of the swap
before the next: the old state is kept as
``<state>.before-repartition-<batch>-<old>-to-<new>`` (a name no earlier
backup has), then the new state takes its place. On an object store a move
is a copy and a delete, so each step is one that can run again. Run the
command again after a crash at any point: it finishes the swap.
"""

from __future__ import annotations

import json
import posixpath
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from encoding import PartitionLocal, Row
from operators._checkpoint.journal import Journal, QueryShape
from operators._checkpoint.location import StateLocation, table_schema
from operators._checkpoint.read import scan_chunks
from operators._engine.spark_hash import spark_hash, supported
from operators._engine.task import TIMERS
from operators.errors import InputError
from statestore import StateStore, StoreConfig, TableMeta, write_atomically

__all__ = ["RepartitionResult", "repartition"]

#: The steps of the swap, in order; the journal names the last one done.
_STAGED, _KEPT, _CLEARED, _INSTALLED = "staged", "kept", "cleared", "installed"


@dataclass(frozen=True)
class RepartitionResult:
    """What a repartition did."""

    operator: str
    batch_id: int
    old_partitions: int
    new_partitions: int
    rows: dict[str, int]
    backup: str
    #: The keyless stages: one partition each, carried over as they were.
    keyless: tuple[str, ...] = ()


def _spark_type(dtype: pa.DataType) -> str:
    from pyspark.sql.pandas.types import from_arrow_type

    return str(from_arrow_type(dtype).simpleString())


#: Per table: the positions of the columns that hold the query's key, or
#: its :class:`PartitionLocal` rule.
Placement = list[int] | PartitionLocal


def _placements(metas: list[TableMeta], key_types: list[str]) -> dict[str, Placement]:
    """How each table's rows move; an error for a table whose declared key
    columns do not have the query's key types."""
    out: dict[str, Placement] = {}
    k = len(key_types)
    for meta in metas:
        if not meta.partition_recorded:
            raise InputError(
                f"table {meta.name!r}: its manifest was written by a relstate that did not "
                "record which columns hold the query's key, so its rows cannot be placed. "
                "Run the query for one batch with this relstate (which records it), stop "
                "it, and repartition then"
            )
        by = meta.partition_by
        if isinstance(by, PartitionLocal):
            out[meta.name] = by
            continue
        declared = [n for n, _, _ in meta.key_columns] if by is None else list(by)
        where = "leading primary-key columns" if by is None else "partition_by columns"
        names = declared[:k]
        types = [meta.columns.field(n).type for n in names]
        if len(names) < k or [_spark_type(t) for t in types] != key_types:
            raise InputError(
                f"table {meta.name!r} cannot be repartitioned: its {where} {names} "
                f"({[str(t) for t in types]}) are not the query's {k} key column(s) of "
                f"Spark types {key_types}; a table's rows must be keyed by the columns the "
                "runner partitions them by"
            )
        unsupported = [str(t) for t in types if not supported(t)]
        if unsupported:
            raise InputError(
                f"table {meta.name!r}: relstate cannot compute Spark's hash of key "
                f"type(s) {unsupported}, so it cannot repartition this state"
            )
        out[meta.name] = [meta.columns.get_field_index(n) for n in names]
    return out


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    found: bool = fs.get_file_info(path).type != pafs.FileType.NotFound
    return found


def _write_json(fs: pafs.FileSystem, path: str, obj: Any) -> None:
    fs.create_dir(posixpath.dirname(path), recursive=True)
    write_atomically(fs, path, json.dumps(obj, sort_keys=True).encode())


def _read_json(fs: pafs.FileSystem, path: str) -> Any:
    with fs.open_input_stream(path) as src:
        return json.loads(src.read())


def _backup_name(fs: pafs.FileSystem, root: str, batch: int, old: int, new: int) -> str:
    """A backup directory no earlier repartition used."""
    base = f"{root}.before-repartition-{batch}-{old}-to-{new}"
    name, n = base, 1
    while _exists(fs, name):
        n += 1
        name = f"{base}-{n}"
    return name


def _stage_keys(location: StateLocation, query: QueryShape) -> dict[str, list[str]]:
    """Every stage, each with the Spark types of the key its rows are
    partitioned by (none for a keyless stage, whose one partition is carried
    over as it is); an error when no stage has a key."""
    for stage in query.stages:
        location.operator(stage.name)  # held here, or a clear error
    if all(s.keyless for s in query.stages):
        raise InputError(
            f"every stage of the query at {location.path} ({query.names}) is keyless: each "
            "runs as one partition whatever the query's partition count, so there is "
            "nothing to repartition"
        )
    return {s.name: list(s.key_types) for s in query.stages}


#: Rows read, and held by each new store before it spills, at a time.
CHUNK_ROWS = 100_000


def repartition(
    path: str,
    partitions: int,
    options: dict[str, str] | None = None,
    progress: Callable[[str], None] = lambda _: None,
    force: bool = False,
    chunk_rows: int = CHUNK_ROWS,
) -> RepartitionResult:
    """Rewrite the state of the stopped query at ``path`` (its checkpoint or
    state location) for ``partitions`` partitions. The query must not run:
    a partition with a version newer than the last committed batch (an
    attempt in flight, or left by a failed batch) is refused unless
    ``force``."""
    if not isinstance(partitions, int) or partitions < 1:
        raise InputError(f"--partitions must be a positive integer, got {partitions!r}")
    fs, root = StateLocation.resolve_root(path, options)
    journal = f"{root}.repartition.json"
    if _exists(fs, journal):
        progress("finishing an interrupted repartition")
        return _swap(fs, root, _read_json(fs, journal))
    location = StateLocation(path, options)
    root = location.root
    staging = f"{root}.repartition"
    query = location.query()
    batch = location.latest_batch()
    if query is None or batch is None:
        raise InputError(
            f"the state at {location.path} has no committed batch recorded by the runner; there is "
            "nothing to repartition"
        )
    record = location.record(batch)
    assert record is not None
    stage_keys = _stage_keys(location, query)
    old = query.partitions
    if old == partitions:
        raise InputError(f"the state at {location.path} has {old} partitions already")
    # Check every operator's tables before anything is written.
    placements = {}
    for operator, key_types in stage_keys.items():
        if not force:
            _check_stopped(location, operator, batch)
        metas = location.tables(operator, batch)
        placements[operator] = (metas, _placements(metas, key_types) if key_types else None)
    if _exists(fs, staging):
        fs.delete_dir(staging)  # an earlier run's, never swapped in (no journal)
    pipeline = len(stage_keys) > 1
    rows: dict[str, int] = {}
    winners_by_stage: dict[str, dict[int, str]] = {}
    keyless = tuple(name for name, (_, placement) in placements.items() if placement is None)
    for operator, (metas, placement) in placements.items():
        if placement is None:
            progress(f"{operator} has no key: its one partition is carried over as it is")
        winners, moved = _move_operator(
            location,
            staging,
            operator,
            metas,
            placement,
            batch,
            old if placement is not None else 1,
            partitions if placement is not None else 1,
            progress,
            chunk_rows,
        )
        rows.update({f"{operator}.{t}" if pipeline else t: n for t, n in moved.items()})
        winners_by_stage[operator] = {int(p): c for p, c in winners.items()}
    # The new partitions' first version: a change feed must not start before it.
    records = Journal(fs, staging)
    records.write(replace(record, winners=winners_by_stage, repartitioned=(old, partitions)))
    records.write_shape(replace(query, partitions=partitions))
    summary = {
        "operator": "+".join(query.names),
        "batch_id": batch,
        "old_partitions": old,
        "new_partitions": partitions,
        "rows": rows,
        "backup": _backup_name(fs, root, batch, old, partitions),
        "keyless": list(keyless),
        "root": root,
        "staging": staging,
        "step": _STAGED,
    }
    # From here on the new state is complete and the swap is decided.
    _write_json(fs, journal, summary)
    return _swap(fs, root, summary)


def _check_stopped(location: StateLocation, operator: str, batch: int) -> None:
    """Refuse when a partition has a version after ``batch``, the last one
    the runner recorded: a task of the next batch committed (the query runs,
    or its last batch failed), and the state would move under it."""
    for p in location.partitions(operator):
        newer = [v for v in location.checkpoint(operator, p).versions() if v > batch]
        if newer:
            raise InputError(
                f"partition {p} of operator {operator!r} at {location.path} has version(s) "
                f"{newer} after batch {batch}, the last one the runner recorded: a batch is "
                "running (stop the query first) or failed after a task committed. If the "
                "query is stopped, run again with --force: the last recorded batch is "
                "repartitioned and the unrecorded attempts stay in the backup only"
            )


def _move_operator(
    location: StateLocation,
    staging: str,
    operator: str,
    metas: list[TableMeta],
    placements: dict[str, Placement] | None,
    batch: int,
    old: int,
    partitions: int,
    progress: Callable[[str], None],
    chunk_rows: int,
) -> tuple[dict[str, str], dict[str, int]]:
    """Write ``operator``'s state at ``batch`` under ``staging`` for
    ``partitions`` partitions, each new partition committed as ``batch``;
    return the new winners and the rows moved per table. ``placements``
    ``None``: a keyless stage, whose one partition's rows (timers and
    partition-local rows too) are written as they are into one new
    partition.

    Rows stream through in chunks of ``chunk_rows``: each old partition is
    read chunk by chunk, and each new store spills its MemTable into its
    local database at ``chunk_rows`` keys, so memory holds a chunk and a
    MemTable per new partition, never a whole state. Only the
    partition-local rows (a few per partition) are gathered in memory."""
    local = tempfile.mkdtemp(prefix="relstate-repartition-")
    rows = {m.name: 0 for m in metas if m.name != TIMERS.name}
    config = StoreConfig(local_dir=local, partition_count=partitions, spill_rows=chunk_rows)
    try:
        stores = [
            StateStore(
                staging,
                operator,
                q,
                [table_schema(m) for m in metas],
                config,
                filesystem=location.fs,
            )
            for q in range(partitions)
        ]
        try:
            for store in stores:
                store.load(None)
            least: dict[str, dict[Row, Row]] = {}
            for p in location.partitions(operator):
                progress(f"reading {operator} partition {p}")
                for meta, chunk in scan_chunks(location, operator, p, batch, chunk_rows):
                    if placements is None:
                        for row in chunk:
                            stores[0].table(meta.name).insert(row)
                        if meta.name in rows:
                            rows[meta.name] += len(chunk)
                        continue
                    placement = placements[meta.name]
                    if isinstance(placement, PartitionLocal):
                        _check_local(meta, placement, p, chunk)
                        _keep_least(least.setdefault(meta.name, {}), chunk, meta, placement)
                        continue
                    for q, row in _placed(meta, placement, p, chunk, old, partitions):
                        stores[q].table(meta.name).insert(row)
                    if meta.name in rows:
                        rows[meta.name] += len(chunk)
            for name, kept in least.items():
                for store in stores:
                    for row in kept.values():
                        store.table(name).insert(row)
                rows[name] = len(kept) * partitions
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
    return winners, rows


def _check_local(
    meta: TableMeta, placement: PartitionLocal, partition: int, rows: list[Row]
) -> None:
    """Refuse partition-local rows that have no rule to move them (``rows``
    is a chunk of :func:`scan_chunks`, never empty)."""
    if placement.least is not None:
        return
    hint = (
        " Let the timers fire (advance the watermark) before repartitioning"
        if meta.name == TIMERS.name
        else ""
    )
    raise InputError(
        f"partition {partition} has row(s) in table {meta.name!r} (for timers: pending "
        "timers), which belong to no key of the query and have no rule to move them, so "
        f"relstate cannot tell which new partition they belong to.{hint}"
    )


def _placed(
    meta: TableMeta, placement: list[int], partition: int, rows: list[Row], old: int, new: int
) -> Iterator[tuple[int, Row]]:
    """Each keyed row of old ``partition`` with its new partition; an error
    for a row whose key the runner would not have put in ``partition``."""
    types = [meta.columns.field(i).type for i in placement]
    for row in rows:
        key = [row[i] for i in placement]
        h = spark_hash(key, types)  # spark_partition(key, types, n) is h % n
        if h % old != partition:
            names = [meta.columns.field(i).name for i in placement]
            raise InputError(
                f"a row of table {meta.name!r} with key {key} (columns {names}) is in "
                f"partition {partition}, but the runner puts that key in partition {h % old}: "
                "the table is not partitioned by the columns it declares, so it cannot be "
                "repartitioned"
            )
        yield h % new, row


def _keep_least(
    kept: dict[Row, Row], rows: list[Row], meta: TableMeta, rule: PartitionLocal
) -> None:
    """Fold a partition's own rows into ``kept``: per primary key, the row
    with the least value of the table's ``least`` column."""
    assert rule.least is not None  # _check_local refused the rows otherwise
    at = meta.columns.get_field_index(rule.least)
    keys = [meta.columns.get_field_index(n) for n, _, _ in meta.key_columns]
    for row in rows:
        pk = tuple(row[i] for i in keys)
        if pk not in kept or row[at] < kept[pk][at]:
            kept[pk] = row


def _put(fs: pafs.FileSystem, src: str, dst: str) -> None:
    """Make ``dst`` hold the tree at ``src``: a rename on a local filesystem
    (atomic; ``src`` gone means it was done), else a copy; either can run
    again. On an object store ``src`` stays until its own step deletes it."""
    if not isinstance(fs, pafs.LocalFileSystem):
        _copy_tree(fs, src, dst)
    elif _exists(fs, src):
        fs.move(src, dst)


def _copy_tree(fs: pafs.FileSystem, src: str, dst: str) -> None:
    """Copy a directory tree; a partial copy an interrupted run left at
    ``dst`` (a name only this repartition uses) is replaced."""
    if _exists(fs, dst):
        fs.delete_dir(dst)
    pafs.copy_files(src, dst, source_filesystem=fs, destination_filesystem=fs)


def _step(fs: pafs.FileSystem, journal: str, summary: dict[str, Any], step: str) -> None:
    summary["step"] = step
    _write_json(fs, journal, summary)


def _swap(fs: pafs.FileSystem, root: str, summary: dict[str, Any]) -> RepartitionResult:
    """Keep the old state as the backup and put the new state in its place,
    each step recorded in the journal before the next starts, so that a run
    after a crash at any point carries on from the last step done. A local
    filesystem renames (atomic); an object store copies, then deletes."""
    root = str(summary.get("root", root))
    staging, backup = str(summary["staging"]), str(summary["backup"])
    journal = f"{root}.repartition.json"
    step = summary["step"]
    if step == _STAGED:
        _put(fs, root, backup)
        _step(fs, journal, summary, step := _KEPT)
    if step == _KEPT:
        if _exists(fs, root):
            fs.delete_dir(root)
        _step(fs, journal, summary, step := _CLEARED)
    if step == _CLEARED:
        _put(fs, staging, root)
        _step(fs, journal, summary, step := _INSTALLED)
    if step == _INSTALLED:
        if _exists(fs, staging):
            fs.delete_dir(staging)
        fs.delete_file(journal)
    return RepartitionResult(
        operator=str(summary["operator"]),
        batch_id=int(summary["batch_id"]),
        old_partitions=int(summary["old_partitions"]),
        new_partitions=int(summary["new_partitions"]),
        rows={str(k): int(v) for k, v in summary["rows"].items()},
        backup=backup,
        keyless=tuple(str(n) for n in summary.get("keyless", ())),
    )
