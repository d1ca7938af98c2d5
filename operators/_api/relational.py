"""Column helpers of the relational operators (group aggregate, top-N): row
kinds as signs, key columns as Python tuples that compare as their key bytes
do, and batched writes of multiplicity tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from encoding import Row, key_equal_values
from operators._api.changelog import ROW_KIND, RowKind, kinds_in
from operators._api.operator import OperatorContext
from operators.errors import InputError
from statestore import StateTable

__all__ = [
    "NAN",
    "Pending",
    "add_counts",
    "aligned",
    "ascending",
    "cast_column",
    "check_names",
    "counted_rows",
    "key_tuples",
    "net_changes",
    "pylists",
    "report_unheld",
    "run_starts",
    "signs",
    "unheld",
    "write_counts",
]


#: The one NaN that key tuples hold: Python compares NaN unequal to itself,
#: but a dict finds the same object, and the key bytes of every NaN are one.
NAN = float("nan")

_ACCUMULATE = pa.array([RowKind.INSERT.value, RowKind.UPDATE_AFTER.value])


def check_names(schema: pa.Schema, names: Sequence[str], what: str) -> None:
    """Raise ``ValueError`` unless every name is a distinct column of ``schema``."""
    missing = [n for n in names if n not in schema.names]
    if missing:
        raise InputError(f"{what} column(s) {missing} are not in the input {schema.names}")
    if len(set(names)) != len(names):
        raise InputError(f"{what} columns {list(names)} name a column twice")


def signs(batch: pa.RecordBatch, operator: str, changelog: bool) -> pa.Array:
    """``+1`` per row that adds a row (``+I``, ``+U``), ``-1`` per row that
    retracts one (``-U``, ``-D``). Without ``changelog`` a retraction is an
    :class:`InputError`; an unknown kind raises ``EncodingError``."""
    index = batch.schema.get_field_index(ROW_KIND)
    if index < 0:
        return pa.array(np.ones(batch.num_rows, np.int64))
    kinds = kinds_in(batch)
    if not changelog and kinds - {RowKind.INSERT}:
        raise InputError(
            f"operator {operator!r} was built for an append-only input (changelog=False), "
            f"but this batch has row kinds {sorted(k.value for k in kinds)}; build it with "
            "changelog=True to take retractions"
        )
    accumulate = pc.is_in(batch.column(index), value_set=_ACCUMULATE)
    return pc.if_else(accumulate, pa.scalar(1, pa.int64()), pa.scalar(-1, pa.int64()))


def pylists(columns: Sequence[pa.Array | pa.ChunkedArray]) -> list[list[Any]]:
    """Columns as Python lists, every float NaN the one :data:`NAN`."""
    out = []
    for column in columns:
        values = column.to_pylist()
        if pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py():
            values = [NAN if v is not None and v != v else v for v in values]
        out.append(values)
    return out


def key_tuples(columns: Sequence[pa.Array | pa.ChunkedArray], n: int) -> list[Row]:
    """Key tuples of the rows of ``columns`` (``n`` rows): floats made equal
    as the key bytes make them (-0.0 is 0.0, one NaN)."""
    if not columns:
        return [()] * n
    lists = pylists([key_equal_values(c) for c in columns])
    return list(zip(*lists, strict=True))


class Pending:
    """A micro-batch's input, gathered until the operator's ``close``.

    The runner hands a task's rows to ``process_batch`` in chunks (runs of
    one side, cut at a size); an operator that folds a micro-batch per key
    must see them all before it emits, or a key touched by two chunks would
    emit twice. Held per batch run (the context), dropped at ``close``: it
    is never state."""

    def __init__(self) -> None:
        self._runs: dict[int, list[pa.RecordBatch]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"_runs": {}}

    def start(self, ctx: object) -> None:
        """A batch run begins: nothing gathered."""
        self._runs[id(ctx)] = []

    def add(self, ctx: object, batch: pa.RecordBatch) -> None:
        """Gather one chunk of the run's input."""
        if batch.num_rows:
            self._runs.setdefault(id(ctx), []).append(batch)

    def take(self, ctx: object) -> pa.RecordBatch | None:
        """Everything the run gathered, as one batch (``None``: nothing)."""
        parts = self._runs.pop(id(ctx), [])
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        table = pa.Table.from_batches(parts).combine_chunks()
        return table.to_batches()[0]


def net_changes(
    arrays: Sequence[pa.Array | pa.ChunkedArray], sign: pa.Array, keep: pa.Array | None = None
) -> pa.Table:
    """The net change of a batch per distinct key of ``arrays`` (rows where
    ``keep`` holds, or all), in one Arrow group-by with values made equal as
    the key bytes make them, leaving out keys whose changes cancel: key
    columns ``__k0``... then ``__s_sum``, keys in order of first appearance."""
    columns = {f"__k{j}": key_equal_values(a) for j, a in enumerate(arrays)}
    columns["__s"] = sign
    keys = list(columns)[:-1]
    table = pa.table(columns)
    if keep is not None:
        table = table.filter(keep)
    net = table.group_by(keys, use_threads=False).aggregate([("__s", "sum")])
    return net.filter(pc.not_equal(net.column("__s_sum"), 0)).select([*keys, "__s_sum"])


def ascending(net: pa.Table) -> pa.Table:
    """:func:`net_changes` sorted by its key columns, each ascending with
    nulls first: the order of their encoded keys where the state table's
    key columns are plain ascending ones, so that the multi-get of
    :func:`add_counts` needs no sort of its own. Where the orders differ
    (a float column with NaN, which Arrow puts first and the encoding
    last; a descending key column), the multi-get sorts as before."""
    keys = [(name, "ascending", "at_start") for name in net.column_names[:-1]]
    return net.sort_by(keys) if net.num_rows > 1 else net


def aligned(stored: pa.RecordBatch, found: pa.BooleanArray, n: int) -> pa.Table:
    """The rows a multi-get found (``stored``, in order) at the places of the
    ``n`` keys asked for, all-null rows where ``found`` says none."""
    at = pc.subtract(pc.cumulative_sum(pc.cast(found, pa.int64())), 1)
    index = pc.if_else(found, at, pa.scalar(None, pa.int64()))
    return pa.Table.from_batches([stored]).take(index) if n else pa.Table.from_batches([stored])


def add_counts(
    table: StateTable,
    rows: pa.Table,
    deltas: pa.Array,
    read: tuple[pa.RecordBatch, Any] | None = None,
) -> tuple[pa.Array, pa.Array]:
    """Add each row's net change to its multiplicity in ``table``, whose last
    column is the count and whose other columns ``rows`` holds (distinct
    keys, by name), in batches: one multi-get, then the rows that come in
    inserted, changed ones updated, those whose count reaches zero or below
    deleted. Returns each row's count before and after (below zero: it
    retracted more than the table held, which the caller may count).

    ``read`` is what the caller read of the table this epoch already: every
    stored row of some key prefixes (as :meth:`StateTable.scan_prefixes`
    gives them), and per row of ``rows`` whether it falls under one of them
    (a numpy boolean array). Those rows' counts are found among the rows
    read, or are zero; only the others are looked up."""
    rows = counted_rows(table, rows)
    if read is None:
        before = _held(table, rows)
    else:
        stored, under = read
        before = np.zeros(rows.num_rows, dtype=np.int64)
        before[~under] = _held(table, rows.filter(pa.array(~under))).to_numpy()
        if stored.num_rows:
            mine = table.keys.encode_arrow(rows.filter(pa.array(under)))
            at = pc.index_in(mine, value_set=table.keys.encode_arrow(stored))
            counts = stored.column(stored.num_columns - 1).take(at)
            before[under] = pc.fill_null(counts, 0).to_numpy(zero_copy_only=False)
        before = pa.array(before)
    after = pc.add(before, deltas)
    # A stored count is above zero: a row is held where its count was.
    write_counts(table, rows, pc.greater(before, 0), after)
    return before, after


def _held(table: StateTable, rows: pa.Table) -> pa.Array:
    """Each of ``rows``' count in the multiplicity ``table`` (0: not held),
    in one multi-get."""
    stored, found = table.get_batch(rows)
    old = aligned(stored, found, rows.num_rows)
    return pc.fill_null(old.column(old.num_columns - 1), 0).combine_chunks()


def counted_rows(table: StateTable, rows: pa.Table) -> pa.Table:
    """``rows`` as the columns of a multiplicity ``table`` less its count
    (by name, in its order, of its types)."""
    fields = list(table.schema.columns)[:-1]
    return rows.select([f.name for f in fields]).cast(pa.schema(fields))


def write_counts(
    table: StateTable, rows: pa.Table, found: pa.BooleanArray, after: pa.Array
) -> None:
    """Write each row's new multiplicity ``after`` (``rows``: as
    :func:`counted_rows` gives them; ``found``: whether the table held the
    row): a row that comes in is inserted, a changed one updated, one whose
    count reaches zero or below deleted."""
    alive = pc.greater(after, 0)
    new = rows.append_column(table.schema.columns[-1], after)
    table.insert_batch(new.filter(pc.and_(pc.invert(found), alive)))
    table.update_batch(new.filter(pc.and_(found, alive)))
    table.delete_keys(rows.filter(pc.and_(found, pc.invert(alive))))


def run_starts(columns: Sequence[pa.Array | pa.ChunkedArray], n: int) -> Any:
    """Per row of ``n``, whether it starts a run of equal keys (``columns``;
    rows of one key together, as a scan gives them): the first row, and
    each whose key is another than the row before's, as keys compare (a
    null equals a null, a NaN a NaN). A numpy array of booleans."""
    starts = np.zeros(n, dtype=bool)
    if n:
        starts[0] = True
    for column in columns:
        values = key_equal_values(
            column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        )
        current, previous = values[1:], values[:-1]
        both_null = pc.and_(pc.is_null(current), pc.is_null(previous))
        differs = pc.fill_null(pc.not_equal(current, previous), True)
        if pa.types.is_floating(values.type):
            both_nan = pc.fill_null(pc.and_(pc.is_nan(current), pc.is_nan(previous)), False)
            differs = pc.and_(differs, pc.invert(both_nan))
        starts[1:] |= pc.and_(differs, pc.invert(both_null)).to_numpy(zero_copy_only=False)
    return starts


def unheld(after: pa.Array | pa.ChunkedArray) -> int:
    """How many retractions went beyond what the table held: the counts
    below zero that :func:`add_counts` returns, added up."""
    below = pc.if_else(pc.greater(after, 0), 0, pc.negate(after))
    return int(pc.sum(below).as_py() or 0)


def report_unheld(
    ctx: OperatorContext, rows: pa.Table, after: pa.Array | pa.ChunkedArray, key_width: int
) -> None:
    """Report to the stage's policy the retractions that went beyond what a
    multiplicity table held (``rows``, each row's count ``after`` the batch;
    its first ``key_width`` columns the partition key): the table dropped
    them already, as a count cannot go below zero, so ``apply`` and
    ``drop`` come to one; ``fail`` raises. The example is the first such row."""
    unknown = unheld(after)
    if not unknown:
        return
    at = pc.index(pc.less(after, 0), True).as_py()
    row = tuple(rows.slice(at, 1).to_pylist()[0].values())
    ctx.retracted_unknown(0, row, row[:key_width], unknown)


def cast_column(column: pa.Array | pa.ChunkedArray, field: pa.Field, what: str) -> pa.Array:
    """``column`` as one array of ``field``'s type, cast if it has another;
    a column that does not cast is an :class:`InputError` that names it as
    ``what`` (``"emitted column"``, say) with both types."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.type == field.type:
        return column
    try:
        return column.cast(field.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputError(
            f"{what} {field.name!r} of type {column.type} does not cast to {field.type}: {exc}"
        ) from exc
