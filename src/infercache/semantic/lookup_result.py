"""What a semantic lookup returns: the hit it serves (`SemanticHit`), and what it computed for
the store step and for judging (`Probe`, with the miss's `Noted` best candidate). Pure values."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from infercache.semantic.answer_stats import GroupKey
from infercache.semantic.matcher import NearbyAnswer
from infercache.semantic.scope import Query
from infercache.stores.base import Entry


class Noted(NamedTuple):
    """A miss's best candidate, to be judged against the fresh answer when it arrives."""

    key: str
    score: float
    group: GroupKey
    cached: bytes  # the candidate's stored response body
    neighbours: tuple[NearbyAnswer, ...] = ()  # what the matcher saw (rescored after a refit)
    position: int = 0  # which of them is the noted candidate


class Probe(NamedTuple):
    """What a lookup computed, reused when the answer is stored (the embedding is the costly
    part; the scope is recomputed then, since the answer may be stored under a newer view)."""

    query: Query
    vector: npt.NDArray[np.float32]
    noted: Noted | None = None


class SemanticHit(NamedTuple):
    entry: Entry
    key: str  # the exact key of the near-duplicate whose answer is served
    similarity: float  # cosine similarity in [-1, 1] (what `x-infercache-similarity` shows)
    score: float  # the matcher's decision score the threshold was applied to
    group: GroupKey  # the answer group whose statistics the hit belongs to
