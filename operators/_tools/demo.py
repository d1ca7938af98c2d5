"""``relstate demo``: a complete pipeline on local Spark, in one query.

Two changelogs arrive as Parquet files, one per micro-batch each: orders
(inserts, amount changes as ``-U``/``+U`` pairs, cancellations as ``-D``) and
customers (new customers, and customers moving to another segment as
``-U``/``+U``). One :class:`~operators.Pipeline` runs four stages:

- ``join``: a changelog :class:`~operators.join.StreamingJoin` of orders with
  their customer (a customer who changes segment takes every order along);
- ``segment_revenue``: a :class:`~operators.aggregate.GroupAggregate`, orders
  and revenue per segment;
- ``customer_revenue``: the same per customer;
- ``top_customers``: a :class:`~operators.topn.TopN`, the five customers with
  the most revenue over all customers: a keyless stage (``keys=()``), which
  runs as one partition, as Spark runs a global top.

``segment_revenue`` and ``top_customers`` are the query's two outputs, each
written through its own idempotent Parquet sink. At the end the demo checks
every batch: for each batch N it materialises both output changelogs up to
batch N and compares them with Spark batch SQL (``GROUP BY``,
``ROW_NUMBER() OVER (ORDER BY revenue DESC, customer)``) over the
materialised inputs of batches 0..N, one query per output and batch.

Batches are numbered from 0, as the runner's records, the sink's ``batch``
column and ``relstate inspect`` number them. ``--crash-after N`` kills the
whole pipeline (SIGKILL at the fault point ``runner.driver_after_sink``, no
clean-up) during batch N, after both outputs were written and before the
batch was recorded: the worst moment. ``--resume`` then finishes the run from
the checkpoint, batch N first.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from encoding import Direction, KeyColumn, NullOrder
from operators._api.changelog import RowKind
from operators._engine.graph import Stream
from operators._spark.pipeline import Pipeline
from operators._spark.runner import RelstateQuery
from operators._spark.session import local_spark
from operators._spark.sinks import ParquetSink
from operators.aggregate import Aggregate, GroupAggregate
from operators.errors import InputError, RunnerError
from operators.join import StreamingJoin
from operators.topn import TopN
from operators.typing import BatchSummary
from statestore import FAULT_ENV_VAR, redact

__all__ = [
    "DemoConfig",
    "build_pipeline",
    "check_batches",
    "check_java",
    "expected_tables",
    "join_orders",
    "materialise",
    "materialised",
    "read_batches",
    "revenue_by",
    "run_demo",
    "segment_table",
    "top_table",
    "write_batches",
]

ORDERS = pa.schema(
    [
        ("order_id", pa.int64()),
        ("customer", pa.string()),
        ("amount", pa.int64()),  # in cents
        ("seq", pa.int64()),
        ("row_kind", pa.string()),
    ]
)
CUSTOMERS = pa.schema(
    [
        ("customer", pa.string()),
        ("segment", pa.string()),
        ("seq", pa.int64()),
        ("row_kind", pa.string()),
    ]
)
SEGMENTS = ("enterprise", "mid-market", "smb", "consumer")
TOP = 5


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


def generate(config: DemoConfig) -> list[tuple[pa.Table, pa.Table]]:
    """The two changelogs, one (orders, customers) pair of tables per batch.

    Customers: most are inserted in batch 0, the rest over later batches (an
    order may come before its customer: the join holds it until then); from
    batch 1 on, some move to another segment (``-U`` old, ``+U`` new). Orders:
    new orders of any customer, amount changes of live orders (``-U`` old,
    ``+U`` new) and cancellations (``-D``). One sequence numbers the changes
    of both, in the order they happen."""
    rng = random.Random(config.seed)
    names = [f"customer-{i:04d}" for i in range(config.customers)]
    waiting = rng.sample(names, len(names))
    # Nine in ten customers in batch 0, the others spread over the later batches.
    first = max(1, len(names) * 9 // 10)
    later = -(-(len(names) - first) // max(1, config.batches - 1))
    movers = max(1, len(names) // 20)  # customers changing segment per batch
    segment: dict[str, str] = {}
    live: dict[int, tuple[str, int]] = {}
    next_id, seq = 0, 0
    batches = []
    for number in range(config.batches):
        people: list[tuple[str, str, int, str]] = []
        if number:
            for customer in rng.sample(sorted(segment), min(len(segment), movers)):
                old = segment[customer]
                new = rng.choice([s for s in SEGMENTS if s != old])
                segment[customer] = new
                people.append((customer, old, seq, "-U"))
                people.append((customer, new, seq + 1, "+U"))
                seq += 2
        count = later if number else first
        arriving, waiting = waiting[:count], waiting[count:]
        for customer in arriving:
            segment[customer] = rng.choice(SEGMENTS)
            people.append((customer, segment[customer], seq, "+I"))
            seq += 1
        orders: list[tuple[int, str, int, int, str]] = []
        for _ in range(config.orders_per_batch):
            roll = rng.random()
            if roll < 0.6 or len(live) < 10:
                customer = rng.choice(names)
                amount = rng.randrange(500, 50_000)
                live[next_id] = (customer, amount)
                orders.append((next_id, customer, amount, seq, "+I"))
                next_id += 1
            elif roll < 0.85:
                order = rng.choice(list(live))
                customer, old_amount = live[order]
                new_amount = max(100, old_amount + rng.randrange(-2_000, 2_000))
                live[order] = (customer, new_amount)
                orders.append((order, customer, old_amount, seq, "-U"))
                seq += 1
                orders.append((order, customer, new_amount, seq, "+U"))
            else:
                order = rng.choice(list(live))
                customer, amount = live.pop(order)
                orders.append((order, customer, amount, seq, "-D"))
            seq += 1
        batches.append((_table(ORDERS, orders), _table(CUSTOMERS, people)))
    return batches


def _table(schema: pa.Schema, rows: Iterable[tuple[Any, ...]]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema)


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


def read_batches(spark: Any, directory: Path, schema: pa.Schema) -> Any:
    """The files :func:`write_batches` wrote, with ``schema``, as a streaming
    DataFrame that takes one file per micro-batch."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return (
        spark.readStream.schema(from_arrow_schema(schema))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(directory))
    )


def join_orders(pipeline: Pipeline, orders: Stream, customers: Stream) -> Stream:
    """The stage that joins order changes with their customer's: a changelog
    inner :class:`~operators.join.StreamingJoin` on ``customer`` (a customer
    who changes segment takes every order along), its columns ``o_*`` and
    ``c_*``. The demo's first stage, and the bench's and tests' too."""
    return pipeline.stage(
        StreamingJoin(
            "inner",
            orders.schema,
            customers.schema,
            ["customer"],
            ["customer"],
            left_unique_key=["order_id"],
            right_unique_key=["customer"],
            left_prefix="o_",
            right_prefix="c_",
        ),
        orders,
        customers,
        keys=["customer"],
    )


def revenue_by(joined: pa.Schema, group_by: list[str], name: str) -> GroupAggregate:
    """Orders and revenue (the sum of ``o_amount``) per ``group_by`` of the
    joined changelog :func:`join_orders` gives."""
    return GroupAggregate(
        joined,
        group_by=group_by,
        aggregates=[Aggregate.count(name="orders"), Aggregate.sum("o_amount", "revenue")],
        changelog=True,
        name=name,
    )


def build_pipeline(orders: Any, customers: Any) -> tuple[Pipeline, Stream, Stream]:
    """The demo's pipeline over the two changelogs (streaming DataFrames, or
    Arrow schemas for the harness): the pipeline, the revenue per segment and
    the top customers."""
    pipeline = Pipeline()
    order_changes = pipeline.source(orders, name="orders", sequence="seq")
    customer_changes = pipeline.source(customers, name="customers", sequence="seq")
    joined = join_orders(pipeline, order_changes, customer_changes)
    per_segment = revenue_by(joined.schema, ["c_segment"], "segment_revenue")
    segments = pipeline.stage(per_segment, joined, keys=list(per_segment.key_columns))
    per_customer = revenue_by(joined.schema, ["c_customer", "c_segment"], "customer_revenue")
    customers_revenue = pipeline.stage(per_customer, joined, keys=list(per_customer.key_columns))
    top = TopN(
        customers_revenue.schema,
        order_by=[KeyColumn("revenue", Direction.DESC, NullOrder.LAST), "c_customer"],
        limit=TOP,
        name="top_customers",
    )
    # One top over every customer: a keyless stage, one partition.
    best = pipeline.stage(top, customers_revenue, keys=())
    return pipeline, segments, best


class _Progress:
    """A one-line progress bar per recorded batch, batches numbered from 0 as
    the tables number them."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.started = time.perf_counter()

    def __call__(self, summary: BatchSummary) -> None:
        elapsed = time.perf_counter() - self.started
        print(f"  {self.line(summary['batch_id'], elapsed)}", flush=True)

    def line(self, batch_id: int, elapsed: float) -> str:
        """The progress line once batch ``batch_id`` is done."""
        done = batch_id + 1
        width = 30
        filled = int(width * done / self.total)
        bar = "#" * filled + "." * (width - filled)
        return f"batch {batch_id} done ({done} of {self.total}) [{bar}] {elapsed:6.1f} s"


def run_demo(config: DemoConfig) -> bool:
    """Run (or resume) the demo; prints what it does. Returns whether the
    outputs matched Spark batch SQL over the inputs."""
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
        write_batches(source / "orders", [o for o, _ in batches], "orders")
        write_batches(source / "customers", [c for _, c in batches], "customers")
        state = config.state_location
        print(
            f"relstate demo: {config.batches} batches (0..{config.batches - 1}) of "
            f"{config.orders_per_batch:,} order changes for {config.customers} customers "
            f"(who change segment), {config.partitions} partitions, state in "
            f"{redact(state) if state else config.checkpoint}"
        )
        print(
            "  one query, four stages: join orders with customers, revenue per segment, "
            f"revenue per customer, top {TOP} customers"
        )
    print("  starting Spark (local[2,3]) ...", flush=True)
    spark = local_spark("relstate-demo")
    orders, customers = (
        read_batches(spark, source / name, schema)
        for name, schema in (("orders", ORDERS), ("customers", CUSTOMERS))
    )
    pipeline, segments, top = build_pipeline(orders, customers)
    segment_sink = ParquetSink(str(output / "segment_revenue"))
    top_sink = ParquetSink(str(output / "top_customers"))
    if config.crash_after is not None:
        # Reached once per batch this process runs, the fresh run's first batch 0.
        os.environ[FAULT_ENV_VAR] = f"runner.driver_after_sink@{config.crash_after + 1}"
        print(
            f"  --crash-after {config.crash_after}: the pipeline is killed (SIGKILL) during "
            f"batch {config.crash_after}, once its outputs are written and before the batch "
            f"is recorded; finish it from the checkpoint {config.checkpoint}: "
            f"{config.resume_command()}",
            flush=True,
        )
    query: RelstateQuery = pipeline.start(
        top,
        top_sink,
        checkpoint=str(config.checkpoint),
        partitions=config.partitions,
        trigger={"availableNow": True},
        query_name="relstate_demo",
        state_location=config.state_location,
        progress=_Progress(config.batches),
        more_outputs=[(segments, segment_sink)],
    )
    query.awaitTermination()
    ok = _report(spark, source, segment_sink, top_sink, query, config.batches)
    spark.stop()
    return ok


def expected_tables(
    spark: Any, source: Path, through: int | None = None
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """What the outputs must hold after batch ``through`` (by default the
    last), by Spark batch SQL over the inputs of batches 0..``through``
    materialised: (segment, orders, revenue) per segment, and (customer,
    segment, orders, revenue) of the top customers."""
    for name in ("orders", "customers"):
        # One file per batch, named in batch order (write_batches).
        files = sorted(str(p) for p in (source / name).glob(f"{name}-*.parquet"))
        if through is not None:
            files = files[: through + 1]
        spark.read.parquet(*files).createOrReplaceTempView(f"demo_{name}_changes")
    spark.sql(_LATEST.format(table="orders", key="order_id")).createOrReplaceTempView("demo_orders")
    spark.sql(_LATEST.format(table="customers", key="customer")).createOrReplaceTempView(
        "demo_customers"
    )
    spark.sql(
        "SELECT c.customer, c.segment, o.amount FROM demo_orders o "
        "JOIN demo_customers c ON o.customer = c.customer"
    ).createOrReplaceTempView("demo_joined")
    segments = spark.sql(
        "SELECT segment, COUNT(*) AS orders, SUM(amount) AS revenue FROM demo_joined "
        "GROUP BY segment"
    ).collect()
    top = spark.sql(
        "SELECT customer, segment, orders, revenue FROM ("
        "  SELECT *, ROW_NUMBER() OVER (ORDER BY revenue DESC, customer) AS rank FROM ("
        "    SELECT customer, segment, COUNT(*) AS orders, SUM(amount) AS revenue"
        "    FROM demo_joined GROUP BY customer, segment))"
        f" WHERE rank <= {TOP}"
    ).collect()
    return [tuple(r) for r in segments], [tuple(r) for r in top]


#: A changelog materialised: each key's latest change, unless it is a deletion.
_LATEST = (
    "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY {key} ORDER BY seq DESC) AS n "
    "FROM demo_{table}_changes) WHERE n = 1 AND row_kind IN ('+I', '+U')"
)


def materialised(
    rows: Iterable[Any], columns: list[str], key: list[str] | None = None
) -> Counter[tuple[Any, ...]]:
    """The multiset of ``columns`` an output changelog's rows leave: each
    accumulation counts up, each retraction down, whatever the row order.

    An upsert stream (an aggregate built with ``update_before=False``: ``+U``
    with no ``-U``) is applied by its ``key`` columns instead: each key's
    row of the latest batch (``batch`` column), unless that is a ``-D``.
    Without a key, rows with more ``+U`` than ``-U`` are refused: counted,
    every old row would stay beside its new one."""
    if key is not None:
        latest: dict[tuple[Any, ...], Any] = {}
        for r in sorted(rows, key=lambda r: int(r["batch"])):
            latest[tuple(r[c] for c in key)] = r
        return Counter(
            tuple(r[c] for c in columns)
            for r in latest.values()
            if RowKind(r["row_kind"]) is not RowKind.DELETE
        )
    net: Counter[tuple[Any, ...]] = Counter()
    befores = afters = 0
    for r in rows:
        kind = RowKind(r["row_kind"])
        befores += kind is RowKind.UPDATE_BEFORE
        afters += kind is RowKind.UPDATE_AFTER
        net[tuple(r[c] for c in columns)] += 1 if kind.is_accumulate else -1
    if afters != befores:
        raise InputError(
            f"the changelog has {afters} +U rows but {befores} -U rows: it is an upsert "
            "stream (update_before=False), whose +U replaces its key's row; give its key "
            "columns to materialise it"
        )
    return +net


def materialise(
    rows: Iterable[Any], columns: list[str], key: list[str] | None = None
) -> list[tuple[Any, ...]]:
    """An output changelog's current rows (:func:`materialised`), sorted."""
    return sorted(materialised(rows, columns, key).elements())


def segment_table(rows: Iterable[tuple[str, int, int]]) -> list[str]:
    """Revenue per segment, most first: rows of (segment, orders, revenue in
    cents); the table shows dollars and says so."""
    lines = [
        "Revenue per segment (amounts are stored in cents, shown in dollars):",
        f"  {'segment':<14}{'orders':>8}{'revenue ($)':>16}",
    ]
    for segment, orders, revenue in sorted(rows, key=lambda r: (-r[2], r[0])):
        lines.append(f"  {segment:<14}{orders:>8}{revenue / 100:>16,.2f}")
    return lines


def top_table(rows: Iterable[tuple[str, str, int, int]]) -> list[str]:
    """The top customers by revenue, ranked: rows of (customer, segment,
    orders, revenue in cents); the table shows dollars and says so."""
    lines = [
        f"Top {TOP} customers by revenue (amounts are stored in cents, shown in dollars):",
        f"  {'rank':>4}  {'customer':<16}{'segment':<14}{'orders':>8}{'revenue ($)':>14}",
    ]
    ranked = sorted(rows, key=lambda r: (-r[3], r[0]))
    for rank, (customer, segment, orders, revenue) in enumerate(ranked, 1):
        lines.append(f"  {rank:>4}  {customer:<16}{segment:<14}{orders:>8}{revenue / 100:>14,.2f}")
    return lines


#: The columns of the two outputs the check compares.
SEGMENT_COLUMNS = ("c_segment", "orders", "revenue")
TOP_COLUMNS = ("c_customer", "c_segment", "orders", "revenue")


def check_batches(
    spark: Any, source: Path, segment_rows: list[Any], top_rows: list[Any], batches: int
) -> list[tuple[int, bool]]:
    """Check the outputs after every batch: for each batch N, the output
    changelogs' rows (``segment_rows``, ``top_rows``, with their ``batch``
    column) of batches 0..N materialised against :func:`expected_tables`
    through N. Prints a line per batch; returns (batch, matched) pairs."""
    verdicts = []
    for batch in range(batches):
        segments = materialise(
            (r for r in segment_rows if r["batch"] <= batch), list(SEGMENT_COLUMNS)
        )
        top = materialise((r for r in top_rows if r["batch"] <= batch), list(TOP_COLUMNS))
        want_segments, want_top = expected_tables(spark, source, batch)
        same = segments == sorted(want_segments) and top == sorted(want_top)
        verdicts.append((batch, same))
        print(
            f"  batch {batch}: revenue per segment and the top {TOP} "
            f"{'match' if same else 'DO NOT MATCH'} Spark batch SQL over the inputs of "
            f"batches 0..{batch}",
            flush=True,
        )
    return verdicts


def _report(
    spark: Any,
    source: Path,
    segment_sink: ParquetSink,
    top_sink: ParquetSink,
    query: RelstateQuery,
    batches: int,
) -> bool:
    segment_rows = segment_sink.read(spark).collect()
    top_rows = top_sink.read(spark).collect()
    print(f"\nChecking the outputs after each of the {batches} batches against Spark batch SQL:")
    verdicts = check_batches(spark, source, segment_rows, top_rows, batches)
    same = all(ok for _, ok in verdicts)
    segments = materialise(segment_rows, list(SEGMENT_COLUMNS))
    top = materialise(top_rows, list(TOP_COLUMNS))
    print("\n" + "\n".join(segment_table(segments)))
    print("\n" + "\n".join(top_table(top)))
    print("\nPer-batch metrics (summed over stages and partitions), this run:")
    header = ("batch", "ms", "output rows", "state rows", "updated", "removed")
    print("  " + "".join(f"{h:>12}" for h in header))
    for record in query.history:
        m = record["metrics"]
        cells = (
            record["batch_id"],
            record["duration_ms"],
            m.get("numOutputRows", 0),
            m.get("numTotalStateRows", 0),
            m.get("numUpdatedStateRows", 0),
            m.get("numRemovedStateRows", 0),
        )
        print("  " + "".join(f"{c!s:>12}" for c in cells))
    if same:
        verdict = f"match Spark batch SQL after every batch (0..{batches - 1})"
    else:
        wrong = ", ".join(str(b) for b, ok in verdicts if not ok)
        verdict = f"DO NOT MATCH Spark batch SQL after batches {wrong}"
    print(
        f"\nRevenue per segment and the top {TOP} customers {verdict} "
        "(GROUP BY, ROW_NUMBER() OVER (ORDER BY revenue DESC, customer)) over the "
        "materialised inputs."
    )
    return same
