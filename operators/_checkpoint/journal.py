"""The runner's batch journal: the only reader and writer of batch records.

A query's state location holds, beside its operators' state, the runner's own
directory ``_runner/``:

- ``query.json``: the query's shape (its stages with the Spark types of their
  keys and their partition counts, and the query's partition count), written
  by the first batch and checked by every later start;
- ``batches/<batch id, 20 digits>.json``: one record per finished batch, naming
  every stage's winning commit per partition, the watermarks and the metrics.
  A batch counts as committed when, and only when, its record exists;
- ``batches/<batch id>.start``: the batch's processing time, written before
  its first run so that a batch that runs again sees the same one.

The runner, the state reader, ``relstate inspect`` and ``relstate repartition``
all go through :class:`Journal`. Records of the format before pipelines (one
operator's winners, or ``stage_winners``) are read as their one-format
equivalent.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow.fs as pafs

from operators.errors import InputError
from statestore import PartitionCheckpoint, redact, write_atomically

__all__ = ["RUNNER", "BatchRecord", "Journal", "QueryShape", "StageShape"]

#: The runner's directory in a state location.
RUNNER = "_runner"
_FORMAT = 2
#: At most this many partitions' winner records are written at once.
_WINNER_WRITERS = 8


@dataclass(frozen=True)
class StageShape:
    """A stage as the checkpoint records it: its name (the directory of its
    state), the Spark types of the key its rows are partitioned by (none for
    a keyless stage), and its partition count, which :class:`QueryShape`
    sets from the key: the query's count, or one for a keyless stage."""

    name: str
    key_types: tuple[str, ...]
    partitions: int | None = None

    @property
    def keyless(self) -> bool:
        """A stage without a key: its rows all go to partition 0."""
        return not self.key_types


@dataclass(frozen=True)
class QueryShape:
    """What must not change over a checkpoint's life: the stages, their key
    types and partition counts, and the query's partition count (every keyed
    stage's; a keyless stage has one partition)."""

    stages: tuple[StageShape, ...]
    partitions: int

    def __post_init__(self) -> None:
        # A stage's count follows from its key: the query's, or one.
        stages = tuple(
            replace(s, partitions=1 if s.keyless else self.partitions) for s in self.stages
        )
        object.__setattr__(self, "stages", stages)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def stage_partitions(self) -> dict[str, int]:
        """Each stage's partition count, by stage name."""
        return {s.name: s.partitions or self.partitions for s in self.stages}

    def to_json(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "partitions": self.partitions,
            "stages": [
                {"name": s.name, "key_types": list(s.key_types), "partitions": s.partitions}
                for s in self.stages
            ],
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> QueryShape:
        if "stages" in obj:
            # Records before keyless stages give no per-stage count: the query's.
            stages = [
                StageShape(s["name"], tuple(s["key_types"]), s.get("partitions"))
                for s in obj["stages"]
            ]
        else:  # before pipelines: "operator" joined stage names with "+"
            names = str(obj["operator"]).split("+")
            if len(names) != len(obj["key_types"]):
                raise InputError(
                    f"the query record names stages {names} with key types "
                    f"{obj['key_types']}: not one key per stage, so relstate cannot tell "
                    "each stage's key"
                )
            stages = [StageShape(n, tuple(t)) for n, t in zip(names, obj["key_types"], strict=True)]
        shape = QueryShape(tuple(stages), int(obj["partitions"]))
        for given, stage in zip(stages, shape.stages, strict=True):
            if given.partitions is not None and given.partitions != stage.partitions:
                rule = "a keyless stage has 1" if stage.keyless else "a keyed stage the query's"
                raise InputError(
                    f"the query record gives stage {stage.name!r} {given.partitions} "
                    f"partitions in a query of {shape.partitions}, but {rule}; the record "
                    "is damaged or from another relstate"
                )
        return shape


@dataclass(frozen=True)
class BatchRecord:
    """What the runner records once a batch's output is written."""

    batch_id: int
    #: Each stage's winning commit id per partition.
    winners: dict[str, dict[int, str]]
    #: The query's event-time watermark in force for the batch.
    watermark: int | None = None
    #: Each stage's input watermark for the batch (see operators/_engine/watermark.py).
    stage_watermarks: dict[str, int | None] = field(default_factory=dict)
    #: The greatest event time seen per source (by source name), up to and
    #: including this batch.
    max_event_time: dict[str, int] = field(default_factory=dict)
    #: Each stage's metrics, summed over its partitions.
    metrics: dict[str, dict[str, int]] = field(default_factory=dict)
    #: ``(old, new)`` partition counts when ``relstate repartition`` rewrote
    #: this batch's state: its new partitions' first version.
    repartitioned: tuple[int, int] | None = None

    def winners_of(self, stage: str) -> dict[int, str]:
        """Each partition's winning commit of ``stage`` in this batch."""
        return self.winners.get(stage, {})

    def to_json(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "batch_id": self.batch_id,
            "winners": {s: {str(p): c for p, c in w.items()} for s, w in self.winners.items()},
            "watermark": self.watermark,
            "stage_watermarks": self.stage_watermarks,
            "max_event_time": self.max_event_time,
            "metrics": self.metrics,
            "repartitioned": None
            if self.repartitioned is None
            else {"from": self.repartitioned[0], "to": self.repartitioned[1]},
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any], shape: QueryShape | None) -> BatchRecord:
        moved = obj.get("repartitioned")
        repartitioned = None if moved is None else (int(moved["from"]), int(moved["to"]))
        if obj.get("format") == _FORMAT:
            return BatchRecord(
                batch_id=int(obj["batch_id"]),
                winners={
                    s: {int(p): str(c) for p, c in w.items()} for s, w in obj["winners"].items()
                },
                watermark=obj.get("watermark"),
                stage_watermarks=dict(obj.get("stage_watermarks", {})),
                max_event_time={str(k): int(v) for k, v in obj.get("max_event_time", {}).items()},
                metrics={
                    s: {k: int(v) for k, v in m.items()} for s, m in obj.get("metrics", {}).items()
                },
                repartitioned=repartitioned,
            )
        return _legacy_record(obj, shape, repartitioned)


def _legacy_record(
    obj: Mapping[str, Any], shape: QueryShape | None, repartitioned: tuple[int, int] | None
) -> BatchRecord:
    """A record of the format before pipelines: one operator's ``winners`` or
    a pipeline's ``stage_winners``, metrics flat."""
    names = shape.names if shape is not None else []
    staged = obj.get("stage_winners") or {}
    if staged:
        winners = {s: {int(p): str(c) for p, c in w.items()} for s, w in staged.items()}
    else:
        name = names[0] if names else "operator"
        winners = {name: {int(p): str(c) for p, c in obj.get("winners", {}).items()}}
    flat = {str(k): int(v) for k, v in obj.get("metrics", {}).items()}
    metrics: dict[str, dict[str, int]] = {}
    for stage in winners:
        prefix = f"{stage}."
        own = {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}
        metrics[stage] = own if staged else flat
    return BatchRecord(
        batch_id=int(obj["batch_id"]),
        winners=winners,
        watermark=obj.get("watermark"),
        metrics=metrics,
        repartitioned=repartitioned,
    )


class Journal:
    """The batch records of the state at ``root`` on ``fs``."""

    def __init__(self, fs: pafs.FileSystem, root: str, printable: str | None = None) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.dir = posixpath.join(self.root, RUNNER)
        #: The location as it may be printed (no credentials).
        self.printable = printable or redact(root)

    # -- the query's shape --------------------------------------------------------------

    def shape(self) -> QueryShape | None:
        """The recorded shape, or ``None`` before the first batch (or for
        state not written by the runner)."""
        obj = self._read_json("query.json")
        return QueryShape.from_json(obj) if isinstance(obj, dict) else None

    def bind_shape(self, shape: QueryShape) -> None:
        """Record ``shape`` for a new checkpoint; refuse a query whose shape
        differs from the recorded one (the stages' partition counts follow
        from their keys and the query's count)."""
        recorded = self.shape()
        if recorded is None:
            self.write_shape(shape)
            return
        for what, mine, theirs in (
            ("stages", shape.names, recorded.names),
            ("partitions", shape.partitions, recorded.partitions),
            (
                "key types",
                [list(s.key_types) for s in shape.stages],
                [list(s.key_types) for s in recorded.stages],
            ),
        ):
            if mine != theirs:
                raise InputError(
                    f"the checkpoint at {self.printable} was written with {what} {theirs!r}; "
                    f"this query has {mine!r}. Keep them, or start from a new checkpoint; to "
                    "change the partition count of a stopped query, run `relstate repartition`"
                )

    def write_shape(self, shape: QueryShape) -> None:
        self.fs.create_dir(self.dir, recursive=True)
        self._write_json("query.json", shape.to_json())

    # -- batch records ------------------------------------------------------------------

    def batches(self) -> list[int]:
        """The recorded batch ids, ascending."""
        selector = pafs.FileSelector(posixpath.join(self.dir, "batches"), allow_not_found=True)
        return sorted(
            int(i.base_name[:-5])
            for i in self.fs.get_file_info(selector)
            if i.base_name.endswith(".json") and i.base_name[:-5].isdigit()
        )

    def record(self, batch_id: int) -> BatchRecord | None:
        """The record of ``batch_id``, if the batch was recorded."""
        obj = self._read_json(_record_name(batch_id))
        return None if obj is None else BatchRecord.from_json(obj, self.shape())

    def previous(self, batch_id: int) -> BatchRecord | None:
        """The record of the newest batch before ``batch_id``."""
        earlier = [b for b in self.batches() if b < batch_id]
        return self.record(earlier[-1]) if earlier else None

    def latest(self) -> int | None:
        """The newest recorded batch id."""
        recorded = self.batches()
        return recorded[-1] if recorded else None

    def write(self, record: BatchRecord) -> None:
        """Record a batch: from here on it is committed."""
        self.fs.create_dir(posixpath.join(self.dir, "batches"), recursive=True)
        self._write_json(_record_name(record.batch_id), record.to_json())

    def record_winners(self, record: BatchRecord) -> None:
        """Write each partition's winner of the batch into its checkpoint, for
        readers that load a version without naming a commit. The batch record
        decides; these follow it. Each partition's is a file of its own, so
        they are written at once: the caller waits for the slowest
        partition's, not for their sum."""

        def record_winner(stage: str, partition: int, commit_id: str) -> None:
            checkpoint = PartitionCheckpoint(self.root, stage, partition, filesystem=self.fs)
            checkpoint.record_winner(record.batch_id, commit_id)  # idempotent

        winners = [
            (stage, partition, commit_id)
            for stage, by_partition in record.winners.items()
            for partition, commit_id in by_partition.items()
        ]
        if not winners:
            return
        with ThreadPoolExecutor(min(len(winners), _WINNER_WRITERS)) as writers:
            # Consumed, so that the first write that fails raises here.
            list(writers.map(lambda w: record_winner(*w), winners))

    def processing_time(self, batch_id: int) -> int:
        """The batch's processing time (ms): recorded before its first run, so
        that a batch that runs again sees the same one."""
        name = f"batches/{batch_id:020d}.start"
        obj = self._read_json(name)
        if obj is not None:
            return int(obj)
        now = int(time.time() * 1000)
        self.fs.create_dir(posixpath.join(self.dir, "batches"), recursive=True)
        self._write_json(name, now)
        return now

    def prune(self, keep: int) -> int:
        """Delete the records (and start times) of all but the newest ``keep``
        recorded batches: the state keeps no older versions to read them
        with. Returns how many records went."""
        recorded = self.batches()
        gone = recorded[:-keep] if keep > 0 else recorded
        for batch_id in gone:
            for suffix in (".start", ".json"):
                path = posixpath.join(self.dir, "batches", f"{batch_id:020d}{suffix}")
                with contextlib.suppress(FileNotFoundError, OSError):
                    self.fs.delete_file(path)
        return len(gone)

    # -- files --------------------------------------------------------------------------

    def _read_json(self, rel: str) -> Any:
        path = posixpath.join(self.dir, rel)
        try:
            with self.fs.open_input_stream(path) as src:
                return json.loads(src.read())
        except FileNotFoundError:
            return None
        except OSError:
            if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
                return None
            raise

    def _write_json(self, rel: str, obj: Any) -> None:
        data = json.dumps(obj, sort_keys=True).encode()
        write_atomically(self.fs, posixpath.join(self.dir, rel), data)


def _record_name(batch_id: int) -> str:
    return f"batches/{batch_id:020d}.json"
