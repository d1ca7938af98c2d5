"""How a stage's task orders its partition's rows before its operator sees
them: one rule, :class:`RowOrder`, applied in the task, in Arrow.

A changelog operator must apply a partition's rows in the order their
sources wrote them. The runner gives each row its sequence number
(``__seq``) and, where a stage takes its inputs in turn, its side
(``__side``); the task sorts by them, and at one sequence number puts
retractions (``-U``, ``-D``) before accumulations, so that an update's
``-U``/``+U`` pair sharing its number applies in order. The sort is stable:
rows equal in all of that keep the order they came in.

Spark could sort the partition (``sortWithinPartitions``) before the task
reads it; the task sorts instead, in Arrow, which costs a batch less than
Spark's sort in the JVM (docs/runner.md), and bounds its memory as Spark's sort does: a
partition of up to :data:`SORT_BYTES` of Arrow input is sorted in memory;
past that, the task writes each :data:`SORT_BYTES` of it to local disk (the
executor's, where Spark spills) as a sorted run, and merges the runs
:data:`MERGE_WAYS` at a time, in as many passes as it takes, holding a
file batch of each (at most :data:`MERGE_ROWS` rows and about
:data:`MERGE_BYTES`). However large the partition, the task then holds
at most a few times :data:`SORT_BYTES` of it (the rows held, and a sorted
copy of them or of a merge step), and has :data:`MERGE_WAYS` files open.
"""

from __future__ import annotations

import os
import tempfile
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from operators._api.changelog import ROW_KIND, RowKind

__all__ = [
    "MERGE_BYTES",
    "MERGE_ROWS",
    "MERGE_WAYS",
    "SEQ",
    "SIDE",
    "SORT_BYTES",
    "RowOrder",
    "RowSorter",
]

#: A stage's input column: the side of the stage a row belongs to.
SIDE = "__side"
#: A stage's input column: a row's sequence number in its source.
SEQ = "__seq"
#: A task sorts up to this many bytes of its input (Arrow's) in memory;
#: past it, it writes sorted runs of this size to local disk and merges them.
SORT_BYTES = 64 << 20
#: Runs merged at once; more are merged in passes, into longer runs.
MERGE_WAYS = 16
#: A run's file batches, each of which a merge holds at once: at most this
#: many rows, and of about this many bytes (a row at least).
MERGE_ROWS = 65_536
MERGE_BYTES = SORT_BYTES // MERGE_WAYS

#: The sort key that puts retractions first (false) at one sequence number.
_ACCUMULATES = "__accumulates"
_RETRACTIONS = pa.array([RowKind.UPDATE_BEFORE.value, RowKind.DELETE.value])


def _known(key: str) -> str:
    """The sort key column that says whether ``key`` is known (not null)."""
    return f"{key}__known"


@dataclass(frozen=True)
class RowOrder:
    """The order of a stage's input rows: by side first when ``sides`` (a
    stage that takes its inputs in turn), then by sequence number, then, when
    ``kinds`` (the input carries row kinds), retractions first. Ascending,
    nulls first (a row with no sequence number before those with one), as
    Spark sorts by default."""

    sides: bool
    kinds: bool

    @property
    def _columns(self) -> list[str]:
        """The sort key columns of a keyed table (:meth:`_keyed`), first to last."""
        keys = [SIDE, SEQ] if self.sides else [SEQ]
        ranked = [col for key in keys for col in (_known(key), key)]
        return [*ranked, _ACCUMULATES] if self.kinds else ranked

    def _keyed(self, rows: pa.Table) -> pa.Table:
        """``rows`` with the columns of their sort key: before the side and
        the sequence number, whether each is known (not null), so that nulls
        come first whatever the sort does with them (pyarrow has moved its
        null placement from the whole sort to each key); last, whether the
        row accumulates (a row kind that is null, or none, does)."""
        for key in [SIDE, SEQ] if self.sides else [SEQ]:
            rows = rows.append_column(_known(key), rows.column(key).is_valid())
        if self.kinds:
            accumulates = pc.invert(pc.is_in(rows.column(ROW_KIND), _RETRACTIONS))
            rows = rows.append_column(_ACCUMULATES, accumulates)
        return rows

    def _sorted(self, rows: pa.Table) -> pa.Table:
        """Keyed ``rows`` in this order; stable."""
        keys = [(c, "ascending") for c in self._columns]
        return rows.take(pc.sort_indices(rows, sort_keys=keys))

    def _key(self, rows: pa.Table, at: int) -> tuple[Any, ...]:
        """Keyed row ``at``'s sort key, as a tuple that compares as the order
        does (a null only ever meets a null)."""
        return tuple(rows.column(c)[at].as_py() for c in self._columns)

    def _without_keys(self, rows: pa.Table) -> pa.Table:
        """``rows`` as the task hands them on: no sequence number, no key of
        the sort's own."""
        own = [_known(SIDE), _known(SEQ), SEQ, _ACCUMULATES]
        return rows.drop_columns([c for c in own if c in rows.column_names])


class RowSorter:
    """A partition's rows (:meth:`add`, each batch with the columns ``order``
    sorts by) handed back in ``order`` (:meth:`rows`), without their
    sequence numbers. Stable. Up to ``memory_bytes`` (default
    :data:`SORT_BYTES`) of input is held and sorted in memory; past that,
    sorted runs go to a temporary directory, which :meth:`close` removes
    (the sorter is a context manager)."""

    def __init__(self, order: RowOrder, memory_bytes: int | None = None) -> None:
        self.order = order
        self.memory_bytes = SORT_BYTES if memory_bytes is None else memory_bytes
        self._held: list[pa.RecordBatch] = []
        self._size = 0
        self._runs: list[str] = []
        self._cleanup = ExitStack()
        self._directory = ""
        self._written = 0

    def __enter__(self) -> RowSorter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove the runs written, if any."""
        self._cleanup.close()

    def add(self, batch: pa.RecordBatch) -> None:
        """Take a batch of the partition's rows."""
        if not batch.num_rows:
            return
        self._held.append(batch)
        self._size += batch.nbytes
        if self._size >= self.memory_bytes:
            self._spill()

    def _spill(self) -> None:
        """Write the rows held as a sorted run."""
        if not self._directory:
            make = tempfile.TemporaryDirectory(prefix="relstate-sort-", dir=_spill_root())
            self._directory = self._cleanup.enter_context(make)
        rows = self.order._sorted(self.order._keyed(pa.Table.from_batches(self._held)))
        self._runs.append(_write_run(self._path(), [rows]))
        self._held, self._size = [], 0

    def _path(self) -> str:
        """A new run's file."""
        self._written += 1
        return os.path.join(self._directory, f"{self._written}.arrow")

    @property
    def spilled(self) -> int:
        """The sorted runs written to disk so far."""
        return len(self._runs)

    def rows(self) -> Iterator[pa.RecordBatch]:
        """Every row taken, in order (once every row is taken)."""
        order = self.order
        if not self._runs:
            if self._held:
                rows = order._sorted(order._keyed(pa.Table.from_batches(self._held)))
                self._held = []
                yield from order._without_keys(rows).to_batches(MERGE_ROWS)
            return
        if self._held:
            self._spill()
        runs = self._runs
        while len(runs) > MERGE_WAYS:
            # A pass: each MERGE_WAYS runs in a row become one, in order.
            groups = [runs[i : i + MERGE_WAYS] for i in range(0, len(runs), MERGE_WAYS)]
            runs = [_write_run(self._path(), _merged(order, g)) for g in groups]
            for path in (p for g in groups for p in g):
                os.unlink(path)
        for rows in _merged(order, runs):
            yield from order._without_keys(rows).to_batches()


def _spill_root() -> str | None:
    """Where a task writes its runs: the first of the executor's local
    directories, which Spark hands its Python workers (``SPARK_LOCAL_DIRS``,
    where PySpark's own shuffle spills too); else (not in Spark) Python's
    temporary directory."""
    return os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or None


def _write_run(path: str, parts: Iterable[pa.Table]) -> str:
    """Sorted, keyed ``parts`` (one after another) as a run's file at
    ``path``, in file batches a merge can hold (:data:`MERGE_ROWS`,
    :data:`MERGE_BYTES`)."""
    writer = None
    with pa.OSFile(path, "wb") as sink:
        for rows in parts:
            if writer is None:
                writer = pa.ipc.new_file(sink, rows.schema)
            per_row = max(rows.nbytes // max(rows.num_rows, 1), 1)
            writer.write_table(rows, max_chunksize=max(min(MERGE_ROWS, MERGE_BYTES // per_row), 1))
        if writer is not None:
            writer.close()
    return path


class _Run:
    """A sorted run on disk, read a file batch at a time: ``rows``, the rows
    read and not yet merged (``None``: every row is merged)."""

    def __init__(self, path: str, index: int) -> None:
        self.source = pa.OSFile(path)
        self.file = pa.ipc.open_file(self.source)
        self.index = index
        self.next = 0
        self.rows: pa.Table | None = None
        self.read()

    def last(self, order: RowOrder) -> tuple[tuple[Any, ...], int]:
        """The sort key of the last row held, then the run's index: where
        the run's rows read so far end in the merge's order."""
        assert self.rows is not None, "a run that is merged to its end holds nothing"
        return order._key(self.rows, self.rows.num_rows - 1), self.index

    def read(self) -> None:
        """Hold the run's next file batch with rows (none left: close the file)."""
        while self.next < self.file.num_record_batches:
            batch = self.file.get_batch(self.next)
            self.next += 1
            if batch.num_rows:
                self.rows = pa.Table.from_batches([batch])
                return
        self.rows = None
        self.source.close()


def _merged(order: RowOrder, paths: list[str]) -> Iterator[pa.Table]:
    """The sorted runs at ``paths`` (in input order) merged, a step at a time.

    A row's place is its sort key, then its run, then its place in the run
    (which is what stable means). At each step every run holds some of its
    rows; the least of their last rows (by key, then run) bounds the step:
    no row still to be read comes before it, so every held row up to it is
    merged, sorted in Arrow (its runs' rows in run order, and the sort
    stable). The run that holds the bound is then merged to its last held
    row, and reads on: each step reads a batch at least."""
    runs = [_Run(path, i) for i, path in enumerate(paths)]
    try:
        while live := [r for r in runs if r.rows is not None]:
            bound = min(run.last(order) for run in live)
            taken: list[pa.Table] = []
            for run in live:
                rows = run.rows
                assert rows is not None
                # Up to the bound: a key below it, or equal in a run not after its run.
                n = bisect_right(
                    range(rows.num_rows), bound, key=lambda at: (order._key(rows, at), run.index)
                )
                if n:
                    taken.append(rows.slice(0, n))
                if n == rows.num_rows:
                    run.read()
                else:
                    run.rows = rows.slice(n)
            yield order._sorted(pa.concat_tables(taken))
    finally:
        for run in runs:
            run.source.close()
