"""A test driver for the foreign-key join without Spark: keeps both tables as
they stand, turns upserts and deletes into changelogs with before-images and
sequence numbers, runs each micro-batch through a PipelineHarness (several
partitions per stage) and keeps the materialised output; plus the batch join
of the two tables that the output must equal."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa

from operators import FkJoin, Pipeline, RowKind
from operators._fk_join.join import add_stages
from operators._fk_join.stages import ResultStage, SubscriptionStage
from operators.testing import PipelineHarness
from statestore import ConsistencyMode

Key = tuple[Any, ...]


class FkDriver:
    """One FK join, fed table changes, run batch by batch.

    Every changelog row gets its own sequence number, unless
    ``shared_sequences``: then an update's ``-U``/``+U`` pair shares one, and
    a left and a right change share one until a side changes again. With
    ``right_sequence_start``, the right table numbers its changes with a
    counter of its own, from that number: the tables' numbers are then
    unrelated, as two CDC logs' positions are. With
    ``shuffle``, each table's changelog rows are listed in random order, as
    Spark's shuffle may deliver them (the Spark tests write them so); only
    their numbers order them. The harness sorts by number and kind, keeping
    side order at a tie, unless ``tie_break`` orders ties at random. The
    right changelog sends updates as plain upserts (``+U``), or with
    ``right_before_images`` as ``-U``/``+U`` pairs, as the left one does. A
    table whose schema holds the sequence column gets each change's number
    there, as a changelog with its own numbers does: a row as it stands has
    the number of its last insert or update, a ``-U``/``-D`` the number of
    the change that retracts it. With ``strict``, both stages' tables check
    every write against the row they hold (the stages run them unchecked).

    The driver also models what the subscription stage answers, to know how
    many responses the results stage must drop as stale (``expected_stale``):
    exact while the changes reach the join in the order they were made,
    which holds when every change has its own number from one counter.
    """

    def __init__(
        self,
        join: FkJoin,
        partitions: tuple[int, int] = (3, 2),
        shared_sequences: bool = False,
        shuffle: random.Random | None = None,
        right_before_images: bool = False,
        tie_break: random.Random | None = None,
        backend: str = "memory",
        right_sequence_start: int | None = None,
        strict: bool = False,
    ) -> None:
        self.join = join
        self.shared_sequences = shared_sequences
        self.right_before_images = right_before_images
        self.shuffle = shuffle
        pipeline = Pipeline()
        left = pipeline.source(
            join.keyed_input(),
            "left",
            sequence=join.sequence_column,
        )
        right = pipeline.source(
            join.with_sequence(join.right), "right", sequence=join.sequence_column
        )
        stages = (SubscriptionStage(join), ResultStage(join))
        if strict:
            # The stages' tables check every write against the stored row.
            for stage in stages:
                stage.consistency = ConsistencyMode.STRICT
        self.output_stage = add_stages(join, pipeline, left, right, *stages).name
        self.harness = PipelineHarness(pipeline, partitions, backend, tie_break)
        self.left: dict[Key, tuple[Any, ...]] = {}
        self.right: dict[Any, tuple[Any, ...]] = {}
        #: The output table as the upsert changelog leaves it, by K.
        self.output: dict[Key, tuple[Any, ...]] = {}
        self._seq = 0
        self._sides_at_seq: set[int] = set()
        #: The right table's own counter, if it numbers its changes itself.
        self._right_seq = None if right_sequence_start is None else right_sequence_start - 1
        self._changes: list[list[tuple[tuple[Any, ...], str, int]]] = [[], []]
        self._lkey = [join.left.get_field_index(k) for k in join.left_key]
        self._okey = [join.output.get_field_index(k) for k in join.left_key]
        self._rkey = join.right.get_field_index(join.right_key)
        self._seq_at = [s.get_field_index(join.sequence_column) for s in (join.left, join.right)]
        #: This batch's responses by K: the hash of the left row each answers.
        self._responses: dict[Key, list[bytes]] = {}
        #: Responses the last batch taken should have dropped as stale.
        self.expected_stale = 0

    def _number(self, side: int) -> int:
        """The sequence number of the next change of ``side``."""
        if side == 1 and self._right_seq is not None:
            self._right_seq += 1
            return self._right_seq
        if not self.shared_sequences or side in self._sides_at_seq:
            self._seq += 1
            self._sides_at_seq.clear()
        self._sides_at_seq.add(side)
        return self._seq

    def _change(self, side: int, row: tuple[Any, ...], kind: RowKind, seq: int) -> tuple[Any, ...]:
        """Queue a change of ``side``; the row as it was sent: with its number
        in the sequence column where the table holds one (a row that ends
        before that column gets it appended)."""
        at = self._seq_at[side]
        if at >= 0:
            row = (*row[:at], seq, *row[at + 1 :])
        self._changes[side].append((row, kind.value, seq))
        return row

    def upsert_left(self, row: tuple[Any, ...]) -> None:
        """Insert or replace a left row: ``+I``, or ``-U`` of the old then ``+U``."""
        key = tuple(row[i] for i in self._lkey)
        old = self.left.get(key)
        seq = self._number(0)
        if old is None:
            row = self._change(0, row, RowKind.INSERT, seq)
        else:
            self._change(0, old, RowKind.UPDATE_BEFORE, seq)
            after = seq if self.shared_sequences else self._number(0)
            row = self._change(0, row, RowKind.UPDATE_AFTER, after)
        self.left[key] = row
        if self.join.foreign_key_of(row) is not None:
            self._respond(key, row)  # the subscription is answered at once

    def delete_left(self, key: Key) -> None:
        """Delete a left row (``-D`` with its before-image)."""
        self._change(0, self.left.pop(key), RowKind.DELETE, self._number(0))

    def retract_left(self, row: tuple[Any, ...], kind: RowKind = RowKind.DELETE) -> None:
        """Send a ``-D`` (or ``-U``) of ``row`` whatever the table holds (a
        repeated tombstone, one for a key never seen, a stale before-image):
        as in Kafka's keyed table, its key is deleted if held."""
        key = tuple(row[i] for i in self._lkey)
        self._change(0, row, kind, self._number(0))
        self.left.pop(key, None)

    def upsert_right(self, row: tuple[Any, ...]) -> None:
        """Insert or replace a right row: ``+I``, or an update as a plain
        upsert (``+U``), or with ``right_before_images`` as :meth:`update_right`."""
        fk = row[self._rkey]
        if fk in self.right and self.right_before_images:
            self.update_right(fk, row)
            return
        kind = RowKind.UPDATE_AFTER if fk in self.right else RowKind.INSERT
        self._put_right(row, kind, self._number(1))

    def update_right(self, fk: Any, row: tuple[Any, ...]) -> None:
        """Replace right row ``fk`` by ``row``, whose key may be another:
        ``-U`` of the old row, then ``+U`` of the new."""
        seq = self._retract_right(fk, RowKind.UPDATE_BEFORE)
        self._put_right(row, RowKind.UPDATE_AFTER, seq if self.shared_sequences else None)

    def delete_right(self, fk: Any) -> None:
        """Delete a right row."""
        self._retract_right(fk, RowKind.DELETE)

    def _retract_right(self, fk: Any, kind: RowKind) -> int:
        """Queue a ``-U``/``-D`` of right row ``fk``; its sequence number."""
        seq = self._number(1)
        self._change(1, self.right.pop(fk), kind, seq)
        self._answer_subscribers(fk)
        return seq

    def _put_right(self, row: tuple[Any, ...], kind: RowKind, seq: int | None) -> None:
        """Queue a ``+I``/``+U`` of a right row (numbered ``seq``, or the next)."""
        row = self._change(1, row, kind, self._number(1) if seq is None else seq)
        fk = row[self._rkey]
        if self.right.get(fk) != row:
            self._answer_subscribers(fk)
        self.right[fk] = row

    def _respond(self, key: Key, row: tuple[Any, ...]) -> None:
        self._responses.setdefault(key, []).append(self.join.row_hash(row))

    def _answer_subscribers(self, fk: Any) -> None:
        """A change of right row ``fk`` answers every K that points at it."""
        for key, row in self.left.items():
            if self.join.foreign_key_of(row) == fk:
                self._respond(key, row)

    def _stale(self) -> int:
        """The batch's responses computed for another left row than the one
        K holds now (every response of a K with no row or no FK)."""
        stale = 0
        for key, hashes in self._responses.items():
            row = self.left.get(key)
            if row is None or self.join.foreign_key_of(row) is None:
                stale += len(hashes)
            else:
                stale += sum(h != self.join.row_hash(row) for h in hashes)
        return stale

    def take_changes(self) -> list[pa.Table | None]:
        """The pending changes of each table as a changelog (its columns, the
        sequence column, ``row_kind``), or ``None``; they are no longer pending
        and make one batch, whose stale responses ``expected_stale`` counts."""
        self.expected_stale, self._responses = self._stale(), {}
        tables: list[pa.Table | None] = []
        for side, schema in enumerate((self.join.left, self.join.right)):
            rows, self._changes[side] = self._changes[side], []
            if self.shuffle is not None:
                self.shuffle.shuffle(rows)
            if not rows:
                tables.append(None)
                continue
            cols = list(zip(*[r for r, _, _ in rows], strict=True))
            arrays = [pa.array(list(c), type=f.type) for c, f in zip(cols, schema, strict=True)]
            arrays.append(pa.array([s for _, _, s in rows], type=pa.int64()))
            arrays.append(pa.array([k for _, k, _ in rows], type=pa.string()))
            names = [*schema.names, self.join.sequence_column, "row_kind"]
            if self._seq_at[side] >= 0:
                del arrays[-2], names[-2]  # the rows hold their numbers
            tables.append(pa.Table.from_arrays(arrays, names=names))
        return tables

    def flush(self) -> dict[Key, tuple[Any, ...] | None]:
        """Run the pending changes as one micro-batch; the output rows it
        emitted by K (``None`` for a delete)."""
        tables = self.take_changes()
        left = tables[0]
        if left is not None:
            tables[0] = pa.Table.from_batches([self.join.keyed_left(left.to_batches()[0])])
        out = self.harness.run_batch(tables)[self.output_stage]
        changes: dict[Key, tuple[Any, ...] | None] = {}
        names = self.join.output.names
        for record in out.to_pylist():
            row = tuple(record[n] for n in names)
            key = tuple(row[i] for i in self._okey)
            assert key not in changes, f"two output rows for {key} in one batch"
            if record["row_kind"] == RowKind.DELETE.value:
                assert key in self.output, f"a delete of {key}, which has no output"
                del self.output[key]
                changes[key] = None
            else:
                assert (record["row_kind"] == RowKind.UPDATE_AFTER.value) == (key in self.output)
                self.output[key] = row
                changes[key] = row
        return changes

    def batch_join(self) -> dict[Key, tuple[Any, ...]]:
        """The join of the two tables as they stand, by K."""
        result: dict[Key, tuple[Any, ...]] = {}
        for key, row in self.left.items():
            fk = self.join.foreign_key_of(row)
            right = None if fk is None else self.right.get(fk)
            if right is not None or self.join.how == "left":
                result[key] = tuple(self.join.joiner(row, right))
        return result

    def close(self) -> None:
        """Release the harness's state."""
        self.harness.close()

    def results_metric(self, name: str) -> int:
        """A counter of the results stage in the last batch (0 if not counted)."""
        metrics = self.harness.last_metrics.get(self.join.name + "-results", {})
        return metrics.get(name, 0)

    @property
    def stale_dropped(self) -> int:
        """Responses dropped as stale in the last batch."""
        return self.results_metric("numResultsDroppedAsStale")
