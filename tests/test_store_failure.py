"""A broken store never fails a request: the upstream answers and `store_error` counts it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.settings import Settings
from tests.harness.servers import free_port
from tests.harness.upstreams import CountingUpstream
from tests.harness.vocabulary import chat


def cache_at(url: str, tmp_path: Path, clock: ManualClock) -> Cache:
    return Cache(Settings(data_dir=tmp_path, store_url=url), clock=clock)


def broken_urls(tmp_path: Path) -> dict[str, str]:
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"garbage " * 512)
    a_directory = tmp_path / "dir.db"
    a_directory.mkdir()
    return {
        "corrupted sqlite file": f"sqlite:///{corrupt}",
        "unwritable sqlite path": f"sqlite:///{a_directory}",
        "unreachable redis": f"redis://127.0.0.1:{free_port()}/0",
        "unreachable redis cluster": f"redis+cluster://127.0.0.1:{free_port()}",
    }


@pytest.mark.parametrize(
    "kind",
    [
        "corrupted sqlite file",
        "unwritable sqlite path",
        "unreachable redis",
        "unreachable redis cluster",
    ],
)
def test_requests_succeed_and_store_errors_are_counted(
    kind: str,
    tmp_path: Path,
    clock: ManualClock,
    upstream: CountingUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = cache_at(broken_urls(tmp_path)[kind], tmp_path, clock)
    with caplog.at_level(logging.WARNING):
        layers = [cache.complete(chat(), upstream).layer for _ in range(3)]
    assert layers == [Layer.MISS] * 3
    assert upstream.calls == 3
    snap = cache.stats()["strategies"]["exact"]
    assert snap["misses"] == {"store_error": 3}
    assert snap["counters"]["store_errors"] == 3
    assert "cache store failed" in caplog.text
    cache.close()


def test_a_store_that_breaks_mid_run_degrades_to_misses(
    tmp_path: Path, clock: ManualClock, upstream: CountingUpstream
) -> None:
    db = tmp_path / "c.db"
    cache = cache_at(f"sqlite:///{db}", tmp_path, clock)
    cache.complete(chat(), upstream)
    assert cache.complete(chat(), upstream).layer == Layer.EXACT
    cache.backend.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.mkdir()  # the file is gone and cannot come back
    assert cache.complete(chat(), upstream).layer == Layer.MISS
    assert cache.stats()["strategies"]["exact"]["misses"]["store_error"] == 1
