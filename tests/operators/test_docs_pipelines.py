"""The examples of docs/pipelines.md run as written."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).parents[2] / "docs" / "pipelines.md"


@pytest.mark.spark
def test_the_worked_example_runs_and_gives_its_revenue(spark: Any) -> None:
    """The example's code, run as pasted, leaves revenue 95 for retail and
    no smb row after its two batches, as its comments say."""
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert code is not None
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(code.group(1), str(DOC), "exec"), namespace)
    rows = namespace["sink"].read(spark).collect()
    table: dict[str, int] = {}
    for r in sorted(
        rows, key=lambda r: (r["batch"], r["row_kind"] != "-U" and r["row_kind"] != "-D")
    ):
        if r["row_kind"] in ("-U", "-D"):
            del table[r["c_segment"]]
        else:
            table[r["c_segment"]] = r["revenue"]
    assert table == {"retail": 95}


def test_the_keyless_stage_example_gives_the_top_two() -> None:
    """The keyless-stage example, run as pasted (in the harness), gives the
    top two customers its comment names, from a top stage of one partition."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    keyless = [b for b in blocks if "keys=()" in b]
    assert len(keyless) == 1
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(textwrap.dedent(keyless[0]), str(DOC), "exec"), namespace)
    rows = namespace["out"]["top"].to_pylist()
    assert sorted((r["customer"], r["revenue"], r["row_kind"]) for r in rows) == [
        ("a", 9, "+I"),
        ("b", 7, "+I"),
    ]
    assert [len(h) for h in namespace["harness"].harnesses] == [4, 1]
