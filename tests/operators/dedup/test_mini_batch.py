"""Mini-batch deduplication against record at a time, on hundreds of random
configurations and inputs, on both backends: after every batch both
materialise to the same table, keep the same state, and count duplicates and
retractions of unknown keys alike."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from operators import RowKind
from operators.dedup import Deduplicate
from operators.testing import Emitted, OperatorHarness

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("t", pa.int64())])
KINDS = [RowKind.INSERT, RowKind.UPDATE_AFTER, RowKind.UPDATE_BEFORE, RowKind.DELETE]


def materialise(table: dict[Any, tuple[Any, ...]], emitted: list[Emitted]) -> None:
    """Apply a changelog keyed by ``k``: +I/+U upsert, -U/-D delete the row
    they name (which must be the one held)."""
    for kind, row in emitted:
        if kind.is_accumulate:
            table[row[0]] = row
        else:
            assert table.pop(row[0]) == row, f"{kind} of a row not held: {row}"


def random_config(rng: random.Random) -> dict[str, Any]:
    keep = rng.choice(["first", "last"])
    order_by = rng.choice([None, "t"])
    changelog = keep == "last" and order_by is None and rng.random() < 0.5
    return {
        "keep": keep,
        "order_by": order_by,
        "changelog": changelog,
        "generate_update_before": rng.random() < 0.5,
        "generate_insert": rng.random() < 0.5,
        "state_ttl_ms": rng.choice([None, 30, 80]),
    }


def random_batches(
    rng: random.Random, changelog: bool
) -> list[tuple[int, list[tuple[Any, ...]], list[RowKind]]]:
    """Batches of (processing time, rows, kinds): few keys, values and times,
    so duplicates, identical rows, ties and expiries all happen."""
    batches = []
    now = 0
    for _ in range(rng.randint(1, 6)):
        now += rng.choice([0, 10, 40, 100])
        rows, kinds = [], []
        for _ in range(rng.randint(0, 12)):
            kind = rng.choice(KINDS) if changelog else RowKind.INSERT
            value = None if kind.is_retract and rng.random() < 0.5 else rng.randint(0, 2)
            rows.append((rng.randint(0, 3), value, rng.randint(0, 4)))
            kinds.append(kind)
        batches.append((now, rows, kinds))
    return batches


#: Counters that count the same rows with and without mini-batch.
SAME_IN_BOTH_MODES = ("numDroppedDuplicateRows", "numRetractionsOfUnknownRows")


def decided(emitted: list[Emitted], metrics: dict[str, int]) -> int:
    """How many input rows the rules decided rather than dropped: each one
    emits exactly one row that is not ``-U`` (an update's ``-U`` comes with
    its ``+U``), or is suppressed as identical to the stored row."""
    emitting = sum(kind is not RowKind.UPDATE_BEFORE for kind, _ in emitted)
    return emitting + metrics.get("numSuppressedIdenticalRows", 0)


#: 300 runs in memory; RocksDB, whose commits write files, runs the first 50.
RUNS = [(seed, "memory") for seed in range(300)] + [(seed, "rocksdb") for seed in range(50)]


class TestMiniBatch:
    @pytest.mark.parametrize(("seed", "backend"), RUNS)
    def test_mini_batch_materialises_like_record_at_a_time(self, seed: int, backend: str) -> None:
        """Folded per key per batch, the output materialises to the table that
        record-at-a-time output does, after every batch, with the same state,
        and duplicates and retractions of unknown keys count the same."""
        rng = random.Random(seed)
        config = random_config(rng)
        batches = random_batches(rng, config["changelog"])
        record = OperatorHarness(
            Deduplicate(SCHEMA, ["k"], mini_batch=False, **config),
            backend=backend,
            consistency="strict",
        )
        folded = OperatorHarness(
            Deduplicate(SCHEMA, ["k"], mini_batch=True, **config),
            backend=backend,
            consistency="strict",
        )
        by_record: dict[Any, tuple[Any, ...]] = {}
        by_batch: dict[Any, tuple[Any, ...]] = {}
        with record, folded:
            for now, rows, kinds in batches:
                record.set_processing_time(now)
                folded.set_processing_time(now)
                emitted: list[Emitted] = []
                for row, kind in zip(rows, kinds, strict=True):
                    emitted += record.process_element(row, kind)
                materialise(by_record, emitted)
                emitted_folded = folded.process_rows(rows, kinds)
                materialise(by_batch, emitted_folded)
                record.commit()
                folded.commit()
                assert by_batch == by_record, config
                for name in record.tables:
                    assert list(folded.table(name).scan()) == list(record.table(name).scan())
                for name in SAME_IN_BOTH_MODES:
                    assert folded.last_metrics.get(name, 0) == record.last_metrics.get(name, 0)
                # Folded: the rows record at a time decides that the fold
                # left out (a later row of their key replaced them).
                assert folded.last_metrics.get("numFoldedRows", 0) == decided(
                    emitted, record.last_metrics
                ) - decided(emitted_folded, folded.last_metrics)
                assert record.last_metrics.get("numFoldedRows", 0) == 0
