"""The held rows of the changelog join's batch path (operators/join/_batch.py)
on float join keys: NaN, -0.0 and 0.0 find each other as their key bytes do
in the state table, so the batch path emits what record at a time emits."""

from __future__ import annotations

import math
import pickle
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators import RowKind
from operators.join import JoinType, StreamingJoin
from operators.testing import OperatorHarness
from tests.operators.join.test_join_batch import RowAtATime

SIDE = pa.schema([("id", pa.int64()), ("k", pa.float64()), ("v", pa.int64())])
KEYS = [math.nan, -0.0, 0.0, 1.5, None]


def run(join: StreamingJoin, seed: int, path: Path) -> list[Any]:
    """Every emitted row and the final state of both sides, in order (NaN
    written as a string, as NaN equals nothing)."""
    rnd = random.Random(seed)
    live: list[list[tuple[Any, ...]]] = [[], []]
    with OperatorHarness(join, backend="memory", path=path) as h:
        for b in range(20):
            side = rnd.randrange(2)
            rows, kinds = [], []
            for j in range(rnd.randint(1, 8)):
                if live[side] and rnd.random() < 0.3:
                    rows.append(live[side].pop(rnd.randrange(len(live[side]))))
                    kinds.append(RowKind.DELETE)
                else:
                    row = (b * 100 + j, rnd.choice(KEYS), rnd.randrange(3))
                    live[side].append(row)
                    rows.append(row)
                    kinds.append(RowKind.INSERT)
            h.process_rows(rows, kinds, side)
            if b % 6 == 5:
                h.commit()
        h.commit()
        state = [list(h.table(n).scan()) for n in ("left", "right")]
        return [repr(x) for x in [h.output, *state]]


class TestFloatJoinKeys:
    @pytest.mark.parametrize("join_type", [JoinType.INNER, JoinType.FULL])
    @pytest.mark.parametrize("unique", [True, False])
    def test_nan_and_signed_zero_keys(
        self, join_type: JoinType, unique: bool, tmp_path: Path
    ) -> None:
        """With NaN, -0.0, 0.0 and null join keys, the batch path and record
        at a time emit the same rows in the same order and keep the same
        state."""
        key = ["id"] if unique else None
        for seed in range(4):
            made = [
                cls(join_type, SIDE, SIDE, ["k"], ["k"], key, key, right_prefix="r_", name="j")
                for cls in (StreamingJoin, RowAtATime)
            ]
            batched = run(made[0], seed, tmp_path / f"b{seed}")
            single = run(made[1], seed, tmp_path / f"r{seed}")
            assert batched == single, f"seed {seed}"


class TestShippedJoin:
    @pytest.mark.parametrize("join_type", [JoinType.INNER, JoinType.LEFT])
    @pytest.mark.parametrize("unique", [True, False])
    def test_join_unpickled_as_a_spark_task_gets_it(
        self, join_type: JoinType, unique: bool, tmp_path: Path
    ) -> None:
        """A join pickled and loaded again (as the runner ships it to Spark's
        workers) writes each side's rows in its own layout on the batch
        path: the same output and state as the join never pickled."""
        key = ["id"] if unique else None

        def join() -> StreamingJoin:
            return StreamingJoin(join_type, SIDE, SIDE, ["k"], ["k"], key, key, right_prefix="r_")

        from pyspark import cloudpickle

        shipped = pickle.loads(cloudpickle.dumps(join()))
        assert run(shipped, 0, tmp_path / "shipped") == run(join(), 0, tmp_path / "local")
