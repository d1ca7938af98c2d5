"""The examples of docs/first-pipeline.md run as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).parents[2] / "docs" / "first-pipeline.md"


@pytest.mark.spark
def test_the_first_pipeline_runs_as_written(spark: Any) -> None:
    """Every block of the page, run in order in one namespace as pasted,
    runs two batches (a restart between them), reads the output with a
    second query, and checks it against batch SQL (its own asserts)."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 6
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile("\n".join(blocks), str(DOC), "exec"), namespace)
    assert namespace["seen"] == [0, 1]
    changes = spark.sql("SELECT * FROM revenue_changes").collect()
    assert {(r["customer"], r["revenue"], r["row_kind"]) for r in changes} == {
        ("ann", 50, "+I"),
        ("bob", 50, "+I"),
    }
