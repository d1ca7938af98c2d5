"""Fixtures of the state store tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.statestore._store_util import Stores


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    """A store factory on a fresh checkpoint location; every store it opened is
    closed at the end."""
    factory = Stores(tmp_path)
    yield factory
    factory.close_all()
