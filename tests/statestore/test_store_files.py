"""The checkpoint's files: changelog format, manifests, atomic writes on a
renaming and on an object-store filesystem, and fault points."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyarrow._fs import _MockFileSystem

from statestore import StateStore, StoreConfig, _changelog
from statestore import _faults as faults
from statestore._checkpoint_fs import TEMP_MARK, CheckpointFS
from statestore._manifest import Manifest, ManifestFormatError
from tests.statestore._store_util import KV, Stores, put, rows

keys = st.binary(min_size=0, max_size=40)
write_ops = st.lists(st.tuples(keys, st.none() | st.binary(max_size=200)), max_size=30)
ranges = st.lists(st.tuples(keys, keys), max_size=4)


class TestChangelogFormat:
    @given(version=st.integers(0, 2**63 - 1), ops=write_ops, range_deletes=ranges)
    def test_round_trip(
        self,
        version: int,
        ops: list[tuple[bytes, bytes | None]],
        range_deletes: list[tuple[bytes, bytes]],
    ) -> None:
        """Any batch of puts, deletes and range deletes decodes to itself,
        said to be ordered exactly when its keys ascend strictly."""
        cid = "ab" * 16
        log = _changelog.decode(_changelog.encode(version, cid, ops, range_deletes))
        assert (log.version, log.commit_id) == (version, cid)
        assert list(log.writes) == ops and log.range_deletes == range_deletes
        keys = [k for k, _ in ops]
        assert log.writes.ordered == all(a < b for a, b in pairwise(keys))
        ascending = sorted(dict(ops).items())
        assert _changelog.decode(_changelog.encode(version, cid, ascending, [])).writes.ordered

    @given(ops=write_ops.filter(bool), data=st.data())
    def test_any_damage_is_detected(
        self, ops: list[tuple[bytes, bytes | None]], data: st.DataObject
    ) -> None:
        """A truncated file or one with a flipped byte never decodes."""
        raw = _changelog.encode(1, "cd" * 16, ops, [])
        cut = data.draw(st.integers(0, len(raw) - 1))
        with pytest.raises(_changelog.ChangelogFormatError):
            _changelog.decode(raw[:cut])
        pos = data.draw(st.integers(0, len(raw) - 1))
        flipped = raw[:pos] + bytes([raw[pos] ^ 0x41]) + raw[pos + 1 :]
        with pytest.raises(_changelog.ChangelogFormatError):
            _changelog.decode(flipped)

    def test_header_names_format(self) -> None:
        """The file starts with the magic and format version 2."""
        raw = _changelog.encode(3, "ef" * 16, [(b"k", b"v")], [])
        assert raw[:4] == b"RSCL" and raw[4:6] == b"\x00\x02"

    def test_format_1_files_still_decode(self) -> None:
        """A file of format 1 (a record per operation), as relstate wrote
        before format 2, decodes to its operations."""
        body = (
            struct.pack(">4sHHq16sII", b"RSCL", 1, 0, 7, bytes.fromhex("ef" * 16), 1, 2)
            + struct.pack(">I", 1) + b"a" + struct.pack(">I", 1) + b"b"
            + struct.pack(">BI", 0, 2) + b"k1" + struct.pack(">I", 3) + b"val"
            + struct.pack(">BI", 1, 2) + b"k2"
        )  # fmt: skip
        raw = body + struct.pack(">I4s", zlib.crc32(body), b"LCSR")
        log = _changelog.decode(raw)
        assert (log.version, log.commit_id) == (7, "ef" * 16)
        assert list(log.writes) == [(b"k1", b"val"), (b"k2", None)]
        assert log.range_deletes == [(b"a", b"b")]

    def test_unknown_operation_kind_is_refused(self) -> None:
        """A format 2 file whose kind column holds a value other than put or
        delete does not decode, even with a matching CRC."""
        raw = _changelog.encode(3, "ef" * 16, [(b"k", b"v")], [])
        header = 4 + 2 + 2 + 8 + 16 + 4 + 4
        body = raw[:header] + b"\x07" + raw[header + 1 : -8]
        bad = body + struct.pack(">I4s", zlib.crc32(body), b"LCSR")
        with pytest.raises(_changelog.ChangelogFormatError, match="unknown operation kind 7"):
            _changelog.decode(bad)


class TestManifestFormat:
    def test_round_trip_and_damage(self, stores: Stores) -> None:
        """A real manifest parses back equal; an edited one fails its CRC."""
        s = stores.open()
        s.load(None)
        put(s, {"a": 1})
        info = s.commit(1)
        m = s.checkpoint.manifest(1, info.commit_id)
        again = Manifest.from_bytes(m.to_bytes())
        assert again == m
        doc = json.loads(m.to_bytes())
        doc["body"]["partition_count"] = 99
        with pytest.raises(ManifestFormatError):
            Manifest.from_bytes(json.dumps(doc).encode())
        with pytest.raises(ManifestFormatError):
            Manifest.from_bytes(m.to_bytes()[:-10])

    def test_manifest_records_metadata(self, stores: Stores) -> None:
        """A manifest names parent, tables, key types, formats and partitions."""
        s = stores.open(partition_count=8)
        s.load(None)
        first = s.commit(1)
        second = s.commit(2)
        m = s.checkpoint.manifest(2, second.commit_id)
        assert m.parent is not None and m.parent.commit_id == first.commit_id
        assert m.partition_count == 8 and m.value_format_version >= 1
        (table,) = m.tables
        assert (table.name, table.table_id, table.layout) == ("kv", 1, "row")
        assert table.key_columns == (("k", "asc", "first"),)
        assert table.columns.equals(KV.columns)
        assert [c.commit.version for c in m.changelogs] == [1, 2]


class TestAtomicWrites:
    def test_local_write_leaves_no_temporary(self, tmp_path: Path) -> None:
        """A local write publishes by rename and leaves only the final file."""
        fs = CheckpointFS(str(tmp_path))
        size, _ = fs.write_bytes("d/f.bin", b"12345")
        assert size == 5 and os.listdir(tmp_path / "d") == ["f.bin"]

    def test_failed_write_publishes_nothing(self, tmp_path: Path) -> None:
        """A write that fails before its move leaves no final file and no temp."""
        fs = CheckpointFS(str(tmp_path))

        def boom() -> None:
            raise RuntimeError("crash before the move")

        with pytest.raises(RuntimeError):
            fs.write_bytes("d/f.bin", b"x", on_temp=boom)
        assert [n for n in os.listdir(tmp_path / "d") if TEMP_MARK not in n] == []

    def test_object_store_writes_final_name_once(self) -> None:
        """On an object store the file is written once under its final name."""
        mock = _MockFileSystem()
        fs = CheckpointFS("bucket/root", filesystem=mock)
        assert not fs.rename
        fs.write_bytes("manifests/x.json", b"{}")
        assert fs.read_bytes("manifests/x.json") == b"{}"
        assert [s.path for s in fs.list("manifests")] == ["manifests/x.json"]

    def test_store_on_object_store_filesystem(self, tmp_path: Path) -> None:
        """The store works unchanged on a non-renaming pyarrow filesystem."""
        mock = _MockFileSystem()
        cfg = StoreConfig(snapshot_interval=3, retain_versions=4, local_dir=str(tmp_path / "a"))
        with StateStore("bucket/ckpt", "op", 0, [KV], cfg, filesystem=mock) as s:
            s.load(None)
            for v in range(1, 9):
                put(s, {str(v): v})
                s.commit(v)
            assert s.versions() == [5, 6, 7, 8]
        cfg2 = StoreConfig(local_dir=str(tmp_path / "b"))
        with StateStore("bucket/ckpt", "op", 0, [KV], cfg2, filesystem=mock) as r:
            r.load(7)
            assert rows(r) == {str(v): v for v in range(1, 8)}

    def test_file_uri_location(self, tmp_path: Path) -> None:
        """A file:// URI names the same directory as the plain path."""
        cfg = StoreConfig(local_dir=str(tmp_path / "l1"))
        with StateStore(f"file://{tmp_path}/c", "op", 0, [KV], cfg) as s:
            s.load(None)
            put(s, {"a": 1})
            s.commit(1)
        with StateStore(
            str(tmp_path / "c"), "op", 0, [KV], StoreConfig(local_dir=str(tmp_path / "l2"))
        ) as r:
            r.load(1)
            assert rows(r) == {"a": 1}


class TestRetentionReads:
    def test_a_fresh_store_reads_no_kept_manifest_again(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Retention reads each kept manifest once per process: a fresh store
        of the partition (the next batch's task) commits without reading again
        a manifest an earlier store's retention read, and one rewritten since
        (another modification time) is read again."""
        reads: list[str] = []
        read_bytes = CheckpointFS.read_bytes

        def counted(fs: CheckpointFS, rel: str) -> bytes:
            reads.append(rel)
            return read_bytes(fs, rel)

        monkeypatch.setattr(CheckpointFS, "read_bytes", counted)
        location = str(tmp_path / "c")
        cfg = StoreConfig(retain_versions=3, local_dir=str(tmp_path / "l"))
        with StateStore(location, "op", 0, [KV], cfg) as s:
            s.load(None)
            for v in range(1, 7):
                put(s, {str(v): v})
                s.commit(v)

        def commit_reads(version: int) -> list[str]:
            with StateStore(location, "op", 0, [KV], cfg) as s:
                s.load(version - 1)
                put(s, {str(version): version})
                reads.clear()
                s.commit(version)
                assert s.versions() == [version - 2, version - 1, version]
                return [r for r in reads if r.startswith("manifests/")]

        assert commit_reads(7) == []
        manifests = tmp_path / "c" / "op" / "0" / "manifests"
        (sixth,) = [p for p in manifests.iterdir() if p.name.startswith(f"{6:020d}")]
        stat = sixth.stat()
        os.utime(sixth, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        assert commit_reads(8) == [f"manifests/{sixth.name}"]


class TestFaultPoints:
    def test_unknown_point_is_rejected(self) -> None:
        """A misspelt fault point is a ValueError, not a silent no-op."""
        with pytest.raises(ValueError):
            faults.fault("commit.nowhere")
        with pytest.raises(ValueError), faults.inject("nowhere"):
            pass

    def test_inject_raises_at_nth_hit(self) -> None:
        """inject(name, nth) raises once, at the nth time the point is reached."""
        with faults.inject("commit.start", nth=2):
            faults.fault("commit.start")
            with pytest.raises(faults.InjectedFault):
                faults.fault("commit.start")
            faults.fault("commit.start")

    def test_env_var_kills_the_process(self, tmp_path: Path) -> None:
        """RELSTATE_FAULT=point@2 SIGKILLs the process at the second hit."""
        code = (
            "from statestore._faults import fault\n"
            "fault('commit.start'); print('one', flush=True)\n"
            "fault('commit.start'); print('two', flush=True)\n"
        )
        env = {**os.environ, "RELSTATE_FAULT": "commit.start@2"}
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            cwd=Path(__file__).parents[2],
            timeout=60,
        )
        assert proc.returncode == -9 and proc.stdout.split() == ["one"]
