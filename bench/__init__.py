"""The benchmark behind ``relstate bench``.

Three comparisons, every figure a ratio measured side by side in one run: the
row layout against the cell layout, StateTable against raw rocksdict, and the
batch codecs against per-row encoding. Then checkpoints: the same commit on a
small and a large state, side by side, and the load and replay times of a
partition. ``bench/`` runs the same workloads under pytest-benchmark.
"""

from bench import charts, report
from bench.config import BenchConfig
from bench.measure import Figure, Reading, Section
from bench.runner import BenchResult, Machine, run

__all__ = [
    "BenchConfig",
    "BenchResult",
    "Figure",
    "Machine",
    "Reading",
    "Section",
    "charts",
    "report",
    "run",
]
