"""One partition's checkpoint directory on any filesystem ``pyarrow.fs`` reaches.

Every file is published atomically, so that a reader sees it whole or not at
all: where the filesystem renames atomically (local disks, HDFS) it is written
under a temporary name and moved; on object stores (S3, GCS, Azure), where a
rename is a copy but a single upload becomes visible only when it completes, it
is written once under its final name. On a local disk the file and its
directory are fsync'ed before the write returns.

Sizes and CRC-32 checksums are computed while the bytes stream through, so each
file is read once.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import uuid
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from statestore._filesystems import filesystem_for

__all__ = ["CheckpointFS", "FileStat"]

_CHUNK = 8 * 1024 * 1024
_RENAMING = frozenset({"local", "hdfs"})
TEMP_MARK = ".tmp-"


@dataclass(frozen=True)
class FileStat:
    """A written or listed file: its path below the checkpoint root, size and
    CRC-32 (``None`` when only listed); a listed file's modification time in
    nanoseconds where the filesystem gives one."""

    path: str
    size: int
    crc32: int | None = None
    mtime_ns: int | None = None


def _renames_atomically(fs: pafs.FileSystem) -> bool:
    while isinstance(fs, pafs.SubTreeFileSystem):
        fs = fs.base_fs
    return fs.type_name in _RENAMING


def _fsync(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointFS:
    """Reads and atomic writes of files below one root directory."""

    def __init__(
        self, location: str, *parts: str, filesystem: pafs.FileSystem | None = None
    ) -> None:
        if filesystem is None:
            fs, base = filesystem_for(location)
        else:
            fs, base = filesystem, location.rstrip("/") or "/"
        self.fs = fs
        self.root = posixpath.join(base, *parts) if parts else base
        self.rename = _renames_atomically(fs)
        self.local = isinstance(fs, pafs.LocalFileSystem)
        self._made: set[str] = set()

    def full(self, rel: str) -> str:
        """The filesystem path of ``rel`` (a path below the root)."""
        return posixpath.join(self.root, rel)

    def _ensure_dir(self, rel_dir: str) -> None:
        if rel_dir not in self._made:
            self.fs.create_dir(self.full(rel_dir), recursive=True)
            self._made.add(rel_dir)

    # -- writes ---------------------------------------------------------------------

    def write(
        self,
        rel: str,
        produce: Callable[[Any], None],
        on_temp: Callable[[], None] = lambda: None,
        sync_dir: bool = True,
        crc: int | None = None,
    ) -> tuple[int, int]:
        """Publish ``rel`` atomically with the bytes ``produce(stream)`` writes;
        returns ``(size, crc32)``. ``on_temp`` runs when the bytes are written
        under the temporary name, before the move (never on object stores).
        ``sync_dir=False`` leaves the directory's fsync to :meth:`sync_dirs`
        (one fsync for many files). ``crc``, when the caller knows the bytes'
        CRC-32 already, spares a pass over them."""
        self._ensure_dir(posixpath.dirname(rel))
        final = self.full(rel)
        target = f"{final}{TEMP_MARK}{uuid.uuid4().hex[:12]}" if self.rename else final
        sink = _Summing(self.fs.open_output_stream(target, compression=None), crc)
        try:
            produce(sink)
        except BaseException:
            sink.stream.close()
            if self.rename:
                self._delete_quietly(target)
            raise
        sink.stream.close()
        if self.rename:
            if self.local:
                _fsync(target)
            on_temp()
            self.fs.move(target, final)
            if self.local and sync_dir:
                _fsync(posixpath.dirname(final), directory=True)
        return sink.size, sink.crc

    def sync_dirs(self, rels: Iterable[str]) -> None:
        """Make the names of files written with ``sync_dir=False`` durable."""
        if self.local:
            for rel_dir in sorted({posixpath.dirname(r) for r in rels}):
                _fsync(self.full(rel_dir), directory=True)

    def write_bytes(
        self, rel: str, data: bytes, on_temp: Callable[[], None] = lambda: None
    ) -> tuple[int, int]:
        """Publish ``data`` as ``rel``; returns ``(size, crc32)``."""
        return self.write(rel, lambda out: out.write(data), on_temp)

    def write_parts(
        self,
        rel: str,
        parts: Sequence[bytes | memoryview],
        crc: int,
        on_temp: Callable[[], None] = lambda: None,
    ) -> tuple[int, int]:
        """Publish the bytes of ``parts``, one after another, as ``rel``,
        their CRC-32 ``crc`` known already; returns ``(size, crc32)``."""

        def produce(out: Any) -> None:
            for part in parts:
                out.write(part)

        return self.write(rel, produce, on_temp, crc=crc)

    def upload(
        self,
        local_path: str,
        rel: str,
        on_temp: Callable[[], None] = lambda: None,
        sync_dir: bool = True,
    ) -> tuple[int, int]:
        """Publish the local file ``local_path`` as ``rel``; returns
        ``(size, crc32)``."""

        def copy(out: _Summing) -> None:
            with open(local_path, "rb") as src:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)

        return self.write(rel, copy, on_temp, sync_dir)

    # -- reads ----------------------------------------------------------------------

    def read_bytes(self, rel: str) -> bytes:
        """The whole file ``rel``; ``FileNotFoundError`` if it does not exist."""
        with self._open_input(rel) as src:
            data: bytes = src.read()
        return data

    def _open_input(self, rel: str) -> pa.NativeFile:
        """An input stream on ``rel``; ``FileNotFoundError`` if it does not
        exist (some filesystems say so only with a generic ``OSError``)."""
        path = self.full(rel)
        try:
            return self.fs.open_input_stream(path, compression=None)
        except FileNotFoundError:
            raise
        except OSError:
            if self.stat(rel) is None:
                raise FileNotFoundError(path) from None
            raise

    def download(self, rel: str, local_path: str) -> tuple[int, int]:
        """Copy ``rel`` to the local file ``local_path``; returns ``(size,
        crc32)`` of the bytes copied."""
        size, crc = 0, 0
        src = self._open_input(rel)
        with src, open(local_path, "wb") as dst:
            while chunk := src.read(_CHUNK):
                dst.write(chunk)
                size += len(chunk)
                crc = zlib.crc32(chunk, crc)
        return size, crc

    def stat(self, rel: str) -> FileStat | None:
        """Size of ``rel``, or ``None`` if it does not exist."""
        info = self.fs.get_file_info(self.full(rel))
        if info.type == pafs.FileType.NotFound:
            return None
        return FileStat(rel, int(info.size or 0))

    def list(self, rel_dir: str) -> list[FileStat]:
        """The entries directly in ``rel_dir`` (files and directories), or none
        if it does not exist."""
        selector = pafs.FileSelector(self.full(rel_dir), allow_not_found=True)
        return [
            FileStat(
                posixpath.join(rel_dir, info.base_name), int(info.size or 0), None, info.mtime_ns
            )
            for info in self.fs.get_file_info(selector)
        ]

    # -- deletes --------------------------------------------------------------------

    def delete(self, rel: str) -> None:
        """Delete the file ``rel``; a file already gone is not an error."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.full(rel))

    def delete_dir(self, rel: str) -> None:
        """Delete the directory ``rel`` and what it holds, if it exists."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(self.full(rel))

    def _delete_quietly(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.fs.delete_file(path)


class _Summing:
    """An output stream wrapper that counts bytes and folds them into a CRC
    (or, given the CRC of the bytes to come, only counts them)."""

    def __init__(self, stream: Any, crc: int | None = None) -> None:
        self.stream = stream
        self.size = 0
        self.crc = 0 if crc is None else crc
        self._known = crc is not None

    def write(self, data: bytes | memoryview) -> None:
        self.stream.write(data)
        self.size += len(data)
        if not self._known:
            self.crc = zlib.crc32(data, self.crc)
