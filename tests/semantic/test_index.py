"""One contract suite for every `VectorIndex` (flat, HNSW, and the growing index the layer uses,
both before and after its switch), plus a Hypothesis state machine checking `FlatIndex` against
a brute-force model."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from infercache.errors import InfercacheError
from infercache.semantic.flat_index import FlatIndex
from infercache.semantic.growing_index import GrowingIndex
from infercache.semantic.hnsw_index import HNSWIndex
from infercache.semantic.index import VectorIndex

DIM = 32
Factory = Callable[[int], VectorIndex]
FACTORIES: dict[str, Factory] = {
    "flat": FlatIndex,
    "flat-tiny-capacity": lambda dim: FlatIndex(dim, initial_capacity=1),
    "hnsw": lambda dim: HNSWIndex(dim, exact_below=0),
    "hnsw-exact-path": lambda dim: HNSWIndex(dim, exact_below=10**9),
    "hnsw-i8": lambda dim: HNSWIndex(dim, dtype="i8", exact_below=0),
    "growing": GrowingIndex,  # the layer's default: flat at these sizes
    "growing-switching-at-64": lambda dim: GrowingIndex(dim, switch_at=64),
}


def unit_vectors(n: int, seed: int, dim: int = DIM) -> npt.NDArray[np.float32]:
    vectors = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture(params=list(FACTORIES))
def make(request: pytest.FixtureRequest) -> Factory:
    return FACTORIES[request.param]


def test_a_stored_vector_finds_itself_first_with_similarity_one(make: Factory) -> None:
    index = make(DIM)
    vectors = unit_vectors(200, seed=1)
    index.add(list(range(100, 300)), vectors)
    assert len(index) == 200
    for row in (0, 57, 199):
        best = index.search(vectors[row], 3)[0]
        assert best.id == 100 + row
        assert best.similarity == pytest.approx(1.0, abs=0.02)


def test_hits_are_cosine_similarities_best_first_within_range(make: Factory) -> None:
    index = make(DIM)
    vectors = unit_vectors(300, seed=2)
    index.add(list(range(300)), vectors)
    query = unit_vectors(1, seed=3)[0]
    hits = index.search(query, 10)
    assert len(hits) == 10
    sims = [h.similarity for h in hits]
    assert sims == sorted(sims, reverse=True)
    assert all(-1.0 <= s <= 1.0 for s in sims)
    for hit in hits:  # the similarity is the cosine (within the stored precision)
        assert hit.similarity == pytest.approx(float(vectors[hit.id] @ query), abs=0.02)
    assert hits[-1].similarity == pytest.approx(-sorted(-(vectors @ query))[9], abs=0.02)
    opposite = index.search(-vectors[0], 300)
    assert opposite[-1].id == 0
    assert opposite[-1].similarity == pytest.approx(-1.0, abs=0.02)


def test_a_removed_id_is_never_returned(make: Factory) -> None:
    index = make(DIM)
    vectors = unit_vectors(1000, seed=4)
    index.add(list(range(1000)), vectors)
    removed = set(range(0, 1000, 3))
    assert index.remove(sorted(removed)) == len(removed)
    assert len(index) == 1000 - len(removed)
    for hits in index.search_many(vectors[:200], 50):
        assert removed.isdisjoint(h.id for h in hits)
    assert all(h.id not in removed for h in index.search(vectors[3], 1000))


def test_removing_unknown_or_already_removed_ids_is_a_counted_no_op(make: Factory) -> None:
    index = make(DIM)
    index.add([1, 2], unit_vectors(2, seed=5))
    assert index.remove([2, 2, 99]) == 1
    assert index.remove([2]) == 0
    assert len(index) == 1


def test_adding_an_existing_id_replaces_its_vector(make: Factory) -> None:
    index = make(DIM)
    vectors = unit_vectors(50, seed=6)
    index.add(list(range(50)), vectors)
    index.add([7], vectors[40:41])
    assert len(index) == 50
    hits = index.search(vectors[7], 50)
    assert all(h.id != 7 or h.similarity < 0.99 for h in hits)
    assert {h.id for h in index.search(vectors[40], 2)} == {7, 40}


def test_an_id_removed_then_added_again_comes_back(make: Factory) -> None:
    index = make(DIM)
    vectors = unit_vectors(20, seed=7)
    index.add(list(range(20)), vectors)
    index.remove([5])
    index.add([5], vectors[5:6])
    assert index.search(vectors[5], 1)[0].id == 5


def test_search_returns_fewer_hits_than_k_when_the_index_holds_fewer(make: Factory) -> None:
    index = make(DIM)
    assert index.search(unit_vectors(1, seed=8)[0], 5) == []
    index.add([3, 4], unit_vectors(2, seed=9))
    assert sorted(h.id for h in index.search(unit_vectors(1, seed=10)[0], 5)) == [3, 4]


def test_search_many_answers_each_row_like_search(make: Factory) -> None:
    index = make(DIM)
    vectors = unit_vectors(100, seed=11)
    index.add(list(range(100)), vectors)
    queries = unit_vectors(4, seed=12)
    many = index.search_many(queries, 5)
    assert [[h.id for h in hits] for hits in many] == [
        [h.id for h in index.search(q, 5)] for q in queries
    ]


def test_bulk_add_of_many_vectors_keeps_recall_against_brute_force(make: Factory) -> None:
    index = make(DIM)
    vectors = unit_vectors(5000, seed=13)
    index.add(list(range(5000)), vectors)
    queries = unit_vectors(200, seed=14)
    truth = np.argmax(queries @ vectors.T, axis=1)
    found = [hits[0].id for hits in index.search_many(queries, 1)]
    recall = float(np.mean(np.asarray(found) == truth))
    assert recall >= 0.9


@pytest.mark.parametrize(
    ("ids", "vectors", "error", "message"),
    [
        ([1, 2], np.zeros((3, DIM)), ValueError, r"shape \(2, 32\), got \(3, 32\)"),
        ([1], np.zeros((1, DIM + 1)), ValueError, r"got \(1, 33\)"),
        ([1, 1], np.zeros((2, DIM)), ValueError, "id 1 repeated"),
        ([-4], np.zeros((1, DIM)), ValueError, "got -4"),
        ([1], np.full((1, DIM), np.nan), ValueError, "NaN"),
        ([1.5], np.zeros((1, DIM)), TypeError, "integers"),
    ],
)
def test_bad_adds_are_rejected_naming_the_value(
    make: Factory,
    ids: list[int],
    vectors: npt.NDArray[np.float64],
    error: type[Exception],
    message: str,
) -> None:
    """Internal shape checks: plain ValueError/TypeError, never a client-facing error class."""
    index = make(DIM)
    with pytest.raises(error, match=message) as raised:
        index.add(ids, vectors)
    assert not isinstance(raised.value, InfercacheError)
    assert len(index) == 0


def test_bad_searches_are_rejected_naming_the_value(make: Factory) -> None:
    index = make(DIM)
    index.add([1], unit_vectors(1, seed=15))
    with pytest.raises(ValueError, match="k must be at least 1, got 0"):
        index.search(unit_vectors(1, seed=16)[0], 0)
    with pytest.raises(ValueError, match=r"shape \(32,\), got \(2, 32\)"):
        index.search(unit_vectors(2, seed=16), 1)


def test_concurrent_writers_and_readers_never_see_a_removed_id(make: Factory) -> None:
    index = make(DIM)
    vectors = unit_vectors(400, seed=17)
    index.add(list(range(200)), vectors[:200])
    index.remove(list(range(100)))  # ids 0..99 are gone for good
    failures: list[str] = []

    def write() -> None:
        for i in range(200, 400, 10):
            index.add(list(range(i, i + 10)), vectors[i : i + 10])
            index.remove([i + 5])

    def read() -> None:
        for q in vectors[:100]:
            failures.extend(f"dead {h.id}" for h in index.search(q, 20) if h.id < 100)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert len(index) == 100 + 200 - 20


def test_a_zero_vector_has_similarity_zero_to_everything(make: Factory) -> None:
    index = make(DIM)
    index.add([1, 2], np.vstack([np.zeros(DIM, np.float32), unit_vectors(1, seed=18)]))
    hits = {h.id: h.similarity for h in index.search(unit_vectors(1, seed=19)[0], 2)}
    assert hits[1] == pytest.approx(0.0, abs=1e-6)


def test_bad_construction_arguments_are_value_errors() -> None:
    with pytest.raises(ValueError, match="got 0"):
        FlatIndex(0)
    with pytest.raises(ValueError, match="got 0"):
        GrowingIndex(0)
    with pytest.raises(ValueError, match="'f64'"):
        HNSWIndex(8, dtype="f64")  # type: ignore[arg-type]


def test_the_growing_index_moves_to_hnsw_once_past_its_switch_and_keeps_every_vector() -> None:
    index = GrowingIndex(DIM, switch_at=100)
    vectors = unit_vectors(300, seed=20)
    index.add(list(range(100)), vectors[:100])
    index.remove([7])
    index.add([100], vectors[100:101])
    assert isinstance(index._index, FlatIndex)  # 100 held: at the switch point, still exact
    index.add([101], vectors[101:102])
    assert isinstance(index._index, HNSWIndex)
    index.add(list(range(102, 300)), vectors[102:])
    assert len(index) == 299
    found = [hits[0].id for hits in index.search_many(vectors, 1)]
    assert found[:7] + found[8:] == [i for i in range(300) if i != 7]
    assert found[7] != 7  # removed before the switch: never carried over


class FlatIndexAgainstBruteForce(RuleBasedStateMachine):
    """Random adds (with upserts), removes and searches; the index must agree with a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.index = FlatIndex(8, initial_capacity=2)
        self.model: dict[int, npt.NDArray[np.float32]] = {}

    @rule(ids=st.lists(st.integers(0, 40), max_size=12, unique=True), seed=st.integers(0, 2**16))
    def add(self, ids: list[int], seed: int) -> None:
        vectors = unit_vectors(len(ids), seed, dim=8)
        self.index.add(ids, vectors)
        self.model.update(zip(ids, vectors, strict=True))

    @rule(ids=st.lists(st.integers(0, 45), max_size=8))
    def remove(self, ids: list[int]) -> None:
        expected = len(set(ids) & set(self.model))
        assert self.index.remove(ids) == expected
        for id_ in ids:
            self.model.pop(id_, None)

    @rule(seed=st.integers(0, 2**16), k=st.integers(1, 50))
    def search(self, seed: int, k: int) -> None:
        query = unit_vectors(1, seed, dim=8)[0]
        hits = self.index.search(query, k)
        ranked = sorted((float(v @ query) for v in self.model.values()), reverse=True)[:k]
        assert len(hits) == len(ranked)
        assert len({h.id for h in hits}) == len(hits)
        for hit, expected in zip(hits, ranked, strict=True):
            assert hit.id in self.model
            assert hit.similarity == pytest.approx(float(self.model[hit.id] @ query), abs=1e-5)
            assert hit.similarity == pytest.approx(expected, abs=1e-5)

    @invariant()
    def same_size(self) -> None:
        assert len(self.index) == len(self.model)


TestFlatIndexAgainstBruteForce = FlatIndexAgainstBruteForce.TestCase
TestFlatIndexAgainstBruteForce.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
