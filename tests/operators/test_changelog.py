"""Changelog rows: RowKind symbols and flags, and reading a batch's row kinds."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from encoding import EncodingError
from operators._api.changelog import ROW_KIND, RowKind, kinds_in, row_kinds


class TestRowKind:
    @pytest.mark.parametrize(
        ("symbol", "kind"),
        [
            ("+I", RowKind.INSERT),
            ("-U", RowKind.UPDATE_BEFORE),
            ("+U", RowKind.UPDATE_AFTER),
            ("-D", RowKind.DELETE),
        ],
    )
    def test_parse_and_str_round_trip(self, symbol: str, kind: RowKind) -> None:
        """Each of the four symbols parses to its kind, which prints as the symbol."""
        assert RowKind.parse(symbol) is kind
        assert str(kind) == symbol
        assert kind.value == symbol

    def test_accumulate_and_retract_flags(self) -> None:
        """+I and +U accumulate, -U and -D retract, and no kind is both."""
        assert {k for k in RowKind if k.is_accumulate} == {RowKind.INSERT, RowKind.UPDATE_AFTER}
        assert {k for k in RowKind if k.is_retract} == {RowKind.UPDATE_BEFORE, RowKind.DELETE}

    @pytest.mark.parametrize("symbol", ["", "+i", "I", "+X", "-I", " +I", "insert"])
    def test_parse_rejects_unknown_symbols(self, symbol: str) -> None:
        """An unknown symbol raises EncodingError (a ValueError) naming it and the valid ones."""
        with pytest.raises(EncodingError, match=r"unknown row kind .*'\+I', '-U', '\+U' or '-D'"):
            RowKind.parse(symbol)
        with pytest.raises(ValueError):
            RowKind.parse(symbol)


class TestRowKinds:
    def test_missing_column_means_all_inserts(self) -> None:
        """A batch without a row-kind column is append-only: every row is +I."""
        batch = pa.record_batch({"key": ["a", "b", "c"]})
        assert row_kinds(batch) == [RowKind.INSERT] * 3

    def test_empty_batch(self) -> None:
        """An empty batch has no row kinds, with or without the column."""
        assert row_kinds(pa.record_batch({"key": pa.array([], pa.string())})) == []
        empty = pa.record_batch(
            {"key": pa.array([], pa.string()), ROW_KIND: pa.array([], pa.string())}
        )
        assert row_kinds(empty) == []

    def test_reads_the_column_in_row_order(self) -> None:
        """The row-kind column is read row by row, wherever it stands in the batch."""
        batch = pa.record_batch(
            {ROW_KIND: ["+I", "-U", "+U", "-D", "+I"], "key": ["a", "a", "a", "a", "b"]}
        )
        assert row_kinds(batch) == [
            RowKind.INSERT,
            RowKind.UPDATE_BEFORE,
            RowKind.UPDATE_AFTER,
            RowKind.DELETE,
            RowKind.INSERT,
        ]

    @pytest.mark.parametrize(("bad", "shown"), [("+X", "'+X'"), (None, "None"), ("", "''")])
    def test_bad_symbol_raises(self, bad: str | None, shown: str) -> None:
        """An unknown symbol or a null raises EncodingError naming it and the column."""
        batch = pa.record_batch({"key": ["a", "b"], ROW_KIND: pa.array(["+I", bad], pa.string())})
        with pytest.raises(
            EncodingError, match=rf"unknown row kind {re.escape(shown)} in column 'row_kind'"
        ):
            row_kinds(batch)


class TestKindsIn:
    def test_the_distinct_kinds_of_a_batch(self) -> None:
        """kinds_in gives the set of kinds that occur; no column means inserts
        (none for an empty batch)."""
        batch = pa.record_batch({ROW_KIND: ["+I", "-D", "+I"], "key": ["a", "b", "c"]})
        assert kinds_in(batch) == {RowKind.INSERT, RowKind.DELETE}
        assert kinds_in(pa.record_batch({"key": ["a"]})) == {RowKind.INSERT}
        assert kinds_in(pa.record_batch({"key": pa.array([], pa.string())})) == set()

    def test_bad_symbol_raises(self) -> None:
        """An unknown symbol or a null raises EncodingError, as for row_kinds."""
        for bad in ("+X", None):
            batch = pa.record_batch({ROW_KIND: pa.array(["+I", bad], pa.string())})
            with pytest.raises(EncodingError, match="unknown row kind"):
                kinds_in(batch)
