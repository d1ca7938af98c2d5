"""An S3-compatible server (moto) on loopback for the tests, and checkpoint
locations in its bucket."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

__all__ = ["MotoS3", "start_moto"]

BUCKET = "relstate"


@dataclass
class MotoS3:
    """A running moto server and the bucket the tests use."""

    process: subprocess.Popen[bytes]
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def filesystem(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(
            access_key="test",
            secret_key="test",
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )

    def uri(self, name: str | None = None) -> str:
        """A fresh location in the bucket, in pyarrow's URI syntax with the
        endpoint and credentials in it (so that Spark's Python workers, whose
        environment is the JVM's, reach the server too)."""
        prefix = name or uuid.uuid4().hex
        return (
            f"s3://test:test@{BUCKET}/{prefix}?endpoint_override=127.0.0.1:{self.port}"
            "&scheme=http&region=us-east-1"
        )

    def upload(self, local: Path, uri: str) -> None:
        """Copy a local directory tree to ``uri``."""
        _, path = pafs.FileSystem.from_uri(uri)
        pafs.copy_files(
            str(local),
            path,
            source_filesystem=pafs.LocalFileSystem(),
            destination_filesystem=self.filesystem(),
        )

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto() -> MotoS3:
    """Start ``moto.server`` on a free loopback port and create the bucket."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = MotoS3(process, port)
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise RuntimeError("the moto S3 server did not start") from None
            time.sleep(0.1)
    server.filesystem().create_dir(BUCKET)
    return server
