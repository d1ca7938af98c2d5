"""Retention: keep the newest versions loadable, delete what none of them needs.

The kept versions are the newest ``retain`` distinct versions that have a
manifest (every attempt at a kept version is kept). A file is deleted only when

* no kept manifest names it, and
* the version its name starts with is older than the oldest kept version.

The first rule keeps every file a kept version needs. The second protects the
files of commits still in flight (which a manifest does not name yet): they
carry their own version, which is at least the oldest kept one unless the
commit is for a version retention has already dropped. Expired manifests go
first, oldest first, so that a crash part-way leaves the kept versions a suffix
and never a manifest whose files are gone.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass

from statestore._checkpoint_fs import CheckpointFS, FileStat
from statestore._faults import fault
from statestore._manifest import Manifest, name_version, parse_manifest_name, winner_path

__all__ = ["Cleanup", "cleanup"]


@dataclass
class Cleanup:
    """What one cleanup removed."""

    oldest_kept: int | None = None
    manifests_deleted: int = 0
    files_deleted: int = 0


def cleanup(
    fs: CheckpointFS,
    retain: int,
    read_manifest: Callable[[tuple[int, str], FileStat], Manifest],
) -> Cleanup:
    """Delete the manifests of all but the newest ``retain`` versions and every
    file that only they (or failed attempts) needed. ``read_manifest`` reads
    a listed manifest, given its version and commit id and its listing."""
    listed = fs.list("manifests")
    named = [(parse_manifest_name(posixpath.basename(s.path)), s) for s in listed]
    manifests = [(ref, stat) for ref, stat in named if ref is not None]
    versions = sorted({v for (v, _), _ in manifests})
    result = Cleanup()
    if len(versions) <= retain:
        return result
    oldest = result.oldest_kept = versions[-retain]
    kept = [read_manifest(ref, stat) for ref, stat in manifests if ref[0] >= oldest]
    needed = {f.path for m in kept for f in m.files()}

    fault("cleanup.before_delete")
    for (v, _), stat in sorted(manifests, key=lambda m: m[0]):
        if v < oldest:
            fs.delete(stat.path)
            result.manifests_deleted += 1
    for v in versions:
        if v < oldest:
            fs.delete(winner_path(v))
    fault("cleanup.after_manifests")

    def expired(path: str) -> bool:
        v = name_version(posixpath.basename(path))
        return v is not None and v < oldest and path not in needed

    for directory in ("changelogs", "sst", "manifests", "winners"):
        for stat in fs.list(directory):
            if expired(stat.path):
                fs.delete(stat.path)
                result.files_deleted += 1
    for stat in fs.list("snapshots"):
        taken = name_version(posixpath.basename(stat.path))
        if taken is None or taken >= oldest:
            continue
        files = fs.list(stat.path)
        if not any(f.path in needed for f in files):
            fs.delete_dir(stat.path)
            result.files_deleted += len(files)
    fault("cleanup.after_files")
    return result
