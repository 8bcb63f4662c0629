"""`ScopedIndexes`: one index per scope, one vector per exact key, a bound on the total; and the
semantic record's round trip through an `Entry`."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from infercache.semantic.flat_index import FlatIndex
from infercache.semantic.records import SemanticRecord, decode_record, encode_record
from infercache.semantic.registry import IndexedItem, ScopedIndexes
from infercache.stores.base import Entry

DIM = 16


def unit(seed: int) -> npt.NDArray[np.float32]:
    vector = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return vector / np.linalg.norm(vector)


def item(scope: str, key: str) -> IndexedItem:
    return IndexedItem(scope, key, f"text of {key}")


def test_a_search_sees_only_its_own_scope() -> None:
    indexes = ScopedIndexes(DIM, FlatIndex, max_vectors=100)
    indexes.add(item("tenant-a", "k1"), unit(1))
    indexes.add(item("tenant-b", "k2"), unit(1))
    found = indexes.search("tenant-a", unit(1), 5)
    assert [c.item.key for c in found] == ["k1"]
    assert found[0].similarity == pytest.approx(1.0, abs=1e-6)
    assert indexes.search("tenant-c", unit(1), 5) == []
    assert indexes.scopes == 2


def test_adding_a_key_again_replaces_its_vector() -> None:
    indexes = ScopedIndexes(DIM, FlatIndex, max_vectors=100)
    indexes.add(item("s", "k"), unit(1))
    assert indexes.add(item("s", "k"), unit(2)) == 1
    (only,) = indexes.search("s", unit(2), 5)
    assert only.item.key == "k"
    assert only.similarity == pytest.approx(1.0, abs=1e-6)


def test_the_oldest_vectors_go_first_beyond_the_bound_and_empty_scopes_are_dropped() -> None:
    indexes = ScopedIndexes(DIM, FlatIndex, max_vectors=3)
    indexes.add(item("old", "k0"), unit(0))
    for i in range(1, 4):
        indexes.add(item("new", f"k{i}"), unit(i))
    assert len(indexes) == 3
    assert indexes.search("old", unit(0), 5) == []
    assert indexes.scopes == 1
    assert indexes.forget_key("k2") is True
    assert indexes.forget_key("k2") is False
    assert {c.item.key for c in indexes.search("new", unit(1), 5)} == {"k1", "k3"}


def test_a_bulk_add_indexes_every_scope_and_keeps_a_repeated_keys_last_vector() -> None:
    indexes = ScopedIndexes(DIM, FlatIndex, max_vectors=100)
    items = [item("a", "k1"), item("b", "k2"), item("a", "k1"), item("a", "k3")]
    vectors = np.stack([unit(1), unit(2), unit(4), unit(3)])
    assert indexes.add_many(items, vectors) == 3
    best = indexes.search("a", unit(4), 1)[0]
    assert (best.item.key, round(best.similarity, 5)) == ("k1", 1.0)
    assert [c.item.key for c in indexes.search("b", unit(2), 5)] == ["k2"]


def test_a_semantic_record_round_trips_through_an_entry_living_as_long_as_its_answer() -> None:
    answer = Entry(
        response=b"{}",
        model="m",
        model_version="v1",
        tags=(("kb", 2),),
        created_at_s=10.0,
        expires_at_s=110.0,
        upstream_s=0.4,
        prompt_tokens=5,
        completion_tokens=7,
    )
    record = SemanticRecord("scope", "How do I reset it?", "key", "embedder@1", unit(5))
    stored = encode_record(record, answer)
    assert (stored.expires_at_s, stored.model_version, stored.tags) == (110.0, "v1", (("kb", 2),))
    back = decode_record(stored)
    assert back[:4] == record[:4]
    assert np.array_equal(back.vector, record.vector)
    with pytest.raises(ValueError, match="not a semantic record"):
        decode_record(answer)
