"""``relstate repartition``: rewrite a stopped query's state for a new
partition count.

The runner puts a key's rows in partition ``pmod(F.hash(key columns), n)``
(:mod:`operators._spark_hash`). Each table declares, and its manifest records,
how its rows map to the query's key (:data:`encoding.PartitionBy`): by its
leading primary-key columns (the default), by other named columns (an index
keyed by time first), or not at all (:class:`encoding.PartitionLocal`: a
partition's own bookkeeping, which every new partition gets the least of, or
which must be empty). Every keyed row moves to the partition of its key, and
is checked on the way to be in the partition of that key now. A
``run_stages`` pipeline (the FK join) moves each stage's state by that
stage's own key. This covers queries whose manifests record the placement
(written by this relstate or later), and no pending timers.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from encoding import PartitionLocal
from operators._sinks import write_atomically
from operators._spark_hash import spark_partition, supported
from operators._state_location import RUNNER, StateLocation, table_schema
from operators._state_read import read_rows
from operators._task import TIMERS
from operators.errors import InputError
from statestore import StateStore, StoreConfig
from statestore._metadata import TableMeta

__all__ = ["RepartitionResult", "repartition"]

#: The steps of the swap, in order; the journal names the last one done.
_STAGED, _KEPT, _CLEARED, _INSTALLED = "staged", "kept", "cleared", "installed"

Row = tuple[Any, ...]


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


def _rows(table: pa.Table) -> list[Row]:
    columns = [c.to_pylist() for c in table.columns]
    return list(zip(*columns, strict=True)) if columns else []


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


def _stage_keys(
    location: StateLocation, query: dict[str, Any], record: dict[str, Any]
) -> dict[str, list[str]]:
    """The operators whose state moves, each with the Spark types of the key
    its rows are partitioned by: ``run_operator``'s one operator, or each
    stage of a ``run_stages`` pipeline (the query records one key per stage,
    in the order of the stages its name joins with ``+``)."""
    stage_winners = record.get("stage_winners") or {}
    if not stage_winners:
        return {location.operator(query["operator"]): list(query["key_types"][0])}
    names = str(query["operator"]).split("+")
    if len(names) != len(query["key_types"]) or sorted(names) != sorted(stage_winners):
        raise InputError(
            f"the state at {location.path} is a pipeline whose stages {sorted(stage_winners)} "
            f"do not match its query record ({query['operator']!r}, key types "
            f"{query['key_types']}), so relstate cannot tell each stage's key"
        )
    return {name: list(types) for name, types in zip(names, query["key_types"], strict=True)}


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
    record_path = posixpath.join(root, RUNNER, "batches", f"{batch:020d}.json")
    record = _read_json(fs, record_path)
    stage_keys = _stage_keys(location, query, record)
    old = int(query["partitions"])
    if old == partitions:
        raise InputError(f"the state at {location.path} has {old} partitions already")
    # Check every operator's tables before anything is written.
    placements = {}
    for operator, key_types in stage_keys.items():
        metas = location.tables(operator, batch)
        placements[operator] = (metas, _placements(metas, key_types))
    if _exists(fs, staging):
        fs.delete_dir(staging)  # an earlier run's, never swapped in (no journal)
    pipeline = bool(record.get("stage_winners"))
    rows: dict[str, int] = {}
    for operator, (metas, placement) in placements.items():
        winners, moved = _move_operator(
            location, staging, operator, metas, placement, batch, old, partitions, progress
        )
        rows.update({f"{operator}.{t}" if pipeline else t: n for t, n in moved.items()})
        if pipeline:
            record["stage_winners"][operator] = winners
        else:
            record["winners"] = winners
    # The new partitions' first version: a change feed must not start before it.
    record["repartitioned"] = {"from": old, "to": partitions}
    runner = posixpath.join(staging, RUNNER)
    _write_json(fs, posixpath.join(runner, "batches", f"{batch:020d}.json"), record)
    _write_json(fs, posixpath.join(runner, "query.json"), {**query, "partitions": partitions})
    summary = {
        "operator": str(query["operator"]),
        "batch_id": batch,
        "old_partitions": old,
        "new_partitions": partitions,
        "rows": rows,
        "backup": _backup_name(fs, root, batch, old, partitions),
        "root": root,
        "staging": staging,
        "step": _STAGED,
    }
    # From here on the new state is complete and the swap is decided.
    _write_json(fs, journal, summary)
    return _swap(fs, root, summary)


def _move_operator(
    location: StateLocation,
    staging: str,
    operator: str,
    metas: list[TableMeta],
    placements: dict[str, Placement],
    batch: int,
    old: int,
    partitions: int,
    progress: Callable[[str], None],
) -> tuple[dict[str, str], dict[str, int]]:
    """Write ``operator``'s state at ``batch`` under ``staging`` for
    ``partitions`` partitions, each new partition committed as ``batch``;
    return the new winners and the rows moved per table."""
    local = tempfile.mkdtemp(prefix="relstate-repartition-")
    rows = {m.name: 0 for m in metas if m.name != TIMERS.name}
    try:
        stores = [
            StateStore(
                staging,
                operator,
                q,
                [table_schema(m) for m in metas],
                StoreConfig(local_dir=local, partition_count=partitions),
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
                moved = _move_partition(
                    location, operator, metas, placements, p, old, partitions, batch
                )
                for meta in metas:
                    keyed, own = moved[meta.name]
                    for q, row in keyed:
                        stores[q].table(meta.name).insert(row)
                    if meta.name in rows:
                        rows[meta.name] += len(keyed)
                    if own:
                        _keep_least(least.setdefault(meta.name, {}), own, meta, placements)
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


def _move_partition(
    location: StateLocation,
    operator: str,
    metas: list[TableMeta],
    placements: dict[str, Placement],
    partition: int,
    old: int,
    new: int,
    batch: int,
) -> dict[str, tuple[list[tuple[int, Row]], list[Row]]]:
    """One old partition's rows, per table: each keyed row with its new
    partition, and the partition-local rows."""
    out: dict[str, tuple[list[tuple[int, Row]], list[Row]]] = {}
    for meta in metas:
        table = read_rows(location, operator, meta, partition, batch)
        placement = placements[meta.name]
        if isinstance(placement, PartitionLocal):
            if placement.least is None and table.num_rows:
                hint = (
                    " Let the timers fire (advance the watermark) before repartitioning"
                    if meta.name == TIMERS.name
                    else ""
                )
                raise InputError(
                    f"partition {partition} has {table.num_rows} row(s) in table "
                    f"{meta.name!r} (for timers: pending timers), which belong to no key of "
                    "the query and have no rule to move them, so relstate cannot tell which "
                    f"new partition they belong to.{hint}"
                )
            out[meta.name] = ([], _rows(table))
            continue
        types = [meta.columns.field(i).type for i in placement]
        keyed = []
        for row in _rows(table):
            key = [row[i] for i in placement]
            if spark_partition(key, types, old) != partition:
                names = [meta.columns.field(i).name for i in placement]
                raise InputError(
                    f"a row of table {meta.name!r} with key {key} (columns {names}) is in "
                    f"partition {partition}, but the runner puts that key in partition "
                    f"{spark_partition(key, types, old)}: the table is not partitioned by "
                    "the columns it declares, so it cannot be repartitioned"
                )
            keyed.append((spark_partition(key, types, new), row))
        out[meta.name] = (keyed, [])
    return out


def _keep_least(
    kept: dict[Row, Row], rows: list[Row], meta: TableMeta, placements: dict[str, Placement]
) -> None:
    """Fold a partition's own rows into ``kept``: per primary key, the row
    with the least value of the table's ``least`` column."""
    rule = placements[meta.name]
    assert isinstance(rule, PartitionLocal) and rule.least is not None
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
    )
