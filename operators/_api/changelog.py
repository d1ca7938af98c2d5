"""Changelog rows: the kind of change a row carries (Flink's RowKind)."""

from __future__ import annotations

import enum

import pyarrow as pa
import pyarrow.compute as pc

from encoding import EncodingError
from operators.errors import InputError

__all__ = [
    "ROW_KIND",
    "RowKind",
    "all_known_kinds",
    "kind_symbols",
    "kinds_in",
    "non_inserts",
    "row_kind_array",
    "row_kinds",
]

#: The name of the row-kind column in operator inputs and outputs. An input
#: without it is append-only: every row is an insert.
ROW_KIND = "row_kind"


class RowKind(enum.Enum):
    """What a changelog row does to the table it describes."""

    INSERT = "+I"
    UPDATE_BEFORE = "-U"
    UPDATE_AFTER = "+U"
    DELETE = "-D"

    @property
    def is_accumulate(self) -> bool:
        """``+I`` and ``+U`` add a row; ``-U`` and ``-D`` retract one."""
        return self is RowKind.INSERT or self is RowKind.UPDATE_AFTER

    @property
    def is_retract(self) -> bool:
        """``-U`` and ``-D`` retract a row."""
        return not self.is_accumulate

    @classmethod
    def parse(cls, symbol: str | None) -> RowKind:
        """The kind of a symbol (``+I``, ``-U``, ``+U``, ``-D``)."""
        try:
            return _BY_SYMBOL[symbol]
        except KeyError:
            raise EncodingError(
                f"unknown row kind {symbol!r}: a changelog row is '+I', '-U', '+U' or '-D'"
            ) from None

    def __str__(self) -> str:
        return self.value


#: A null symbol (``None``) is not a key: it is unknown like any other.
_BY_SYMBOL: dict[str | None, RowKind] = {k.value: k for k in RowKind}


def row_kinds(batch: pa.RecordBatch | pa.Table) -> list[RowKind]:
    """The kind of each row of ``batch``: its row-kind column, or all inserts
    when it has none. An unknown symbol or a null raises ``EncodingError``."""
    index = batch.schema.get_field_index(ROW_KIND)
    if index < 0:
        return [RowKind.INSERT] * batch.num_rows
    symbols = batch.column(index).to_pylist()
    by_symbol = _BY_SYMBOL
    try:
        return [by_symbol[s] for s in symbols]
    except KeyError:
        bad = next(s for s in symbols if s not in by_symbol)
        raise EncodingError(
            f"unknown row kind {bad!r} in column {ROW_KIND!r}: a changelog row is "
            "'+I', '-U', '+U' or '-D'"
        ) from None


def kind_symbols(batch: pa.RecordBatch | pa.Table) -> set[str | None]:
    """The distinct symbols of ``batch``'s row-kind column, unchecked (a null
    is ``None``), without making a Python object per row; ``{'+I'}`` when it
    has no such column but has rows."""
    index = batch.schema.get_field_index(ROW_KIND)
    if index < 0:
        return {RowKind.INSERT.value} if batch.num_rows else set()
    return set(pc.unique(batch.column(index)).to_pylist())


def kinds_in(batch: pa.RecordBatch | pa.Table) -> set[RowKind]:
    """The row kinds that occur in ``batch`` (without making a Python object
    per row); an unknown symbol or a null raises ``EncodingError``."""
    return {RowKind.parse(s) for s in kind_symbols(batch)}


def non_inserts(batch: pa.RecordBatch, reason: str) -> pa.Array | None:
    """``reason`` at each row of ``batch`` that is not an insert (a
    retraction, or an unknown kind), null at each insert; ``None`` when the
    batch carries no row kinds (every row an insert). What an operator that
    takes inserts only says of a batch (:meth:`Operator.rejected_rows
    <operators.Operator.rejected_rows>`)."""
    index = batch.schema.get_field_index(ROW_KIND)
    if index < 0:
        return None
    inserts = pc.fill_null(pc.equal(batch.column(index), RowKind.INSERT.value), False)
    return pc.if_else(inserts, pa.scalar(None, pa.string()), pa.scalar(reason, pa.string()))


def row_kind_array(kinds: pa.Array | pa.ChunkedArray, n: int, operator: str) -> pa.Array:
    """``kinds``, the row kind symbols ``operator`` emitted for ``n`` rows,
    as one string array; :class:`~operators.errors.InputError` unless
    there is one known symbol per row."""
    if len(kinds) != n:
        raise InputError(f"operator {operator!r} emitted {n} rows with {len(kinds)} row kinds")
    if isinstance(kinds, pa.ChunkedArray):
        kinds = kinds.combine_chunks()
    if not (pa.types.is_string(kinds.type) or pa.types.is_large_string(kinds.type)):
        raise InputError(
            f"operator {operator!r} emitted row kinds of type {kinds.type}; they are strings "
            "('+I', '-U', '+U', '-D')"
        )
    if not all_known_kinds(kinds):
        known = pc.fill_null(pc.is_in(kinds, value_set=_SYMBOLS), False)
        bad = kinds.filter(pc.invert(known))[0].as_py()
        raise InputError(
            f"operator {operator!r} emitted an unknown row kind {bad!r}: a changelog row is "
            "'+I', '-U', '+U' or '-D'"
        )
    return kinds.cast(pa.string())


def all_known_kinds(kinds: pa.Array | pa.ChunkedArray) -> bool:
    """Whether every value of ``kinds`` is a known row kind symbol (no
    null), in Arrow: ``True`` for none."""
    known = pc.is_in(kinds, value_set=_SYMBOLS)
    return not kinds.null_count and bool(pc.all(known, min_count=0).as_py())


_SYMBOLS = pa.array([k.value for k in RowKind])
