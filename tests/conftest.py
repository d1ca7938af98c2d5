"""Shared fixtures: a KV backend of each kind, so that every behaviour suite runs
against both the in-memory reference and RocksDB."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from statestore import KVBackend, MemoryBackend, RocksDBBackend
from tests._s3 import MotoS3, start_moto

settings.register_profile(
    "relstate",
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("relstate")

BackendFactory = Callable[[], KVBackend]


@pytest.fixture(params=["memory", "rocksdb"])
def backend_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BackendFactory]:
    """Opens backends of one kind; RocksDB ones in fresh directories, all closed
    at the end."""
    opened: list[KVBackend] = []
    counter = iter(range(1_000_000))

    def make() -> KVBackend:
        backend: KVBackend
        if request.param == "memory":
            backend = MemoryBackend()
        else:
            backend = RocksDBBackend(tmp_path / f"db{next(counter)}")
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        backend.close()


def reopen(backend: KVBackend) -> KVBackend:
    """The same data through a new handle: RocksDB is closed and opened again at
    its path; the memory backend, which lives only in its object, is returned."""
    if isinstance(backend, RocksDBBackend):
        backend.close()
        return RocksDBBackend(backend.path, backend.config)
    return backend


@pytest.fixture
def backend(backend_factory: BackendFactory) -> KVBackend:
    """One open backend of each kind."""
    return backend_factory()


@pytest.fixture(scope="session")
def s3() -> Iterator[MotoS3]:
    """An S3-compatible server (moto) on loopback for the whole session."""
    server = start_moto()
    yield server
    server.stop()
