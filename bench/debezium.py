"""Changelogs as Flink reads and writes them in files, and the final table
a changelog leaves, so that relstate's output and Flink's can be compared.

Flink's ``debezium-json`` format is one JSON object a line: ``op`` ``c``
(an insert, ``after`` set), ``d`` (a delete, ``before`` set) or ``u`` (an
update, both: Flink reads it as ``-U`` then ``+U``). Flink writes a ``-U``
as a ``d`` and a ``+U`` as a ``c``. An append stream is written as plain
JSON lines (Flink's ``json`` format), which Flink reads as insert-only.

A changelog, applied from the empty table, leaves a multiset of rows: its
final table. Two sides did the same work when their outputs leave the same
final table, whatever order and whatever intermediate updates each emitted.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from encoding import Row
from operators._api.changelog import ROW_KIND, RowKind, row_kinds

__all__ = [
    "FinalTable",
    "OutputsDiffer",
    "changelog_rows",
    "check_same",
    "final_table",
    "read_debezium",
    "write_debezium",
    "write_json",
]

#: What a changelog leaves: each row with its multiplicity.
FinalTable = Counter[Row]


class OutputsDiffer(RuntimeError):
    """Two sides' outputs leave different final tables: they did not do the
    same work, so their times are not to be compared."""


def _templates(names: Sequence[str]) -> str:
    """A ``%`` template of a JSON object of ``names``, values filled in as JSON."""
    return "{" + ",".join(f"{json.dumps(n)}:%s" for n in names) + "}"


def _json_columns(table: pa.Table, names: Sequence[str]) -> list[list[str]]:
    """Each column of ``names`` as JSON text per value (``null`` for a null)."""
    out = []
    for name in names:
        column = table.column(name)
        if pa.types.is_integer(column.type):
            out.append(["null" if v is None else str(v) for v in column.to_pylist()])
        else:
            out.append([json.dumps(v) for v in column.to_pylist()])
    return out


def changelog_rows(tables: Iterable[pa.Table], names: Sequence[str]) -> Iterable[tuple[str, Row]]:
    """The rows of ``tables`` (columns ``names`` and the row-kind column), in
    order, as (row kind symbol, values)."""
    for table in tables:
        kinds = table.column(ROW_KIND).to_pylist()
        columns = [table.column(n).to_pylist() for n in names]
        yield from zip(kinds, zip(*columns, strict=True), strict=True)


def write_debezium(tables: Iterable[pa.Table], names: Sequence[str], path: Path) -> int:
    """Write the changelog ``tables`` (columns ``names`` and the row-kind
    column) to ``path`` as debezium-json lines, in order; returns the lines
    written. A ``-U`` and the ``+U`` right after it are one ``u`` event; a
    ``-U`` not followed by a ``+U``, or a ``+U`` not after a ``-U``, is
    refused, as Flink's format has no such event."""
    template = _templates(names)
    lines = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for table in tables:
            kinds = table.column(ROW_KIND).to_pylist()
            rows = [template % values for values in zip(*_json_columns(table, names), strict=True)]
            i = 0
            while i < len(rows):
                kind = kinds[i]
                if kind == "+I":
                    out.write(f'{{"before":null,"after":{rows[i]},"op":"c"}}\n')
                elif kind == "-D":
                    out.write(f'{{"before":{rows[i]},"after":null,"op":"d"}}\n')
                elif kind == "-U" and i + 1 < len(rows) and kinds[i + 1] == "+U":
                    out.write(f'{{"before":{rows[i]},"after":{rows[i + 1]},"op":"u"}}\n')
                    i += 1
                else:
                    raise ValueError(
                        f"row {i} of a changelog batch is {kind!r}"
                        + (f" followed by {kinds[i + 1]!r}" if i + 1 < len(rows) else "")
                        + ": debezium-json has no event for it (a -U must come right "
                        "before its +U)"
                    )
                lines += 1
                i += 1
    return lines


def write_json(tables: Iterable[pa.Table], names: Sequence[str], path: Path) -> int:
    """Write the append stream ``tables`` to ``path`` as JSON lines of
    ``names``, in order; returns the rows written."""
    template = _templates(names)
    rows = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for table in tables:
            out.writelines(
                template % values + "\n"
                for values in zip(*_json_columns(table, names), strict=True)
            )
            rows += table.num_rows
    return rows


def read_debezium(directory: Path, names: Sequence[str]) -> FinalTable:
    """The final table of the debezium-json files under ``directory`` (as
    Flink's filesystem sink writes them, hidden in-progress files skipped),
    rows as tuples of ``names``. Events are applied in file order; the
    result does not depend on the order of the files."""
    table: FinalTable = Counter()
    for path in sorted(directory.rglob("*")):
        if not path.is_file() or path.name.startswith((".", "_")):
            continue
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                event = json.loads(line)
                op = event["op"]
                if op in ("d", "u"):
                    table[tuple(event["before"][n] for n in names)] -= 1
                if op in ("c", "r", "u"):
                    table[tuple(event["after"][n] for n in names)] += 1
                elif op != "d":
                    raise ValueError(f"{path}: unknown debezium op {op!r} in {line!r}")
    return _settled(table)


def final_table(
    batches: Iterable[pa.RecordBatch | pa.Table],
    names: Sequence[str],
    upsert_key: Sequence[str] = (),
) -> FinalTable:
    """The final table of the changelog ``batches`` (columns ``names``, and
    the row-kind column, or none for inserts), applied in order. With an
    ``upsert_key`` (columns of ``names``) the batches are an upsert
    changelog keyed by it, as an operator writes one without ``-U`` rows:
    each key's last ``+I`` or ``+U`` row stands until a ``-D``, and a
    ``-U`` changes nothing."""
    if upsert_key:
        key = [list(names).index(k) for k in upsert_key]
        rows: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        for kind, row in _changes(batches, names):
            at = tuple(row[i] for i in key)
            if kind is RowKind.DELETE:
                rows.pop(at, None)
            elif kind is not RowKind.UPDATE_BEFORE:
                rows[at] = row
        return Counter(rows.values())
    table: FinalTable = Counter()
    for kind, row in _changes(batches, names):
        table[row] += 1 if kind.is_accumulate else -1
    return _settled(table)


def _changes(
    batches: Iterable[pa.RecordBatch | pa.Table], names: Sequence[str]
) -> Iterator[tuple[RowKind, Row]]:
    """Each row of ``batches`` in order, as its kind and its values of ``names``."""
    for batch in batches:
        if batch.num_rows:
            columns = [batch.column(n).to_pylist() for n in names]
            yield from zip(row_kinds(batch), zip(*columns, strict=True), strict=True)


def _settled(table: FinalTable) -> FinalTable:
    """``table`` without its rows of multiplicity 0 (a row retracted more
    often than inserted keeps its negative count, so that it shows)."""
    return Counter({row: n for row, n in table.items() if n})


def check_same(mine: FinalTable, theirs: FinalTable, what: str) -> None:
    """Raise :class:`OutputsDiffer` unless the two final tables are equal,
    naming a few rows of the difference."""
    if mine == theirs:
        return
    missing = theirs - mine
    extra = mine - theirs
    negative = [r for r, n in {**mine, **theirs}.items() if n < 0]
    sample = ", ".join(repr(r) for r in [*missing, *extra][:4])
    raise OutputsDiffer(
        f"{what}: relstate's output leaves {sum(extra.values())} rows Flink's does not and "
        f"lacks {sum(missing.values())} of Flink's"
        + (f" ({len(negative)} rows retracted more than inserted)" if negative else "")
        + f"; for example {sample}"
    )
