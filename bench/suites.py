"""The operator suites of ``relstate bench --suite NAME``, by name.

Each suite is a module with ``run(quick, workdir, progress, scale=1) ->
SuiteResult``, ``scale`` times its default size; it is imported only when
asked for, since most start Spark. A suite may take more options (the
Flink suite: ``only``, ``rounds``); one it is given and cannot take, such
as a workload it does not have, is a :class:`SuiteUsageError`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from bench.versus import SuiteResult

__all__ = ["STORE", "SUITES", "Suite", "SuiteUsageError", "load"]

#: The state-store benchmark (encodings, StateTable vs raw, checkpoints).
STORE = "store"

#: Suite name -> its module.
SUITES: dict[str, str] = {
    "join": "bench.suite_join",
    "append_join": "bench.suite_append_join",
    "dedup": "bench.suite_dedup",
    "fkjoin": "bench.suite_fkjoin",
    "aggregate": "bench.suite_aggregate",
    "topn": "bench.suite_topn",
    "pipeline": "bench.suite_pipeline",
    "flink": "bench.suite_flink",
    "tws": "bench.suite_tws",
}


class SuiteUsageError(ValueError):
    """A suite was given an option value it cannot take."""


class Suite(Protocol):
    """What a suite module provides."""

    def __call__(
        self,
        quick: bool,
        workdir: Path,
        progress: Callable[[str], None],
        scale: int = 1,
        **options: Any,
    ) -> SuiteResult: ...


def load(name: str) -> Suite:
    """The ``run`` function of suite ``name``."""
    if name not in SUITES:
        raise KeyError(f"no benchmark suite {name!r}; there are {[STORE, *sorted(SUITES)]}")
    run: Suite = importlib.import_module(SUITES[name]).run
    return run
