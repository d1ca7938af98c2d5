"""The checkpoint of one (location, operator, partition): its versions, commits,
manifests and winner records, with no local database.

A state store uses it to publish and find commits; a driver uses it alone to
list versions and record which attempt of a batch counts
(:meth:`PartitionCheckpoint.record_winner`).
"""

from __future__ import annotations

import json
import posixpath
import threading
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import NoReturn

import pyarrow.fs as pafs

from statestore import _changelog
from statestore._checkpoint_fs import CheckpointFS, FileStat
from statestore._faults import fault
from statestore._manifest import (
    ChangelogRef,
    CommitRef,
    FileEntry,
    Manifest,
    ManifestFormatError,
    changelog_path,
    manifest_path,
    parse_manifest_name,
    winner_path,
)
from statestore._retention import Cleanup, cleanup
from statestore._typing import WriteOp
from statestore.errors import (
    AmbiguousVersionError,
    CheckpointCorruptError,
    IncompatibleStateError,
    InvalidVersionError,
    VersionNotFoundError,
    WinnerConflictError,
)

__all__ = ["PartitionCheckpoint"]


#: The manifests retention read, by full path, size and modification time,
#: for the whole process: a manifest is never rewritten (its name holds its
#: commit id), and retention reads every kept one at each commit, which a
#: task's fresh store would otherwise read and verify again each batch (every
#: kept manifest, the larger part of a commit that writes nothing). Python
#: workers run many tasks, so the next
#: batch's commit of a partition finds them here. A manifest whose size or
#: time changed is read again; a filesystem that gives no time is not cached.
_KEPT: OrderedDict[tuple[str, int, int], Manifest] = OrderedDict()
_KEPT_LIMIT = 4096
_KEPT_LOCK = threading.Lock()


def _check_ids(operator_id: str, partition_id: int) -> None:
    if (
        not isinstance(operator_id, str)
        or not operator_id
        or "/" in operator_id
        or (operator_id in (".", ".."))
    ):
        raise ValueError(f"operator_id must be a non-empty name without '/', got {operator_id!r}")
    if not isinstance(partition_id, int) or isinstance(partition_id, bool) or partition_id < 0:
        raise ValueError(f"partition_id must be an integer >= 0, got {partition_id!r}")


def check_version(version: object) -> int:
    """``version`` as a version number, or :class:`InvalidVersionError`."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise InvalidVersionError(
            f"version {version!r} is not a version: a version is a micro-batch id, an "
            "integer >= 0 (None loads the empty state)",
            version,
        )
    return version


class PartitionCheckpoint:
    """Files under ``{location}/{operator_id}/{partition_id}/``.

    ``location`` is a URI or local path; with ``filesystem`` (a configured
    ``pyarrow.fs.FileSystem``, an S3 one with credentials, say) it is a path on it.
    """

    def __init__(
        self,
        location: str,
        operator_id: str,
        partition_id: int,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        _check_ids(operator_id, partition_id)
        self.operator_id = operator_id
        self.partition_id = partition_id
        self.fs = CheckpointFS(location, operator_id, str(partition_id), filesystem=filesystem)
        self._manifests: dict[str, Manifest] = {}

    @property
    def root(self) -> str:
        """The partition's directory, as the filesystem spells it."""
        return self.fs.root

    # -- listing ------------------------------------------------------------------------

    def _listed(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for stat in self.fs.list("manifests"):
            parsed = parse_manifest_name(posixpath.basename(stat.path))
            if parsed is not None:
                out.setdefault(parsed[0], []).append(parsed[1])
        for ids in out.values():
            ids.sort()
        return out

    def versions(self) -> list[int]:
        """The versions that have at least one manifest, ascending."""
        return sorted(self._listed())

    def commits(self, version: int) -> list[str]:
        """The commit ids of every attempt that published ``version``."""
        return self._listed().get(check_version(version), [])

    # -- manifests ----------------------------------------------------------------------

    def manifest(self, version: int, commit_id: str) -> Manifest:
        """The verified manifest of one commit (cached: manifests are immutable).

        :class:`VersionNotFoundError` if it does not exist,
        :class:`CheckpointCorruptError` if it is damaged.
        """
        path = manifest_path(version, commit_id)
        cached = self._manifests.get(path)
        if cached is not None:
            return cached
        full = self.fs.full(path)
        try:
            data = self.fs.read_bytes(path)
        except FileNotFoundError:
            raise VersionNotFoundError(
                f"there is no manifest {full}: version {version} was not committed "
                f"by commit {commit_id}",
                version,
                commit_id,
            ) from None
        try:
            m = Manifest.from_bytes(data)
        except ManifestFormatError as exc:
            raise CheckpointCorruptError(
                f"manifest {full} of version {version} is damaged: {exc}; restore it, or "
                "load another version",
                full,
                version,
            ) from exc
        if (m.version, m.commit_id) != (version, commit_id):
            raise CheckpointCorruptError(
                f"manifest {full} describes commit {m.version}/{m.commit_id}, not its "
                f"name's {version}/{commit_id}",
                full,
                version,
            )
        if (m.operator_id, m.partition_id) != (self.operator_id, self.partition_id):
            raise IncompatibleStateError(
                f"manifest {full} belongs to operator {m.operator_id!r} partition "
                f"{m.partition_id}, not {self.operator_id!r} partition {self.partition_id}"
            )
        self._manifests[path] = m
        return m

    def resolve(self, version: int, commit_id: str | None = None) -> Manifest:
        """The manifest a load of ``version`` uses: the named commit; else the
        recorded winner; else the only attempt. :class:`AmbiguousVersionError`
        when several attempts exist and none is named."""
        check_version(version)
        if commit_id is not None:
            try:
                return self.manifest(version, commit_id)
            except VersionNotFoundError:
                self._raise_missing(version, commit_id)
        winner = self.winner(version)
        if winner is not None:
            try:
                return self.manifest(version, winner)
            except VersionNotFoundError:
                path = self.fs.full(manifest_path(version, winner))
                raise CheckpointCorruptError(
                    f"the winner record of version {version} names commit {winner}, but "
                    f"its manifest {path} is missing",
                    path,
                    version,
                ) from None
        ids = self.commits(version)
        if len(ids) == 1:
            return self.manifest(version, ids[0])
        if len(ids) > 1:
            raise AmbiguousVersionError(
                f"version {version} at {self.root} was committed by {len(ids)} attempts "
                f"{ids} and no winner is recorded; pass commit_id= or call "
                "record_winner(version, commit_id) first",
                version,
                tuple(ids),
            )
        self._raise_missing(version, None)

    def _raise_missing(self, version: int, commit_id: str | None) -> NoReturn:
        """Raise the error for a commit without a manifest: corruption when a
        kept later version names it as an ancestor (its manifest was deleted),
        else not found."""
        listed = self._listed()
        later = [v for v in listed if v > version]
        if listed and version > min(listed) and later:
            nxt = min(later)
            for cid in listed[nxt]:
                try:
                    ancestors = self.manifest(nxt, cid).ancestors
                except CheckpointCorruptError:
                    continue
                for a in ancestors:
                    if a.version == version and commit_id in (None, a.commit_id):
                        path = self.fs.full(manifest_path(version, a.commit_id))
                        raise CheckpointCorruptError(
                            f"manifest {path} of version {version} is missing, though "
                            f"version {nxt} builds on it; restore it, or load another "
                            "version",
                            path,
                            version,
                        )
        which = "" if commit_id is None else f" commit {commit_id}"
        known = f"{min(listed)}..{max(listed)}" if listed else "none"
        raise VersionNotFoundError(
            f"version {version}{which} is not in the checkpoint at {self.root} "
            f"(versions there: {known}); it was never committed or retention removed it",
            version,
            commit_id,
        )

    def publish(self, manifest: Manifest) -> None:
        """Publish ``manifest`` atomically: from this moment its version exists."""
        fault("manifest.before_write")
        self.fs.write_bytes(
            manifest.path, manifest.to_bytes(), on_temp=lambda: fault("manifest.after_temp")
        )
        fault("manifest.after_write")
        self._manifests[manifest.path] = manifest

    def write_changelog(
        self,
        commit: CommitRef,
        ops: Sequence[WriteOp],
        range_deletes: Sequence[tuple[bytes, bytes]],
        part: int | None = None,
    ) -> ChangelogRef:
        """Write one commit's changelog file, or one ``part`` of it (immutable;
        its name has the commit id)."""
        parts, crc = _changelog.encode_parts(commit.version, commit.commit_id, ops, range_deletes)
        path = changelog_path(commit.version, commit.commit_id, part)
        fault("changelog.before_write")
        size, crc = self.fs.write_parts(
            path, parts, crc, on_temp=lambda: fault("changelog.after_temp")
        )
        fault("changelog.after_write")
        return ChangelogRef(commit, FileEntry(path, size, crc))

    # -- winners ------------------------------------------------------------------------

    def winner(self, version: int) -> str | None:
        """The commit id recorded as ``version``'s winner, if any."""
        path = winner_path(version)
        try:
            data = self.fs.read_bytes(path)
        except FileNotFoundError:
            return None
        try:
            obj = json.loads(data)
            v, cid = int(obj["version"]), str(obj["commit_id"])
            ok = v == version and obj["crc32"] == zlib.crc32(f"{v}:{cid}".encode())
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            full = self.fs.full(path)
            raise CheckpointCorruptError(
                f"winner record {full} of version {version} is damaged; write it again "
                "with record_winner",
                full,
                version,
            )
        return cid

    def record_winner(self, version: int, commit_id: str) -> None:
        """Record that ``commit_id`` is the attempt of ``version`` that counts, so
        that ``load(version)`` follows it even when other attempts published.

        Idempotent; :class:`WinnerConflictError` if another commit was recorded.
        """
        self.manifest(check_version(version), commit_id)  # it must exist and be sound
        current = self.winner(version)
        if current == commit_id:
            return
        if current is not None:
            raise WinnerConflictError(
                f"version {version} at {self.root} already has winner {current}; it "
                f"cannot become {commit_id}"
            )
        data = json.dumps(
            {
                "version": version,
                "commit_id": commit_id,
                "crc32": zlib.crc32(f"{version}:{commit_id}".encode()),
            }
        ).encode()
        fault("winner.before_write")
        self.fs.write_bytes(winner_path(version), data, on_temp=lambda: fault("winner.after_temp"))
        fault("winner.after_write")

    # -- retention ------------------------------------------------------------------------

    def cleanup(self, retain: int) -> Cleanup:
        """Apply retention (see :mod:`statestore._retention`)."""

        def read(ref: tuple[int, str], stat: FileStat) -> Manifest:
            if stat.mtime_ns is None:
                return self.manifest(*ref)
            key = (self.fs.full(stat.path), stat.size, stat.mtime_ns)
            with _KEPT_LOCK:
                cached = _KEPT.get(key)
                if cached is not None:
                    _KEPT.move_to_end(key)
                    return cached
            manifest = self.manifest(*ref)
            with _KEPT_LOCK:
                _KEPT[key] = manifest
                if len(_KEPT) > _KEPT_LIMIT:
                    _KEPT.popitem(last=False)
            return manifest

        result = cleanup(self.fs, retain, read)
        if result.oldest_kept is not None:
            for path in [p for p, m in self._manifests.items() if m.version < result.oldest_kept]:
                del self._manifests[path]
        return result
