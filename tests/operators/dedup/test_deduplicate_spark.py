"""Flink's Deduplicate through Spark's runner: keep-last on a changelog whose
rows reach the tasks in any order, ordered only by their sequence numbers (an
update's ``-U``/``+U`` pair shares one), gives in every batch what the
operator gives in the harness, record at a time in sequence order."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators import RowKind
from operators._spark.runner import run_operator
from operators._spark.sinks import ParquetSink
from operators._tools.demo import write_batches
from operators.dedup import Deduplicate
from operators.testing import OperatorHarness

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("seq", pa.int64())])
CHANGELOG = pa.schema([*SCHEMA, ("row_kind", pa.string())])

Row = tuple[Any, ...]


def changelog(seed: int, batches: int = 4, changes: int = 60) -> list[pa.Table]:
    """Consistent changelogs of 15 keys: inserts, updates (``-U``/``+U`` under
    one sequence number) and deletes; each batch's rows shuffled."""
    rng = random.Random(seed)
    live: dict[int, int] = {}
    seq = 0
    tables = []
    for _ in range(batches):
        rows: list[Row] = []
        for _ in range(changes):
            k, seq = rng.randrange(15), seq + 1
            if k not in live:
                live[k] = rng.randrange(1000)
                rows.append((k, live[k], seq, "+I"))
            elif rng.random() < 0.25:
                rows.append((k, live.pop(k), seq, "-D"))
            else:
                new = rng.randrange(1000)
                rows += [(k, live[k], seq, "-U"), (k, new, seq, "+U")]
                live[k] = new
        rng.shuffle(rows)
        columns = [list(c) for c in zip(*rows, strict=True)]
        tables.append(pa.Table.from_arrays(columns, schema=CHANGELOG))
    return tables


def in_sequence(table: pa.Table) -> pa.RecordBatch:
    """The rows in the runner's order: by sequence, retractions first."""
    rows = sorted(table.to_pylist(), key=lambda r: (r["seq"], RowKind(r["row_kind"]).is_accumulate))
    return pa.RecordBatch.from_pylist(rows, CHANGELOG)


def test_changelog_keep_last_equals_harness(spark: Any, tmp_path: Path) -> None:
    """Every batch's output through Spark (two partitions, shuffled input)
    equals the harness's for the same batch, in kinds, keys and values."""
    from pyspark.sql.pandas.types import from_arrow_schema

    operator = Deduplicate(SCHEMA, ["k"], changelog=True, generate_update_before=True)
    batches = changelog(seed=3)
    harness = OperatorHarness(operator)
    expected = []
    for table in batches:
        emitted = harness.process_batch(in_sequence(table))
        harness.commit()
        expected.append(Counter((kind.value, *row) for kind, row in emitted))

    write_batches(tmp_path / "source", batches, prefix="changes")
    stream = (
        spark.readStream.schema(from_arrow_schema(CHANGELOG))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "source"))
    )
    sink = ParquetSink(str(tmp_path / "output"))
    query = run_operator(
        stream,
        operator,
        keys=["k"],
        partitions=2,
        checkpoint=str(tmp_path / "checkpoint"),
        sink=sink,
        sequence_column="seq",
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    got: list[Counter[Row]] = [Counter() for _ in batches]
    for r in sink.read(spark).collect():
        got[r["batch"]][(r["row_kind"], r["k"], r["v"], r["seq"])] += 1
    assert got == expected
    assert any(kind == "-U" for batch in expected for kind, *_ in batch)
