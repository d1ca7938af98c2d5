"""AppendJoin against a reference model of Spark's stream-stream join, on
random inputs: hundreds of seeds through the harness, no Spark.

The model is Spark's algorithm written plainly: per batch, left rows then
right rows each join the other side's list of stored rows and are stored;
then each side's rows at or below its state watermark leave, outer ones that
never matched padded. (A null-key row can never match: only an outer side
keeps it, to pad it.) The operator gets each batch's rows in random chunks
and side order (the runner's shuffle keeps none), and must give the same
rows per batch, as multisets.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest

from operators.join import AppendJoin, TimeRange, TimeWindows, _append
from operators.testing import OperatorHarness

LEFT = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.int64())])
RIGHT = pa.schema([("k", pa.int64()), ("ts", pa.int64()), ("v", pa.int64())])
Row = tuple[Any, ...]


def _even_sum(left: Row, right: Row) -> bool:
    return (left[2] + right[2]) % 2 == 0


@dataclass
class _Stored:
    row: Row
    matched: bool = False


@dataclass
class Model:
    """Spark's stream-stream join, brute force."""

    join_type: str
    time: TimeRange | TimeWindows
    condition: Any
    state: tuple[list[_Stored], list[_Stored]] = field(default_factory=lambda: ([], []))

    def _meets(self, side: int, row: Row, other: Row) -> bool:
        left, right = (row, other) if side == 0 else (other, row)
        if left[0] is None or left[0] != right[0]:
            return False
        if isinstance(self.time, TimeRange):
            lo = left[1] - self.time.before_ms
            ok = lo <= right[1] <= left[1] + self.time.after_ms
        else:
            size = self.time.size_ms
            ok = left[1] // size == right[1] // size
        return ok and (self.condition is None or self.condition(left, right))

    def _lateness_time(self, row: Row) -> int:
        """Spark's late rule looks at the stream's event-time column: the row's
        time, or (windows) its window's end."""
        if isinstance(self.time, TimeRange):
            return row[1]
        size = self.time.size_ms
        return row[1] // size * size + size

    def batch(
        self, late: int | None, wm: int | None, sides: tuple[list[Row], list[Row]]
    ) -> Counter[Row]:
        out: Counter[Row] = Counter()
        outer = {"inner": (), "left": (0,), "right": (1,), "full": (0, 1)}[self.join_type]
        for side in (0, 1):
            for row in sides[side]:
                if late is not None and self._lateness_time(row) <= late:
                    continue
                stored = _Stored(row)
                for other in self.state[1 - side]:
                    if self._meets(side, row, other.row):
                        out[row + other.row if side == 0 else other.row + row] += 1
                        other.matched = stored.matched = True
                if row[0] is not None or side in outer:
                    self.state[side].append(stored)
        if wm is None:
            return out
        for side in (0, 1):
            keep = []
            for s in self.state[side]:
                if isinstance(self.time, TimeRange):
                    bound = self.time.after_ms if side == 0 else self.time.before_ms
                    gone = s.row[1] <= wm - bound - 1
                else:
                    size = self.time.size_ms
                    gone = s.row[1] // size * size + size <= wm
                if not gone:
                    keep.append(s)
                elif side in outer and not s.matched:
                    pad = (None, None, None)
                    out[s.row + pad if side == 0 else pad + s.row] += 1
            self.state[side][:] = keep
        return out


def _rows(rng: random.Random, base: int, keys: int) -> list[Row]:
    out = []
    for _ in range(rng.randrange(0, 12)):
        key = None if rng.random() < 0.05 else rng.randrange(keys)
        out.append((key, base + rng.randrange(-4_000, 6_000), rng.randrange(6)))
    return out


@pytest.mark.parametrize("seed", range(200))
def test_matches_the_model(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random batches, join types, ranges (lopsided, negative bounds),
    windows and conditions give the model's rows, batch by batch; odd seeds
    read the other side by one scan per run of overlapping time ranges, even
    ones by one scan over all the times a batch reaches."""
    monkeypatch.setattr(_append, "_SEEK_ROWS", 0 if seed % 2 else 10**9)
    rng = random.Random(seed)
    join_type = rng.choice(["inner", "left", "right", "full"])
    time: TimeRange | TimeWindows
    if rng.random() < 0.25:
        time = TimeWindows(rng.choice([1_000, 3_000]))
    else:
        before = rng.randrange(-1_500, 3_000)
        time = TimeRange(before, rng.randrange(max(0, -before), 3_000))
    condition = _even_sum if rng.random() < 0.3 else None
    delay, keys = rng.choice([0, 1_000, 3_000]), rng.choice([1, 3, 8])
    op = AppendJoin(LEFT, RIGHT, ["k"], ["k"], "ts", "ts", time, join_type, condition, "l_", "r_")
    model = Model(join_type, time, condition)
    seen: dict[int, int] = {}
    wm: int | None = None
    with OperatorHarness(op) as h:
        for b in range(rng.randrange(3, 8)):
            late = wm
            if len(seen) == 2:
                wm = max(wm or -(2**62), min(seen.values()) - delay)
            sides = (_rows(rng, 10_000 + 2_000 * b, keys), _rows(rng, 10_000 + 2_000 * b, keys))
            for side in (0, 1):
                if sides[side]:
                    seen[side] = max(seen.get(side, -(2**62)), max(r[1] for r in sides[side]))
            expected = model.batch(late, wm, sides)
            start = len(h.output)
            if wm is not None:
                h.advance_watermark(wm)
            chunks = [(s, sides[s][i : i + 3]) for s in (0, 1) for i in range(0, len(sides[s]), 3)]
            rng.shuffle(chunks)
            for side, chunk in chunks:
                h.process_rows(chunk, side=side)
            h.commit()
            assert Counter(row for _, row in h.output[start:]) == expected, f"batch {b}"
            stored = sum(len(s) for s in model.state)
            m = h.last_metrics
            assert m["left.numTotalStateRows"] + m["right.numTotalStateRows"] == stored
