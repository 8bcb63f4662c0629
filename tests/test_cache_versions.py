"""Several live versions through the library API, versions set by hand (issue 29 acceptance 6):
each version keeps its own entries, retiring one is one O(1) write every process on the store
reads, reviving it serves its still-fresh entries at once, and a version set for the whole
model retires every older one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.settings import Settings
from tests.harness.vocabulary import chat

QUESTIONS = [f"question {i}?" for i in range(20)]


class VersionedUpstream:
    """Two deployments of one model: answers carry the version that produced them."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return {
            "id": f"chatcmpl-{self.version}-{self.calls}",
            "object": "chat.completion",
            "model": body["model"],
            "system_fingerprint": self.version,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"{self.version} answers"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
        }


def cache_on(path: Path, clock: ManualClock) -> Cache:
    return Cache(Settings(data_dir=path.parent, store_url=f"sqlite:///{path}"), clock=clock)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def test_two_versions_live_at_once_each_answer_from_its_own_entries(
    tmp_path: Path, clock: ManualClock
) -> None:
    cache = cache_on(tmp_path / "c.db", clock)
    upstreams = {v: VersionedUpstream(v) for v in ("v1", "v2")}
    layers = []
    for _ in range(10):
        for i, question in enumerate(QUESTIONS):
            version = "v1" if i % 2 else "v2"  # the caller routes, as a gateway does
            done = cache.complete(chat(question), upstreams[version], version=version)
            layers.append(done.layer)
            assert done.response["system_fingerprint"] == version
    assert layers.count(Layer.EXACT) == 180
    # The same question under both versions: two entries, neither overwrites the other.
    for version in ("v1", "v2", "v1", "v2"):
        done = cache.complete(chat("shared?"), upstreams[version], version=version)
        assert done.response["system_fingerprint"] == version
    assert [u.calls for u in upstreams.values()] == [11, 11]


def test_retire_and_revive_are_shared_by_every_process_on_the_store(
    tmp_path: Path, clock: ManualClock
) -> None:
    one, other = cache_on(tmp_path / "c.db", clock), cache_on(tmp_path / "c.db", clock)
    v1, v2 = VersionedUpstream("v1"), VersionedUpstream("v2")
    for question in QUESTIONS:
        one.complete(chat(question), v1, version="v1")
    assert all(other.complete(chat(q), v1, version="v1").layer is Layer.EXACT for q in QUESTIONS)
    assert one.retire_version("test-model", "v1") is True  # promotion of v2
    for question in QUESTIONS:  # no answer of v1 is served, by either process
        assert other.complete(chat(question), v1, version="v1").layer is Layer.MISS
        assert one.complete(chat(question), v2, version="v2").layer is Layer.MISS
    calls = v1.calls
    clock.advance(60.0)  # within the entries' TTL
    assert other.revive_version("test-model", "v1") is True  # rolled back
    assert one.retire_version("test-model", "v2") is True
    for cache in (one, other):  # v1's fresh entries are hits again at once
        assert all(
            cache.complete(chat(q), v1, version="v1").layer is Layer.EXACT for q in QUESTIONS
        )
        assert all(cache.complete(chat(q), v2, version="v2").layer is Layer.MISS for q in QUESTIONS)
    assert v1.calls == calls
    clock.advance(one.settings.default_ttl_s)  # past their TTL: a revival does not bring them back
    assert one.complete(chat(QUESTIONS[0]), v1, version="v1").layer is Layer.MISS


def test_a_version_set_for_the_whole_model_retires_every_live_version(
    tmp_path: Path, clock: ManualClock
) -> None:
    cache = cache_on(tmp_path / "c.db", clock)
    upstreams = {v: VersionedUpstream(v) for v in ("v1", "v2")}
    for version, upstream in upstreams.items():
        cache.complete(chat("q"), upstream, version=version)
    assert cache.set_model_version("test-model", "v3") is True  # an upgrade of every replica
    for version, upstream in upstreams.items():
        assert cache.complete(chat("q"), upstream, version=version).layer is Layer.MISS
