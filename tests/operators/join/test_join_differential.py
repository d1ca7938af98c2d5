"""StreamingJoin against a batch SQL join, on random retract changelogs.

Hundreds of seeded random runs: two inputs ``(id, k1, k2, v)``, several
partitions (each a harness; rows routed by a hash of their join key, as the
runner does), several batches with a commit between them and, sometimes, a
batch run, thrown away by a restore of the last committed version, and run
again. All four join types, with and without a non-equi condition, null-safe
or not, one or two key columns with nulls and heavy duplicates, sides with no
unique key, a unique key outside the join key or one inside it, retract or
upsert (``+U`` without ``-U``) inputs.

After every batch the materialised output equals the reference: the same join
over the materialised inputs, computed in plain Python (a nested loop with
SQL's null rules) and, where SQLite can (the standard library's ``sqlite3``;
RIGHT and FULL joins need SQLite 3.39 or later), by SQLite too, which must
agree with it. So no run is skipped on an older SQLite. A retract output is
materialised as a multiset (``+I``/``+U`` add, ``-U``/``-D`` remove, never
below zero); an upsert output is keyed by the two sides' unique keys, as a
downstream upsert sink keeps it.
"""

from __future__ import annotations

import random
import sqlite3
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators._api.changelog import RowKind
from operators.join import JoinType, StreamingJoin
from operators.testing import Emitted, OperatorHarness

INS, UB, UA, DEL = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE
Row = tuple[Any, ...]

SIDE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        ("k1", pa.int64()),
        ("k2", pa.int64()),
        ("v", pa.int64()),
    ]
)
UNIQUE_KEYS = {"none": None, "id": ["id"], "k1": ["k1"]}

#: SQLite has RIGHT and FULL JOIN from 3.39 on; before, it checks the rest.
SQLITE_OUTER = sqlite3.sqlite_version_info >= (3, 39)


def condition(left: Row, right: Row) -> bool:
    """The non-equi condition of the runs that have one."""
    return bool((left[3] + right[3]) % 3 != 0)


@dataclass
class Config:
    """One random run's join."""

    join_type: JoinType
    keys: list[str]
    unique: tuple[str, str]
    upsert: bool
    with_condition: bool
    null_safe: bool
    partitions: int

    @classmethod
    def draw(cls, rnd: random.Random) -> Config:
        keys = rnd.choice([["k1"], ["k1", "k2"]])
        upsert = rnd.random() < 0.3
        choices = ["id", "k1"] if upsert else ["none", "id", "k1"]
        unique = (rnd.choice(choices), rnd.choice(choices))
        return cls(
            join_type=rnd.choice(list(JoinType)),
            keys=keys,
            unique=unique,
            upsert=upsert,
            with_condition=rnd.random() < 0.5,
            null_safe=rnd.random() < 0.25,
            partitions=rnd.randint(2, 4),
        )

    def join(self) -> StreamingJoin:
        return StreamingJoin(
            self.join_type,
            SIDE,
            SIDE,
            self.keys,
            self.keys,
            left_unique_key=UNIQUE_KEYS[self.unique[0]],
            right_unique_key=UNIQUE_KEYS[self.unique[1]],
            condition=condition if self.with_condition else None,
            null_safe=self.null_safe,
            right_prefix="r_",
        )


class Side:
    """One input's live rows and a generator of changelog rows over them."""

    def __init__(self, rnd: random.Random, unique: str, upsert: bool) -> None:
        self.rnd = rnd
        self.unique = unique
        self.upsert = upsert
        self.live: list[Row] = []
        self.next_id = 0

    def _new(self, keep: Row | None) -> Row:
        rnd = self.rnd
        # A unique k1 may be null too (one row at most): the view keyed by
        # the join key stores it, and it matches only null-safe.
        k1 = rnd.choice([0, 1, 2, None] if self.unique != "k1" else [0, 1, 2, 3, 4, 5, None])
        if self.unique == "none":  # ids from a small range: whole rows repeat
            row_id = rnd.randint(0, 1)
        elif keep is not None:  # an update keeps the unique key (and, upserting, the join key)
            row_id = keep[0]
            if self.unique == "k1" or self.upsert:
                k1 = keep[1]
        else:
            row_id = self.next_id
            self.next_id += 1
        k2 = rnd.choice([0, 1, None])
        if keep is not None and self.upsert:
            k2 = keep[2]
        return (row_id, k1, k2, rnd.randint(0, 4))

    def step(self) -> list[tuple[RowKind, Row]]:
        """One random change: an insert, a delete or an update."""
        rnd = self.rnd
        action = rnd.choice(["insert", "insert", "delete", "update"]) if self.live else "insert"
        if action == "insert":
            row = self._new(None)
            if self.unique == "k1" and any(r[1] == row[1] for r in self.live):
                return []  # its unique key is taken
            self.live.append(row)
            return [(INS, row)]
        old = self.live.pop(rnd.randrange(len(self.live)))
        if action == "delete":
            return [(DEL, old)]
        new = self._new(old)
        self.live.append(new)
        return [(UA, new)] if self.upsert else [(UB, old), (UA, new)]


def route(row: Row, keys: list[str], partitions: int) -> int:
    """The partition of a row: a hash of its join key."""
    key = tuple(row[SIDE.names.index(k)] for k in keys)
    return zlib.crc32(repr(key).encode()) % partitions


class Output:
    """The join's output, materialised."""

    def __init__(self, config: Config) -> None:
        self.keyed = config.upsert
        self.rows: Counter[Row] = Counter()
        self.by_key: dict[Row, Row] = {}

    def apply(self, emitted: list[Emitted]) -> None:
        for kind, row in emitted:
            if self.keyed:
                key = (row[0], row[1], row[4], row[5])
                if kind.is_accumulate:
                    self.by_key[key] = row
                else:
                    assert self.by_key.pop(key) == row, f"{kind} {row} of a row not held"
            elif kind.is_accumulate:
                self.rows[row] += 1
            else:
                assert self.rows[row] > 0, f"{kind} {row} of a row the output does not hold"
                self.rows[row] -= 1
                if not self.rows[row]:
                    del self.rows[row]

    def materialised(self) -> Counter[Row]:
        return Counter(self.by_key.values()) if self.keyed else +self.rows


def reference(config: Config, left: list[Row], right: list[Row]) -> Counter[Row]:
    """The join of the materialised inputs, in Python; SQLite's, where it
    has the join type, must be the same."""
    expected = python_join(config, left, right)
    if SQLITE_OUTER or config.join_type in (JoinType.INNER, JoinType.LEFT):
        assert sqlite_join(config, left, right) == expected, "the references disagree"
    return expected


def python_join(config: Config, left: list[Row], right: list[Row]) -> Counter[Row]:
    """The join as SQL defines it, by a nested loop: a null key equals
    nothing (null-safe: it equals null); an outer side's row that matches
    nothing comes once, padded with nulls. Each copy of a row is a row."""
    keys = [SIDE.names.index(k) for k in config.keys]

    def joins(left_row: Row, right_row: Row) -> bool:
        for i in keys:
            a, b = left_row[i], right_row[i]
            if (a is None or b is None) and not (config.null_safe and a is None and b is None):
                return False
            if a != b:
                return False
        return not config.with_condition or condition(left_row, right_row)

    out: Counter[Row] = Counter()
    matched_right: set[int] = set()
    pad = (None,) * len(SIDE)
    outer = {
        JoinType.INNER: (False, False),
        JoinType.LEFT: (True, False),
        JoinType.RIGHT: (False, True),
        JoinType.FULL: (True, True),
    }[config.join_type]
    for left_row in left:
        hits = [j for j, right_row in enumerate(right) if joins(left_row, right_row)]
        for j in hits:
            out[left_row + right[j]] += 1
        matched_right.update(hits)
        if outer[0] and not hits:
            out[left_row + pad] += 1
    if outer[1]:
        for j, right_row in enumerate(right):
            if j not in matched_right:
                out[pad + right_row] += 1
    return out


def sqlite_join(config: Config, left: list[Row], right: list[Row]) -> Counter[Row]:
    """The same join run by SQLite over the materialised inputs."""
    db = sqlite3.connect(":memory:")
    db.create_function("cond", 2, lambda a, b: (a + b) % 3 != 0, deterministic=True)
    for name, rows in (("l", left), ("r", right)):
        db.execute(f"CREATE TABLE {name} (id INTEGER, k1 INTEGER, k2 INTEGER, v INTEGER)")
        db.executemany(f"INSERT INTO {name} VALUES (?, ?, ?, ?)", rows)
    equals = "IS" if config.null_safe else "="
    on = " AND ".join(f"l.{k} {equals} r.{k}" for k in config.keys)
    if config.with_condition:
        on += " AND cond(l.v, r.v)"
    join = {
        JoinType.INNER: "JOIN",
        JoinType.LEFT: "LEFT JOIN",
        JoinType.RIGHT: "RIGHT JOIN",
        JoinType.FULL: "FULL JOIN",
    }[config.join_type]
    query = f"SELECT l.*, r.* FROM l {join} r ON {on}"
    result = Counter(tuple(r) for r in db.execute(query))
    db.close()
    return result


def run(seed: int, backend: str, path: Path, consistency: str | None) -> None:
    """One random run: every batch's materialised output equals SQLite's join.
    ``consistency`` overrides the join's own mode (unchecked) when given."""
    rnd = random.Random(seed)
    config = Config.draw(rnd)
    sides = [Side(rnd, config.unique[s], config.upsert) for s in (0, 1)]
    harnesses = [
        OperatorHarness(
            config.join(), backend, path / f"p{p}", partition_id=p, consistency=consistency
        )
        for p in range(config.partitions)
    ]
    output = Output(config)
    committed: int | None = None
    try:
        for _ in range(rnd.randint(2, 5)):
            changes: list[list[tuple[int, RowKind, Row]]] = [[] for _ in harnesses]
            for _ in range(rnd.randint(1, 40)):
                side = rnd.randrange(2)
                for kind, row in sides[side].step():
                    p = route(row, config.keys, config.partitions)
                    changes[p].append((side, kind, row))
            if rnd.random() < 0.2:  # a failed attempt: run, then restore
                for harness, rows in zip(harnesses, changes, strict=True):
                    feed(harness, rows)
                    harness.restore(committed)
            for harness, rows in zip(harnesses, changes, strict=True):
                output.apply(feed(harness, rows))
                before = len(harness.output)
                committed = harness.commit()
                output.apply(harness.output[before:])
            expected = reference(config, sides[0].live, sides[1].live)
            assert output.materialised() == expected, f"seed {seed}: {config}"
    finally:
        for harness in harnesses:
            harness.close()


def feed(harness: OperatorHarness, rows: list[tuple[int, RowKind, Row]]) -> list[Emitted]:
    """Feed rows in order, each run of one side as one batch."""
    out: list[Emitted] = []
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i][0] != rows[start][0]:
            run_ = rows[start:i]
            out += harness.process_rows(
                [r for _, _, r in run_], [k for _, k, _ in run_], run_[0][0]
            )
            start = i
    return out


class TestDifferential:
    @pytest.mark.parametrize("block", range(8))
    def test_memory(self, block: int, tmp_path: Path) -> None:
        """400 random runs in memory, half with strict tables (every write
        checked against the stored row), half unchecked as the join runs: the
        output equals SQLite's join after every batch."""
        consistency = "strict" if block % 2 else None
        for seed in range(block * 50, (block + 1) * 50):
            run(seed, "memory", tmp_path, consistency)

    @pytest.mark.parametrize("seed", [1000, 1001, 1002, 1003, 1004, 1005])
    def test_rocksdb(self, seed: int, tmp_path: Path) -> None:
        """A few random runs on RocksDB with real checkpoints and restores."""
        run(seed, "rocksdb", tmp_path, "strict" if seed % 2 else None)
