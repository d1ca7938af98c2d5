"""The workloads of ``relstate bench --suite flink``: each changelog operator
on a changelog, written for relstate (an operator and its micro-batches) and
for Flink SQL (tables over files and a query), with the output columns the
two sides are compared on.

The changelogs are the other suites': the join suite's (``join_workload``),
the aggregate and top-N suites' (``relational_workload``: inserts, updates
that move ``v``, deletes), and an append stream for deduplication.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pyarrow as pa

from bench.debezium import write_debezium, write_json
from bench.join_workload import changelog, make_join, run_dict
from bench.relational_workload import APPEND, append_stream, changelog_stream
from bench.suites import SuiteUsageError
from encoding import Direction, KeyColumn
from operators._api.changelog import ROW_KIND
from operators._api.operator import Operator
from operators.aggregate import Aggregate, GroupAggregate
from operators.dedup import Deduplicate
from operators.join import HELD_ROWS, JoinType
from operators.topn import TopN

__all__ = ["NAMES", "TOP", "FlinkInput", "MicroBatch", "Workload", "workloads"]

#: One micro-batch of relstate's input: runs of (side, rows), in order.
MicroBatch = list[tuple[int, pa.RecordBatch]]
#: Rows of the top-N per partition.
TOP = 3
_SQL_TYPES = {pa.int64(): "BIGINT", pa.string(): "STRING"}


@dataclass(frozen=True)
class FlinkInput:
    """One source table of a Flink query, over one file of the input's rows
    in order."""

    name: str
    schema: pa.Schema
    #: The rows, in the order both sides read them (with the row-kind
    #: column for a changelog).
    tables: Sequence[pa.Table]
    #: Declared to Flink as ``PRIMARY KEY ... NOT ENFORCED``.
    primary_key: Sequence[str] = ()
    #: A changelog (debezium-json), or an append stream (json).
    changelog: bool = True
    #: A processing-time attribute ``pt`` for Flink's deduplication.
    proctime: bool = False

    def write(self, directory: Path) -> Path:
        """The input's file under ``directory/<name>``; returns the directory."""
        folder = directory / self.name
        names = self.schema.names
        if self.changelog:
            write_debezium(self.tables, names, folder / "part-0.json")
        else:
            write_json(self.tables, names, folder / "part-0.json")
        return folder

    def ddl(self, folder: Path) -> str:
        """Flink's ``CREATE TABLE`` of the input over ``folder``."""
        columns = [f"`{f.name}` {_SQL_TYPES[f.type]}" for f in self.schema]
        if self.proctime:
            columns.append("pt AS PROCTIME()")
        if self.primary_key:
            columns.append(f"PRIMARY KEY ({', '.join(self.primary_key)}) NOT ENFORCED")
        fmt = "debezium-json" if self.changelog else "json"
        return (
            f"CREATE TABLE {self.name} ({', '.join(columns)}) WITH ('connector'='filesystem', "
            f"'path'='{folder}', 'format'='{fmt}')"
        )

    def scan(self) -> str:
        """A query that reads every row of the input and does nothing else."""
        return f"SELECT {', '.join(f'`{n}`' for n in self.schema.names)} FROM {self.name}"


@dataclass(frozen=True)
class Workload:
    """One operator on one changelog, on both sides."""

    name: str
    #: What it is, for the page.
    label: str
    #: Changelog rows in (every input's, updates counted as two).
    rows: int
    operator: Callable[[], Operator]
    micro: list[MicroBatch]
    inputs: Sequence[FlinkInput]
    #: Flink's query, its output columns in the order of ``output``.
    sql: str
    #: The output columns compared, relstate's names, with their types.
    output: pa.Schema
    #: Whether Flink's mini-batch applies to the query's operator.
    mini_batch: bool
    #: The same operator on plain Python dicts, where a suite has one (the
    #: join suite's ``DictJoin``): its seconds over ``micro``.
    in_dicts: Callable[[], float] | None = None
    #: Where relstate's operator writes an upsert changelog keyed by these
    #: columns, without ``-U`` rows, as Flink's does into the ``blackhole``
    #: (its planner leaves out UPDATE_BEFORE where the sink takes none):
    #: its output is applied as one (``final_table``).
    upsert_key: tuple[str, ...] = ()

    def scan(self) -> str:
        """Flink's query that reads the inputs and does nothing else."""
        return " UNION ALL ".join(i.scan() for i in self.inputs)

    def sink_columns(self) -> str:
        """The columns of a sink of the query's output, for ``CREATE TABLE``."""
        return ", ".join(f"`{f.name}` {_SQL_TYPES[f.type]}" for f in self.output)

    def scan_columns(self) -> str:
        """The columns of a sink of :meth:`scan`, for ``CREATE TABLE``."""
        return ", ".join(f"`{f.name}` {_SQL_TYPES[f.type]}" for f in self.inputs[0].schema)


def _whole(tables: Sequence[pa.Table]) -> list[MicroBatch]:
    """One micro-batch per table, of input 0."""
    return [[(0, b)] for t in tables for b in t.combine_chunks().to_batches()[:1]]


def _joins(rows: int) -> list[Workload]:
    per_side = rows // 2
    micro = changelog(per_side, batches=5, seed=1)
    sides = [
        [pa.Table.from_batches([b]) for m in micro for s, b in m if s == side] for side in (0, 1)
    ]
    out: list[Workload] = []
    for join_type in (JoinType.INNER, JoinType.FULL):
        for unique in (True, False):
            name = f"join_{join_type.value}_{'uk' if unique else 'nouk'}"
            key = ["id"] if unique else []
            left, right = (
                FlinkInput(f"{name}_{s}", _schema(sides[i][0]), sides[i], key)
                for i, s in enumerate(("l", "r"))
            )
            sql_join = "JOIN" if join_type is JoinType.INNER else "FULL OUTER JOIN"
            # relstate's best configuration, as Flink gets its own (see the
            # page): each side held whole however large, and each
            # micro-batch joined whole.
            held_rows = max(HELD_ROWS, per_side)
            join = make_join(join_type, unique, held_rows, whole_micro_batch=True)
            out.append(
                Workload(
                    name,
                    f"changelog join, {join_type.value}, "
                    f"{'a unique key (id) a side' if unique else 'no unique key'}",
                    2 * per_side,
                    partial(make_join, join_type, unique, held_rows, True),
                    micro,
                    (left, right),
                    f"SELECT l.id, l.k, l.v, r.id, r.k, r.v FROM {left.name} AS l {sql_join} "
                    f"{right.name} AS r ON l.k = r.k",
                    join.output,
                    mini_batch=True,
                    in_dicts=partial(_seconds, run_dict, join_type, micro),
                )
            )
    return out


def _seconds(run: Callable[..., tuple[float, int]], *args: object) -> float:
    return run(*args)[0]


def _schema(table: pa.Table) -> pa.Schema:
    """A changelog table's columns, without the row kind."""
    return pa.schema([f.with_nullable(True) for f in table.schema if f.name != ROW_KIND])


#: Every workload's name, in the suite's order.
NAMES = (
    "join_inner_uk",
    "join_inner_nouk",
    "join_full_uk",
    "join_full_nouk",
    "aggregate",
    "topn",
    "dedup_first",
    "dedup_last",
)


def workloads(rows: int, seed: int = 1, only: Collection[str] | None = None) -> list[Workload]:
    """Every workload (``only``: those named), each about ``rows``
    changelog rows; a changelog only the workloads left out would read is
    not made. A name not in :data:`NAMES` is a
    :class:`~bench.suites.SuiteUsageError`."""
    wanted = set(NAMES if only is None else only)
    unknown = wanted.difference(NAMES)
    if unknown:
        raise SuiteUsageError(f"no Flink workload {sorted(unknown)}; there are {list(NAMES)}")
    out: list[Workload] = []
    if wanted.intersection(NAMES[:4]):
        out += _joins(rows)
    if wanted.intersection(("aggregate", "topn")):
        out += _on_changes(rows, seed)
    if wanted.intersection(("dedup_first", "dedup_last")):
        out += _dedups(rows, seed)
    return [w for w in out if w.name in wanted]


def _on_changes(rows: int, seed: int) -> list[Workload]:
    """The group aggregate and top-N over one changelog."""
    initial, changes = rows // 2, rows // 16
    groups = max(rows // 20, 1)
    stream = changelog_stream(initial, changes, 6, groups, seed=seed)
    aggregates = [
        Aggregate.count(),
        Aggregate.sum("v", "sum_v"),
        Aggregate.min("v", "min_v"),
        Aggregate.max("v", "max_v"),
        Aggregate.count_distinct("v", "distinct_v"),
    ]
    group = GroupAggregate(APPEND, ["k"], aggregates, update_before=False)
    changes_in = FlinkInput("agg_src", APPEND, stream)
    topn_in = FlinkInput("topn_src", APPEND, stream)
    top = TopN(APPEND, [KeyColumn("v", Direction.DESC), "id"], TOP, ["k"])
    total = sum(t.num_rows for t in stream)
    return [
        Workload(
            "aggregate",
            "group aggregate: count(*), sum, min, max, count(distinct) of v by k",
            total,
            lambda: GroupAggregate(APPEND, ["k"], aggregates, update_before=False),
            _whole(stream),
            (changes_in,),
            f"SELECT k, COUNT(*), SUM(v), MIN(v), MAX(v), COUNT(DISTINCT v) FROM "
            f"{changes_in.name} GROUP BY k",
            group.output,
            mini_batch=True,
            upsert_key=("k",),
        ),
        Workload(
            "topn",
            f"top-{TOP} by v desc (id breaks ties) per k, updates moving rows in and out",
            total,
            lambda: TopN(APPEND, [KeyColumn("v", Direction.DESC), "id"], TOP, ["k"]),
            _whole(stream),
            (topn_in,),
            f"SELECT k, v, id FROM (SELECT k, v, id, ROW_NUMBER() OVER (PARTITION BY k "
            f"ORDER BY v DESC, id ASC) AS rn FROM {topn_in.name}) WHERE rn <= {TOP}",
            top.output,
            mini_batch=False,
        ),
    ]


def _dedups(rows: int, seed: int) -> list[Workload]:
    """Deduplication keeping the first and the last row, over one append stream."""
    appended = append_stream(rows, max(rows // 10, 1), 10, seed=seed)
    dedup: list[Workload] = []
    for keep in ("first", "last"):
        source = FlinkInput(f"dedup_{keep}_src", APPEND, appended, changelog=False, proctime=True)
        order = "ASC" if keep == "first" else "DESC"
        dedup.append(
            Workload(
                f"dedup_{keep}",
                f"deduplication on processing time, keep {keep}, over an append stream",
                rows,
                partial(Deduplicate, APPEND, ["k"], keep=keep),
                _whole(appended),
                (source,),
                f"SELECT k, v, id FROM (SELECT k, v, id, ROW_NUMBER() OVER (PARTITION BY k "
                f"ORDER BY pt {order}) AS rn FROM {source.name}) WHERE rn = 1",
                APPEND,
                mini_batch=True,
                upsert_key=("k",) if keep == "last" else (),
            )
        )
    return dedup
