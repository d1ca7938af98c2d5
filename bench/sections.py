"""The benchmark's three comparisons, each on one data set, side by side."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from bench.config import BenchConfig
from bench.data import (
    epochs,
    key_samples,
    make_batch,
    prefix_samples,
    rows_of,
    table_schema,
)
from bench.measure import CODECS, LAYOUTS, RAW, Figure, Round, interleave, per_op
from bench.workloads import (
    RawStore,
    get_each,
    get_many,
    insert_batch,
    insert_rows,
    scan_each,
)
from encoding import KeyCodec, RowCodec, TableSchema, ValueLayout
from statestore import ConsistencyMode, RocksDBBackend, StateTable

__all__ = ["Progress", "codecs", "layouts", "versus_raw"]

Progress = Callable[[str], None]
T = TypeVar("T")
WARMUP = 1
BATCH_INSERT = "insert_batch + commit"
ROW_INSERT = "insert per row + commit"
#: A point read is mostly RocksDB's own work, so StateTable must keep more of it.
GET_GOAL = 0.7


def _open(
    path: Path, schema: TableSchema, config: BenchConfig, mode: ConsistencyMode
) -> StateTable:
    return StateTable(schema, RocksDBBackend(path, config.rocksdb), mode)


def _close(table: StateTable) -> None:
    backend = table.backend
    backend.close()
    if isinstance(backend, RocksDBBackend):
        shutil.rmtree(backend.path, ignore_errors=True)


def _per_round(make: Callable[[], T], rounds: int) -> dict[int, T]:
    """A fresh sample for every round, the warm-up rounds included."""
    return {r: make() for r in range(-WARMUP, rounds)}


def _batch_writes(table: StateTable, parts: Sequence[pa.RecordBatch]) -> Round:
    return lambda r: per_op(lambda: insert_batch(table, parts[r], r + 1), parts[r].num_rows)


def _row_writes(table: StateTable, parts: Sequence[Sequence[tuple[Any, ...]]]) -> Round:
    return lambda r: per_op(lambda: insert_rows(table, parts[r], r + 1), len(parts[r]))


def _gets(table: StateTable, keys: dict[int, list[tuple[int, int]]]) -> Round:
    return lambda r: per_op(lambda: get_each(table, keys[r]), len(keys[r]))


def _scans(table: StateTable, prefixes: dict[int, list[tuple[int]]]) -> Round:
    return lambda r: per_op(lambda: scan_each(table, prefixes[r]), len(prefixes[r]))


def layouts(config: BenchConfig, workdir: Path, progress: Progress) -> list[Figure]:
    """Row layout vs cell layout: write + commit, point reads and prefix scans of
    whole rows, for each row width."""
    rng = np.random.default_rng(config.seed)
    figures = []
    for columns in config.widths:
        progress(f"row vs cell layout, {columns} columns")
        batch = make_batch(config.rows, columns, config.seed + columns)
        parts = epochs(batch, config.epochs)
        tables = {
            layout.value: _open(
                workdir / f"{layout.value}-{columns}",
                table_schema(columns, layout),
                config,
                ConsistencyMode.RELAXED,
            )
            for layout in (ValueLayout.ROW, ValueLayout.CELL)
        }
        try:
            writes = interleave({n: _batch_writes(t, parts) for n, t in tables.items()}, len(parts))
            keys = _per_round(
                lambda: key_samples(config.rows, config.reads_per_round, rng), config.rounds
            )
            reads = interleave(
                {n: _gets(t, keys) for n, t in tables.items()}, config.rounds, WARMUP
            )
            prefixes = _per_round(
                lambda: prefix_samples(config.rows, config.scans_per_round, rng), config.rounds
            )
            scans = interleave(
                {n: _scans(t, prefixes) for n, t in tables.items()}, config.rounds, WARMUP
            )
        finally:
            for table in tables.values():
                _close(table)
        detail = f"{columns} columns"
        for workload, unit, times in (
            ("write + commit", "row", writes),
            ("get_row", "read", reads),
            ("prefix scan", "scan", scans),
        ):
            figures.append(Figure.of(LAYOUTS, workload, detail, unit, times["row"], times["cell"]))
    return figures


#: What raw rocksdict does for each consistency mode and insert kind: the same
#: reads that the mode makes, so that the ratio is StateTable's own cost
#: (a ``RawStore`` method; the page's method text names them).
_RAW_INSERTS: dict[tuple[ConsistencyMode, str], str] = {
    (ConsistencyMode.STRICT, "batch"): "write_read_once",
    (ConsistencyMode.STRICT, "rows"): "put_each_read",
    (ConsistencyMode.RELAXED, "batch"): "write_read_once",
    (ConsistencyMode.RELAXED, "rows"): "write_read_once",
    (ConsistencyMode.UNCHECKED, "batch"): "write",
    (ConsistencyMode.UNCHECKED, "rows"): "write",
}


def versus_raw(config: BenchConfig, workdir: Path, progress: Progress) -> list[Figure]:
    """StateTable vs rocksdict given pre-encoded keys and values: inserts (batch
    and per row, in every consistency mode, against raw writes that read what
    the mode reads) + commit, point reads, multi-gets and prefix scans."""
    schema = table_schema(config.columns)
    raws = {
        method: RawStore(workdir / f"raw-{method}", config.rocksdb)
        for method in dict.fromkeys(_RAW_INSERTS.values())
    }
    try:
        progress(f"StateTable vs raw rocksdict, {config.columns} columns: writes")
        figures, reader = _raw_writes(config, workdir, schema, raws)
        try:
            progress(f"StateTable vs raw rocksdict, {config.columns} columns: reads")
            figures += _raw_reads(config, reader, raws["write"], KeyCodec(schema))
        finally:
            _close(reader)
    finally:
        for raw in raws.values():
            raw.close()
    return figures


def _raw_writes(
    config: BenchConfig, workdir: Path, schema: TableSchema, raws: dict[str, RawStore]
) -> tuple[list[Figure], StateTable]:
    """The write figures, and the relaxed batch-written table to read from."""
    batch = make_batch(config.rows, config.columns, config.seed)
    parts = epochs(batch, config.epochs)
    row_parts = [rows_of(part) for part in parts]
    key_codec, row_codec = KeyCodec(schema), RowCodec(schema)
    encoded = [(key_codec.encode_batch(p), row_codec.encode_batch(p)) for p in parts]
    tables: dict[str, StateTable] = {}

    def raw_work(method: str) -> Round:
        write = getattr(raws[method], method)
        return lambda r: per_op(lambda: write(*encoded[r]), parts[r].num_rows)

    works: dict[str, Round] = {f"raw-{m}": raw_work(m) for m in raws}
    names: dict[str, tuple[str, str, str]] = {}
    try:
        for mode in ConsistencyMode:
            for kind, workload in (("batch", BATCH_INSERT), ("rows", ROW_INSERT)):
                name = f"{kind}-{mode.value}"
                method = _RAW_INSERTS[mode, kind]
                names[name] = (workload, mode.value, f"raw-{method}")
                tables[name] = _open(workdir / name, schema, config, mode)
                if kind == "batch":
                    works[name] = _batch_writes(tables[name], parts)
                else:
                    works[name] = _row_writes(tables[name], row_parts)
        writes = interleave(works, len(parts))
    except BaseException:
        for table in tables.values():
            _close(table)
        raise
    reader = tables.pop(f"batch-{ConsistencyMode.RELAXED.value}")
    for table in tables.values():
        _close(table)
    figures = [
        Figure.of(RAW, workload, detail, "row", writes[name], writes[raw])
        for name, (workload, detail, raw) in names.items()
    ]
    return figures, reader


def _raw_reads(
    config: BenchConfig, table: StateTable, raw: RawStore, codec: KeyCodec
) -> list[Figure]:
    rng = np.random.default_rng(config.seed + 1)
    size = config.multi_get_size
    keys = _per_round(lambda: key_samples(config.rows, config.reads_per_round, rng), config.rounds)
    raw_keys = {r: [codec.encode(k) for k in ks] for r, ks in keys.items()}
    prefixes = _per_round(
        lambda: prefix_samples(config.rows, config.scans_per_round, rng), config.rounds
    )
    raw_prefixes = {r: [codec.encode(p) for p in ps] for r, ps in prefixes.items()}
    n_keys, n_scans = config.reads_per_round, config.scans_per_round
    gets = interleave(
        {
            "table": _gets(table, keys),
            "raw": lambda r: per_op(lambda: raw.get_each(raw_keys[r]), n_keys),
        },
        config.rounds,
        WARMUP,
    )
    multi = interleave(
        {
            "table": lambda r: per_op(lambda: get_many(table, keys[r], size), n_keys),
            "raw": lambda r: per_op(lambda: raw.get_many(raw_keys[r], size), n_keys),
        },
        config.rounds,
        WARMUP,
    )
    scans = interleave(
        {
            "table": _scans(table, prefixes),
            "raw": lambda r: per_op(lambda: raw.scan_each(raw_prefixes[r]), n_scans),
        },
        config.rounds,
        WARMUP,
    )
    return [
        Figure.of(RAW, "get_row vs get", "", "read", gets["table"], gets["raw"], goal=GET_GOAL),
        Figure.of(
            RAW,
            "get_rows vs multi-get",
            f"{size:,} keys a call",
            "key",
            multi["table"],
            multi["raw"],
        ),
        Figure.of(
            RAW,
            "prefix scan",
            "~10 rows",
            "scan",
            scans["table"],
            scans["raw"],
        ),
    ]


def codecs(config: BenchConfig, progress: Progress) -> list[Figure]:
    """Keys and row values encoded and decoded a RecordBatch at a time vs a row
    at a time."""
    progress(f"key and value encoding, {config.columns} columns")
    schema = table_schema(config.columns)
    batch = make_batch(config.rows, config.columns, config.seed)
    n = batch.num_rows
    key_codec, row_codec = KeyCodec(schema), RowCodec(schema)
    rows = rows_of(batch)
    pks = [schema.key_of(row) for row in rows]
    keys = key_codec.encode_batch(batch)
    values = row_codec.encode_batch(batch)
    pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "key encode": (
            lambda: key_codec.encode_batch(batch),
            lambda: [key_codec.encode(pk) for pk in pks],
        ),
        "value encode": (
            lambda: row_codec.encode_batch(batch),
            lambda: [row_codec.encode(row) for row in rows],
        ),
        "key decode": (
            lambda: key_codec.decode_batch(keys),
            lambda: [key_codec.decode(key) for key in keys],
        ),
        "value decode": (
            lambda: row_codec.decode_batch(values),
            lambda: [row_codec.decode(value) for value in values],
        ),
    }
    figures = []
    for name, (whole, each) in pairs.items():
        works = {"batch": _repeat(whole, n), "row": _repeat(each, n)}
        times = interleave(works, config.codec_rounds)
        figures.append(Figure.of(CODECS, name, "", "row", times["batch"], times["row"]))
    return figures


def _repeat(fn: Callable[[], object], ops: int) -> Round:
    return lambda r: per_op(fn, ops)
