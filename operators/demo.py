"""``relstate demo``: a complete pipeline on local Spark.

An orders changelog (inserts, updates as ``-U``/``+U`` pairs, deletes) arrives as
Parquet files, one per micro-batch. The runner keeps revenue per customer (the
:class:`~operators.examples.RunningAggregate` operator) in relstate state
tables, checkpointed under the demo directory, and writes each batch's output
changelog through the idempotent Parquet sink. At the end the demo checks the
output against the same operator run record at a time in memory, with no Spark
and no failures, batch by batch.

Batches are numbered from 0, as the runner's records, the sink's ``batch``
column and ``relstate inspect`` number them. ``--crash-after N`` kills the
whole pipeline (SIGKILL, no clean-up) during batch N, after its output was
written and before it was recorded: the worst moment. ``--resume`` then
finishes the run from the checkpoint, batch N first.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from operators._changelog import RowKind
from operators._runner import RelstateQuery, run_operator
from operators._sinks import ParquetSink
from operators._spark import local_spark
from operators.errors import InputError, RunnerError
from operators.examples import RunningAggregate
from operators.testing import OperatorHarness
from statestore import redact

__all__ = ["DemoConfig", "check_java", "revenue_table", "run_demo", "write_batches"]

ORDERS = pa.schema(
    [
        ("order_id", pa.int64()),
        ("key", pa.string()),  # the customer
        ("value", pa.int64()),  # the amount, in cents
        ("row_kind", pa.string()),
        ("seq", pa.int64()),
    ]
)


@dataclass(frozen=True)
class DemoConfig:
    """The demo's knobs (all have command-line flags)."""

    directory: Path = Path("relstate-demo")
    batches: int = 6
    orders_per_batch: int = 2_000
    customers: int = 300
    partitions: int = 4
    seed: int = 7
    crash_after: int | None = None
    resume: bool = False
    #: Where relstate keeps its state (any pyarrow.fs location); default: the checkpoint.
    state_location: str | None = None

    def __post_init__(self) -> None:
        """Refuse settings the run cannot honour, before Spark starts."""
        for flag, value in (
            ("--batches", self.batches),
            ("--orders", self.orders_per_batch),
            ("--partitions", self.partitions),
        ):
            if value < 1:
                raise InputError(f"{flag} must be at least 1, got {value}")
        if self.customers < 1:
            raise InputError(f"the demo needs at least 1 customer, got {self.customers}")
        if self.crash_after is None:
            return
        if self.resume:
            raise InputError(
                "--crash-after kills a fresh run; --resume finishes one: give one of them"
            )
        if not 0 <= self.crash_after < self.batches:
            raise InputError(
                f"--crash-after {self.crash_after}: this run has batches 0..{self.batches - 1} "
                "(numbered from 0, as the tables number them); give one of them"
            )

    @property
    def checkpoint(self) -> Path:
        """The query's checkpoint directory, inside the demo directory."""
        return self.directory.resolve() / "checkpoint"

    def resume_command(self) -> str:
        """The command that finishes this run from its checkpoint."""
        command = ["relstate demo --resume"]
        if self.directory != DemoConfig.directory:
            command.append(f"--dir {self.directory}")
        if self.batches != DemoConfig.batches:
            command.append(f"--batches {self.batches}")
        if self.orders_per_batch != DemoConfig.orders_per_batch:
            command.append(f"--orders {self.orders_per_batch}")
        if self.partitions != DemoConfig.partitions:
            command.append(f"--partitions {self.partitions}")
        if self.state_location is not None:
            command.append(f"--state-location {redact(self.state_location)}")
        return " ".join(command)


def check_java() -> str:
    """The ``java`` Spark will run, or :class:`RunnerError` saying how to get one."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise RunnerError(
            "relstate demo runs Spark, which needs Java 17 or newer, and no `java` was "
            "found (JAVA_HOME unset and no java on PATH). Install one, for example "
            "`apt-get install openjdk-17-jre-headless`, then run the demo again."
        )
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
        text = out.stderr + out.stdout
        version = text.split('"')[1] if '"' in text else ""
        major = int(version.split(".")[0]) if version[:1].isdigit() else 0
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        major = 0
    if major and major < 17:
        raise RunnerError(
            f"Spark 4 needs Java 17 or newer; {java} is Java {version}. Point JAVA_HOME "
            "at a newer one."
        )
    return java


def generate(config: DemoConfig) -> list[pa.Table]:
    """The orders changelog, one table per batch: new orders, amount changes
    of live orders (``-U`` old, ``+U`` new) and cancellations (``-D``)."""
    rng = random.Random(config.seed)
    live: dict[int, tuple[str, int]] = {}
    next_id, seq = 0, 0
    batches = []
    for _ in range(config.batches):
        rows: list[tuple[int, str, int, str, int]] = []
        for _ in range(config.orders_per_batch):
            roll = rng.random()
            if roll < 0.6 or len(live) < 10:
                customer = f"customer-{rng.randrange(config.customers):04d}"
                amount = rng.randrange(500, 50_000)
                live[next_id] = (customer, amount)
                rows.append((next_id, customer, amount, "+I", seq))
                next_id += 1
            elif roll < 0.85:
                order = rng.choice(list(live))
                customer, old = live[order]
                new = max(100, old + rng.randrange(-2_000, 2_000))
                live[order] = (customer, new)
                rows.append((order, customer, old, "-U", seq))
                seq += 1
                rows.append((order, customer, new, "+U", seq))
            else:
                order = rng.choice(list(live))
                customer, amount = live.pop(order)
                rows.append((order, customer, amount, "-D", seq))
            seq += 1
        batches.append(
            pa.Table.from_pylist([dict(zip(ORDERS.names, r, strict=True)) for r in rows], ORDERS)
        )
    return batches


def write_batches(directory: Path, batches: list[pa.Table], prefix: str = "orders") -> None:
    """Write one Parquet file per batch, each a second newer than the last.

    Spark's file source takes files in modification-time order; files written
    within one tick of the filesystem clock could be taken in either order, so
    each gets its own time, as files arriving one by one would.
    """
    directory.mkdir(parents=True, exist_ok=True)
    start = time.time() - len(batches) - 1
    for i, table in enumerate(batches):
        path = directory / f"{prefix}-{i:04d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (start + i, start + i))


def reference(batches: list[pa.Table]) -> list[Counter[tuple[Any, ...]]]:
    """What each batch must output: the operator run record at a time, in
    memory, with no Spark and no failure."""
    operator = RunningAggregate()
    expected = []
    with OperatorHarness(operator) as harness:
        for table in batches:
            rows = table.select(["key", "value"]).to_pylist()
            emitted = harness.process_rows(
                [(r["key"], r["value"]) for r in rows], table.column("row_kind").to_pylist()
            )
            harness.commit()
            expected.append(Counter((k.value, *row) for k, row in emitted))
    return expected


class _Progress:
    """The sink, then a one-line progress bar per batch, batches numbered
    from 0 as the tables number them; kills the process during batch
    ``crash_after``, once its output is written, saying how to resume."""

    def __init__(self, sink: ParquetSink, total: int, crash_after: int | None, resume: str) -> None:
        self.sink = sink
        self.total = total
        self.crash_after = crash_after
        self.resume = resume
        self.started = time.perf_counter()

    def __call__(self, output: Any, batch_id: int) -> None:
        self.sink(output, batch_id)
        if batch_id == self.crash_after:
            print(
                f"  batch {batch_id}: output written; --crash-after {batch_id} kills the "
                "pipeline now (SIGKILL), before the batch is recorded",
                flush=True,
            )
            print(f"  {self.resume}", flush=True)
            os.kill(os.getpid(), 9)
        print(f"  {self.line(batch_id, time.perf_counter() - self.started)}", flush=True)

    def commit(self, batch_id: int) -> None:
        """The runner recorded the batch: commit it in the sink, for readers."""
        self.sink.commit(batch_id)

    def line(self, batch_id: int, elapsed: float) -> str:
        """The progress line once batch ``batch_id`` is done."""
        done = batch_id + 1
        width = 30
        filled = int(width * done / self.total)
        bar = "#" * filled + "." * (width - filled)
        return f"batch {batch_id} done ({done} of {self.total}) [{bar}] {elapsed:6.1f} s"


def run_demo(config: DemoConfig) -> bool:
    """Run (or resume) the demo; prints what it does. Returns whether the
    output matched the reference."""
    check_java()
    root = config.directory.resolve()
    source, output = root / "source", root / "output"
    batches = generate(config)
    if config.resume:
        if not config.checkpoint.exists():
            raise RunnerError(f"nothing to resume in {root}: run `relstate demo` first")
        print(f"relstate demo: resuming from the checkpoint {config.checkpoint}")
    else:
        shutil.rmtree(root, ignore_errors=True)
        write_batches(source, batches)
        state = config.state_location
        print(
            f"relstate demo: {config.batches} batches (0..{config.batches - 1}) of "
            f"{config.orders_per_batch:,} order changes for {config.customers} customers, "
            f"{config.partitions} partitions, state in "
            f"{redact(state) if state else config.checkpoint}"
        )
    print("  starting Spark (local[2,3]) ...", flush=True)
    spark = local_spark("relstate-demo")
    stream = (
        spark.readStream.schema(_spark_schema())
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
    )
    sink = ParquetSink(str(output))
    query: RelstateQuery = run_operator(
        stream,
        RunningAggregate(),
        keys=["key"],
        partitions=config.partitions,
        checkpoint=str(config.checkpoint),
        sink=_Progress(
            sink,
            config.batches,
            config.crash_after,
            f"finish it from the checkpoint {config.checkpoint}: {config.resume_command()}",
        ),
        sequence_column="seq",
        trigger={"availableNow": True},
        query_name="relstate_demo",
        state_location=config.state_location,
    )
    query.awaitTermination()
    ok = _report(spark, sink, batches, query)
    spark.stop()
    return ok


def revenue_table(final: dict[str, tuple[int, int]]) -> list[str]:
    """The top ten customers by revenue: ``final`` maps a customer to its
    (orders, total in cents); the table shows dollars and says so."""
    lines = [
        "Top customers by revenue (from the output changelog; amounts are stored in "
        "cents, shown in dollars):",
        f"  {'customer':<16}{'orders':>8}{'revenue ($)':>14}",
    ]
    for key, (count, total) in sorted(final.items(), key=lambda kv: (-kv[1][1], kv[0]))[:10]:
        lines.append(f"  {key:<16}{count:>8}{total / 100:>14,.2f}")
    return lines


def _spark_schema() -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(ORDERS)


def _report(spark: Any, sink: ParquetSink, batches: list[pa.Table], query: RelstateQuery) -> bool:
    rows = sink.read(spark).collect()
    got: dict[int, Counter[tuple[Any, ...]]] = {}
    for r in rows:
        got.setdefault(r["batch"], Counter())[
            (r["row_kind"], r["key"], r["count"], r["total"])
        ] += 1
    expected = reference(batches)
    same = all(got.get(i, Counter()) == e for i, e in enumerate(expected))

    # The output is a changelog: what it adds minus what it retracts, as
    # multisets, leaves each customer's current row, whatever the row order.
    net: Counter[tuple[str, int, int]] = Counter()
    for batch in got.values():
        for (kind, key, count, total), n in batch.items():
            net[(key, count, total)] += n if RowKind(kind).is_accumulate else -n
    final = {key: (count, total) for (key, count, total), n in net.items() if n > 0}
    print("\n" + "\n".join(revenue_table(final)))
    print("\nPer-batch metrics (summed over partitions), this run:")
    header = ("batch", "output rows", "state rows", "updated", "removed", "commit ms", "watermark")
    print("  " + "".join(f"{h:>12}" for h in header))
    for record in query.history:
        m = record["metrics"]
        cells = (
            record["batch_id"],
            m.get("numOutputRows", 0),
            m.get("numTotalStateRows", 0),
            m.get("numUpdatedStateRows", 0),
            m.get("numRemovedStateRows", 0),
            m.get("commitTimeMs", 0),
            "-" if record["watermark"] is None else record["watermark"],
        )
        print("  " + "".join(f"{c!s:>12}" for c in cells))
    verdict = "matches" if same else "DOES NOT MATCH"
    print(
        f"\nOutput of all {len(expected)} batches {verdict} the same operator run record at "
        "a time in memory, with no failures."
    )
    return same
