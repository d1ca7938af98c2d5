"""A query's state location, read-only: its operators and partitions, the
runner's records of which commit of each batch counts, and the manifests.

Nothing here writes to the location or starts Spark: ``relstate inspect``, the
``relstate-state`` data source and ``relstate repartition`` all find state
through it. A batch is *committed* when the runner recorded it
(``_runner/batches/<20 digits>.json``, naming each partition's winning commit); an attempt
the runner did not record (a crashed or running batch) is never read.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

import pyarrow.fs as pafs

from encoding import TableSchema
from encoding._schema import Direction, KeyColumn, NullOrder
from operators._checkpoint.journal import RUNNER, BatchRecord, Journal, QueryShape
from operators.errors import InputError
from statestore import (
    Manifest,
    PartitionCheckpoint,
    TableMeta,
    VersionNotFoundError,
    filesystem_for,
    redact,
)

__all__ = ["StateLocation", "table_schema"]


def table_schema(meta: TableMeta) -> TableSchema:
    """The table schema a manifest records."""
    keys = [KeyColumn(n, Direction(d), NullOrder(o)) for n, d, o in meta.key_columns]
    return TableSchema(
        meta.table_id,
        meta.columns,
        keys,
        layout=meta.layout,
        name=meta.name,
        partition_by=meta.partition_by,
    )


class StateLocation:
    """The state of a query: ``path`` is the query's checkpoint (whose state is
    in ``state/``) or the state location itself (``run_operator``'s
    ``state_location``). ``options`` configure S3 (see
    :mod:`statestore._filesystems`)."""

    def __init__(self, path: str, options: Mapping[str, str] | None = None) -> None:
        fs, root = self.resolve_root(path, options)
        #: ``path`` as it may be printed: without credentials.
        self.path = redact(path)
        if fs.get_file_info(root).type != pafs.FileType.Directory:
            raise InputError(
                f"there is no relstate state at {self.path}: give a query's checkpoint "
                "directory or its state location"
            )
        self.fs = fs
        self.root = root

    @staticmethod
    def resolve_root(
        path: str, options: Mapping[str, str] | None = None
    ) -> tuple[pafs.FileSystem, str]:
        """The filesystem and the state directory of ``path``: ``path/state``
        when it is a query's checkpoint (or one being repartitioned), else
        ``path``."""
        fs, root = filesystem_for(path, options)
        nested = posixpath.join(root, "state")
        for candidate in (nested, f"{nested}.repartition"):
            if fs.get_file_info(candidate).type == pafs.FileType.Directory:
                return fs, nested
        return fs, root

    # -- the runner's records --------------------------------------------------------

    @property
    def journal(self) -> Journal:
        """The runner's batch records of this state."""
        return Journal(self.fs, self.root, self.path)

    def query(self) -> QueryShape | None:
        """The query's shape the runner recorded (stages, their key types,
        partitions), or ``None`` for state not written by the runner."""
        return self.journal.shape()

    def recorded_batches(self) -> list[int]:
        """The batch ids the runner recorded, ascending."""
        return self.journal.batches()

    def record(self, batch_id: int) -> BatchRecord | None:
        """The runner's record of ``batch_id``, if it recorded one."""
        return self.journal.record(batch_id)

    # -- operators and partitions -----------------------------------------------------

    def _dirs(self, rel: str) -> list[str]:
        selector = pafs.FileSelector(posixpath.join(self.root, rel), allow_not_found=True)
        return sorted(
            i.base_name
            for i in self.fs.get_file_info(selector)
            if i.type == pafs.FileType.Directory
        )

    def operators(self) -> list[str]:
        """The operators that hold state here."""
        return [d for d in self._dirs("") if d != RUNNER and not d.startswith(".")]

    def operator(self, name: str | None) -> str:
        """``name`` checked, or the only operator when ``name`` is ``None``."""
        found = self.operators()
        if name is None:
            if len(found) != 1:
                raise InputError(
                    f"the state at {self.path} holds operators {found}; name one (option "
                    "'operator', --operator)"
                )
            return found[0]
        if name not in found:
            raise InputError(f"the state at {self.path} holds operators {found}, not {name!r}")
        return name

    def partitions(self, operator: str) -> list[int]:
        """The partitions of ``operator`` that hold state."""
        return sorted(int(d) for d in self._dirs(operator) if d.isdigit())

    def checkpoint(self, operator: str, partition: int) -> PartitionCheckpoint:
        """The partition's checkpoint (manifests, versions, winners)."""
        return PartitionCheckpoint(self.root, operator, partition, filesystem=self.fs)

    def kept_batches(self, operator: str, partition: int) -> list[int]:
        """The partition's kept versions that are committed batches, ascending:
        a version that an attempt published after the runner's latest record
        (a batch that failed, or still runs) is not one."""
        versions = self.checkpoint(operator, partition).versions()
        latest = self.latest_batch()
        return versions if latest is None else [v for v in versions if v <= latest]

    # -- versions -----------------------------------------------------------------------

    def latest_batch(self) -> int | None:
        """The newest batch the runner recorded (``None``: none, or state not
        written by the runner)."""
        batches = self.recorded_batches()
        return batches[-1] if batches else None

    def check_committed(self, batch_id: int) -> None:
        """Refuse ``batch_id`` when it is after the runner's latest record: no
        partition's state of it counts."""
        self._check_committed(batch_id, self.recorded_batches())

    def _check_committed(self, batch_id: int, recorded: list[int]) -> None:
        if recorded and batch_id > recorded[-1]:
            raise InputError(
                f"batch {batch_id} is not committed: the runner recorded batches up to "
                f"{recorded[-1]} at {self.path}; a later attempt may still be running or "
                "may have failed"
            )

    def commit(self, operator: str, partition: int, batch_id: int | None) -> Manifest | None:
        """The manifest of ``partition``'s state after ``batch_id`` (default:
        the latest committed batch), following the runner's record of the
        batch; ``None`` when the partition has no state then."""
        checkpoint = self.checkpoint(operator, partition)
        recorded = self.recorded_batches()
        if batch_id is None:
            if recorded:
                batch_id = recorded[-1]
            else:
                versions = checkpoint.versions()
                if not versions:
                    return None
                batch_id = versions[-1]
        else:
            self._check_committed(batch_id, recorded)
        record = self.record(batch_id) if recorded else None
        commit_id = None if record is None else record.winners_of(operator).get(partition)
        if record is not None and commit_id is None:
            return None  # the batch ran with fewer partitions than there are now
        try:
            return checkpoint.resolve(batch_id, commit_id)
        except VersionNotFoundError:
            kept = checkpoint.versions()
            raise InputError(
                f"batch {batch_id} of operator {operator!r} partition {partition} is not "
                f"kept at {self.path} (kept: {kept[0] if kept else '-'}.."
                f"{kept[-1] if kept else '-'}); read a kept batch"
            ) from None

    def tables(self, operator: str, batch_id: int | None = None) -> list[TableMeta]:
        """The tables of ``operator`` as the newest manifest at ``batch_id``
        records them."""
        for partition in self.partitions(operator):
            manifest = self.commit(operator, partition, batch_id)
            if manifest is not None:
                return list(manifest.tables)
        raise InputError(f"operator {operator!r} at {self.path} has no committed state")

    def table(self, operator: str, name: str | None, batch_id: int | None = None) -> TableMeta:
        """One table by name (for a join, each side's table has its own name);
        the only non-timer table when ``name`` is ``None``."""
        metas = self.tables(operator, batch_id)
        names = [m.name for m in metas]
        if name is None:
            own = [m for m in metas if not m.name.startswith("__")]
            if len(own) != 1:
                raise InputError(
                    f"operator {operator!r} has tables {names}; name one (option 'table', --table)"
                )
            return own[0]
        for meta in metas:
            if meta.name == name:
                return meta
        raise InputError(f"operator {operator!r} has tables {names}, not {name!r}")

    def side_table(self, operator: str, side: str, batch_id: int | None = None) -> TableMeta:
        """The table of a join's ``side`` (``left`` or ``right``): the table
        of that name (``StreamingJoin``, the FK join's stages), or
        ``{side}_rows`` (``AppendJoin``)."""
        metas = self.tables(operator, batch_id)
        for name in (side, f"{side}_rows"):
            for meta in metas:
                if meta.name == name:
                    return meta
        raise InputError(
            f"operator {operator!r} has tables {[m.name for m in metas]}, none of them the "
            f"{side} side of a join ({side!r} or {f'{side}_rows'!r}); name a table (option "
            "'table')"
        )
