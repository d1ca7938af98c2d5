"""A stateful query on a Spark cluster of two executor JVMs
(``local-cluster[2,1,1024]``), one of which is SIGKILLed during a batch.

Run as ``python -m tests.operators._cluster_job WORKLOAD ROOT KILL_BATCH``: it
runs the workload once with an executor killed while a task of batch
``KILL_BATCH`` waits after its commit (the kill first, then the pause
released, so the attempt is a zombie for certain and never resumes into a
live JVM), then once undisturbed on a fresh checkpoint, and writes
``ROOT/result.json`` with both outputs, per batch, the reference (the
operator run record at a time without Spark), the attempts of that batch
in partition 0 with the recorded winner, and each run's time. It runs in its
own process because the test session's Spark is ``local[2,3]``, and a JVM
holds one SparkContext.

A workload is a parameter (:data:`WORKLOADS`): the operator, its inputs (one
list of batch tables per input), key and sequence columns, and its reference.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyarrow.fs import LocalFileSystem

from operators import ROW_KIND, Operator, OperatorContext, ParquetSink, RowKind, run_operator
from operators._checkpoint.journal import Journal
from operators._tools.demo import write_batches
from operators.dedup import DropDuplicates
from operators.join import JoinType, StreamingJoin
from operators.testing import OperatorHarness
from statestore import PartitionCheckpoint, _faults

#: A batch's output as a multiset of rows, each ``(row_kind, *output columns)``.
Output = list[Counter[tuple[Any, ...]]]


@dataclass(frozen=True)
class Workload:
    """A query to run on the cluster."""

    operator: Callable[[], Operator]
    #: One list of batch tables per input (the n-th file of each input is
    #: batch n).
    inputs: Callable[[], list[list[pa.Table]]]
    keys: list[list[str]]
    sequence: str | None
    reference: Callable[[list[list[pa.Table]]], Output]
    partitions: int = 4


def _harness_reference(
    operator: Operator, inputs: list[list[pa.Table]], sequence: str | None
) -> Output:
    """Each batch's output of ``operator`` run record at a time, the rows of
    all inputs in sequence order (as the runner sorts each partition)."""
    out: Output = []
    with OperatorHarness(operator) as harness:
        for b in range(len(inputs[0])):
            tagged = []
            for side, batches in enumerate(inputs):
                for i, row in enumerate(batches[b].to_pylist()):
                    tagged.append((row[sequence] if sequence else i, side, row))
            tagged.sort(key=lambda t: (t[0], t[1]))
            emitted: Counter[tuple[Any, ...]] = Counter()
            for side, group in itertools.groupby(tagged, key=lambda t: t[1]):
                rows = [r for _, _, r in group]
                names = operator.inputs[side].names
                for kind, row in harness.process_rows(
                    [tuple(r[n] for n in names) for r in rows],
                    [r.get(ROW_KIND, RowKind.INSERT.value) for r in rows],
                    side=side,
                ):
                    emitted[(kind.value, *row)] += 1
            harness.commit()
            out.append(emitted)
    return out


_SIDE = pa.schema([("k", pa.int64()), ("v", pa.int64())])
_SIDE_FILES = pa.schema([*_SIDE, ("seq", pa.int64()), ("row_kind", pa.string())])


def _join_inputs() -> list[list[pa.Table]]:
    """Per side, 4 batches of a changelog keyed by ``k`` (inserts and deletes
    of earlier rows), with one sequence shared by both sides."""
    rng = random.Random(21)
    live: list[list[tuple[int, int]]] = [[], []]
    files: list[list[pa.Table]] = [[], []]
    seq = 0
    for _ in range(4):
        rows: list[list[dict[str, Any]]] = [[], []]
        for _ in range(200):
            side = rng.randrange(2)
            seq += 1
            if live[side] and rng.random() < 0.3:
                k, v = live[side].pop(rng.randrange(len(live[side])))
                kind = RowKind.DELETE.value
            else:
                k, v = rng.randrange(40), rng.randrange(5)
                live[side].append((k, v))
                kind = RowKind.INSERT.value
            rows[side].append({"k": k, "v": v, "seq": seq, "row_kind": kind})
        for side in (0, 1):
            files[side].append(pa.Table.from_pylist(rows[side], _SIDE_FILES))
    return files


_EVENTS = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("seq", pa.int64())])


def _dedup_inputs() -> list[list[pa.Table]]:
    """4 batches of events with many repeated keys."""
    rng = random.Random(31)
    seq = iter(range(10**6))
    return [
        [
            pa.Table.from_pylist(
                [
                    {"k": rng.randrange(900), "v": rng.randrange(9), "seq": next(seq)}
                    for _ in range(300)
                ],
                _EVENTS,
            )
            for _ in range(4)
        ]
    ]


def _join() -> Operator:
    return StreamingJoin(JoinType.INNER, _SIDE, _SIDE, ["k"], ["k"], right_prefix="r_")


def _dedup() -> Operator:
    return DropDuplicates(_EVENTS, ["k"])


WORKLOADS: dict[str, Workload] = {
    "streaming_join": Workload(
        operator=_join,
        inputs=_join_inputs,
        keys=[["k"], ["k"]],
        sequence="seq",
        reference=lambda inputs: _harness_reference(_join(), inputs, "seq"),
    ),
    "drop_duplicates": Workload(
        operator=_dedup,
        inputs=_dedup_inputs,
        keys=[["k"]],
        sequence="seq",
        reference=lambda inputs: _harness_reference(_dedup(), inputs, "seq"),
    ),
}


class PauseOnce(Operator):
    """``inner``, except that the first task of partition 0 in batch
    ``batch`` arms a pause for its own Python worker at the runner's point
    after the commit (:func:`statestore._faults.arm_pause`): the attempt
    commits, then waits there until its executor is killed, so that a
    committed attempt that nobody records exists for certain and the retry
    commits a second one. Every later attempt runs straight through."""

    def __init__(self, inner: Operator, batch: int, markers: str) -> None:
        self.inner = inner
        self.batch = batch
        self.markers = markers
        self.name = inner.name
        self.tables = inner.tables
        self.inputs = inner.inputs
        self.output = inner.output
        self.sequence_column = inner.sequence_column
        self.consistency = inner.consistency

    def open(self, ctx: OperatorContext) -> None:
        self.inner.open(ctx)

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        self.inner.process_batch(ctx, batch, side)

    def on_watermark(self, ctx: OperatorContext, watermark: int) -> None:
        self.inner.on_watermark(ctx, watermark)

    def on_timer(self, ctx: OperatorContext, timer: Any) -> None:
        self.inner.on_timer(ctx, timer)

    def flush(self, ctx: OperatorContext) -> None:
        self.inner.flush(ctx)

    def close(self, ctx: OperatorContext) -> None:
        self.inner.close(ctx)
        if ctx.batch_id != self.batch or ctx.partition_id != 0:
            return
        try:  # the first attempt only: the file exists once
            os.close(os.open(Path(self.markers, "armed"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
        os.environ[_faults.DIR_ENV_VAR] = self.markers
        _faults.arm_pause(self.markers, PAUSE_POINT, os.getpid())


#: Where the paused attempt waits: committed, its output not yet returned.
PAUSE_POINT = "runner.task_after_commit"


def _executor_of(pid: int) -> int | None:
    """The executor JVM above a Python worker: the first ancestor whose
    command line runs CoarseGrainedExecutorBackend."""
    while pid > 1:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return None
        if b"CoarseGrainedExecutorBackend" in cmdline:
            return pid
        pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid")))
    return None


@dataclass
class Killed:
    """What the killer did: the executor JVM it killed, the paused Python
    worker, the commit id the paused attempt published, and whether that
    worker exited."""

    executor: int | None = None
    worker: int | None = None
    commit_id: str | None = None
    worker_exited: bool = False
    #: When the executor was killed (``time.monotonic()``), and how long the
    #: paused worker took to exit after that.
    at: float = 0.0
    exit_s: float | None = None


def _gone(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` has ended (or is a zombie) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def _killer(
    markers: Path, state: Path, operator: str, batch: int, out: Killed, stop: threading.Event
) -> None:
    """Wait for the paused attempt, SIGKILL its executor JVM, then release
    the pause, and make sure the paused worker exits."""
    while not stop.is_set():
        paused = list(markers.glob(f"{PAUSE_POINT}.paused-*"))
        if not paused:
            time.sleep(0.1)
            continue
        out.worker = int(paused[0].name.rsplit("-", 1)[1])
        # The paused attempt has committed; the retry cannot have yet.
        (out.commit_id,) = PartitionCheckpoint(str(state), operator, 0).commits(batch)
        out.executor = _executor_of(out.worker)
        if out.executor is not None:
            os.kill(out.executor, signal.SIGKILL)
        out.at = time.monotonic()
        paused[0].unlink()  # only now may the worker go on (to a dead JVM)
        out.worker_exited = _gone(out.worker, 60)
        if out.worker_exited:
            out.exit_s = round(time.monotonic() - out.at, 1)
        else:
            os.kill(out.worker, signal.SIGKILL)
        return


def _run(
    spark: Any, workload: Workload, sources: Sequence[Path], root: Path, operator: Operator
) -> Output:
    from pyspark.sql.pandas.types import from_arrow_schema

    frames = [
        spark.readStream.schema(from_arrow_schema(_schema(source)))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
        for source in sources
    ]
    sink = ParquetSink(str(root / "output"))
    query = run_operator(
        frames if len(frames) > 1 else frames[0],
        operator,
        keys=workload.keys if len(frames) > 1 else workload.keys[0],
        partitions=workload.partitions,
        checkpoint=str(root / "checkpoint"),
        sink=sink,
        sequence_column=workload.sequence,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    names = operator.output.names
    out: dict[int, Counter[tuple[Any, ...]]] = {}
    for r in sink.read(spark).collect():
        out.setdefault(r["batch"], Counter())[(r["row_kind"], *(r[n] for n in names))] += 1
    return [out.get(i, Counter()) for i in range(max(out) + 1)] if out else []


def _schema(source: Path) -> pa.Schema:
    import pyarrow.parquet as pq

    return pq.read_schema(sorted(source.glob("*.parquet"))[0])


def _jsonable(output: Output) -> list[list[list[Any]]]:
    return [sorted([[*row, n] for row, n in batch.items()], key=repr) for batch in output]


def main(argv: list[str]) -> None:
    name, root_text, kill_text = argv
    root, kill_batch = Path(root_text), int(kill_text)
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("relstate-cluster-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.log.level", "ERROR")
        .getOrCreate()
    )
    workload = WORKLOADS[name]
    inputs = workload.inputs()
    sources = []
    for side, batches in enumerate(inputs):
        source = root / f"source-{side}"
        write_batches(source, batches)
        sources.append(source)
    markers = root / "markers"
    markers.mkdir(parents=True)
    killed = Killed()
    stop = threading.Event()
    operator = workload.operator()
    state = root / "disturbed" / "checkpoint" / "state"
    thread = threading.Thread(
        target=_killer, args=(markers, state, operator.name, kill_batch, killed, stop), daemon=True
    )
    thread.start()
    paused = PauseOnce(operator, kill_batch, str(markers))
    started = time.monotonic()
    disturbed = _run(spark, workload, sources, root / "disturbed", paused)
    finished = time.monotonic()
    stop.set()
    thread.join(70)
    disturbed_s = finished - started
    killed_after_s = killed.at - started if killed.at else None
    started = time.monotonic()
    calm = _run(spark, workload, sources, root / "calm", workload.operator())
    calm_s = time.monotonic() - started
    checkpoint = PartitionCheckpoint(str(state), operator.name, 0)
    record = Journal(LocalFileSystem(), str(state)).record(kill_batch)
    assert record is not None, f"batch {kill_batch} was not recorded"
    result: Mapping[str, Any] = {
        "killed": asdict(killed),
        "attempts": checkpoint.commits(kill_batch),
        "winner": checkpoint.winner(kill_batch),
        "recorded": record.winners_of(operator.name)[0],
        "seconds": {
            "disturbed": round(disturbed_s, 1),
            "kill_at": None if killed_after_s is None else round(killed_after_s, 1),
            "calm": round(calm_s, 1),
        },
        "disturbed": _jsonable(disturbed),
        "calm": _jsonable(calm),
        "reference": _jsonable(workload.reference(inputs)),
    }
    (root / "result.json").write_text(json.dumps(result))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
