"""Shared test helpers.

Vectors are read from ``../shared/vectors`` (beside the repository) when that directory
exists, else from the unchanged copies in ``tests/vectors``, so a clean clone works too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_SHARED_VECTORS = Path(__file__).resolve().parents[2] / "shared" / "vectors"
_LOCAL_VECTORS = Path(__file__).resolve().parent / "vectors"
VECTORS_DIR = _SHARED_VECTORS if _SHARED_VECTORS.is_dir() else _LOCAL_VECTORS


def load_vector(name: str) -> Any:
    """The parsed JSON of the vector file ``name`` (e.g. ``"rfc8032_ed25519.json"``)."""
    return json.loads((VECTORS_DIR / name).read_text(encoding="utf-8"))


@pytest.fixture
def vectors() -> Callable[[str], Any]:
    """A loader for the published vector files."""
    return load_vector


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local Redis Cluster (three primaries, three replicas) shared by the test session."""
    from cluster_helpers import cluster_fixture

    yield from cluster_fixture(tmp_path_factory)


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local primary, its replica and three sentinels, shared by the test session."""
    from sentinel_helpers import sentinel_fixture

    yield from sentinel_fixture(tmp_path_factory)
