"""Corruption: every kind of checkpoint file, truncated, altered or deleted,
gives a typed error that names the file and the version."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from statestore import (
    CheckpointCorruptError,
    CorruptionError,
    StateStore,
    VersionNotFoundError,
)
from tests.statestore._store_util import Stores, put, rows


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))


def _delete(path: Path) -> None:
    path.unlink()


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncate": _truncate,
    "flip": _flip,
    "delete": _delete,
}


def _build(stores: Stores) -> StateStore:
    """Versions 1..7, a snapshot every 3: version 7 needs the snapshot of 6
    (SST files shared with 3) and the changelog of 7."""
    s = stores.open(snapshot_interval=3)
    s.load(None)
    for v in range(1, 8):
        put(s, {str(v): v, "last": v})
        s.commit(v)
    s.close()
    return s


def _files_of(store: StateStore, version: int) -> dict[str, list[Path]]:
    (cid,) = store.checkpoint.commits(version)
    m = store.checkpoint.manifest(version, cid)
    root = Path(store.checkpoint.root)
    assert m.snapshot is not None
    snap = [root / f.path for f in m.snapshot.files]
    return {
        "manifest": [root / m.path],
        "changelog": [root / c.file.path for c in m.changelogs],
        "sst": [p for p in snap if p.name.endswith(".sst")],
        "snapshot-MANIFEST": [p for p in snap if p.name.startswith("MANIFEST-")],
        "snapshot-CURRENT": [p for p in snap if p.name == "CURRENT"],
        "snapshot-OPTIONS": [p for p in snap if p.name.startswith("OPTIONS-")],
    }


class TestCorruption:
    @pytest.mark.parametrize("damage", sorted(DAMAGE))
    @pytest.mark.parametrize(
        "kind",
        [
            "changelog",
            "sst",
            "snapshot-MANIFEST",
            "snapshot-CURRENT",
            "snapshot-OPTIONS",
            "manifest",
        ],
    )
    def test_damaged_file_names_file_and_version(
        self, stores: Stores, kind: str, damage: str
    ) -> None:
        """Loading version 7 with a damaged file raises CheckpointCorruptError
        naming that file and version 7; versions not needing it still load."""
        writer = _build(stores)
        version = 7
        if kind == "manifest" and damage == "delete":
            version = 5  # a deleted newest manifest is a commit that never finished
        files = _files_of(writer, version)[kind]
        assert files, f"version {version} has no {kind} file"
        victim = files[0]
        DAMAGE[damage](victim)
        reader = stores.open(snapshot_interval=3)
        with pytest.raises(CheckpointCorruptError) as info:
            reader.load(version)
        err = info.value
        assert isinstance(err, CorruptionError)
        assert Path(err.path) == victim and err.version == version
        assert str(victim) in str(err) and f"version {version}" in str(err)
        reader.load(2)
        assert rows(reader) == {"1": 1, "2": 2, "last": 2}

    def test_deleted_newest_manifest_is_not_found(self, stores: Stores) -> None:
        """Without its manifest the newest version never existed: not found,
        and the version before it loads."""
        writer = _build(stores)
        _files_of(writer, 7)["manifest"][0].unlink()
        reader = stores.open()
        with pytest.raises(VersionNotFoundError):
            reader.load(7)
        reader.load(6)
        assert rows(reader)["last"] == 6

    @pytest.mark.parametrize("damage", ["truncate", "flip"])
    def test_damaged_winner_record(self, stores: Stores, damage: str) -> None:
        """A damaged winner record is a CheckpointCorruptError naming it."""
        writer = _build(stores)
        (cid,) = writer.checkpoint.commits(7)
        writer.checkpoint.record_winner(7, cid)
        path = Path(writer.checkpoint.root) / "winners" / f"{7:020d}.json"
        DAMAGE[damage](path)
        with pytest.raises(CheckpointCorruptError) as info:
            stores.open().load(7)
        assert Path(info.value.path) == path and info.value.version == 7

    def test_changelog_of_another_commit_is_rejected(self, stores: Stores) -> None:
        """A changelog replaced by the bytes of another commit's is detected."""
        writer = _build(stores)
        files = _files_of(writer, 5)["changelog"]
        assert len(files) == 2
        first, second = files
        first.write_bytes(second.read_bytes())
        with pytest.raises(CheckpointCorruptError) as info:
            stores.open().load(5)
        assert Path(info.value.path) == first
