"""The changelog join workload of ``relstate bench --suite join`` and
``bench/test_join.py``, and its baseline: the same join on plain Python dicts.

Each side sends ``rows`` changelog rows ``(id, k, v)``: mostly inserts of new
ids, and deletes of earlier live rows. Keys are drawn from ``rows // 2`` values,
so a live row has a couple of rows of the other side with its key. The rows
come in micro-batches, each a few runs of one side, as the runner feeds them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from encoding import Row
from operators._api.changelog import ROW_KIND, RowKind, row_kinds
from operators.join import HELD_ROWS, JoinType, StreamingJoin
from operators.testing import OperatorHarness

__all__ = ["SIDE", "DictJoin", "MicroBatch", "changelog", "make_join", "run_dict", "run_harness"]

SIDE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("k", pa.int64(), nullable=False),
        pa.field("v", pa.int64(), nullable=False),
    ]
)

#: One micro-batch: runs of rows of one side, in order.
MicroBatch = list[tuple[int, pa.RecordBatch]]


def changelog(rows: int, batches: int = 5, run: int = 1_000, seed: int = 0) -> list[MicroBatch]:
    """``rows`` changelog rows per side (about one in six a delete of a live
    row), in ``batches`` micro-batches of alternating runs of ``run`` rows."""
    rng = np.random.default_rng(seed)
    per_side: list[list[tuple[Row, str]]] = []
    for side in (0, 1):
        live: list[Row] = []
        out: list[tuple[Row, str]] = []
        keys = rng.integers(0, max(rows // 2, 1), rows)
        values = rng.integers(0, 100, rows)
        deletes = rng.random(rows) < 1 / 6
        picks = rng.random(rows)
        for i in range(rows):
            if deletes[i] and live:
                j = int(picks[i] * len(live))
                live[j], live[-1] = live[-1], live[j]
                out.append((live.pop(), RowKind.DELETE.value))
            else:
                row = (side * rows + i, int(keys[i]), int(values[i]))
                live.append(row)
                out.append((row, RowKind.INSERT.value))
        per_side.append(out)
    micro: list[MicroBatch] = []
    size = -(-rows // batches)
    for b in range(batches):
        runs: MicroBatch = []
        for start in range(b * size, min((b + 1) * size, rows), run):
            for side in (0, 1):
                part = per_side[side][start : min(start + run, (b + 1) * size, rows)]
                runs.append((side, _batch(part)))
        micro.append(runs)
    return micro


def _batch(rows: Sequence[tuple[Row, str]]) -> pa.RecordBatch:
    columns = list(zip(*(r for r, _ in rows), strict=True))
    arrays = [pa.array(c, type=f.type) for c, f in zip(columns, SIDE, strict=True)]
    arrays.append(pa.array([k for _, k in rows], type=pa.string()))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema([*SIDE, (ROW_KIND, pa.string())]))


def make_join(
    join_type: JoinType,
    unique_key: bool,
    held_rows: int = HELD_ROWS,
    whole_micro_batch: bool = False,
) -> StreamingJoin:
    """The workload's join on ``k``; with ``unique_key``, ``id`` is each side's
    unique key (rows keyed (k, id)), else rows are keyed (k, whole row).
    ``held_rows``: the join's bound on a side held whole (0: each input
    batch reads its keys, as a side past the bound does);
    ``whole_micro_batch``: the join's option."""
    uk = ["id"] if unique_key else None
    return StreamingJoin(
        join_type,
        SIDE,
        SIDE,
        ["k"],
        ["k"],
        left_unique_key=uk,
        right_unique_key=uk,
        right_prefix="r_",
        held_rows=held_rows,
        whole_micro_batch=whole_micro_batch,
    )


def run_harness(
    join: StreamingJoin,
    micro: list[MicroBatch],
    backend: str,
    path: Path,
    history: list[dict[str, Any]] | None = None,
) -> tuple[float, int]:
    """Seconds to run every micro-batch (commits included) through one
    harness partition, and the output rows. The output stays in Arrow, as
    the Spark runner hands it on (the dict join's is its Python list); the
    harness does not turn it back into Python rows. Given ``history``, each batch's
    metrics go into it as the runner records them (``commitTimeMs`` timed
    around the harness's commit, which joins a micro-batch held for its
    end)."""
    harness = OperatorHarness(join, backend=backend, path=path)
    try:
        started = time.perf_counter()
        out = 0
        for runs in micro:
            for side, batch in runs:
                out += harness.process_arrow(batch, side).num_rows
            committing = time.perf_counter()
            _, finished = harness.commit_arrow()
            out += finished.num_rows
            if history is not None:
                commit_ms = int((time.perf_counter() - committing) * 1000)
                history.append({"metrics": {**harness.last_metrics, "commitTimeMs": commit_ms}})
        return time.perf_counter() - started, out
    finally:
        harness.close()


class DictJoin:
    """The same join on dicts in memory: per side, join key -> row ->
    [appearances, associations]. No state store, no checkpoint, no Arrow out:
    the naive alternative of a Python operator that holds its state itself."""

    def __init__(self, join_type: JoinType) -> None:
        self.outer = (join_type.is_outer(0), join_type.is_outer(1))
        self.state: tuple[dict[Any, dict[Row, list[int]]], ...] = (
            defaultdict(dict),
            defaultdict(dict),
        )
        self.out: list[tuple[RowKind, Row]] = []

    def _emit(self, side: int, row: Row, other: Row, kind: RowKind) -> None:
        self.out.append((kind, row + other if side == 0 else other + row))

    def process(self, side: int, row: Row, kind: RowKind) -> None:
        """One changelog row (no upserts, no condition, no null keys)."""
        mine, theirs = self.state[side].get(row[1]), self.state[1 - side].get(row[1], {})
        outer, other_outer = self.outer[side], self.outer[1 - side]
        pad, other_pad = (None,) * len(row), (None,) * 3
        accumulate = kind.is_accumulate
        if outer and not theirs:
            self._emit(side, row, other_pad, RowKind.INSERT if accumulate else RowKind.DELETE)
        joined = (
            kind
            if not (outer or other_outer)
            else (RowKind.INSERT if accumulate else RowKind.DELETE)
        )
        matches = 0
        for m, (appearances, associations) in theirs.items():
            matches += appearances
            for _ in range(appearances):
                if accumulate and other_outer and associations == 0:
                    self._emit(1 - side, m, pad, RowKind.DELETE)
                self._emit(side, row, m, joined)
                if not accumulate and other_outer and associations == 1:
                    self._emit(1 - side, m, pad, RowKind.INSERT)
            theirs[m][1] += 1 if accumulate else -1
        if mine is None:
            mine = self.state[side][row[1]] = {}
        entry = mine.get(row)
        if accumulate:
            mine[row] = [1 if entry is None else entry[0] + 1, matches]
        elif entry is not None:
            entry[0] -= 1
            if not entry[0]:
                del mine[row]


def run_dict(join_type: JoinType, micro: list[MicroBatch]) -> tuple[float, int]:
    """Seconds to run every micro-batch through :class:`DictJoin` (rows read
    from Arrow as the operator reads them), and the output rows."""
    join = DictJoin(join_type)
    started = time.perf_counter()
    out = 0
    for runs in micro:
        for side, batch in runs:
            columns = [batch.column(n).to_pylist() for n in SIDE.names]
            for kind, row in zip(row_kinds(batch), zip(*columns, strict=True), strict=True):
                join.process(side, row, kind)
        out += len(join.out)
        join.out.clear()
    return time.perf_counter() - started, out
