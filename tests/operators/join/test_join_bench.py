"""The join benchmark's workload and its plain-dict baseline: the baseline
does the same join as StreamingJoin, so the comparison is fair."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.join_workload import DictJoin, changelog, make_join
from operators._api.changelog import row_kinds
from operators.join import JoinType
from operators.testing import OperatorHarness


class TestDictJoin:
    @pytest.mark.parametrize("join_type", list(JoinType))
    @pytest.mark.parametrize("unique_key", [False, True])
    def test_same_output_as_streaming_join(
        self, join_type: JoinType, unique_key: bool, tmp_path: Path
    ) -> None:
        """On the benchmark's changelog the dict baseline emits exactly the
        rows StreamingJoin emits, in the same order."""
        micro = changelog(400, batches=2, run=50, seed=3)
        baseline = DictJoin(join_type)
        with OperatorHarness(make_join(join_type, unique_key), consistency="strict") as harness:
            for runs in micro:
                for side, batch in runs:
                    names = batch.schema.names[:3]
                    rows = zip(*(batch.column(n).to_pylist() for n in names), strict=True)
                    for kind, row in zip(row_kinds(batch), rows, strict=True):
                        baseline.process(side, row, kind)
                    harness.process_batch(batch, side)
                harness.commit()
            assert baseline.out == harness.output
            assert len(baseline.out) > 400
