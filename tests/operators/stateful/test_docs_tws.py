"""The worked example of docs/transform-with-state.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).parents[3] / "docs" / "transform-with-state.md"


@pytest.mark.spark
def test_the_worked_example_counts_clicks(spark: Any) -> None:
    """The page's example, run as pasted, gives the counts its comment says."""
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert code is not None
    # As a script's own classes: pickled by value to Spark's workers.
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(code.group(1), str(DOC), "exec"), namespace)
    rows = namespace["sink"].read(spark).collect()
    assert sorted((r.batch, r.user, r.clicks, r.row_kind) for r in rows) == [
        (0, "ann", 2, "+I"),
        (0, "bob", 1, "+I"),
        (1, "ann", 3, "+I"),
        (1, "cid", 1, "+I"),
    ]
