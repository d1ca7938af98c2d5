"""Random changelogs for the relational operators' differential tests, and
what their outputs materialise to: rows ``(g, v, w, id)`` with null group
keys and values, updates that move a row to another group, deletes that
favour the current min / max of a group, and (with few ids) identical rows.
With ``floats`` the value column is a double drawn from NaN, +-inf, -0.0,
0.0 and a few exactly summable numbers (``FLOAT_SCHEMA``)."""

from __future__ import annotations

import math
import random
import sqlite3
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from operators import RowKind
from operators._engine.spark_hash import spark_partition
from operators.aggregate import Aggregate
from operators.testing import Emitted, OperatorHarness

SCHEMA = pa.schema([("g", pa.string()), ("v", pa.int64()), ("w", pa.string()), ("id", pa.int64())])
CHANGELOG = pa.schema([*SCHEMA, ("row_kind", pa.string())])
FLOAT_SCHEMA = pa.schema(
    [("g", pa.string()), ("v", pa.float64()), ("w", pa.string()), ("id", pa.int64())]
)
#: One NaN object, so that rows holding it compare equal (as tuples do by identity).
NAN = math.nan
#: Float values: the specials, and dyadic numbers whose sums are exact in any order.
FLOATS = [NAN, math.inf, -math.inf, -0.0, 0.0, 1.5, -2.0, 0.25, 3.0]

Row = tuple[Any, ...]
Change = tuple[RowKind, Row]


def spark_key(value: Any) -> tuple[bool, Any]:
    """Spark's order of a non-null value: NaN above every number."""
    nan = isinstance(value, float) and math.isnan(value)
    return (nan, 0.0 if nan else value)


def changelog(
    seed: int,
    batches: int = 5,
    changes: int = 25,
    ids: int = 1000,
    append: bool = False,
    floats: bool = False,
) -> list[list[Change]]:
    """Consistent changelog batches: every retraction retracts a live row.
    ``ids`` small makes identical rows; ``append`` makes inserts only;
    ``floats`` draws the values from ``FLOATS``."""
    rng = random.Random(seed)
    groups = ["a", "b", "c", None]
    live: list[Row] = []

    def row() -> Row:
        v: Any = None if rng.random() < 0.15 else rng.randrange(-3, 6)
        if floats and v is not None:
            v = FLOATS[v % len(FLOATS)]
        w = None if rng.random() < 0.15 else rng.choice(["x", "y", "z", "é"])
        return (rng.choice(groups), v, w, rng.randrange(ids))

    out = []
    for _ in range(batches):
        batch: list[Change] = []
        for _ in range(changes):
            roll = rng.random()
            if append or not live or roll < 0.45:
                new = row()
                live.append(new)
                batch.append((RowKind.INSERT, new))
                continue
            if roll < 0.6:
                # The current min or max of a random group's rows.
                group = rng.choice(live)[0]
                members = [r for r in live if r[0] == group and r[1] is not None]
                if not members:
                    continue
                pick = min if rng.random() < 0.5 else max
                old = pick(members, key=lambda r: spark_key(r[1]))
            else:
                old = rng.choice(live)
            live.remove(old)
            if roll < 0.8:
                batch.append((RowKind.DELETE, old))
            else:
                new = row()
                live.append(new)
                batch += [(RowKind.UPDATE_BEFORE, old), (RowKind.UPDATE_AFTER, new)]
        out.append(batch)
    return out


def built_in_aggregates(column: str) -> list[Aggregate]:
    """count(*) and every built-in aggregate of ``column``."""
    return [
        Aggregate.count(),
        Aggregate.count(column),
        Aggregate.sum(column),
        Aggregate.avg(column),
        Aggregate.min(column),
        Aggregate.max(column),
        Aggregate.count_distinct(column),
    ]


def apply_top(top: Counter[Row], emitted: Iterable[tuple[RowKind, Row]]) -> Counter[Row]:
    """A top-N's materialised rows after its ``+I``/``-D`` output; a ``-D``
    must name a row in the top."""
    for kind, row in emitted:
        assert kind in (RowKind.INSERT, RowKind.DELETE)
        top[row] += 1 if kind is RowKind.INSERT else -1
        assert top[row] >= 0, f"-D of {row}, which is not in the top"
    return +top


def apply_input(rows: Counter[Row], batch: Iterable[Change]) -> None:
    """Materialise input changes into a multiset of rows."""
    for kind, row in batch:
        rows[row] += 1 if kind.is_accumulate else -1
        assert rows[row] >= 0
    for row in [r for r, n in rows.items() if n == 0]:
        del rows[row]


def as_batch(changes: Sequence[Change], schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    """Changes as one changelog batch of rows of ``schema``."""
    with_kind = pa.schema([*schema, ("row_kind", pa.string())])
    return pa.RecordBatch.from_pylist(
        [dict(zip(with_kind.names, (*row, kind.value), strict=True)) for kind, row in changes],
        with_kind,
    )


class Partitioned:
    """One harness per partition; a batch's rows go to the partition of
    their key, as the runner's repartition sends them (Spark's hash)."""

    def __init__(
        self, make: Any, key: Sequence[str], partitions: int, schema: pa.Schema = SCHEMA
    ) -> None:
        self.harnesses = [OperatorHarness(make()) for _ in range(partitions)]
        self._schema = schema
        self._key = [schema.names.index(k) for k in key]
        self._types = [schema.field(k).type for k in key]

    def run(self, changes: Sequence[Change]) -> list[Emitted]:
        """Process a batch on every partition, commit, and return all output."""
        parts: list[list[Change]] = [[] for _ in self.harnesses]
        for kind, row in changes:
            key = tuple(row[i] for i in self._key)
            parts[spark_partition(key, self._types, len(self.harnesses))].append((kind, row))
        out: list[Emitted] = []
        for harness, part in zip(self.harnesses, parts, strict=True):
            n = len(harness.output)
            if part:
                harness.process_batch(as_batch(part, self._schema))
            harness.commit()  # the operators emit at the end of a batch
            out += harness.output[n:]
        return out

    def close(self) -> None:
        for harness in self.harnesses:
            harness.close()


def sqlite_of(rows: Counter[Row]) -> sqlite3.Connection:
    """An in-memory SQLite table ``t(g, v, w, id)`` holding ``rows``."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (g TEXT, v INTEGER, w TEXT, id INTEGER)")
    db.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", list(rows.elements()))
    return db


def rounded(row: Row) -> Row:
    """A row with floats rounded, so float sums in another order compare."""
    return tuple(round(x, 9) if isinstance(x, float) else x for x in row)
