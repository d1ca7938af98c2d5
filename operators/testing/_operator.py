"""``OperatorHarness``: run an operator record at a time, without Spark.

Feed rows one by one (or in batches) with a row kind and a side, advance the
watermark and processing time, commit, restore a committed version, and get
back exactly what the operator emitted, in order. This is how the seeds' emit
rules are tested.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from operators._api.changelog import ROW_KIND, RowKind, row_kinds
from operators._api.dirty import InputPolicy, UnknownRetractions
from operators._api.operator import Operator
from operators._engine.task import BatchRun, state_metrics, state_tables
from operators.errors import InputError
from statestore import (
    ConsistencyMode,
    StateStore,
    StateTable,
    StoreConfig,
    StoreTables,
)

__all__ = ["Emitted", "OperatorHarness"]

#: One emitted row: its kind and its values.
Emitted = tuple[RowKind, tuple[Any, ...]]


class _StoreState:
    """Tables in a state store: in memory, or a real :class:`StateStore` with
    its checkpoint on local disk."""

    def __init__(self, store: StoreTables) -> None:
        self.store = store
        self.store.load(None)
        self._commit_ids: dict[int, str] = {}

    @property
    def tables(self) -> Mapping[str, StateTable]:
        return self.store.tables

    def commit(self, version: int) -> None:
        # After a restore a version may be committed again; a load names the
        # newest attempt, so that it is not ambiguous.
        self._commit_ids[version] = self.store.commit(version).commit_id

    def load(self, version: int | None) -> None:
        commit_id = None if version is None else self._commit_ids.get(version)
        self.store.load(version, commit_id)

    def close(self) -> None:
        self.store.close()


class OperatorHarness:
    """Runs ``operator`` on one partition, a row or a batch at a time.

    ``backend="memory"`` keeps state in memory; ``"rocksdb"`` uses a real
    :class:`~statestore.StateStore` (RocksDB and checkpoints) under ``path`` (a
    temporary directory by default). ``consistency`` overrides the operator's
    :attr:`~operators.Operator.consistency`. Every call returns what the
    operator emitted during it; :attr:`output` holds everything emitted so far.
    """

    def __init__(
        self,
        operator: Operator,
        backend: str = "memory",
        path: str | Path | None = None,
        partition_id: int = 0,
        consistency: ConsistencyMode | str | None = None,
        partition_count: int = 1,
        unknown_retractions: UnknownRetractions | str | None = None,
        policy: InputPolicy | None = None,
    ) -> None:
        self.operator = operator
        #: How the operator treats dirty input (operators/_dirty.py):
        #: ``policy``, else the default with ``unknown_retractions``.
        self.policy = policy or InputPolicy.of(unknown_retractions, None, operator.name)
        #: The first retraction of an unknown row the last committed batch
        #: met (``(side, row)``), if any.
        self.last_unknown_example: tuple[int, tuple[Any, ...]] | None = None
        #: The rows the last committed batch set aside (``bad_rows="set_aside"``).
        self.last_set_aside: list[dict[str, Any]] = []
        self.partition_id = partition_id
        self.partition_count = partition_count
        schemas = state_tables(operator)
        mode = ConsistencyMode(operator.consistency if consistency is None else consistency)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._state: _StoreState
        if backend == "memory":
            self._state = _StoreState(
                StateStore.in_memory(operator.name, partition_id, schemas, mode)
            )
        elif backend == "rocksdb":
            if path is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="relstate-harness-")
                path = self._tmp.name
            root = Path(path)
            config = StoreConfig(local_dir=str(root / "local"), snapshot_interval=3)
            self._state = _StoreState(
                StateStore(
                    str(root / "checkpoint"), operator.name, partition_id, schemas, config, mode
                )
            )
        else:
            raise ValueError(f"backend must be 'memory' or 'rocksdb', got {backend!r}")
        #: The id of the batch in progress (the version its commit makes).
        self.batch_id = 0
        self.watermark: int | None = None
        self.processing_time = 0
        self.output: list[Emitted] = []
        #: The counters of the last committed batch: the operator's own (such
        #: as ``numLateRowsDropped``), ``numOutputRows`` and the state metrics.
        self.last_metrics: dict[str, int] = {}
        self._watermarks: dict[int, int | None] = {}
        self._committed: int | None = None
        self._run: BatchRun | None = None

    # -- state ----------------------------------------------------------------------

    @property
    def tables(self) -> Mapping[str, StateTable]:
        """The operator's state tables (the timer table too), current: in
        the middle of a batch the operator first writes what it holds back
        (:meth:`~operators.Operator.flush`)."""
        if self._run is not None:
            self._run.flush()
        return self._state.tables

    def table(self, name: str) -> StateTable:
        """One of the operator's state tables, current (as :attr:`tables`)."""
        return self.tables[name]

    @property
    def metrics(self) -> dict[str, int]:
        """The counters the operator added to in the batch in progress, with
        what it holds back written (as :attr:`tables`)."""
        if self._run is None:
            return {}
        self._run.flush()
        return dict(self._run.metrics)

    # -- feeding ----------------------------------------------------------------------

    def _batch_run(self) -> BatchRun:
        if self._run is None:
            self._run = BatchRun(
                self.operator,
                self._state.tables,
                self.batch_id,
                self.partition_id,
                self.watermark,
                self.watermark,
                self.processing_time,
                partition_count=self.partition_count,
                policy=self.policy,
            )
        return self._run

    def _emitted(self, run: BatchRun, batch: pa.RecordBatch | None = None) -> list[Emitted]:
        """What ``run`` emitted since the last drain (or ``batch``, what its
        ``finish`` returned), added to :attr:`output`."""
        batch = run.drain() if batch is None else batch
        names = [f.name for f in self.operator.output]
        columns = [batch.column(n).to_pylist() for n in names]
        rows = list(zip(*columns, strict=True)) if columns else [()] * batch.num_rows
        out = list(zip(row_kinds(batch), rows, strict=True))
        self.output.extend(out)
        return out

    def process_element(
        self, row: Sequence[Any], kind: RowKind | str = RowKind.INSERT, side: int = 0
    ) -> list[Emitted]:
        """Process one row of input ``side`` with its row kind."""
        return self.process_rows([row], [kind], side)

    def process_rows(
        self,
        rows: Iterable[Sequence[Any]],
        kinds: Iterable[RowKind | str] | None = None,
        side: int = 0,
    ) -> list[Emitted]:
        """Process rows of input ``side`` as one Arrow batch (kinds default to
        inserts)."""
        rows = list(rows)
        kind_list = [RowKind.INSERT] * len(rows) if kinds is None else list(kinds)
        if len(kind_list) != len(rows):
            raise ValueError(f"{len(rows)} rows but {len(kind_list)} row kinds")
        # Unknown symbols go into the batch as they are: check_input rejects them.
        symbols = [k.value if isinstance(k, RowKind) else k for k in kind_list]
        if not 0 <= side < len(self.operator.inputs):
            raise InputError(
                f"operator {self.operator.name!r} has {len(self.operator.inputs)} input(s); "
                f"got side {side}"
            )
        schema = self.operator.inputs[side]
        for row in rows:
            if len(row) != len(schema):
                raise InputError(
                    f"input {side} of operator {self.operator.name!r} has columns "
                    f"{schema.names}; got a row of {len(row)} values: {tuple(row)!r}"
                )
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
        try:
            arrays = [pa.array(list(c), type=f.type) for c, f in zip(columns, schema, strict=True)]
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise InputError(
                f"rows of input {side} of operator {self.operator.name!r} do not fit its "
                f"schema {schema.names}: {exc}"
            ) from exc
        try:
            arrays.append(pa.array(symbols, type=pa.string()))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise InputError(
                f"row kinds must be RowKind or '+I', '-U', '+U', '-D'; got {symbols!r}"
            ) from exc
        batch = pa.RecordBatch.from_arrays(
            arrays, schema=pa.schema([*schema, pa.field(ROW_KIND, pa.string())])
        )
        return self.process_batch(batch, side)

    def process_batch(self, batch: pa.RecordBatch, side: int = 0) -> list[Emitted]:
        """Process one Arrow batch of input ``side`` (with or without a row-kind
        column), as the Spark runner would."""
        run = self._batch_run()
        run.process(side, batch)
        return self._emitted(run)

    def process_arrow(self, batch: pa.RecordBatch, side: int = 0) -> pa.RecordBatch:
        """Process one Arrow batch of input ``side`` as :meth:`process_batch`
        does, and return what the operator emitted as the Spark runner hands
        it on: one Arrow batch of the output schema plus the row-kind column,
        not made into Python rows and not added to :attr:`output`."""
        run = self._batch_run()
        run.process(side, batch)
        return run.drain()

    def advance_watermark(self, watermark: int) -> list[Emitted]:
        """Move the event-time watermark (milliseconds) forward: due event-time
        timers fire, then the operator's ``on_watermark``."""
        if self.watermark is not None and watermark <= self.watermark:
            return []
        run = self._batch_run()
        run.previous_watermark, run.watermark = self.watermark, watermark
        self.watermark = watermark
        run.fire_timers()
        run.advance_watermark()
        return self._emitted(run)

    def set_processing_time(self, now: int) -> list[Emitted]:
        """Move processing time (milliseconds) to ``now``: due processing-time
        timers fire."""
        self.processing_time = now
        run = self._batch_run()
        run.processing_time = now
        run.fire_timers()
        return self._emitted(run)

    def run_batch(
        self,
        runs: Iterable[tuple[int, pa.RecordBatch]],
        watermark: int | None = None,
        processing_time: int | None = None,
    ) -> list[Emitted]:
        """Run one whole micro-batch as a Spark task does and commit it: the
        batch's ``watermark`` in force from its first row (rows are late
        against the previous one), the ``runs`` of input (side, batch) in
        order, due timers, the watermark's advance, the commit."""
        if self._run is not None:
            raise InputError("a batch is in progress: commit it before run_batch")
        if processing_time is not None:
            self.processing_time = processing_time
        previous = self.watermark
        if watermark is not None and (previous is None or watermark > previous):
            self.watermark = watermark
        self._run = BatchRun(
            self.operator,
            self._state.tables,
            self.batch_id,
            self.partition_id,
            self.watermark,
            previous,
            self.processing_time,
            partition_count=self.partition_count,
            policy=self.policy,
        )
        emitted: list[Emitted] = []
        for side, batch in runs:
            emitted += self.process_batch(batch, side)
        self._run.fire_timers()
        self._run.advance_watermark()
        emitted += self._emitted(self._run)
        before = len(self.output)
        self.commit()
        return emitted + self.output[before:]

    # -- versions -----------------------------------------------------------------------

    def commit(self) -> int:
        """Finish the batch in progress and commit it; returns its batch id.

        As the Spark runner does at the end of a batch, timers that came due
        during it (registered at or below the watermark or processing time)
        fire first."""
        run = self._batch_run()
        run.fire_timers()
        # Rows emitted by the operator's close come back from finish.
        self._emitted(run, run.finish())
        return self._commit(run)

    def commit_arrow(self) -> tuple[int, pa.RecordBatch]:
        """:meth:`commit`, with what the operator emitted as the batch
        finished (due timers, :meth:`~operators.Operator.flush`, ``close``)
        returned as :meth:`process_arrow` returns it: one Arrow batch, not
        made into Python rows and not added to :attr:`output`. Returns the
        batch id and that batch."""
        run = self._batch_run()
        run.fire_timers()
        finished = run.finish()
        return self._commit(run), finished

    def _commit(self, run: BatchRun) -> int:
        """Commit the finished ``run``; returns its batch id."""
        metrics = {**run.metrics, **state_metrics(self._state.tables)}
        version = self.batch_id
        self._state.commit(version)
        self.last_metrics = metrics
        self.last_unknown_example = run.unknown_example
        self.last_set_aside = run.set_aside
        self._watermarks[version] = self.watermark
        self._committed = version
        self.batch_id += 1
        self._run = None
        return version

    def restore(self, version: int | None) -> None:
        """Drop the batch in progress and go back to committed ``version``
        (``None``: the empty state); the next commit is ``version + 1``."""
        self._run = None
        self._state.load(version)
        self.watermark = None if version is None else self._watermarks.get(version)
        self.batch_id = 0 if version is None else version + 1
        self._committed = version

    def close(self) -> None:
        """Release the state (and the temporary directory)."""
        self._state.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> OperatorHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
