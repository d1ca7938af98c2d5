"""The manifest of one commit, and the names of every checkpoint file.

A manifest is the only file that makes a version exist. It names the commit
(version, commit id, parent), the snapshot the state builds on and the chain of
changelogs since that snapshot, each file with its size and CRC-32, and the
metadata a later load checks (tables, value format, partition count). Its own
integrity is a CRC-32 over its canonical JSON body.

Every name below the partition directory starts with the zero-padded version
and, except winner records, the commit id, so that two attempts at a version
never write the same name and cleanup can tell a file's age from its name::

    manifests/{version}-{commit}.json
    changelogs/{version}-{commit}.log
    sst/{version}-{commit}-{rocksdb name}.sst        shared by later snapshots
    snapshots/{version}-{commit}/{rocksdb name}      MANIFEST-*, OPTIONS-*, CURRENT
    winners/{version}.json
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from statestore._metadata import TableMeta

__all__ = [
    "ChangelogRef",
    "CommitRef",
    "FileEntry",
    "Manifest",
    "ManifestFormatError",
    "SnapshotRef",
    "changelog_path",
    "manifest_path",
    "name_version",
    "parse_manifest_name",
    "snapshot_file_path",
    "winner_path",
]

FORMAT = "relstate-manifest"
FORMAT_VERSION = 1
_NAME = re.compile(r"^(\d{20})-([0-9a-f]{32})")
_MANIFEST = re.compile(r"^(\d{20})-([0-9a-f]{32})\.json$")


def _v(version: int) -> str:
    return f"{version:020d}"


def manifest_path(version: int, commit_id: str) -> str:
    return f"manifests/{_v(version)}-{commit_id}.json"


def changelog_path(version: int, commit_id: str, part: int | None = None) -> str:
    """A commit's changelog; a commit that spilled writes several parts."""
    suffix = "" if part is None else f"-p{part:06d}"
    return f"changelogs/{_v(version)}-{commit_id}{suffix}.log"


def snapshot_file_path(version: int, commit_id: str, name: str) -> str:
    """Where a snapshot's file goes: SST files in the shared ``sst/`` directory
    (later snapshots reuse them), the rest in the snapshot's own directory."""
    if name.endswith(".sst"):
        return f"sst/{_v(version)}-{commit_id}-{name}"
    return f"snapshots/{_v(version)}-{commit_id}/{name}"


def winner_path(version: int) -> str:
    return f"winners/{_v(version)}.json"


def parse_manifest_name(name: str) -> tuple[int, str] | None:
    """``(version, commit id)`` of a manifest's base name; ``None`` for any
    other name (a temporary file, say)."""
    m = _MANIFEST.match(name)
    return None if m is None else (int(m.group(1)), m.group(2))


def name_version(name: str) -> int | None:
    """The version a checkpoint file's base name starts with, if it does."""
    m = _NAME.match(name)
    if m is None:
        m = re.match(r"^(\d{20})\.json", name)
    return None if m is None else int(m.group(1))


class ManifestFormatError(ValueError):
    """The bytes are not a well-formed manifest."""


@dataclass(frozen=True)
class FileEntry:
    """A checkpoint file that a manifest needs: its path below the partition
    directory, its size and CRC-32, and (snapshot files) its local name."""

    path: str
    size: int
    crc32: int
    name: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "size": self.size, "crc32": self.crc32}
        if self.name:
            out["name"] = self.name
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> FileEntry:
        return cls(str(obj["path"]), int(obj["size"]), int(obj["crc32"]), str(obj.get("name", "")))


@dataclass(frozen=True)
class CommitRef:
    """One commit: a version and the id of the attempt that wrote it."""

    version: int
    commit_id: str

    def to_json(self) -> list[Any]:
        return [self.version, self.commit_id]

    @classmethod
    def from_json(cls, obj: Any) -> CommitRef:
        version, commit_id = obj
        return cls(int(version), str(commit_id))


@dataclass(frozen=True)
class ChangelogRef:
    """A changelog in a manifest's chain."""

    commit: CommitRef
    file: FileEntry


@dataclass(frozen=True)
class SnapshotRef:
    """The snapshot a version builds on: the commit that took it and its files."""

    commit: CommitRef
    files: tuple[FileEntry, ...]


@dataclass(frozen=True)
class Manifest:
    """Everything needed to load one committed version."""

    version: int
    commit_id: str
    parent: CommitRef | None
    #: The newest committed ancestors, parent first (as many as the committing
    #: store kept); a load that finds one of them missing knows it was deleted.
    ancestors: tuple[CommitRef, ...]
    operator_id: str
    partition_id: int
    partition_count: int | None
    value_format_version: int
    changelog_format_version: int
    tables: tuple[TableMeta, ...]
    snapshot: SnapshotRef | None
    changelogs: tuple[ChangelogRef, ...]
    created_at: str
    metrics: dict[str, int] = field(default_factory=dict)
    #: Rows per table at this version (by table name; empty in a manifest
    #: written before relstate recorded them).
    table_rows: dict[str, int] = field(default_factory=dict)

    @property
    def ref(self) -> CommitRef:
        return CommitRef(self.version, self.commit_id)

    @property
    def path(self) -> str:
        return manifest_path(self.version, self.commit_id)

    def files(self) -> Iterator[FileEntry]:
        """Every file this version needs besides the manifest itself."""
        if self.snapshot is not None:
            yield from self.snapshot.files
        for c in self.changelogs:
            yield c.file

    def lineage(self) -> list[CommitRef]:
        """The commits whose state this version's files rebuild, oldest first:
        the snapshot's commit, then each changelog's."""
        out = [] if self.snapshot is None else [self.snapshot.commit]
        return out + [c.commit for c in self.changelogs]

    # -- bytes ------------------------------------------------------------------------

    def _body(self) -> dict[str, Any]:
        snapshot = None
        if self.snapshot is not None:
            snapshot = {
                "commit": self.snapshot.commit.to_json(),
                "files": [f.to_json() for f in self.snapshot.files],
            }
        return {
            "version": self.version,
            "commit_id": self.commit_id,
            "parent": None if self.parent is None else self.parent.to_json(),
            "ancestors": [a.to_json() for a in self.ancestors],
            "operator_id": self.operator_id,
            "partition_id": self.partition_id,
            "partition_count": self.partition_count,
            "value_format_version": self.value_format_version,
            "changelog_format_version": self.changelog_format_version,
            "tables": [t.to_json() for t in self.tables],
            "snapshot": snapshot,
            "changelogs": [
                {"commit": c.commit.to_json(), "file": c.file.to_json()} for c in self.changelogs
            ],
            "created_at": self.created_at,
            "metrics": dict(self.metrics),
            "table_rows": dict(self.table_rows),
        }

    def to_bytes(self) -> bytes:
        body = self._body()
        crc = zlib.crc32(_canonical(body))
        doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "crc32": crc, "body": body}
        # One line: ``indent`` needs the pure-Python encoder, and the C one
        # is the faster by far.
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse and verify a manifest; :class:`ManifestFormatError` if it is
        truncated, altered or of an unknown format."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestFormatError(f"not valid JSON ({exc})") from exc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ManifestFormatError(f"not a {FORMAT} document")
        if doc.get("format_version") != FORMAT_VERSION:
            raise ManifestFormatError(
                f"format version {doc.get('format_version')!r}; this relstate reads "
                f"version {FORMAT_VERSION}"
            )
        body = doc.get("body")
        if not isinstance(body, dict) or zlib.crc32(_canonical(body)) != doc.get("crc32"):
            raise ManifestFormatError("the CRC-32 of the body does not match")
        try:
            return cls._from_body(body)
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestFormatError(f"a field is missing or malformed ({exc!r})") from exc

    @classmethod
    def _from_body(cls, b: Mapping[str, Any]) -> Manifest:
        snap = b["snapshot"]
        snapshot = None
        if snap is not None:
            snapshot = SnapshotRef(
                CommitRef.from_json(snap["commit"]),
                tuple(FileEntry.from_json(f) for f in snap["files"]),
            )
        return cls(
            version=int(b["version"]),
            commit_id=str(b["commit_id"]),
            parent=None if b["parent"] is None else CommitRef.from_json(b["parent"]),
            ancestors=tuple(CommitRef.from_json(a) for a in b["ancestors"]),
            operator_id=str(b["operator_id"]),
            partition_id=int(b["partition_id"]),
            partition_count=None if b["partition_count"] is None else int(b["partition_count"]),
            value_format_version=int(b["value_format_version"]),
            changelog_format_version=int(b["changelog_format_version"]),
            tables=tuple(TableMeta.from_json(t) for t in b["tables"]),
            snapshot=snapshot,
            changelogs=tuple(
                ChangelogRef(CommitRef.from_json(c["commit"]), FileEntry.from_json(c["file"]))
                for c in b["changelogs"]
            ),
            created_at=str(b["created_at"]),
            metrics={str(k): int(v) for k, v in b["metrics"].items()},
            table_rows={str(k): int(v) for k, v in b.get("table_rows", {}).items()},
        )


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
