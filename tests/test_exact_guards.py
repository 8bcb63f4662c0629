"""The exact layer's guards, each with a test that fails when its line is removed: a stale
entry found on read is deleted from the store, and an answer is stored only under the model
version that produced it (a swap while it was generated never lets it be served)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.miss import Miss
from infercache.request import parse_request
from infercache.settings import Settings
from tests.harness.upstreams import CountingUpstream
from tests.harness.vocabulary import chat


@pytest.fixture
def cache(tmp_path: Path, clock: ManualClock) -> Iterator[Cache]:
    c = Cache(
        Settings(data_dir=tmp_path, store_url=f"sqlite:///{tmp_path}/c.db", default_ttl_s=60),
        clock=clock,
    )
    yield c
    c.close()


def key(cache: Cache) -> str:
    return cache.exact.key(parse_request(chat()))


def missed(cache: Cache) -> Miss:
    """`chat()` begun on `cache`: a miss, the caller's to close."""
    miss = cache.begin(chat())
    assert isinstance(miss, Miss)
    return miss


def test_an_expired_entry_found_on_read_is_deleted_from_the_store(
    cache: Cache, clock: ManualClock, upstream: CountingUpstream
) -> None:
    cache.complete(chat(), upstream)
    assert cache.backend.get(key(cache)) is not None
    clock.advance(61)
    assert cache.complete(chat(), upstream).layer is Layer.MISS
    # The miss re-stored a fresh answer; what matters is the stale one did not linger: the
    # entry under the key is the new one.
    entry = cache.backend.get(key(cache))
    assert entry is not None
    assert entry.created_at_s == clock.now_s()


def test_a_stale_entry_is_deleted_on_read_even_when_nothing_replaces_it(
    cache: Cache, upstream: CountingUpstream
) -> None:
    cache.set_model_version("test-model", "v1")
    cache.complete(chat(), upstream)
    cache.set_model_version("test-model", "v2")
    miss = missed(cache)
    assert cache.backend.get(key(cache)) is None  # reclaimed by the read itself
    miss.close(None)
    assert cache.stats()["strategies"]["exact"]["misses"]["stale_model_version"] == 1


def test_an_answer_generated_across_a_swap_is_never_served(
    cache: Cache, upstream: CountingUpstream
) -> None:
    cache.set_model_version("test-model", "v1")
    miss = missed(cache)
    cache.set_model_version("test-model", "v2")  # lands while the answer is being generated
    miss.close(upstream(chat()), upstream_s=1.0)
    assert cache.complete(chat(), upstream).layer is Layer.MISS


def test_an_answer_from_an_older_version_is_not_stored_under_the_current_one(
    cache: Cache, upstream: CountingUpstream
) -> None:
    cache.set_model_version("test-model", "fp-2")
    miss = missed(cache)
    assert miss.lookup is not None
    # A replica still on fp-1 answered: the upstream says which version produced it.
    store = cache.exact.store
    store(miss.lookup, miss.request, upstream(chat()), upstream_s=1.0, produced_by="fp-1")
    assert cache.backend.get(key(cache)) is None
    assert cache.stats()["strategies"]["exact"]["counters"]["not_stored"] == 1
    store(miss.lookup, miss.request, upstream(chat()), upstream_s=1.0, produced_by="fp-2")
    assert cache.complete(chat(), upstream).layer is Layer.EXACT
