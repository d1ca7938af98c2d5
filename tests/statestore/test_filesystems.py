"""Where a checkpoint location's filesystem comes from: local paths, URIs, and
S3 configured from the environment or from options."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from statestore._filesystems import filesystem_for, redact
from tests._s3 import BUCKET, MotoS3


def _roundtrip(fs: pafs.FileSystem, path: str) -> bytes:
    fs.create_dir(path, recursive=True)
    with fs.open_output_stream(f"{path}/probe") as out:
        out.write(b"relstate")
    with fs.open_input_stream(f"{path}/probe") as src:
        data: bytes = src.read()
    return data


class TestFilesystemFor:
    def test_local_path_and_file_uri(self, tmp_path: Path) -> None:
        """A plain path is absolute on the local filesystem; file:// is too."""
        fs, path = filesystem_for(os.path.relpath(tmp_path))
        assert isinstance(fs, pafs.LocalFileSystem) and path == str(tmp_path)
        fs, path = filesystem_for(f"file://{tmp_path}/")
        assert isinstance(fs, pafs.LocalFileSystem) and path == str(tmp_path)

    def test_s3_from_the_environment(self, s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
        """s3://bucket/path takes endpoint, region and credentials from the
        AWS_* variables."""
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        fs, path = filesystem_for(f"s3://{BUCKET}/env-{uuid.uuid4().hex}/")
        assert isinstance(fs, pafs.S3FileSystem) and not path.endswith("/")
        assert _roundtrip(fs, path) == b"relstate"

    def test_options_take_precedence(self, s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
        """Options name the endpoint and credentials even when the environment
        points elsewhere."""
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
        options = {
            "endpoint": s3.endpoint,
            "region": "us-east-1",
            "access_key": "test",
            "secret_key": "test",
        }
        fs, path = filesystem_for(f"s3://{BUCKET}/opt-{uuid.uuid4().hex}", options)
        assert _roundtrip(fs, path) == b"relstate"

    def test_pyarrow_uri_with_endpoint(self, s3: MotoS3) -> None:
        """An s3:// URI carrying its endpoint and credentials is pyarrow's own."""
        fs, path = filesystem_for(s3.uri())
        assert _roundtrip(fs, path) == b"relstate"


class TestRedact:
    @pytest.mark.parametrize(
        ("location", "printed"),
        [
            ("/data/state", "/data/state"),
            ("file:///data/state", "file:///data/state"),
            ("s3://bucket/state", "s3://bucket/state"),
            (
                "s3://AKID:SECRET@bucket/state?endpoint_override=h:9000&scheme=http",
                "s3://***@bucket/state?endpoint_override=h:9000&scheme=http",
            ),
            ("s3://AKID:SECRET@bucket", "s3://***@bucket"),
            ("hdfs://user@namenode:8020/state", "hdfs://***@namenode:8020/state"),
            (
                "s3://bucket/p?access_key=AKID&secret_key=SECRET&session_token=T&region=r",
                "s3://bucket/p?access_key=***&secret_key=***&session_token=***&region=r",
            ),
            ("s3://bucket?region=a@b", "s3://bucket?region=a@b"),
        ],
    )
    def test_credentials_are_replaced(self, location: str, printed: str) -> None:
        """A URI's user info and its key, secret and token parameters are
        replaced by ***; everything else is printed as it is."""
        assert redact(location) == printed
