"""Changelog rows: the kind of change a row carries (Flink's RowKind)."""

from __future__ import annotations

import enum

import pyarrow as pa
import pyarrow.compute as pc

from encoding import EncodingError

__all__ = ["ROW_KIND", "RowKind", "kind_symbols", "kinds_in", "row_kinds"]

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
